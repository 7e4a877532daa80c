"""The ``dflash`` drafter: a block draft (model.py) proposes a whole block in one forward, from the
target's states at the committed context. Its blocks are handed out as chains or as a tree over one
block by the base every block drafter shares (handout.py: ``BlockDrafter``); a further block is
one more forward conditioned on the tokens drafted before it.

The draft's context keys and values come from the target's states of committed tokens only, so
nothing the drafter keeps is ever rolled back; a rejected block is simply dropped. A step's states
are kept as they come and projected when the drafter next drafts, all at once: a run of steps the
draft gate decodes plainly costs the draft nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import attrs
import torch

from pacer_core import Component, DraftInfo, InputError, Resources, hookimpl
from pacer_core.context_vocab import ContextVocab
from pacer_core.draft_folders import MANIFEST, WEIGHTS
from pacer_core.jsonfile import read_json
from pacer_core.kernels import PackedMatrix, pack_linears
from pacer_core.priors import lookup_bias_for
from pacer_core.protocols import feature_target
from pacer_core.trees import TreeConfig, node_budget
from pacer_train.corpus.prior import corpus_prior

from .handout import BlockDrafter
from .model import BlockDraft, ContextCache, draft_identity, load_block_draft
from .published import is_published, load_published_block

DEFAULT_DRAFT = Path(__file__).parent / "default"
COST_KIND = "block"  # one forward drafts a block (pacer_core.cost_profiles.DRAFTER_KINDS)


@attrs.define
class DFlashConfig:
    path: Optional[str] = None  # a folder `pacer distill student.kind=dflash` wrote, or a published DFlash
    # checkpoint (z-lab/dflash or speculators' dflash format, docs/block-checkpoints.md); None = the shipped draft
    allow_other_target: bool = False  # experts: use a draft distilled from another target
    # mask rows one forward fills (tokens drafted per forward); None = the block the draft was trained on
    block: Optional[int] = attrs.field(
        default=None, validator=attrs.validators.optional([attrs.validators.ge(1), attrs.validators.le(32)])
    )
    tree: Optional[TreeConfig] = None  # a tree ({topk, depth, nodes}; past the block: further blocks); None = a chain
    # [b_1, b_2, …]: b_n added to a row's logits of the tokens that followed an earlier occurrence, in the
    # committed text, of the last n tokens of its path (pacer_core/priors.py); None = [2, 4, 4] for drafts
    # `pacer distill` makes, none for published checkpoints; [] = none
    lookup_bias: Optional[List[float]] = None
    # add the committed tokens (prompt and answer so far) outside the draft's vocabulary subset to its head,
    # with their rows of the target's output layer (pacer_core/context_vocab.py); None = on for drafts
    # `pacer distill` makes, off for published checkpoints; true on a draft with its own output layer is refused
    context_vocab: Optional[bool] = None
    # added, times its share, to a row's logits of each token that followed the longest n-gram (up to 4,
    # seen 5 times or more) ending its path in `corpus` (pacer_core/priors.py); None = 3 for drafts `pacer distill`
    # makes where this target wrote the corpus (or it is a file), none for published checkpoints; 0 = none
    corpus_bias: Optional[float] = None
    # what corpus_bias reads: "shipped" (the answers the embedded target wrote), a folder `pacer corpus`
    # wrote, a .json of token ids or a text file (as the eagle drafter's `corpus`)
    corpus: str = "shipped"


def draft_folder(path: Optional[str]) -> Path:
    """The draft folder ``path`` names: one `pacer distill` wrote, or a published DFlash checkpoint
    (published.py); None = the shipped draft."""
    folder = DEFAULT_DRAFT if path is None else Path(path).expanduser()
    if path is not None and is_published(folder):
        return folder
    if not (folder / MANIFEST).is_file() or not (folder / WEIGHTS).is_file():
        hint = (
            "the shipped draft is missing: reinstall"
            if path is None
            else "make one with `pacer distill student.kind=dflash`, or give a published DFlash checkpoint "
            "(config.json and model.safetensors)"
        )
        raise InputError(f"'{folder}' is not a dflash draft folder (no {MANIFEST} and {WEIGHTS}): {hint}")
    return folder


class DFlashDrafter(BlockDrafter):
    """Drafts a block of tokens per forward from the target's states at the committed context."""

    def __init__(self, config: DFlashConfig, resources: Resources):
        folder = draft_folder(config.path)
        target = feature_target(resources.target, "dflash")
        digest = target.digest
        published_draft = is_published(folder)
        if published_draft:  # z-lab/dflash or speculators: checked against the target as it is read
            published = load_published_block(folder, target)
            net, identity = published.net, published.identity
        else:
            manifest = read_json(folder / MANIFEST, "draft manifest", "distill the draft again")
            if digest and manifest.get("target_digest") != digest and not config.allow_other_target:
                raise InputError(
                    f"draft '{folder}' was distilled from target {manifest.get('target_digest')}, but "
                    f"this target is {digest}: distill a draft for it (`pacer distill "
                    "student.kind=dflash`) or set strategy.drafter.allow_other_target=true"
                )
            net, identity = load_block_draft(folder), draft_identity(folder, manifest)
        arch = net.arch
        if arch.vocab_size != target.vocab_size or arch.hidden_size != target.hidden_size:
            raise InputError(f"draft '{folder}' does not fit this target (vocabulary or hidden size differ)")
        embed, head = target.embedding_weights()
        device = embed.device
        self.dtype = torch.float32 if device.type == "cpu" else embed.dtype  # as the eagle drafter
        self.net: BlockDraft = net.to(device=device, dtype=self.dtype).requires_grad_(False)
        subset = self.net.subset.cpu()
        # x @ [subset, hidden].T: the draft's own output layer (a speculators checkpoint's), else the target's rows
        rows = self.net.lm_head.weight.detach() if arch.own_head else head[subset.to(device)].to(self.dtype)
        packed = bool(target.packed_weights) and device.type == "cpu"
        if packed:
            pack_linears(self.net)
        self.embed = embed
        self.head = PackedMatrix(rows, pack=packed)
        context_vocab = not published_draft if config.context_vocab is None else config.context_vocab
        if context_vocab and arch.own_head:
            raise InputError(
                f"strategy.drafter.context_vocab=true needs a draft whose head is a subset of the target's "
                f"output layer; draft '{folder}' has its own output layer: leave context_vocab unset"
            )
        self.columns = ContextVocab(subset, target.vocab_size, head, context_vocab, self.dtype)
        self.block = arch.block if config.block is None else config.block
        self.draft_info = DraftInfo(
            identity=identity, target_layers=tuple(arch.target_layers), tree=config.tree, tokens_per_forward=self.block
        )
        self.sampling = resources.sampling
        self.lookup_bias = lookup_bias_for(not published_draft, config.lookup_bias)
        self.corpus_bias, self.corpus = corpus_prior(
            not published_draft, config.corpus_bias, config.corpus, resources.tokenizer, target.vocab_size, digest
        )
        self.tree = config.tree
        self.budget = (
            None
            if config.tree is None
            else node_budget(
                config.tree, target.device, COST_KIND, digest, folder, self.draft_info.identity, self.block
            )
        )
        self.pacer_start(None)

    def _reset(self) -> None:  # the prompt's states come with step 0's record
        self.context = ContextCache(len(self.net.layers))

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        """Keep the committed rows' target states; they are projected when the drafter next drafts (a
        step the draft gate decodes plainly pays nothing here)."""
        if step.target_hidden is None:
            return
        self.context.crop(step.target_hidden_start)
        if self.context.known == step.target_hidden_start:
            self.context.pending.append(step.target_hidden)

    @torch.inference_mode()
    def _forward(self, committed: list[int], known: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward: the last committed token and ``known`` drafted tokens, then ``block`` mask rows.
        Returns the mask rows' logits over the draft's vocabulary ([block, subset]) and their hidden
        states ([block, hidden])."""
        tokens = committed[-1:] + known
        start = len(committed) - 1
        x = self.net.block_inputs(self.embed[tokens].to(self.dtype)[None], self.block, self.context.latest[None])
        positions = torch.arange(start, start + x.shape[1])
        context = [(k[None], v[None]) for k, v in zip(self.context.keys, self.context.values)]
        hidden = self.net(x, positions, context)[0, len(tokens) :]  # [block, hidden]
        return self.columns.logits(hidden, self.head(hidden)).float().cpu(), hidden

    @torch.inference_mode()
    def _ready(self, committed: list[int]) -> bool:
        """Whether the context holds the target's states of every committed token but the last (at step 0,
        the prefill, there are none yet: it decodes plainly), its pending rows projected first."""
        pending = self.context.take_pending()
        if pending is not None:
            self.net.extend_context(self.context, pending.to(self.embed.device, self.dtype))
        return len(self.context) > 0 and len(self.context) == len(committed) - 1 and self.context.latest is not None


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component(
            "drafter",
            "dflash",
            DFlashConfig,
            DFlashDrafter,
            "block draft (DFlash-style): one forward drafts a whole block from the target's hidden states; a chain "
            "or a tree over the block",
            needs={"target_hidden"},
            provides={"draft_probs", "draft_hidden"},
            draft_folder=lambda config: draft_folder(config.path),
            cost_kind=COST_KIND,
        )
    ]
