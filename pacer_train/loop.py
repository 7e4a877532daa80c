"""The optimisation loop both trainers share: resume, schedule, clipping, progress, interruption.

``TrainingRun`` resumes ``step`` and ``history`` from its checkpoint (if any), then ``fit`` runs
optimizer steps up to ``total``: each sets the learning rate of the step (``cosine_lr``), asks the
trainer for the step's loss, back-propagates, clips the gradient norm, steps the optimizer; every
``checkpoint_every`` steps and at the end it appends the trainer's history entry and writes the
checkpoint atomically. The learning rate is a function of the step alone, so a resumed run continues
the schedule where it stopped.

A time budget (``fit(deadline=...)``) stops the same way as a checkpoint, without an error: the
caller goes on (exports what it has) and the same command continues later.

Ctrl-C or SIGTERM (``interruptible``): the current step finishes, the checkpoint is written, and
``KeyboardInterrupt`` is raised, which the command line turns into its interrupted exit code (130);
rerunning the same command resumes. A second Ctrl-C stops at once (the last checkpoint stays intact).
"""

from __future__ import annotations

import math
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from pacer_core.errors import InputError

from .files import atomic_save, load_run_file


def cosine_lr(step: int, total: int, warmup: int, base: float, floor: float) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay from ``base`` to ``floor · base`` at
    ``total`` (each trainer keeps its floor: distill 0.1, train-preverify 0.05)."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def count_parameters(model: torch.nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def set_threads(threads: int) -> None:
    """torch's intra-op threads; 0 keeps torch's default."""
    if threads:
        torch.set_num_threads(threads)


def progress(total: int, initial: int = 0, desc: str = "train", unit: str = "step"):
    """A tqdm bar on stderr (counts, rate and ETA)."""
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr)


class Interruption:
    """Set by the first Ctrl-C/SIGTERM inside ``interruptible``; the loop checks ``requested``."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""

    def __bool__(self) -> bool:
        return self.requested


@contextmanager
def interruptible(log: Callable[[str], None] = lambda message: None) -> Iterator[Interruption]:
    """Catch SIGINT and SIGTERM while the block runs: the first one only sets ``requested`` (the
    caller finishes its unit of work and saves), a second one raises ``KeyboardInterrupt`` at once.
    Outside the main thread signals cannot be caught, and the block runs unprotected."""
    state = Interruption()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handler(signum, frame):
        if state.requested:
            raise KeyboardInterrupt
        state.requested, state.signal_name = True, signal.Signals(signum).name
        log(f"{state.signal_name}: finishing this step, then saving (once more to stop at once)")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield state
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


CHECKPOINT_KEYS = ("model", "optimizer", "step", "history")


def load_checkpoint(path: Path, net: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore ``net`` and ``optimizer`` from a checkpoint ``TrainingRun`` wrote; returns it."""
    state = load_run_file(path, "checkpoint")
    if not isinstance(state, dict) or any(key not in state for key in CHECKPOINT_KEYS):
        raise InputError(
            f"the checkpoint '{path}' is not one this project wrote (it lacks "
            f"{', '.join(CHECKPOINT_KEYS)}): delete it to train from the start"
        )
    try:
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        raise InputError(
            f"the checkpoint '{path}' holds another model shape than this run's "
            f"({type(exc).__name__}): delete it to train this shape from the start, or choose "
            "another out= folder"
        ) from None
    return state


class TrainingRun:
    """A resumable optimisation of ``net`` by ``optimizer`` for ``total`` steps, checkpointed to
    ``checkpoint`` (``extra`` items are stored with every checkpoint; resuming, the checkpoint's own
    extra items replace the given ones, so what a run recorded at its start stays)."""

    def __init__(
        self,
        checkpoint: Path,
        net: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        total: int,
        log: Callable[[str], None],
        extra: Optional[dict[str, Any]] = None,
    ):
        self.checkpoint, self.net, self.optimizer, self.total, self.log = Path(checkpoint), net, optimizer, total, log
        self.extra = dict(extra or {})
        self.step, self.history = 0, []
        if self.checkpoint.exists():
            state = load_checkpoint(self.checkpoint, net, optimizer)
            self.step, self.history = int(state["step"]), list(state["history"])
            self.extra.update({k: v for k, v in state.items() if k not in CHECKPOINT_KEYS})
            log(f"resuming at step {self.step}/{total}")

    def save(self) -> None:
        atomic_save(
            self.checkpoint,
            {
                "model": self.net.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "step": self.step,
                "history": self.history,
                **self.extra,
            },
        )

    def fit(
        self,
        step_loss: Callable[[int], tuple[torch.Tensor, dict[str, Any]]],
        lr: Callable[[int], float],
        checkpoint_every: int,
        record: Callable[[int, torch.Tensor, dict[str, Any]], dict[str, Any]],
        after_step: Callable[[int, torch.Tensor, dict[str, Any]], dict[str, str]] = lambda *a: {},
        clip: float = 1.0,
        desc: str = "train",
        deadline: Optional[float] = None,
    ) -> bool:
        """Train from ``self.step`` to ``self.total``. Per step: learning rate ``lr(step)``, then
        ``step_loss(step) -> (loss, parts)``, backward, gradient-norm clipping at ``clip``, optimizer step;
        then ``after_step(step, loss, parts)`` gives the progress bar's postfix, and at checkpoints
        ``record(step, loss, parts)`` the history entry (``step`` counts finished steps there).

        ``deadline`` (a ``time.time()`` value): after the step that reaches it (at least one step
        runs), training stops as at a checkpoint (history entry, checkpoint) and returns False; the
        same command continues later.
        Returns True when ``total`` steps are done."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        with interruptible(self.log) as stop, progress(self.total, self.step, desc) as bar:
            while self.step < self.total and not stop:
                for group in self.optimizer.param_groups:
                    group["lr"] = lr(self.step)
                loss, parts = step_loss(self.step)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, clip)
                self.optimizer.step()
                self.step += 1
                bar.update(1)
                bar.set_postfix(**after_step(self.step, loss, parts))
                out_of_time = deadline is not None and time.time() >= deadline and self.step < self.total
                if self.step % checkpoint_every == 0 or self.step == self.total or out_of_time:
                    self.history.append(record(self.step, loss, parts))
                    self.save()
                if out_of_time:
                    self.log(
                        f"time budget reached: checkpoint kept at step {self.step}/{self.total}; "
                        "run the same command to continue"
                    )
                    return False
            if stop:
                self.save()
                self.log(
                    f"interrupted: checkpoint kept at step {self.step}/{self.total}; run the same command to resume"
                )
                raise KeyboardInterrupt
        return True
