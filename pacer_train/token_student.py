"""The token-level student of ``pacer distill`` (``student.kind=token``): a small causal LM made of
target decoder layers (``student.layers``), sharing the target's embeddings and tied head, trained
towards the target's next-token distribution over the draft's vocabulary subset, and saved as the
draft folder the ``draft_model`` drafter reads (the shipped one: plugins/pacer_builtins/default).

It lives in the training package, beside the loop it shares with the feature-level students
(distillation.py): the draft it makes is served by the built-in plugins, the command that trains it
is the eagle plugin's ``pacer distill``, and no plugin imports another.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from .distillation import fit
from .loop import count_parameters

TOKEN_CHECKPOINT = "checkpoint-token.pt"  # beside the feature-level students' checkpoint.pt in one run folder


def token_loss(
    student, head_sub: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, dict[str, float]]:
    """Soft cross-entropy (KL up to a constant) from the student's next-token distribution at every
    position to the target's (its logits divided by ``temperature``), both over the draft's vocabulary
    subset; the target's logits come from its cached last hidden states (``feats``), so no target
    forward runs while training."""
    hidden = student.base_model(input_ids=tokens, use_cache=False).last_hidden_state  # [B, L, d], after the norm
    teacher = torch.softmax(feats @ head_sub.T / temperature, -1)
    log_student = torch.log_softmax(hidden @ head_sub.T, -1)
    ce = -(teacher * log_student).sum(-1).mean()
    agree = (log_student.argmax(-1) == teacher.argmax(-1)).float().mean()
    return ce, {"ce": float(ce.detach()), "top1": float(agree)}


@torch.no_grad()
def evaluate_token(
    student, head_full: torch.Tensor, subset: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor
) -> dict[str, float]:
    """Held-out agreement with the target's greedy next token (full vocabulary): the student's
    argmax over its subset at each position (its first draft token), and for two tokens in a row."""
    student.eval()
    hidden = student.base_model(input_ids=tokens, use_cache=False).last_hidden_state
    draft_next = subset[(hidden @ head_full[subset].T).argmax(-1)]
    target_next = (feats @ head_full.T).argmax(-1)
    hit = draft_next == target_next
    student.train()
    return {
        "heldout_top1_first": float(hit.float().mean()),
        "heldout_top1_first_two": float((hit[:, :-1] & hit[:, 1:]).float().mean()),
    }


def train_token(
    cfg,
    out: Path,
    tokens: torch.Tensor,
    features: np.memmap,
    target,
    subset: torch.Tensor,
    deadline: Optional[float] = None,
):
    from pacer_train.students import student_from_target

    layers = [i % target.num_layers for i in cfg.student.layers]
    torch.manual_seed(cfg.seed)
    student = student_from_target(target, layers).train()
    student.get_input_embeddings().weight.requires_grad_(False)  # shared with the target (and the tied head)
    if not student.config.tie_word_embeddings:
        student.get_output_embeddings().weight.requires_grad_(False)
    head_full = target.embedding_weights()[1].float()
    head_sub = head_full[subset]
    held = cfg.corpus.heldout_sequences
    device = next(student.parameters()).device
    held_feats = torch.from_numpy(np.asarray(features[:held], dtype=np.float32)).to(device)

    def measure() -> dict[str, float]:
        return evaluate_token(student, head_full, subset.to(device), tokens[:held].to(device), held_feats)

    training = fit(
        cfg,
        out,
        student,
        tokens,
        features,
        lambda batch_tokens, batch_feats, batch_fused, generator: token_loss(
            student, head_sub, batch_tokens, batch_feats, cfg.train.teacher_temperature
        ),
        checkpoint=TOKEN_CHECKPOINT,
        evaluate_fn=measure,
        deadline=deadline,
    )
    return student, measure(), training


def save_token_draft(
    student,
    folder: Path,
    manifest: dict[str, Any],
    *,
    target_path: Optional[str],
    target_digest: str,
    dtype: str,
    subset: torch.Tensor,
) -> None:
    """The draft folder (replacing one there): the student's own tensors in ``dtype``, the vocabulary
    subset, and ``manifest`` completed with the bytes stored and the trainable parameters."""
    from pacer_train.students import save_student

    if folder.exists():
        shutil.rmtree(folder)
    manifest["stored_bytes"] = save_student(
        student, folder, target_path=target_path, target_digest=target_digest, dtype=dtype, vocab_subset=subset.tolist()
    )
    manifest["parameters"] = count_parameters(student, trainable_only=True)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
