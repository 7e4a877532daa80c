"""The ``eagle`` drafter: a feature-level draft (see model.py) reading the target's hidden states.

``path`` names a folder written by ``pacer distill`` (manifest.json; the EAGLE-1-style
``FeatureDraft`` or the EAGLE-3-style ``Eagle3Draft``, whose config records the target layers it
reads) or a published EAGLE-1/2 or EAGLE-3 checkpoint as downloaded (config.json + weights, see
published.py)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import attrs
import numpy as np
import torch

from pacer_core import (
    Component,
    DraftBlock,
    DraftInfo,
    InputError,
    Resources,
    hookimpl,
)
from pacer_core.context_vocab import ContextVocab
from pacer_core.draft_folders import MANIFEST
from pacer_core.draft_folders import draft_identity as folder_identity
from pacer_core.jsonfile import read_json
from pacer_core.kernels import PackedMatrix, pack_linears
from pacer_core.priors import SuccessorIndex, lookup_bias_for, path_bonus
from pacer_core.protocols import feature_target
from pacer_core.sampling import argmax_first, logits_to_probs, sample, take_rows
from pacer_core.tree_hooks import BudgetedTree
from pacer_core.trees import GrownLevels, TreeConfig, grow_level, node_budget
from pacer_core.types import StepWatch
from pacer_train.corpus.prior import corpus_prior

from .model import Eagle3Draft, KVCache, load_draft
from .published import load_published, weights_file

DEFAULT_DRAFT = Path(__file__).parent / "default"
COST_KIND = "feature"  # a head over the target's states (pacer_core.cost_profiles.DRAFTER_KINDS)


@attrs.define
class EagleConfig:
    path: Optional[str] = None  # a folder written by `pacer distill` or a published EAGLE/EAGLE-3
    # checkpoint (config.json + pytorch_model.bin or model.safetensors); None = the shipped default draft
    allow_other_target: bool = False  # experts: use a draft distilled from another target
    tree: Optional[TreeConfig] = None  # grow a token tree ({topk, depth, nodes}); None = a chain
    # add the context's tokens that lie outside the draft's vocabulary subset to its head (their rows
    # of the target's output layer), so the draft can say any word of the prompt or answer; None = on
    # for drafts whose head is the target's output layer restricted to a subset (docs/draft.md)
    context_vocab: Optional[bool] = None
    # added to the draft's logits of the tokens already in the context (a copy prior, before the sampling
    # parameters); 0 = none: with the lookup bias on it adds nothing (docs/draft.md)
    context_bias: float = 0.0
    # [b_1, b_2, ...]: b_n added to the logits of the tokens that followed an earlier occurrence of the
    # last n tokens of the draft's path in the committed text (priors.py); None = LOOKUP_BIAS for drafts
    # `pacer distill` makes, [] (none) for published checkpoints
    lookup_bias: Optional[List[float]] = None
    # added, times its share, to the logits of each token that followed the longest n-gram (up to
    # CORPUS_NGRAM, seen 5 times or more) ending the draft's path in `corpus` (priors.CorpusSuccessors);
    # None = CORPUS_BIAS for drafts `pacer distill` makes of kind `feature` where this target wrote the
    # corpus (or it is a file), 0 (none) otherwise (docs/draft.md)
    corpus_bias: Optional[float] = None
    # what corpus_bias reads: "shipped" (the answers the embedded target wrote), a folder `pacer corpus`
    # wrote, a .json of token ids or a text file (as the datastore drafter's `corpus`)
    corpus: str = "shipped"


def draft_folder(path: Optional[str]) -> Path:
    """The draft folder ``path`` names: one ``pacer distill`` wrote (manifest.json) or a published
    EAGLE checkpoint (config.json + weights); anything else is one ``InputError``."""
    folder = DEFAULT_DRAFT if path is None else Path(path).expanduser()
    if not (folder / MANIFEST).exists() and weights_file(folder) is None:
        hint = (
            "the shipped draft is missing: reinstall"
            if path is None
            else "run `pacer distill` to make one, or download a published EAGLE checkpoint"
        )
        raise InputError(
            f"'{folder}' is not a feature draft folder (no {MANIFEST}) nor an EAGLE checkpoint "
            f"(config.json with model.safetensors or pytorch_model.bin): {hint}"
        )
    return folder


PRIOR_OPTIONS = ("context_vocab", "context_bias", "lookup_bias", "corpus_bias", "corpus")


def read_manifest(folder: Path) -> dict:
    """The manifest of a draft folder ``pacer distill`` wrote (``InputError`` naming it when damaged)."""
    return read_json(folder / MANIFEST, "draft manifest", "distill the draft again (`pacer distill`)")


def recommended_stop_thresholds(folder: Path, manifest: dict, config: EagleConfig) -> dict[str, float]:
    """The thresholds the manifest of the draft in ``folder`` recommends to the stop policies reading
    its probabilities (its ``stop_thresholds``: chosen for the drafter's default priors,
    docs/stop-policies.md), or none when ``config`` sets any of the priors' options or the manifest
    has no such entry."""
    defaults = attrs.fields_dict(EagleConfig)
    if any(getattr(config, name) != defaults[name].default for name in PRIOR_OPTIONS):
        return {}
    entry = manifest.get("stop_thresholds", {})
    if not isinstance(entry, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0
        for k, v in entry.items()
    ):
        raise InputError(
            f"'{folder / MANIFEST}': stop_thresholds must map stop names to numbers in [0, 1]: "
            "fix that entry or remove it"
        )
    return {k: float(v) for k, v in entry.items()}


def draft_identity(folder: Path) -> str:
    """Names a draft folder for components trained on its drafts (PACER's M_B): the digest of the
    target it was distilled from and a hash of its weights file."""
    return folder_identity("eagle", folder, read_manifest(folder))


@attrs.define
class _Level:
    """The latest level of the tree being grown: its tokens, cumulative scores, the main path's tip
    among them, what feeding them needs, and their draft-tree numbers once the call's block has them."""

    tokens: list[int]
    scores: list[float]  # [f], float32 values
    tip_row: Optional[int]
    depth: int
    parent_rows: list[Optional[int]]  # cache row of each node's parent (None: the root)
    parent_features: torch.Tensor  # [f, hidden]: the feature that chose each node
    blocks: int  # blocks in the draft once this level is added (another drafter may add side nodes)
    rows: list[Optional[int]] = attrs.field(factory=list)  # cache rows once fed
    paths: list[tuple[int, ...]] = attrs.field(factory=list)  # each node's tokens from the root (lookup_bias)
    nodes: list[int] = attrs.field(factory=list)  # draft-tree numbers (GrownLevels.block), main-path node first


class EagleDrafter(BudgetedTree):
    """Drafts with predicted target features: row t of the draft network reads (x_{t+1}, f_t).

    Rows whose f_t is the target's true feature are kept across steps; rows fed with predicted
    features are recomputed once the target has scored those tokens. The draft's hidden states
    (for PACER) are the predicted features that produced each draft token.
    """

    def __init__(self, config: EagleConfig, resources: Resources):
        folder = draft_folder(config.path)
        target = feature_target(resources.target, "eagle")
        embed, head = target.embedding_weights()
        device = embed.device
        # float32 on the CPU (as the target's packed products); the target's dtype on an accelerator
        self.dtype = torch.float32 if device.type == "cpu" else embed.dtype
        packed = bool(target.packed_weights) and device.type == "cpu"  # pack as the target does
        # what the engine and later components read of it (DraftInfo): the draft's identity, the stop
        # thresholds it recommends, the target layers whose inputs the net reads (None: the last layer)
        if (folder / MANIFEST).exists():
            manifest = read_manifest(folder)
            self.net = self._own_draft(folder, manifest, config, target)
            self.layout = "eagle3" if isinstance(self.net, Eagle3Draft) else "pacer"
            subset = self.net.subset
            self.draft_info = DraftInfo(
                identity=draft_identity(folder),
                stop_thresholds=recommended_stop_thresholds(folder, manifest, config),
                target_layers=tuple(self.net.arch.target_layers) if self.layout == "eagle3" else None,
                tree=config.tree,
            )
        else:  # a published EAGLE checkpoint; the stops keep their own thresholds
            published = load_published(folder, target)
            self.net, self.layout = published.net, published.layout
            self.draft_info = DraftInfo(
                identity=published.identity, target_layers=published.target_layers, tree=config.tree
            )
            subset = published.vocab if published.vocab is not None else torch.arange(target.vocab_size)
        self.net.to(device=device, dtype=self.dtype).requires_grad_(False)
        self.embed = embed
        if packed:
            pack_linears(self.net)
        if self.layout == "eagle3":
            self.head = self.net.logits  # the draft's own norm and head over its vocabulary
        elif self.layout == "eagle1" and len(subset) == target.vocab_size:
            self.head = PackedMatrix(head.to(self.dtype), pack=packed)  # the target's full head
        else:
            self.head = PackedMatrix(head[subset.to(device)].to(self.dtype), pack=packed)  # x @ [subset, hidden].T
        self.subset = subset.cpu()  # target id of each logit of the draft's own head
        own_subset = self.layout == "pacer"
        self.context_vocab = own_subset if config.context_vocab is None else config.context_vocab
        if self.context_vocab and not own_subset:
            has = "its own output layer" if self.layout == "eagle3" else "the target's whole vocabulary"
            raise InputError(
                f"strategy.drafter.context_vocab=true needs a draft whose head is a subset of the "
                f"target's output layer; this {self.layout} draft has {has}: leave context_vocab unset"
            )
        # the draft's columns: the subset, then (context_vocab) the committed tokens outside it, with their
        # rows of the target's output layer
        self.columns = ContextVocab(self.subset, target.vocab_size, head, self.context_vocab, self.dtype)
        self.context_bias = float(config.context_bias)
        self.lookup_bias = lookup_bias_for(own_subset, config.lookup_bias)
        self.reads_context = self.context_vocab or bool(self.context_bias) or bool(self.lookup_bias)
        self.corpus_bias, self.corpus = corpus_prior(
            own_subset, config.corpus_bias, config.corpus, resources.tokenizer, target.vocab_size, target.digest
        )
        # the last tokens of a path the priors read
        self.suffix_length = max(len(self.lookup_bias), self.corpus.longest if self.corpus else 0)
        self.sampling = resources.sampling
        self.vocab_size = target.vocab_size
        self.tree = config.tree
        self.budget = (
            None
            if config.tree is None
            else node_budget(config.tree, target.device, COST_KIND, target.digest, folder, self.draft_info.identity)
        )
        self.hidden_size = target.hidden_size
        self.pacer_start(None)

    @staticmethod
    def _own_draft(folder: Path, manifest: dict, config: EagleConfig, target) -> torch.nn.Module:
        """A draft ``pacer distill`` wrote (``FeatureDraft`` or ``Eagle3Draft``; ``manifest``: its
        manifest), checked against the target it was distilled from."""
        target_digest = target.digest
        if target_digest and manifest.get("target_digest") != target_digest and not config.allow_other_target:
            raise InputError(
                f"draft '{folder}' was distilled from target {manifest.get('target_digest')}, but this "
                f"target is {target_digest}: distill a draft for it (`pacer distill`) or set "
                "strategy.drafter.allow_other_target=true"
            )
        net = load_draft(folder)
        fused = getattr(net.arch, "fused_size", net.arch.hidden_size)
        layers = len(getattr(net.arch, "target_layers", [])) or 1
        if (
            net.arch.vocab_size != target.vocab_size
            or net.arch.hidden_size != target.hidden_size
            or fused != layers * target.hidden_size
        ):
            raise InputError(f"draft '{folder}' does not fit this target (vocabulary or hidden size differ)")
        return net

    def reset(self, features: torch.Tensor) -> None:
        self.features = features  # [F, hidden]: the net's features of the true target states of tokens 0..F-1
        self.cache = KVCache()
        self.true_rows = 0  # leading cache rows fed with true features
        self.row_tokens: list[int] = []  # token x_{r+1} fed at row r
        self.row_out: list[torch.Tensor] = []  # predicted f_{r+1} from row r
        self.level: Optional[_Level] = None  # the latest level of this step's tree (tree mode)
        self.step = StepWatch()  # tree mode: a step's first call grows from the root
        self._tree_seen: list[list[int]] = []  # per tree row of the step: the tree rows it sees (its path)
        self.columns.reset()
        # [columns]: context_bias at the context's tokens (None without a context_bias)
        self.bias = torch.zeros(len(self.subset)) if self.context_bias else None
        self._index = SuccessorIndex(len(self.lookup_bias))  # the committed text's n-grams → successors

    def _read_context(self, context: list[int]) -> None:
        """Read the tokens of ``context`` (committed tokens, which only grow within a generation) not read
        yet: add those the draft cannot say to its vocabulary with their rows of the target's output
        layer (``context_vocab``), give every one it can say ``context_bias``, and index its n-grams
        (``lookup_bias``)."""
        if self.lookup_bias:
            self._index.extend(context[len(self._index.text) :])
        new, added = self.columns.read(context)
        if added and self.bias is not None:
            self.bias = torch.cat([self.bias, torch.zeros(added)])
        column = self.columns.column
        said = [column[t] for t in new if column[t] >= 0] if self.context_bias else []
        if said:
            self.bias[said] = self.context_bias

    def _logits(self, features: torch.Tensor, suffixes: Optional[list[list[int]]] = None) -> torch.Tensor:
        """[k, hidden] → [k, columns] float32 on the CPU, with the context priors; suffixes[i]: the
        path row i drafts after (its last ``suffix_length`` tokens suffice), for ``lookup_bias`` and
        ``corpus_bias``."""
        logits = self.columns.logits(features, self.head(features)).float().cpu()
        if self.context_bias:
            logits = logits + self.bias
        if self.suffix_length and suffixes is not None:
            # the priors' bonuses in one indexed add into the flat logits (no two share a cell: a row's
            # tokens are distinct); tokens the draft cannot say get nothing
            column, width, cells, bonuses = self.columns.column, int(logits.shape[1]), [], []
            for row, suffix in enumerate(suffixes):
                for token, bonus in path_bonus(
                    self._index, self.lookup_bias, self.corpus, self.corpus_bias, suffix
                ).items():
                    if column[token] >= 0:
                        cells.append(row * width + column[token])
                        bonuses.append(bonus)
            if cells:  # float32 additions, one per cell, in numpy (two small tensors cost more)
                logits = logits.contiguous()
                logits.view(-1).numpy()[cells] += np.asarray(bonuses, dtype=np.float32)
        return logits

    @torch.inference_mode()
    def _fuse(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """The target's states ([k, hidden], or [k, 3 × hidden] of three layers for EAGLE-3) → the
        features rows fed with them read ([k, hidden])."""
        return self.net.fuse(target_hidden.to(self.embed.device, self.dtype))

    @hookimpl
    def pacer_start(self, state) -> None:  # the prompt's rows come with step 0's record
        self.reset(torch.empty(0, self.hidden_size, dtype=self.dtype, device=self.embed.device))
        if self.budget is not None and state is not None and not state.sampling.greedy:
            self.budget.restart()  # auto's learned rate carries across greedy generations only

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        if step.target_hidden is not None:
            start = step.target_hidden_start
            self.features = torch.cat([self.features[:start], self._fuse(step.target_hidden)])

    def _truncate_rows(self, keep: int) -> None:
        self.cache.crop(keep)
        del self.row_tokens[keep:], self.row_out[keep:]
        self.true_rows = min(self.true_rows, keep)

    @torch.inference_mode()
    def _feed(self, tokens: list[int], features: torch.Tensor) -> torch.Tensor:
        start = len(self.cache)
        # one token (a chain's): its embedding's row as a view, cheaper than gathering by a list
        embeds = self.embed[tokens[0] : tokens[0] + 1] if len(tokens) == 1 else take_rows(self.embed, tokens)
        out = self.net(embeds.to(self.dtype), features, torch.arange(start, start + len(tokens)), self.cache)
        self.row_tokens.extend(tokens)
        self.row_out.extend(out.unbind(0))
        return out

    def _sync(self, context: list[int]) -> int:
        """Bring the cache to rows 0..len(context)-2; returns the number of forwards spent."""
        forwards, known = 0, len(self.features)
        if known > self.true_rows:  # new true features: recompute rows fed with predictions
            self._truncate_rows(self.true_rows)
        else:  # same step: keep predicted rows whose tokens still match the context
            keep = self.true_rows
            while (
                keep < len(self.row_tokens) and keep + 1 < len(context) and self.row_tokens[keep] == context[keep + 1]
            ):
                keep += 1
            self._truncate_rows(keep)
        rows = len(self.row_tokens)
        if rows < known and known <= len(context) - 1:
            self._feed(context[rows + 1 : known + 1], self.features[rows:known])
            self.true_rows = known
            forwards += 1
        while len(self.row_tokens) < len(context) - 1 and self.row_out:
            r = len(self.row_tokens)
            self._feed([context[r + 1]], self.row_out[r - 1][None])
            forwards += 1
        return forwards

    def _draft_distribution(
        self, features: torch.Tensor, suffixes: Optional[list[list[int]]], out: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """The draft's distribution after each feature over its own vocabulary ([k, columns];
        column j is token ``self.columns.id_list[j]``; suffixes[i]: the path row i drafts after), written into
        ``out`` when given: sampling parameters applied (softmax under greedy). Blocks carry rows at
        this width with ``self.columns.draft_vocab``, widened into the target's vocabulary only when read."""
        logits = self._logits(features, suffixes)  # [k, draft vocabulary]
        if self.sampling.greedy:
            return torch.softmax(logits, -1) if out is None else torch.softmax(logits, -1, out=out)
        probs = logits_to_probs(logits, self.sampling)
        return probs if out is None else out.copy_(probs)

    def _choose(self, feature: torch.Tensor, generator, suffix: list[int]) -> tuple[int, torch.Tensor]:
        """The next token after ``feature`` and the row it was chosen from, over the draft's vocabulary
        (``self.columns.draft_vocab``): under greedy decoding the logits (a chain takes the softmax of its
        rows at once, row by row the same values), else the probabilities it was drawn from."""
        logits = self._logits(feature, [suffix])[0]  # feature: [1, hidden] → [draft vocabulary]
        if self.sampling.greedy:
            return self.columns.id_list[argmax_first(logits)], logits
        probs = logits_to_probs(logits, self.sampling)
        return self.columns.id_list[int(sample(probs, generator))], probs

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        if self.tree is not None:
            return self._propose_levels(state, draft, num_tokens)
        context = state.tokens + draft.tokens.tolist() if len(draft) else state.tokens
        if len(self.features) == 0:
            return None  # step 0 (the prefill): no target feature yet, it decodes plainly
        if self.reads_context:
            self._read_context(state.tokens)
        forwards = self._sync(context)
        if len(self.row_tokens) != len(context) - 1:
            return None
        tokens, rows, hidden = [], [], []
        feature = self.row_out[-1][None]  # [1, hidden]
        longest = self.suffix_length
        for i in range(num_tokens):
            token, row = self._choose(feature, state.generator, (context + tokens)[-longest:] if longest else [])
            tokens.append(token)
            rows.append(row)
            hidden.append(feature)
            if token in state.eos_token_ids or i == num_tokens - 1:
                break
            feature = self._feed([token], feature)[-1:]
            forwards += 1
        probs = torch.softmax(torch.stack(rows), -1) if self.sampling.greedy else torch.stack(rows)
        return DraftBlock(
            tokens=torch.tensor(tokens, dtype=torch.long),
            draft_probs=probs,
            hidden_states=torch.cat(hidden),
            forwards=forwards,
            draft_vocab=self.columns.draft_vocab,
        )

    # -- token trees (docs/trees.md) -------------------------------------------------------------

    def _propose_levels(self, state, draft, num_tokens: int) -> Optional[DraftBlock]:
        """Up to ``num_tokens`` levels of an EAGLE-2-style tree (pacer_core.trees) in one block: the
        first level of a step reads the draft's distribution after the context; each later one feeds
        every node of the latest level in one tree-masked forward and keeps the best children. The
        block's main path is each level's main-path child; the others are its side nodes. A stop
        policy that asks for one token at a time gets one level per call."""
        tree, forwards = self.tree, 0
        if self.step.starts(state):  # a new step: drop the previous tree's rows, sync with the context
            self.level, self._tree_seen = None, []
            context = state.tokens
            if len(self.features) == 0:
                return None  # step 0 (the prefill): no target feature yet, it decodes plainly
            if self.reads_context:
                self._read_context(context)
            self.cache.crop(len(self.row_tokens))
            forwards = self._sync(context)
            if len(self.row_tokens) != len(context) - 1:
                return None
        elif self.level is None or self.level.blocks != len(draft.blocks):
            return None  # another drafter's block came last: this tree stops growing
        grown = GrownLevels([-1] if self.level is None else self.level.nodes)  # this call's levels, one block
        # every level's rows of draft probabilities, written one level after another into one table
        # (f ≤ topk rows a level): the block maps each node to its parent's row, nothing is copied
        levels = min(num_tokens, tree.depth - (0 if self.level is None else self.level.depth))
        table, used = torch.empty(max(levels, 1) * tree.topk, len(self.columns.id_list)), 0
        for _ in range(num_tokens):
            level = self.level
            if level is None:  # the root
                features = self.row_out[-1][None]  # [1, hidden]
                scores, tip_row, rows = [0.0], 0, [None]
                paths: list[tuple[int, ...]] = [()]
            else:
                if level.depth >= tree.depth or level.tokens[level.tip_row] in state.eos_token_ids:
                    break  # nothing is drafted past an end-of-sequence token on the main path
                features = self._feed_level(level)  # [f, hidden]: after each node of the latest level
                forwards += 1
                scores, tip_row, rows, paths = level.scores, level.tip_row, level.rows, level.paths
            longest = self.suffix_length
            suffixes = [(state.tokens[-longest:] + list(path))[-longest:] for path in paths] if longest else None
            # chosen over the draft's own vocabulary (top-k of f × its width, not the target's); the chosen
            # nodes' rows stay at that width (self.columns.draft_vocab), widened only if a verifier or stop reads them
            f = int(features.shape[0])
            probs = self._draft_distribution(features, suffixes, table[used : used + f])  # [f, draft vocabulary]
            if level is not None:  # nothing grows past an end-of-sequence token
                ends = [i for i, t in enumerate(level.tokens) if t in state.eos_token_ids]
                if ends:
                    probs[ends] = 0.0
            chosen = grow_level(
                scores, probs, tip_row, tree.topk, tree.topk, None if self.columns.whole else self.columns.id_list
            )  # the draft's columns → token ids
            if not chosen or tip_row is None or chosen[0].row != tip_row:
                break
            picked = [c.row for c in chosen]  # each chosen node's parent's row (of features, probs)
            parent_features = take_rows(features, picked)  # [len(chosen), hidden]: the feature that chose each node
            # the level's rows stay whole: a node maps to its parent's row (siblings share it)
            grown.add(chosen, table, parent_features[0], [used + row for row in picked])
            used += f
            self.level = _Level(
                tokens=[c.token for c in chosen],
                scores=[c.score for c in chosen],
                tip_row=0,
                depth=1 if level is None else level.depth + 1,
                parent_rows=[rows[row] for row in picked],
                parent_features=parent_features,
                blocks=len(draft.blocks) + 1,
                paths=[paths[c.row] + (c.token,) for c in chosen],
            )
        if not grown:
            return None
        block, self.level.nodes = grown.block(draft.num_nodes, forwards, self.columns.draft_vocab)
        return block

    @torch.inference_mode()
    def _feed_level(self, level: "_Level") -> torch.Tensor:
        """Feed the latest level's nodes (token, the feature that chose it) in one forward; each row
        sees the context rows, its ancestors' rows and itself. Returns their predicted features."""
        start, base = len(self.cache), len(self.row_tokens)
        f, r = len(level.tokens), start - base  # r: the tree rows cached before this level
        # each new row sees its parent's row and what that sees, and itself (tree rows, from 0)
        seen = [
            (self._tree_seen[row - base] if row is not None else []) + [r + i]
            for i, row in enumerate(level.parent_rows)
        ]
        self._tree_seen += seen
        # [f, start + f]: every context row, the tree rows each sees (built in numpy: a few small
        # tensor operations cost more than the whole mask)
        mask = np.zeros((f, start + f), dtype=bool)
        mask[:, :base] = True
        mask[[i for i, rows in enumerate(seen) for _ in rows], [base + j for rows in seen for j in rows]] = True
        positions = torch.full((f,), base + level.depth - 1)
        out = self.net(
            take_rows(self.embed, level.tokens).to(self.dtype),
            level.parent_features,
            positions,
            self.cache,
            torch.from_numpy(mask),
        )
        level.rows = [start + i for i in range(f)]
        return out


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component(
            "drafter",
            "eagle",
            EagleConfig,
            EagleDrafter,
            "feature-level draft (EAGLE-style) distilled from the target, or a published EAGLE-1/2/3 checkpoint; "
            "reads the target's hidden states",
            needs={"target_hidden"},
            provides={"draft_probs", "draft_hidden"},
            draft_folder=lambda config: draft_folder(config.path),
            cost_kind=COST_KIND,
        )
    ]


@hookimpl
def pacer_shipped() -> dict[str, Path]:
    """The self-distillation corpora, committed beside the draft distilled on them (docs/corpus.md)."""
    from pacer_train.corpus.loaders import OPEN_CHAT_CORPUS, SELFDISTILL_CORPUS

    here = Path(__file__).resolve().parent
    return {SELFDISTILL_CORPUS: here / "corpus", OPEN_CHAT_CORPUS: here / "corpus-open"}
