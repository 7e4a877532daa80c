"""The block student of ``pacer distill`` (``student.kind=dflash``): a ``BlockDraft`` trained on the
target's cached states to fill a block of mask rows after random anchors.

A training sequence packs ``train.anchors`` blocks. The block at anchor a reads the context features
of positions 0..a−1 (what the drafter has when token a is the last committed one), then the rows of
tokens a..a+c (c ``known`` tokens drafted before it: 0 for a step's first block, ``student.block``
for a further block, one batch in four at random) and ``student.block`` mask rows. Mask row i predicts token
a+c+i; its loss is the soft cross-entropy to the target's distribution there (over the draft's
vocabulary subset, from the target's cached last-layer states), weighed by
``train.unroll_decay`` ** (i − 1): acceptance is a prefix property, so early rows matter more.
One attention mask keeps the blocks of a sequence apart (``block_layout``).

Registered through the ``pacer_sd.students`` entry-point group (``STUDENT``), so ``pacer distill``
(the eagle plugin's command) trains it without importing this plugin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import attrs
import numpy as np
import torch

from pacer_train.distillation import fit, log
from pacer_train.students import StudentKind

from .export import export_block_draft
from .model import BlockArch, BlockDraft, save_block_draft

CHECKPOINT = "checkpoint-dflash.pt"  # beside the other students' checkpoints in one run folder
CONTINUE_EVERY = 4  # one batch in this many trains a further block (known = student.block)


@attrs.frozen
class BlockLayout:
    """Where the rows of ``len(anchors)`` packed blocks sit (the same for every sequence of a batch)."""

    tokens: torch.Tensor  # [K · R] the token index of each known row, -1 for a mask row
    positions: torch.Tensor  # [K · R] each row's position
    mask: torch.Tensor  # [K · R, L + K · R] bool: the context rows and the block rows each row sees
    predicts: torch.Tensor  # [K, block] the position each mask row predicts (teacher state: predicts − 1)
    mask_rows: torch.Tensor  # [K, block] the row index of each mask row
    latest: torch.Tensor  # [K · R] the context position whose feature each row joins (its anchor − 1)


def block_layout(anchors: list[int], known: int, block: int, length: int) -> BlockLayout:
    """The packed blocks for ``anchors`` in a sequence of ``length`` tokens, each with ``known`` drafted
    tokens before ``block`` mask rows (anchor a: rows a..a+known, then masks predicting
    a+known+1..a+known+block; every anchor satisfies 1 <= a <= length − known − block).

    Example: anchors [3], known 1, block 2 → row tokens [3, 4, -1, -1] at positions [3, 4, 5, 6];
    they see context rows 0..2 and each other; the masks predict positions 5 and 6."""
    rows = known + 1 + block
    tokens, positions = [], []
    mask = torch.zeros(len(anchors) * rows, length + len(anchors) * rows, dtype=torch.bool)
    for k, a in enumerate(anchors):
        tokens += list(range(a, a + known + 1)) + [-1] * block
        positions += list(range(a, a + rows))
        mask[k * rows : (k + 1) * rows, :a] = True
        mask[k * rows : (k + 1) * rows, length + k * rows : length + (k + 1) * rows] = True
    first = torch.tensor(anchors)[:, None] + known + 1  # [K, 1]
    predicts = first + torch.arange(block)[None]
    mask_rows = torch.arange(len(anchors))[:, None] * rows + known + 1 + torch.arange(block)[None]
    latest = torch.tensor(anchors).repeat_interleave(rows) - 1
    return BlockLayout(torch.tensor(tokens), torch.tensor(positions), mask, predicts, mask_rows, latest)


def block_outputs(
    net: BlockDraft, embed: torch.Tensor, tokens: torch.Tensor, fused: torch.Tensor, layout: BlockLayout
) -> torch.Tensor:
    """The mask rows' outputs [B, K, block, d] for sequences ``tokens`` [B, L] whose target layers'
    inputs are ``fused`` [B, L, n·d]."""
    b, length = tokens.shape
    features = net.context_features(fused)  # [B, L, d]
    context_positions = torch.arange(length)
    context = [net.context_kv(layer, features, context_positions) for layer in net.layers]
    known = layout.tokens >= 0
    ids = tokens[:, layout.tokens.clamp_min(0).to(tokens.device)]  # [B, K·R]
    rows = torch.where(
        known.to(tokens.device)[None, :, None],
        embed[ids],
        net.mask_embedding.to(embed.dtype).expand(b, len(layout.tokens), -1),
    )
    x = net.join(rows, features[:, layout.latest.to(features.device)])  # each row with its anchor's latest feature
    out = net(x, layout.positions, context, layout.mask)  # [B, K·R, d]
    return out[:, layout.mask_rows.to(out.device)]  # [B, K, block, d]


def draw_anchors(generator: torch.Generator, count: int, known: int, block: int, length: int) -> list[int]:
    """``count`` distinct anchors in 1..length − known − block (fewer when the sequence is short), sorted."""
    last = length - known - block
    count = min(count, last)
    return sorted((torch.randperm(last, generator=generator)[:count] + 1).tolist())


def block_loss(
    net: BlockDraft,
    embed: torch.Tensor,
    head_sub: torch.Tensor,
    tokens: torch.Tensor,
    feats: torch.Tensor,
    fused: torch.Tensor,
    layout: BlockLayout,
    decay: float,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The weighed soft cross-entropy of a batch (tokens [B, L], feats [B, L, d] the target's last-layer
    states, fused [B, L, n·d]) over the blocks of ``layout``."""
    out = block_outputs(net, embed, tokens, fused, layout)  # [B, K, block, d]
    student = torch.log_softmax(out @ head_sub.T, -1)  # [B, K, block, subset]
    teacher = torch.softmax(feats[:, (layout.predicts - 1).to(feats.device)] @ head_sub.T / temperature, -1)
    ce = -(teacher * student).sum(-1)  # [B, K, block]
    weights = decay ** torch.arange(ce.shape[-1], dtype=ce.dtype, device=ce.device)
    loss = (ce * weights).sum(-1).mean() / weights.sum()
    hits = (student.argmax(-1) == teacher.argmax(-1)).float().mean((0, 1))  # [block]
    return loss, {"ce": float(ce.detach().mean()), "top1": float(hits[0]), "top1_last": float(hits[-1])}


