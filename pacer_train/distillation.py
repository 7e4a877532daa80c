"""Distilling a student from the target's cached states: what every student kind of ``pacer distill``
shares — the feature-level drafts (plugins/eagle/students.py) and the token-level draft
(token_student.py). ``cfg`` is the distill config: its ``train`` section, ``corpus.heldout_sequences``
and ``seed``.

- ``batch_ids``: the training sequences of a step (epoch-seeded permutations), so a resumed run
  draws the batches an uninterrupted one would;
- ``fit``: AdamW with warm-up and cosine decay to ``LR_FLOOR`` × ``train.lr`` on ``TrainingRun``
  (checkpoints, Ctrl-C, resume, a time budget), the held-out agreement at every checkpoint;
- the scaling curve (``scaling.json``, + ``scaling.png`` with matplotlib): tokens seen → held-out
  agreement, the ``init`` weights' points first;
- ``init_sources``/``with_init_sources``: the ``corpus_sources`` record of the weights a run continued.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from .files import atomic_write_json, read_json
from .loop import TrainingRun, cosine_lr, set_threads

LR_FLOOR = 0.1  # the cosine schedule decays to 0.1 × train.lr
CHECKPOINT = "checkpoint.pt"  # the feature-level students' (the token student's: checkpoint-token.pt)
MANIFEST = "manifest.json"  # a draft folder's manifest (its corpus_sources: init_sources)


def log(message: str) -> None:
    """One line on stderr, above the progress bar when one is shown."""
    from tqdm import tqdm

    tqdm.write(f"distill: {message}", file=sys.stderr)


HELDOUT_KEYS = ("heldout_top1_first", "heldout_top1_second", "heldout_top1_first_two")


def batch_ids(cfg, step: int, train_ids: np.ndarray) -> np.ndarray:
    """The training sequences of ``step``: epoch-seeded permutations, ``batch_size`` at a time."""
    t = cfg.train
    steps_per_epoch = max(1, len(train_ids) // t.batch_size)
    epoch, offset = divmod(step, steps_per_epoch)
    order = np.random.RandomState(cfg.seed + epoch).permutation(train_ids)
    return np.sort(order[offset * t.batch_size : (offset + 1) * t.batch_size])


def fit(
    cfg,
    out: Path,
    net: torch.nn.Module,
    tokens: torch.Tensor,
    features: np.memmap,
    loss_fn,
    checkpoint: str = CHECKPOINT,
    fused: Optional[np.memmap] = None,
    evaluate_fn=None,
    start: Optional[dict[str, Any]] = None,
    deadline: Optional[float] = None,
) -> dict[str, Any]:
    """The training loop every student kind shares: AdamW over ``net``'s trainable parameters with
    warm-up and cosine decay, ``loss_fn(tokens [B, L], features [B, L, d], fused [B, L, n·d] or None,
    generator)`` per batch on the net's device, on pacer_train's ``TrainingRun`` (progress bar with ETA,
    checkpoints, Ctrl-C keeps a checkpoint and a rerun resumes, ``deadline`` stops early).

    At every checkpoint ``evaluate_fn()`` measures the held-out agreement, logged and kept in the
    history with the tokens seen so far (counted from ``start["tokens_before"]``, the tokens the
    ``init`` weights had seen); ``scaling.json`` in ``out`` is the curve (``start["points"]`` first)."""
    t = cfg.train
    set_threads(t.threads)
    device = next(net.parameters()).device
    train_ids = np.arange(cfg.corpus.heldout_sequences, tokens.shape[0])
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    total = int(t.epochs * max(1, len(train_ids) // t.batch_size))
    run = TrainingRun(
        out / checkpoint,
        net,
        optimizer,
        total,
        log,
        extra={"start": start or {"init": None, "tokens_before": 0, "points": []}},
    )
    start = run.extra["start"]  # a resumed run keeps what it started from
    per_step = t.batch_size * tokens.shape[1]
    curve = scaling_name(checkpoint)
    generator = torch.Generator().manual_seed(cfg.seed + run.step)
    progress = _Progress(out / curve, run, start, total, per_step, evaluate_fn, time.time(), run.step)

    def step_loss(step: int):
        ids = batch_ids(cfg, step, train_ids)
        batch_tokens = tokens[ids].to(device)
        batch_feats = torch.from_numpy(np.asarray(features[ids], dtype=np.float32)).to(device)
        batch_fused = None if fused is None else torch.from_numpy(np.asarray(fused[ids], dtype=np.float32)).to(device)
        progress.seen += batch_tokens.numel()
        return loss_fn(batch_tokens, batch_feats, batch_fused, generator)

    finished = run.fit(
        step_loss,
        lambda step: cosine_lr(step, total, t.warmup, t.lr, LR_FLOOR),
        t.checkpoint_every,
        record=progress.record,
        after_step=progress.postfix,
        deadline=deadline,
    )
    write_scaling(out / curve, start, run.history)
    return {
        "steps": run.step,
        "total_steps": total,
        "finished": finished,
        "tokens_seen": run.step * per_step,
        "tokens_total": start["tokens_before"] + run.step * per_step,
        "init": start.get("init"),
        "init_corpus_sources": init_sources(start),
        "history": run.history,
    }


@dataclasses.dataclass
class _Progress:
    """``fit``'s record at each checkpoint (the held-out agreement, logged, and the scaling curve written)
    and its progress bar's postfix; ``seen`` counts the tokens trained on since ``started``."""

    curve: Path
    run: TrainingRun
    start: dict[str, Any]
    total: int
    per_step: int
    evaluate_fn: Optional[Callable[[], dict[str, Any]]]
    started: float
    first_step: int
    seen: int = 0
    latest: str = ""  # the last held-out agreement, as shown

    def record(self, step: int, loss, parts) -> dict[str, Any]:
        entry = {
            "step": step,
            "loss": float(loss.detach()),
            **parts,
            "tokens": self.start["tokens_before"] + step * self.per_step,
        }
        if self.evaluate_fn is not None:
            entry.update(self.evaluate_fn())
            self.latest = (
                f"{entry['heldout_top1_first']:.3f}/{entry['heldout_top1_second']:.3f}"
                if "heldout_top1_second" in entry
                else f"{entry['heldout_top1_first']:.3f}"
            )
            eta = (time.time() - self.started) / max(1, step - self.first_step) * (self.total - step)
            log(
                f"step {step}/{self.total}: {entry['tokens']:,} tokens seen, held-out top-1 agreement "
                f"{self.latest} (draft position 1/2), about {eta / 60:.1f} min left"
            )
        write_scaling(self.curve, self.start, self.run.history + [entry])
        return entry

    def postfix(self, step: int, loss, parts) -> dict[str, str]:
        shown = {
            "loss": f"{float(loss.detach()):.3f}",
            "top1": f"{parts['top1']:.2f}",
            "tok_s": f"{self.seen / (time.time() - self.started):.0f}",
        }
        return {**shown, "held": self.latest} if self.latest else shown


