"""The PARD student of ``pacer distill`` (``student.kind=pard``): a token draft fine-tuned with a mask
token so that one forward over ``[context, m, …, m]`` predicts ``student.block`` tokens (PARD, arXiv
2504.18583), served by the ``pard`` drafter.

It starts from a token draft (``init=``; by default the shipped one, plugins/pacer_builtins/default,
whose head covers its own vocabulary subset) and a mask embedding (the mean of the draft's input
embeddings over its subset). A training sequence of L tokens is one forward of L + K·(block − 1)
rows under one attention mask (``pard_layout``): the L real rows causal, as a language model reads
them, then for each of ``train.anchors`` random anchors a the block − 1 mask rows at positions
a+1.., each seeing the real rows 0..a and the mask rows of its own anchor before it. The real row at
a drafts position 1 of the block after a (the token at a+1), mask row j the token at a+1+j.

The loss is the soft cross-entropy to the target's distribution at each predicted token (over the
draft's vocabulary subset, from the target's cached last-layer states; ``train.teacher_temperature``
as for the other students): position 1 over every real row, position j+1 over the anchors' mask
rows j, weighed by ``train.unroll_decay`` ** j (acceptance is a prefix property: early positions
matter more). Registered through the ``pacer_sd.students`` entry-point group (``STUDENT``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import attrs
import numpy as np
import torch
from torch import nn

from pacer_core.errors import InputError
from pacer_train.distillation import fit
from pacer_train.students import StudentKind

from .pard_export import export_pard
from .pard_files import MAX_BLOCK, PARD_CONFIG, save_pard_files

CHECKPOINT = "checkpoint-pard.pt"  # beside the other students' checkpoints in one run folder


class PardStudent(nn.Module):
    """A token draft (a transformers causal LM sharing the target's embeddings and tied head), its
    mask embedding and its vocabulary subset (the head's rows it predicts over)."""

    def __init__(self, lm, mask_embedding: torch.Tensor, subset: torch.Tensor, block: int):
        super().__init__()
        self.lm = lm
        self.mask_embedding = nn.Parameter(mask_embedding.detach().float().clone())
        self.register_buffer("subset", subset.clone())
        self.block = block


@attrs.frozen
class PardLayout:
    """Where the rows of one packed training sequence sit (the same for every sequence of a batch)."""

    positions: torch.Tensor  # [N] each row's position: the L real rows, then the mask rows
    mask: torch.Tensor  # [N, N] bool: the rows each row sees
    block_rows: torch.Tensor  # [K, block] each anchor's rows: its real row a, then its mask rows
    predicts: torch.Tensor  # [K, block] the position each of them predicts (teacher state: predicts − 1)


def pard_layout(anchors: list[int], block: int, length: int) -> PardLayout:
    """The packed rows for ``anchors`` (each in 0..length − block) in a sequence of ``length`` tokens.

    Example: anchors [2], block 3, length 5 → rows t0..t4 at positions 0..4, then m@3 m@4; the masks
    see t0..t2 and the masks before them; the block's rows [2, 5, 6] predict positions [3, 4, 5]."""
    masks = block - 1
    n = length + len(anchors) * masks
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[:length, :length] = torch.ones(length, length, dtype=torch.bool).tril()
    own = torch.ones(masks, masks, dtype=torch.bool).tril()
    positions = list(range(length))
    for k, a in enumerate(anchors):
        first = length + k * masks
        mask[first : first + masks, : a + 1] = True
        mask[first : first + masks, first : first + masks] = own
        positions += range(a + 1, a + block)
    starts = length + torch.arange(len(anchors))[:, None] * masks  # [K, 1]
    block_rows = torch.cat([torch.tensor(anchors)[:, None], starts + torch.arange(masks)[None]], 1)
    predicts = torch.tensor(anchors)[:, None] + 1 + torch.arange(block)[None]
    return PardLayout(torch.tensor(positions), mask, block_rows, predicts)


def draw_anchors(generator: torch.Generator, count: int, block: int, length: int) -> list[int]:
    """``count`` distinct anchors in 0..length − block (fewer when the sequence is short), sorted."""
    last = length - block + 1
    return sorted(torch.randperm(last, generator=generator)[: min(count, last)].tolist())


def pard_hidden(net: PardStudent, tokens: torch.Tensor, layout: PardLayout) -> torch.Tensor:
    """The draft's last-layer states (after its final norm) of every row of ``layout`` for sequences
    ``tokens`` [B, L] → [B, N, d]: one forward, the mask rows fed the mask embedding."""
    b, length = tokens.shape
    embeds = net.lm.get_input_embeddings()(tokens)  # [B, L, d]
    rows = len(layout.positions) - length
    x = torch.cat([embeds, net.mask_embedding.to(embeds.dtype).expand(b, rows, -1)], 1)
    allowed = layout.mask.to(x.device)
    additive = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
    additive.masked_fill_(~allowed, torch.finfo(x.dtype).min)
    out = net.lm.base_model(
        inputs_embeds=x,
        attention_mask=additive[None, None].expand(b, 1, -1, -1),
        position_ids=layout.positions.to(x.device)[None].expand(b, -1),
        use_cache=False,
    )
    return out.last_hidden_state


def pard_loss(
    net: PardStudent,
    head_sub: torch.Tensor,
    tokens: torch.Tensor,
    feats: torch.Tensor,
    layout: PardLayout,
    decay: float,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The weighed soft cross-entropy of a batch (tokens [B, L], feats [B, L, d] the target's last-layer
    states): position 1 over every real row, position j+1 over the mask rows j of every anchor."""
    length = tokens.shape[1]
    hidden = pard_hidden(net, tokens, layout)  # [B, N, d]
    teacher_logits = feats @ head_sub.T / temperature  # [B, L, subset]: the target at each position
    student_real = torch.log_softmax(hidden[:, :length] @ head_sub.T, -1)
    teacher_real = torch.softmax(teacher_logits, -1)
    first = -(teacher_real * student_real).sum(-1).mean()
    masks = layout.block_rows[:, 1:].to(hidden.device)  # [K, block − 1]
    student_masks = torch.log_softmax(hidden[:, masks] @ head_sub.T, -1)  # [B, K, block − 1, subset]
    teacher_masks = torch.softmax(teacher_logits[:, (layout.predicts[:, 1:] - 1).to(hidden.device)], -1)
    later = -(teacher_masks * student_masks).sum(-1).mean((0, 1))  # [block − 1]
    ce = torch.cat([first[None], later])
    weights = decay ** torch.arange(len(ce), dtype=ce.dtype, device=ce.device)
    loss = (ce * weights).sum() / weights.sum()
    hits = (student_masks.argmax(-1) == teacher_masks.argmax(-1)).float().mean((0, 1))
    top1 = float((student_real.argmax(-1) == teacher_real.argmax(-1)).float().mean())
    return loss, {"ce": float(ce.detach().mean()), "top1": top1, "top1_last": float(hits[-1])}


@torch.no_grad()
def evaluate_pard(
    net: PardStudent,
    head_full: torch.Tensor,
    tokens: torch.Tensor,
    target_next: torch.Tensor,
    stride: int = 4,
    chunk: int = 4,
) -> dict[str, object]:
    """Held-out agreement of each block position's argmax (over the draft's subset) with the target's
    greedy token there (``target_next`` [B, L]: the greedy token after each position), for a block at
    every ``stride``-th anchor; and the mean number of leading positions that agree (what a greedy
    chain of one block would have accepted, were the text the target's)."""
    was_training = net.training
    net.eval()
    block, length = net.block, tokens.shape[1]
    layout = pard_layout(list(range(0, length - block + 1, stride)), block, length)
    head_sub = head_full[net.subset]
    rows = layout.block_rows.to(tokens.device)
    hits = []
    for i in range(0, tokens.shape[0], chunk):
        hidden = pard_hidden(net, tokens[i : i + chunk], layout)[:, rows]  # [b, K, block, d]
        drafted = net.subset[(hidden @ head_sub.T).argmax(-1)]
        hits.append(drafted == target_next[i : i + chunk][:, (layout.predicts - 1).to(tokens.device)])
    net.train(was_training)
    hit = torch.cat(hits)  # [B, K, block]
    agreement = hit.float().mean((0, 1))
    return {
        "heldout_top1_first": float(agreement[0]),
        "heldout_top1_second": float(agreement[1]),
        "heldout_top1_first_two": float(hit[..., :2].all(-1).float().mean()),
        "heldout_position_agreement": [round(float(a), 4) for a in agreement],
        "heldout_block_accepted": float(hit.int().cumprod(-1).sum(-1).float().mean()),
    }


def init_student(cfg, target, subset: torch.Tensor) -> tuple[PardStudent, str]:
    """The student at its start: the token draft ``init=`` names (default: the shipped one) on the
    target's device, its vocabulary subset (else distill's ``subset``), a mask embedding at the mean
    of its input embeddings over that subset. Returns (student, the init folder)."""
    from pacer_core.draft_model_helpers import shipped_draft
    from pacer_core.hf import load_model

    folder = cfg.init or shipped_draft()
    if folder is None:
        raise InputError(
            "student.kind=pard starts from a token draft: give init=FOLDER (one `pacer distill "
            "student.kind=token` wrote)"
        )
    draft, _, _ = load_model(str(folder), "float32", str(target.device), None, "pard init", pack_weights=False)
    if draft.vocab_size != target.vocab_size or draft.hidden_size != target.hidden_size:
        raise InputError(
            f"init '{folder}' does not fit this target (vocabulary or hidden size differ): give a token "
            "draft of this target (`pacer distill student.kind=token`)"
        )
    lm = draft.model.float().train()
    embed = lm.get_input_embeddings().weight
    embed.requires_grad_(False)  # shared with the target (and the tied head): not stored, not trained
    if not lm.config.tie_word_embeddings:
        lm.get_output_embeddings().weight.requires_grad_(False)
    own = draft.vocab_subset if draft.vocab_subset is not None else subset
    own = own.to(embed.device)
    return PardStudent(lm, embed[own].mean(0), own, cfg.student.block), _recorded(folder)


def _recorded(folder) -> str:
    """The init folder as the manifest records it: relative to the working folder when inside it (a
    shipped draft's record then names no machine's paths), else as given."""
    path = Path(folder)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def train_pard(
    cfg,
    out: Path,
    tokens: torch.Tensor,
    features: np.memmap,
    target,
    subset: torch.Tensor,
    fused: Optional[np.memmap] = None,
    layers=(),
    deadline: Optional[float] = None,
):
    """Fine-tune a token draft into a PARD draft on the run's corpus (resuming from
    ``checkpoint-pard.pt``)."""
    t = cfg.train
    torch.manual_seed(cfg.seed)
    net, init = init_student(cfg, target, subset)
    head_full = target.embedding_weights()[1].float()
    head_sub = head_full[net.subset]
    held = cfg.corpus.heldout_sequences
    device = head_full.device
    held_tokens = tokens[:held].to(device)
    held_next = (torch.from_numpy(np.asarray(features[:held], dtype=np.float32)).to(device) @ head_full.T).argmax(-1)

    def measure() -> dict[str, object]:
        return evaluate_pard(net, head_full, held_tokens, held_next)

    def loss(batch_tokens, batch_feats, batch_fused, generator):
        layout = pard_layout(
            draw_anchors(generator, t.anchors, net.block, batch_tokens.shape[1]), net.block, batch_tokens.shape[1]
        )
        return pard_loss(net, head_sub, batch_tokens, batch_feats, layout, t.unroll_decay, t.teacher_temperature)

    before = measure()
    training = fit(
        cfg,
        out,
        net,
        tokens,
        features,
        loss,
        checkpoint=CHECKPOINT,
        evaluate_fn=measure,
        deadline=deadline,
        start={"init": init, "tokens_before": 0, "points": [{"tokens": 0, "step": 0, **before}]},
    )
    training["heldout_at_init"] = before
    return net, measure(), training


def save_pard(net: PardStudent, folder: Path, manifest: dict) -> None:
    """The draft folder: the token draft's own tensors (``save_token_draft``: its layers and norm, the
    vocabulary subset, what it shares with the target named), then the mask embedding and block."""
    import json

    from pacer_train.token_student import save_token_draft

    recipe = manifest.get("recipe") or {}
    save_token_draft(
        net.lm,
        folder,
        manifest,
        target_path=(recipe.get("target") or {}).get("path"),
        target_digest=manifest.get("target_digest"),
        dtype=(recipe.get("student") or {}).get("dtype", "bfloat16"),
        subset=net.subset.cpu(),
    )
    save_pard_files(folder, net.mask_embedding, net.block)
    manifest["parameters"] += net.mask_embedding.numel()
    manifest["stored_bytes"] += (folder / "pard.safetensors").stat().st_size
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))


def check_options(cfg) -> None:
    if not 2 <= cfg.student.block <= MAX_BLOCK:
        raise ValueError(
            f"student.block={cfg.student.block}: a pard draft fills 2..{MAX_BLOCK} positions a forward "
            "(its last token's row and block - 1 mask rows)"
        )


def describe(cfg, layers, subset: torch.Tensor) -> str:
    return (
        f"pard (parallel token draft: a token draft fine-tuned with a mask token, {cfg.student.block} positions "
        f"per forward, target embeddings and tied head shared, head over its {len(subset)}-token subset)"
    )


STUDENT = StudentKind(
    name="pard",
    train=train_pard,
    describe=describe,
    save=save_pard,
    checkpoint=CHECKPOINT,
    default_layers=lambda target: (),
    fuses=False,
    takes_init=True,
    export=export_pard,
    family_file=PARD_CONFIG,
    check=check_options,
)
