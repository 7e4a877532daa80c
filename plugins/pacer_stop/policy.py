"""The ``pacer`` stop policy: blockwise pre-verification of the draft by M_B (docs/pacer.md).

Drafting goes in blocks of ``b`` tokens. After each block M_B predicts every block token's
acceptance probability; if the block's mean is below the threshold t the draft stops, else
t ← min(t · rho, t_max) for the next block. t starts at ``t0`` in every step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Optional

import attrs
import torch
from attrs import validators as v

from pacer_core import Draft, InputError, Resources, Stop, hookimpl

from .model import CONFIG, MANIFEST, WEIGHTS, IncrementalPredictor, PreVerifier, confidence_features

DEFAULT_CHECKPOINT = Path(__file__).parent / "default"  # M_B for the embedded target + shipped eagle draft
# every M_B this plugin ships; `checkpoint: null` picks the one trained for the run's draft/target pair
SHIPPED_CHECKPOINTS = (DEFAULT_CHECKPOINT, Path(__file__).parent / "default_draft_model")
TRAIN_HINT = "pacer train-preverify"

Predictor = Callable[..., torch.Tensor]  # predictor(hidden [k, d], start, confidence=None) -> probs [k]


def _unit(instance, attribute, value) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"'{attribute.name}' must be in [0, 1], got {value}")


@attrs.define
class PacerStopConfig:
    b: int = attrs.field(default=2, validator=v.ge(1))  # block size in tokens (1 = per-token, SpecDec++-like)
    t0: float = attrs.field(default=0.8, validator=_unit)  # threshold on the block's mean prediction (swept)
    rho: float = attrs.field(default=1.1, validator=v.ge(1.0))  # threshold growth per passed block (1 = off)
    t_max: float = attrs.field(default=0.9, validator=_unit)  # cap on the threshold
    min_draft: int = attrs.field(default=1, validator=v.ge(0))  # never stop before this many tokens
    max_draft: int = attrs.field(default=16, validator=v.ge(1))  # stop at this many tokens
    send_failed_block: bool = True  # false: trim the failed block (never below min_draft)
    checkpoint: Optional[str] = None  # M_B folder from `pacer train-preverify`; None = the shipped one for
    # the pair; shipped:NAME = a folder shipped with this plugin (shipped:ablation_no_pos)
    allow_other_pair: bool = False  # experts: use an M_B trained for another draft/target pair

    def __attrs_post_init__(self) -> None:  # checked by load_config, before any model loads
        if self.min_draft > self.max_draft:
            raise ValueError(f"min_draft ({self.min_draft}) must not exceed max_draft ({self.max_draft})")
        if self.t_max < self.t0:
            raise ValueError(f"t_max ({self.t_max}) must not be below t0 ({self.t0})")


def checkpoint_folder(path: Optional[str]) -> Path:
    """``None`` = the shipped default; ``shipped:NAME`` = a folder shipped with this plugin; else a path."""
    if path is not None and path.startswith("shipped:"):
        folder = Path(__file__).parent / path[len("shipped:"):]
    else:
        folder = DEFAULT_CHECKPOINT if path is None else Path(path).expanduser()
    missing = [name for name in (CONFIG, WEIGHTS, MANIFEST) if not (folder / name).exists()]
    if missing:
        if path is None:
            raise InputError(
                f"the shipped PACER checkpoint '{folder}' does not exist yet (it is trained for the embedded "
                f"pair): train one with `{TRAIN_HINT}` and set strategy.stop.N.checkpoint=<its folder>"
            )
        raise InputError(f"'{folder}' is not a PACER checkpoint folder (no {', '.join(missing)}): make one "
                         f"with `{TRAIN_HINT}`")
    return folder


def check_pair(folder: Path, manifest: dict[str, Any], target_digest: Optional[str],
               draft_identity: Optional[str]) -> None:
    """Refuse an M_B trained for another draft/target pair (parts this run does not know pass)."""
    trained_target, trained_draft = manifest.get("target_digest"), manifest.get("draft_identity")
    target_differs = bool(target_digest and trained_target and trained_target != target_digest)
    draft_differs = bool(draft_identity and trained_draft and trained_draft != draft_identity)
    if target_differs or draft_differs:
        raise InputError(
            f"PACER checkpoint '{folder}' was trained for target {trained_target} with draft {trained_draft}, "
            f"but this run pairs target {target_digest} with draft {draft_identity}: train one for this pair "
            f"(`{TRAIN_HINT}`) or set allow_other_pair=true on the pacer stop"
        )


def shipped_for_pair(draft_identity: Optional[str]) -> Optional[str]:
    """The shipped M_B trained for this draft (by identity), if any."""
    for folder in SHIPPED_CHECKPOINTS:
        if draft_identity and (folder / MANIFEST).exists():
            if json.loads((folder / MANIFEST).read_text()).get("draft_identity") == draft_identity:
                return str(folder)
    return None


def load_predictor(config: PacerStopConfig, resources: Resources) -> IncrementalPredictor:
    chosen = config.checkpoint if config.checkpoint is not None else shipped_for_pair(resources.draft_identity)
    folder = checkpoint_folder(chosen)
    manifest = json.loads((folder / MANIFEST).read_text())
    if not config.allow_other_pair:
        check_pair(folder, manifest, resources.target.digest, resources.draft_identity)
    predictor = IncrementalPredictor(PreVerifier.load(folder))
    # the drafters reading a draft model return its hidden states; feature-level drafts the target's size
    model = resources.draft if resources.draft is not None else resources.target
    size = model.hidden_size
    if size != predictor.arch.input_size:
        raise InputError(f"PACER checkpoint '{folder}' reads hidden states of size {predictor.arch.input_size}, "
                         f"but this draft's have size {size}: train one for this pair (`{TRAIN_HINT}`)")
    return predictor


def _rows_since(draft: Draft, start: int, field: str) -> Optional[torch.Tensor]:
    """Rows ``start:`` of the draft's ``field`` (hidden_states or draft_probs), from the latest
    blocks only (without concatenating the whole draft)."""
    blocks = getattr(draft, "blocks", None)
    if blocks is None:  # a Draft without blocks: slice the concatenation
        rows = getattr(draft, field)
        return None if rows is None else rows[start:]
    parts, end = [], len(draft)
    for block in reversed(blocks):
        if end <= start:
            break
        rows = getattr(block, field)
        if rows is None:
            return None
        first = max(0, start - (end - len(block)))
        parts.append(rows[first:])
        end -= len(block)
    parts.reverse()
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class PacerStop:
    """Blockwise pre-verification: stop when M_B's mean prediction over the latest block is below t.

    ``predictor(hidden, start, confidence)`` returns the acceptance probabilities of the draft
    tokens ``start..start+k-1`` and remembers them as context for later blocks of the same draft
    (``IncrementalPredictor``); ``reset()`` starts a new draft. Tests pass a scripted one.
    """

    def __init__(self, config: PacerStopConfig, predictor: Any, reads_confidence: bool = False):
        self.config = config
        self.predictor = predictor
        self.reads_confidence = reads_confidence
        self.clock = time.perf_counter
        self.threshold = config.t0
        self.checked = 0  # draft tokens judged so far in this step
        self.predictions: list[float] = []  # of the judged tokens of this step
        self.blocks_judged: list[tuple[int, int, float, float]] = []  # (start, end, mean, threshold)
        self._reset_totals()

    @classmethod
    def from_config(cls, config: PacerStopConfig, resources: Resources) -> "PacerStop":
        predictor = load_predictor(config, resources)
        return cls(config, predictor, reads_confidence=predictor.arch.draft_confidence)

    def _reset_totals(self) -> None:
        self.totals = {"checks": 0, "early_stops": 0, "mb_s": 0.0, "judged": 0, "predicted": 0.0, "accepted": 0}

    def _new_draft(self) -> None:
        self.threshold = self.config.t0
        self.checked = 0
        self.predictions = []
        self.blocks_judged = []
        self.predictor.reset()

    @hookimpl
    def pacer_start(self, state) -> None:
        self._reset_totals()
        self._new_draft()

    def _judge(self, draft: Draft, end: int) -> torch.Tensor:
        """M_B's predictions for the draft tokens ``self.checked:end`` ([k])."""
        start = self.checked
        hidden = _rows_since(draft, start, "hidden_states")
        if hidden is None:
            raise InputError("the pacer stop reads the draft's hidden states, which this drafter did not "
                             "return: use a drafter that provides them (draft_model, eagle)")
        confidence = None
        if self.reads_confidence:
            probs = _rows_since(draft, start, "draft_probs")
            if probs is None:
                raise InputError("this PACER checkpoint reads the draft's probabilities, which this drafter "
                                 "did not return: use a model drafter (draft_model, eagle)")
            confidence = confidence_features(probs[: end - start], draft.tokens[start:end])
        t = self.clock()
        predicted = self.predictor(hidden[: end - start], start, confidence)
        self.totals["mb_s"] += self.clock() - t
        self.totals["checks"] += 1
        return predicted

    @hookimpl
    def pacer_draft_more(self, state, draft):
        c = self.config
        n = len(draft)
        if n == 0 or n < self.checked:  # a new step
            self._new_draft()
        at_max = n >= c.max_draft
        end = min(n, c.max_draft)  # a drafter may return more than asked: judge up to max_draft
        since = end - self.checked
        # judge a complete block (several, if the drafter returned more: one check for all); at
        # max_draft a trimming policy also judges the last, possibly partial, block (a sending one
        # would send it either way)
        if since > 0 and ((since >= c.b and not at_max) or (at_max and not c.send_failed_block)):
            start = self.checked
            predicted = self._judge(draft, end)
            mean = float(predicted.mean())
            self.checked = end
            self.predictions.extend(predicted.tolist())
            self.blocks_judged.append((start, end, mean, self.threshold))
            if mean < self.threshold:
                if end >= c.min_draft:
                    self.totals["early_stops"] += 1
                    keep = end if c.send_failed_block else max(start, c.min_draft)
                    return Stop() if keep >= n else Stop(keep=keep)
                # a failed block before min_draft: drafting goes on, the threshold stays
            else:
                self.threshold = min(self.threshold * c.rho, c.t_max)
            since = 0
        if at_max:
            return Stop() if n == c.max_draft else Stop(keep=c.max_draft)
        return min(c.b - since, c.max_draft - n)

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        """Tally predictions against the verifier's decisions (calibration seen while decoding)."""
        judged = self.predictions[: len(step.draft)]
        accepted = step.main_accepted  # of the main path, which M_B judged
        self.totals["judged"] += len(judged)
        self.totals["predicted"] += sum(judged)
        self.totals["accepted"] += min(accepted, len(judged))

    @hookimpl
    def pacer_finish(self, state, result) -> dict[str, Any]:
        t = self.totals
        judged = t["judged"]
        return {
            "pacer_checks": t["checks"],
            "pacer_early_stops": t["early_stops"],
            "pacer_mb_s": t["mb_s"],
            "pacer_judged_tokens": judged,
            "pacer_mean_prediction": t["predicted"] / judged if judged else 0.0,
            "pacer_judged_accept_rate": t["accepted"] / judged if judged else 0.0,
        }