def init_sources(start: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The ``corpus_sources`` of what a run started from: recorded in its start since runs record it; a
    run started earlier reads its ``init`` draft folder's manifest (when the folder is still there)."""
    if "corpus_sources" in start or not start.get("init"):
        return start.get("corpus_sources")
    manifest = Path(start["init"]) / MANIFEST
    if not manifest.is_file():
        return None
    record = read_json(manifest, "draft manifest")
    return record.get("corpus_sources") if isinstance(record, dict) else None


def with_init_sources(own: dict[str, Any], inherited: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The ``corpus_sources`` record of a draft: its own corpus's, and under ``init`` the record of the
    ``init`` weights it continued (nested as deep as the chain of runs), so what the weights have
    seen stays known (``pacer train-preverify`` keeps all of it out of M_B's training prompts)."""
    return {**own, "init": inherited} if inherited else own


# -- the scaling curve ------------------------------------------------------------------------------
SCALING = "scaling.json"


def scaling_name(checkpoint: str) -> str:
    """The curve of a run's checkpoint: ``scaling.json`` (``checkpoint.pt``), ``scaling-token.json``
    (``checkpoint-token.pt``); the exported draft holds it as ``scaling.json``."""
    return checkpoint.replace("checkpoint", "scaling").replace(".pt", ".json")


def scaling_points(start: dict[str, Any], history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """(tokens seen → held-out agreement) points: the init's curve, then this run's checkpoints."""
    own = [
        {"tokens": h["tokens"], "step": h["step"], **{k: h[k] for k in HELDOUT_KEYS if k in h}}
        for h in history
        if "heldout_top1_first" in h and "tokens" in h
    ]
    return list(start.get("points", [])) + own


def write_scaling(path: Path, start: dict[str, Any], history: list[dict[str, Any]]) -> None:
    """The curve ``path`` ({init, tokens_before, points}) and, when matplotlib is installed, its plot
    beside it (the same name, ``.png``)."""
    points = scaling_points(start, history)
    atomic_write_json(
        path, {"init": start.get("init"), "tokens_before": start.get("tokens_before", 0), "points": points}
    )
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not points:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    tokens = [p["tokens"] for p in points]
    for key, label in (
        ("heldout_top1_first", "draft position 1"),
        ("heldout_top1_second", "draft position 2"),
        ("heldout_top1_first_two", "positions 1 and 2"),
    ):
        if any(key in p for p in points):
            ax.plot(tokens, [p.get(key, float("nan")) for p in points], marker="o", label=label)
    if start.get("tokens_before"):
        ax.axvline(start["tokens_before"], color="grey", linestyle=":", label="init")
    ax.set_xlabel("training tokens seen")
    ax.set_ylabel("held-out top-1 agreement with the target")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=120)
    plt.close(fig)
