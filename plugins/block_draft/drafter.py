"""The ``dflash`` drafter: a block draft (model.py) proposes a whole block in one forward.

Chains: one forward fills ``block`` mask rows after the last committed token; their tokens are
handed to the stop policies as they ask (``fixed(4)`` takes four at once, a policy judging each
token takes one per call, with no new forward until the block is used up); once it is, a further
block is one more forward, conditioned on the tokens drafted so far in the step (PACER's "draft
more"). Under greedy decoding each token is its row's argmax; under sampling it is drawn from its
row, rows independently (each row is a draft distribution like any other: the verifiers stay
exact).

Trees (``tree: {...}``): the block's rows are read as independent distributions of the tokens at
depths 1..block, and the nodes of highest joint probability are taken best-first
(``pacer_core.trees.block_tree``: DDTree's construction), then sent by ``tree.nodes`` (a number or
``auto``). A tree is one forward: it does not grow past the block.

The draft's context keys and values come from the target's states of committed tokens only, so
nothing the drafter keeps is ever rolled back; a rejected block is simply dropped.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

import attrs
import torch

from pacer_core import Component, DraftBlock, DraftInfo, DraftVocab, InputError, Resources, hookimpl
from pacer_core.jsonfile import read_json
from pacer_core.kernels import PackedMatrix, pack_linears
from pacer_core.protocols import feature_target
from pacer_core.sampling import argmax_first, logits_to_probs, sample
from pacer_core.trees import BlockTree, TreeConfig, block_tree, node_budget

from .model import MANIFEST, WEIGHTS, BlockDraft, ContextCache, load_block_draft

DEFAULT_DRAFT = Path(__file__).parent / "default"


@attrs.define
class DFlashConfig:
    path: Optional[str] = None  # a folder `pacer distill student.kind=dflash` wrote; None = the shipped draft
    allow_other_target: bool = False  # experts: use a draft distilled from another target
    # mask rows one forward fills (tokens drafted per forward); None = the block the draft was trained on
    block: Optional[int] = attrs.field(default=None, validator=attrs.validators.optional(
        [attrs.validators.ge(1), attrs.validators.le(32)]))
    tree: Optional[TreeConfig] = None  # a tree over one block ({topk, depth, nodes}); None = a chain


def draft_folder(path: Optional[str]) -> Path:
    folder = DEFAULT_DRAFT if path is None else Path(path).expanduser()
    if not (folder / MANIFEST).is_file() or not (folder / WEIGHTS).is_file():
        hint = "the shipped draft is missing: reinstall" if path is None else \
            "make one with `pacer distill student.kind=dflash`"
        raise InputError(f"'{folder}' is not a dflash draft folder (no {MANIFEST} and {WEIGHTS}): {hint}")
    return folder


@attrs.define
class _Block:
    """The latest block of the step's main path: where it starts (the committed length and the
    drafted tokens it was conditioned on), its tokens, rows and hidden states, and how many were
    handed out."""

    committed: int
    known: list[int]
    tokens: list[int]
    rows: torch.Tensor  # [block, draft vocabulary]
    hidden: torch.Tensor  # [block, hidden]
    handed: int = 0


class DFlashDrafter:
    """Drafts a block of tokens per forward from the target's states at the committed context."""

    def __init__(self, config: DFlashConfig, resources: Resources):
        folder = draft_folder(config.path)
        target = feature_target(resources.target, "dflash")
        manifest = read_json(folder / MANIFEST, "draft manifest", "distill the draft again")
        digest = target.digest
        if digest and manifest.get("target_digest") != digest and not config.allow_other_target:
            raise InputError(f"draft '{folder}' was distilled from target {manifest.get('target_digest')}, but this "
                             f"target is {digest}: distill a draft for it (`pacer distill student.kind=dflash`) or "
                             "set strategy.drafter.allow_other_target=true")
        net = load_block_draft(folder)
        arch = net.arch
        if arch.vocab_size != target.vocab_size or arch.hidden_size != target.hidden_size:
            raise InputError(f"draft '{folder}' does not fit this target (vocabulary or hidden size differ)")
        embed, head = target.embedding_weights()
        device = embed.device
        self.dtype = torch.float32 if device.type == "cpu" else embed.dtype  # as the eagle drafter
        self.net: BlockDraft = net.to(device=device, dtype=self.dtype).requires_grad_(False)
        packed = bool(target.packed_weights) and device.type == "cpu"
        if packed:
            pack_linears(self.net)
        self.embed = embed
        subset = self.net.subset.cpu()
        self.head = PackedMatrix(head[subset.to(device)].to(self.dtype), pack=packed)  # x @ [subset, hidden].T
        self.draft_vocab = DraftVocab(subset, target.vocab_size)
        self.block = arch.block if config.block is None else config.block
        weights = hashlib.sha256((folder / WEIGHTS).read_bytes()).hexdigest()[:16]
        self.draft_info = DraftInfo(identity=f"dflash:{manifest.get('target_digest')}:{weights}",
                                    target_layers=tuple(arch.target_layers))
        self.sampling = resources.sampling
        self.tree = config.tree
        self.draft_folder = folder
        self.budget = None if config.tree is None else node_budget(config.tree, target.device, "block", digest,
                                                                   folder, self.draft_info.identity)
        self.pacer_start(None)

    @hookimpl
    def pacer_start(self, state) -> None:  # the prompt's states come with step 0's record
        if self.budget is not None and state is not None and not state.sampling.greedy:
            self.budget.restart()  # auto's learned rate carries across greedy generations only
        self.context = ContextCache(len(self.net.layers))
        self.latest: Optional[_Block] = None  # a chain's latest block
        self.plan: Optional[BlockTree] = None  # a tree's nodes, handed out level by level
        self.plan_for = (0, 0)  # (committed tokens, draft nodes) the plan's next levels continue

    @hookimpl
    @torch.inference_mode()
    def pacer_observe_step(self, state, step) -> None:
        if step.target_hidden is None:
            return
        self.context.crop(step.target_hidden_start)
        if len(self.context) == step.target_hidden_start:
            self.net.extend_context(self.context, step.target_hidden.to(self.embed.device, self.dtype))

    @torch.inference_mode()
    def _forward(self, committed: list[int], known: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward: the last committed token and ``known`` drafted tokens, then ``block`` mask rows.
        Returns the mask rows' draft distributions over the draft's vocabulary ([block, subset],
        sampling parameters applied) and their hidden states ([block, hidden])."""
        tokens = committed[-1:] + known
        start = len(committed) - 1
        x = self.net.block_inputs(self.embed[tokens].to(self.dtype)[None], self.block, self.context.latest[None])
        positions = torch.arange(start, start + x.shape[1])
        context = [(k[None], v[None]) for k, v in zip(self.context.keys, self.context.values)]
        hidden = self.net(x, positions, context)[0, len(tokens):]  # [block, hidden]
        logits = self.head(hidden).float().cpu()
        rows = torch.softmax(logits, -1) if self.sampling.greedy else logits_to_probs(logits, self.sampling)
        return rows, hidden

    def _ready(self, committed: list[int]) -> bool:
        """Whether the context holds the target's states of every committed token but the last."""
        return len(self.context) > 0 and len(self.context) == len(committed) - 1 and self.context.latest is not None

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        if not self._ready(state.tokens):
            return None  # step 0 (the prefill): no target state yet, it decodes plainly
        if self.tree is not None:
            return self._propose_tree(state, draft, num_tokens)
        main = draft.tokens.tolist()
        latest, forwards = self.latest, 0
        if (latest is None or latest.committed != len(state.tokens) or latest.handed >= len(latest.tokens)
                or main != latest.known + latest.tokens[:latest.handed]):
            rows, hidden = self._forward(state.tokens, main)
            if self.sampling.greedy:
                tokens = [int(self.draft_vocab.ids[argmax_first(row)]) for row in rows]
            else:
                tokens = self.draft_vocab.ids[sample(rows, state.generator)].tolist()
            latest = self.latest = _Block(len(state.tokens), main, tokens, rows, hidden)
            forwards = 1
        first = latest.handed
        last = min(len(latest.tokens), first + num_tokens)
        for i in range(first, last):  # nothing is drafted past an end-of-sequence token
            if latest.tokens[i] in state.eos_token_ids:
                last = i + 1
                break
        latest.handed = last
        return DraftBlock(tokens=torch.tensor(latest.tokens[first:last], dtype=torch.long),
                          draft_probs=latest.rows[first:last], hidden_states=latest.hidden[first:last],
                          forwards=forwards, sampled=not self.sampling.greedy, draft_vocab=self.draft_vocab)

    def _propose_tree(self, state, draft, num_tokens: int) -> Optional[DraftBlock]:
        """The next ``num_tokens`` levels of this step's tree over one block: the first call runs the
        forward and takes the tree's likeliest nodes (``block_tree``), later calls hand out deeper
        levels of the same tree (no forward); a policy judging each token gets one level a call."""
        plan = self.plan
        if draft.num_nodes == 0:
            rows, hidden = self._forward(state.tokens, [])
            depth = min(self.tree.depth, len(rows))
            cap = self.tree.nodes if isinstance(self.tree.nodes, int) else self.tree.topk * depth
            plan = self.plan = block_tree(rows[:depth], hidden[:depth], self.tree.topk, cap, self.draft_vocab,
                                          state.eos_token_ids)
            self.plan_for = (len(state.tokens), 0)
            forwards = 1
        elif plan is None or self.plan_for != (len(state.tokens), draft.num_nodes):
            return None  # another drafter's block came last: this tree stops growing
        else:
            forwards = 0
        block = None if plan is None else plan.next_levels(num_tokens, draft.num_nodes, forwards)
        if block is not None:
            self.plan_for = (len(state.tokens), draft.num_nodes + len(block) + (len(block.side) if block.side else 0))
        return block

    @hookimpl
    def pacer_select_nodes(self, draft) -> Optional[list[int]]:
        """A tree sends its best ``tree.nodes`` nodes, or with ``nodes: auto`` the nodes worth their
        verification cost (``pacer_core.trees.NodeBudget``)."""
        return None if self.budget is None else self.budget.select(draft.tree)


@hookimpl
def pacer_components() -> list[Component]:
    return [Component(
        "drafter", "dflash", DFlashConfig, DFlashDrafter,
        "block draft (DFlash-style): one forward drafts a whole block from the target's hidden states; a chain "
        "or a tree over the block",
        needs={"target_hidden"}, provides={"draft_probs", "draft_hidden"},
    )]