@torch.no_grad()
def evaluate_blocks(
    net: BlockDraft,
    embed: torch.Tensor,
    head_full: torch.Tensor,
    tokens: torch.Tensor,
    fused: torch.Tensor,
    target_next: torch.Tensor,
    stride: int = 4,
    chunk: int = 4,
) -> dict[str, object]:
    """Held-out agreement of each mask row's argmax (over the draft's subset) with the target's greedy
    token there (``target_next`` [B, L]: the greedy token after each position), for a step's first
    block at every ``stride``-th anchor; and the mean number of leading rows that agree (the tokens a
    greedy chain of one block would have accepted, were the text the target's)."""
    net.eval()
    block, length = net.arch.block, tokens.shape[1]
    layout = block_layout(list(range(1, length - block + 1, stride)), 0, block, length)
    subset = net.subset
    head_sub = head_full[subset]
    hits = []
    for i in range(0, tokens.shape[0], chunk):
        rows = slice(i, i + chunk)
        out = block_outputs(net, embed, tokens[rows], fused[rows], layout)
        drafted = subset[(out @ head_sub.T).argmax(-1)]  # [b, K, block]
        hits.append(drafted == target_next[rows][:, (layout.predicts - 1).to(tokens.device)])
    net.train()
    hit = torch.cat(hits)  # [B, K, block]
    agreement = hit.float().mean((0, 1))
    leading = hit.int().cumprod(-1).sum(-1).float().mean()
    return {
        "heldout_top1_first": float(agreement[0]),
        "heldout_top1_second": float(agreement[1]) if block > 1 else float("nan"),
        "heldout_top1_first_two": float(hit[..., :2].all(-1).float().mean()),
        "heldout_position_agreement": [round(float(a), 4) for a in agreement],
        "heldout_block_accepted": float(leading),
    }


def build_block_student(cfg, target, subset: torch.Tensor, layers: list[int]) -> BlockDraft:
    """A fresh ``BlockDraft`` for ``target`` reading the inputs of ``layers``."""
    shape = attrs.asdict(target.attention_shape())
    torch.manual_seed(cfg.seed)
    net = BlockDraft(
        BlockArch(
            hidden_size=target.hidden_size,
            intermediate_size=cfg.student.intermediate_size,
            vocab_size=target.vocab_size,
            subset_size=len(subset),
            target_layers=list(layers),
            num_layers=cfg.student.draft_layers,
            block=cfg.student.block,
            inject=not cfg.student.published,
            qk_norm=cfg.student.published,
            **shape,
        )
    )
    net.subset.copy_(subset)
    return net


