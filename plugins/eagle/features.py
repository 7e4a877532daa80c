"""Stage 2 of ``pacer distill``: the target's states of every corpus sequence, cached on disk so no
target forward runs while a student trains; ``target_greedy`` reads the target's greedy next token
back from them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from pacer_core.errors import InputError
from pacer_train import atomic_write_text, interruptible, progress
from pacer_train.distillation import log


def features_name(layers: Optional[Sequence[int]]) -> str:
    """``features`` (the last layer's states) or ``features-layers-A-B-C`` (those layers' inputs)."""
    return "features" if layers is None else "features-layers-" + "-".join(str(i) for i in layers)


def extract_features(
    out: Path, tokens: torch.Tensor, target, batch_size: int = 8, layers: Optional[Sequence[int]] = None
) -> np.memmap:
    """The target's states of every sequence as fp16 on disk: ``layers`` None, its last-layer hidden
    states after the final norm (``features.f16``, [N, L, d]); else the inputs of those decoder layers
    concatenated (``features-layers-A-B-C.f16``, [N, L, len(layers) × d]), what an eagle3 student
    fuses. Resumable: ``<name>.done`` counts finished sequences; Ctrl-C/SIGTERM stops after a batch."""
    return extract_feature_sets(out, tokens, target, [layers], batch_size)[0]


def extract_feature_sets(
    out: Path, tokens: torch.Tensor, target, groups: Sequence[Optional[Sequence[int]]], batch_size: int = 8
) -> list[np.memmap]:
    """``extract_features`` for several ``layers`` groups from one target forward per batch (an eagle3
    run needs the last-layer states and its fused layers' inputs: half the target's work of two passes).
    Each file keeps its own ``.done`` count; a run resumes from the smallest."""
    from pacer_train.students import target_states

    files, done = [], []
    for layers in groups:
        width = target.hidden_size * (1 if layers is None else len(layers))
        shape = (tokens.shape[0], tokens.shape[1], width)
        name = features_name(layers)
        path, done_file = out / f"{name}.f16", out / f"{name}.done"
        expected = int(np.prod(shape)) * 2
        if path.exists() and path.stat().st_size != expected:
            raise InputError(
                f"'{path}' has {path.stat().st_size} bytes, not the {expected} of this corpus's features: "
                f"delete it and {done_file.name} to extract them again"
            )
        count = 0
        if done_file.exists():
            text = done_file.read_text().strip()
            if not text.isdigit() or int(text) > shape[0]:
                raise InputError(
                    f"'{done_file}' does not hold a sequence count: delete it to extract the features again"
                )
            count = int(text)
        files.append((np.memmap(path, dtype=np.float16, mode="r+" if path.exists() else "w+", shape=shape), done_file))
        done.append(count)
    total, label = tokens.shape[0], " + ".join(features_name(layers) for layers in groups)
    with interruptible(log) as stop, progress(total, min(done), label, "seq") as bar:
        for start in range(min(done), total, batch_size):
            if stop:
                log(f"interrupted: {label} of {start}/{total} sequences kept; run the same command to resume")
                raise KeyboardInterrupt
            batch = tokens[start : start + batch_size]
            for (features, done_file), count, states in zip(files, done, target_states(target, batch, groups)):
                if start + len(batch) > count:  # a file already past this batch keeps what it has
                    features[start : start + len(batch)] = states.float().cpu().numpy().astype(np.float16)
                    features.flush()
                    atomic_write_text(done_file, str(start + len(batch)))
            bar.update(len(batch))
    return [features for features, _ in files]


@torch.no_grad()
def target_greedy(feats: torch.Tensor, head_full: torch.Tensor, chunk: int = 4) -> torch.Tensor:
    """The target's greedy next token after every position ([B, L]) from its last-layer states
    [B, L, d] and its output layer, a few sequences at a time (the full-vocabulary logits are large)."""
    return torch.cat([(feats[i : i + chunk] @ head_full.T).argmax(-1) for i in range(0, feats.shape[0], chunk)])