def start_from(net: BlockDraft, folder: str) -> dict[str, object]:
    """``init=``: the dflash draft folder ``folder`` starts ``net``. Every tensor of the same name and
    shape is copied; the others keep their fresh start (a draft in our architecture starting one in the
    published architecture: ``inject`` is dropped, the q/k norms start at one). The target layers must
    be the same; the vocabulary subset is this run's (a draft continued on a broader corpus predicts
    over the subset that corpus gives: no weight of a student depends on it). Returns the run's start
    (``fit``'s ``start``)."""
    from pacer_core.errors import InputError

    from .model import load_block_draft

    draft = load_block_draft(Path(folder).expanduser())
    if list(draft.arch.target_layers) != list(net.arch.target_layers):
        raise InputError(
            f"init '{folder}' fuses target layers {draft.arch.target_layers}, this run's student "
            f"{net.arch.target_layers}: set student.fused_layers={draft.arch.target_layers}"
        )
    if not torch.equal(draft.subset.cpu(), net.subset.cpu()):
        # a student's layers read no subset (its rows of the target's output layer are chosen after
        # them), so a draft continues on another corpus over the subset that corpus gives
        shared = len(set(draft.subset.tolist()) & set(net.subset.tolist()))
        log(f"init {folder}: this run's corpus gives another vocabulary subset ({shared} of {len(net.subset)} shared)")
    theirs, ours = draft.state_dict(), net.state_dict()
    theirs.pop("subset", None)
    copied = sorted(k for k, v in theirs.items() if k in ours and ours[k].shape == v.shape)
    net.load_state_dict({**ours, **{k: theirs[k].to(ours[k].dtype) for k in copied}})
    fresh = sorted(set(ours) - set(copied) - {"subset"})
    log(f"init {folder}: {len(copied)} tensors copied, {len(fresh)} start fresh {fresh[:6]}")
    return {"init": str(folder), "tokens_before": 0, "points": [], "init_fresh_tensors": fresh}


def train_block(
    cfg,
    out: Path,
    tokens: torch.Tensor,
    features: np.memmap,
    target,
    subset: torch.Tensor,
    fused: Optional[np.memmap] = None,
    layers: Sequence[int] = (),
    deadline: Optional[float] = None,
):
    """Train a ``BlockDraft`` reading the inputs of target ``layers`` (those ``fused`` holds, as distill
    chose and checked them) on the run's corpus (resuming from ``checkpoint-dflash.pt``)."""
    from pacer_core.errors import InputError

    if fused is None or not layers:
        raise InputError("the dflash student reads target layers' inputs: the run has none (a bug in distill)")
    t, s = cfg.train, cfg.student
    embed_w, head_w = target.embedding_weights()
    embed, head_full = embed_w.float(), head_w.float()
    net = build_block_student(cfg, target, subset, list(layers)).to(embed.device)
    start = start_from(net, cfg.init) if cfg.init else None
    held = cfg.corpus.heldout_sequences

    def as_tensor(source) -> torch.Tensor:
        return torch.from_numpy(np.asarray(source[:held], dtype=np.float32)).to(embed.device)

    held_tokens, held_fused = tokens[:held].to(embed.device), as_tensor(fused)
    held_next = (as_tensor(features) @ head_full.T).argmax(-1)

    def measure() -> dict[str, object]:
        return evaluate_blocks(net, embed, head_full, held_tokens, held_fused, held_next)

    def loss(batch_tokens, batch_feats, batch_fused, generator):
        further = int(torch.randint(CONTINUE_EVERY, (1,), generator=generator)) == 0  # a resumed run draws alike
        known = s.block if further else 0
        anchors = draw_anchors(generator, t.anchors, known, s.block, batch_tokens.shape[1])
        layout = block_layout(anchors, known, s.block, batch_tokens.shape[1])
        return block_loss(
            net,
            embed,
            head_full[net.subset],
            batch_tokens,
            batch_feats,
            batch_fused,
            layout,
            t.unroll_decay,
            t.teacher_temperature,
        )

    training = fit(
        cfg,
        out,
        net,
        tokens,
        features,
        loss,
        checkpoint=CHECKPOINT,
        fused=fused,
        evaluate_fn=measure,
        start=start,
        deadline=deadline,
    )
    return net, measure(), training


def target_layers_default(target) -> tuple[int, ...]:
    """The target layers a block student fuses by default: EAGLE-3's low, middle and high (2, L // 2,
    L − 3), the inputs ``pacer distill`` extracts once for both kinds."""
    n = target.num_layers
    return (2, n // 2, n - 3)


def describe(cfg, layers: list[int], subset: torch.Tensor) -> str:
    rows = (
        "each row its embedding alone, per-head q/k norms: the published architecture"
        if cfg.student.published
        else "each row joined with the newest context feature"
    )
    return (
        f"dflash (block draft: fc over the inputs of target layers {layers}, {cfg.student.draft_layers} decoder "
        f"layers attending to the context as keys and values, {cfg.student.block} mask rows per forward ({rows}), "
        f"target embeddings and head over {len(subset)} frequent tokens shared)"
    )


STUDENT = StudentKind(
    name="dflash",
    train=train_block,
    describe=describe,
    save=save_block_draft,
    checkpoint=CHECKPOINT,
    default_layers=target_layers_default,
    export=export_block_draft,
    takes_init=True,
)
