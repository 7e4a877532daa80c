"""The ``pacer`` stop policy: blockwise pre-verification of the draft by M_B (docs/pacer.md).

Drafting goes in blocks of ``b`` tokens. After each block the predictor (M_B, or the draft's own
cumulative confidence) estimates, for every block token, the probability that it and every earlier
draft token are accepted. Then the ``rule`` decides (``rules``): ``paper`` stops when the block's
mean is below the threshold t (else t ← min(t · rho, t_max); t starts at ``t0`` in every step);
``throughput`` goes on while the next block's forecast gain pays its cost at the running throughput
(a measured cost model, ``costs``) and then sends the drafted tokens whose gain pays their
verification (drafting is spent by then).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, List, Optional

import attrs
import torch
from attrs import validators as v

from pacer_core import Draft, InputError, Resources, Stop, hookimpl
from pacer_core.cost_profiles import CostModel, monotone
from pacer_core.jsonfile import read_json

from . import measured_costs, rules
from .model import CONFIG, MANIFEST, WEIGHTS, IncrementalPredictor, PreVerifier, confidence_features

DEFAULT_CHECKPOINT = Path(__file__).parent / "default"  # M_B for the embedded target + shipped eagle draft
# every M_B this plugin ships (the eagle draft's, the token-level draft's, the dflash block draft's);
# `checkpoint: null` picks the one trained for the run's draft/target pair
SHIPPED_CHECKPOINTS = tuple(
    Path(__file__).parent / name for name in ("default", "default_draft_model", "default_dflash")
)
TRAIN_HINT = "pacer train-preverify"

Predictor = Callable[..., torch.Tensor]  # predictor(hidden [k, d], start, confidence=None) -> probs [k]


def _unit(instance, attribute, value) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"'{attribute.name}' must be in [0, 1], got {value}")


RULES = ("paper", "throughput")
PREDICTORS = ("mb", "draft_confidence")


def _one_of(choices):
    def check(instance, attribute, value) -> None:
        if value not in choices:
            raise ValueError(f"'{attribute.name}' must be one of {', '.join(choices)}, got '{value}'")

    return check


@attrs.define
class CostsConfig:
    """A cost model given inline (seconds), instead of a measured cost file."""

    verify_s: List[float] = attrs.field(factory=list)  # one target forward over k = 1..K tokens
    draft_token_s: float = attrs.field(default=0.0, validator=v.ge(0.0))  # drafting one token
    step_s: float = attrs.field(default=0.0, validator=v.ge(0.0))  # a step's other fixed costs

    def __attrs_post_init__(self) -> None:
        if not self.verify_s or min(self.verify_s) <= 0:
            raise ValueError("costs.verify_s needs the positive seconds of a target forward over k = 1, 2, ... tokens")

    def model(self, tokens_per_forward: int = 1) -> CostModel:
        """The cost model, for a drafter whose one forward yields ``tokens_per_forward`` draft tokens."""
        return CostModel(
            monotone(self.verify_s), self.draft_token_s, step_s=self.step_s, tokens_per_forward=tokens_per_forward
        )


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
    rule: str = attrs.field(default="paper", validator=_one_of(RULES))  # paper: t0/rho/t_max; throughput: costs
    predictor: str = attrs.field(default="mb", validator=_one_of(PREDICTORS))  # draft_confidence: no M_B
    margin: float = attrs.field(default=1.0, validator=v.gt(0.0))  # throughput: λ multiplier (> 1: shorter)
    rate_decay: float = attrs.field(default=0.1, validator=[v.gt(0.0), v.le(1.0)])  # throughput: λ's EMA weight
    transient: bool = False  # throughput: forget λ at every prompt (always so under sampling)
    costs: Optional[CostsConfig] = None  # throughput: the cost model inline; None = the measured one
    cost_file: Optional[str] = None  # throughput: a `pacer costs` file; None = the cache's for the pair
    profile: Optional[str] = None  # throughput: a cost profile (docs/costs.md), shipped name or file, instead
    # throughput: read M_B's predictions times (accepted + s) / (predicted + s) over this generation's
    # verified draft tokens, s = this many predicted tokens of prior belief in M_B (4: measured,
    # docs/pacer.md#recalibrating-m_b-while-decoding); null: as M_B gives them
    recalibrate: Optional[float] = attrs.field(default=4.0, validator=v.optional(v.gt(0.0)))

    def __attrs_post_init__(self) -> None:  # checked by load_config, before any model loads
        if sum(x is not None for x in (self.costs, self.cost_file, self.profile)) > 1:
            raise ValueError("give the throughput rule one cost source: costs, cost_file or profile")
        if self.min_draft > self.max_draft:
            raise ValueError(f"min_draft ({self.min_draft}) must not exceed max_draft ({self.max_draft})")
        if self.t_max < self.t0:
            raise ValueError(f"t_max ({self.t_max}) must not be below t0 ({self.t0})")


def checkpoint_folder(path: Optional[str]) -> Path:
    """``None`` = the shipped default; ``shipped:NAME`` = a folder shipped with this plugin; else a path."""
    if path is not None and path.startswith("shipped:"):
        folder = Path(__file__).parent / path[len("shipped:") :]
    else:
        folder = DEFAULT_CHECKPOINT if path is None else Path(path).expanduser()
    missing = [name for name in (CONFIG, WEIGHTS, MANIFEST) if not (folder / name).exists()]
    if missing:
        if path is None:
            raise InputError(
                f"the shipped PACER checkpoint '{folder}' does not exist yet (it is trained for the embedded "
                f"pair): train one with `{TRAIN_HINT}` and set strategy.stop.N.checkpoint=<its folder>"
            )
        raise InputError(
            f"'{folder}' is not a PACER checkpoint folder (no {', '.join(missing)}): make one with `{TRAIN_HINT}`"
        )
    return folder


def check_pair(
    folder: Path, manifest: dict[str, Any], target_digest: Optional[str], draft_identity: Optional[str]
) -> None:
    """Refuse an M_B trained for another draft/target pair (parts this run does not know pass)."""
    trained_target, trained_draft = manifest.get("target_digest"), manifest.get("draft_identity")
    target_differs = bool(target_digest and trained_target and trained_target != target_digest)
    draft_differs = bool(draft_identity and trained_draft and trained_draft != draft_identity)
    if target_differs or draft_differs:
        drafter = manifest.get("drafter")
        reads = (
            f"reads the {drafter['name']} drafter's hidden states and "
            if (isinstance(drafter, dict) and isinstance(drafter.get("name"), str))
            else ""
        )
        raise InputError(
            f"PACER checkpoint '{folder}' {reads}was trained for target {trained_target} with draft {trained_draft}, "
            f"but this run pairs target {target_digest} with draft {draft_identity}: train one for this pair "
            f"(`{TRAIN_HINT}`) or set allow_other_pair=true on the pacer stop"
        )


def shipped_for_pair(draft_identity: Optional[str]) -> Optional[str]:
    """The shipped M_B trained for this draft (by identity), if any."""
    for folder in SHIPPED_CHECKPOINTS:
        if draft_identity and (folder / MANIFEST).exists():
            if (
                read_json(folder / MANIFEST, "M_B manifest", "reinstall pacer-sd").get("draft_identity")
                == draft_identity
            ):
                return str(folder)
    return None


def load_predictor(config: PacerStopConfig, resources: Resources) -> IncrementalPredictor:
    chosen = config.checkpoint if config.checkpoint is not None else shipped_for_pair(resources.draft_identity)
    folder = checkpoint_folder(chosen)
    manifest = read_json(folder / MANIFEST, "M_B manifest", f"train the checkpoint again (`{TRAIN_HINT}`)")
    if not config.allow_other_pair:
        check_pair(folder, manifest, resources.target.digest, resources.draft_identity)
    predictor = IncrementalPredictor(PreVerifier.load(folder))
    # the drafters reading a draft model return its hidden states; feature-level drafts the target's size
    model = resources.draft if resources.draft is not None else resources.target
    size = model.hidden_size
    if size != predictor.arch.input_size:
        raise InputError(
            f"PACER checkpoint '{folder}' reads hidden states of size {predictor.arch.input_size}, "
            f"but this draft's have size {size}: train one for this pair (`{TRAIN_HINT}`)"
        )
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


class DraftConfidence:
    """The training-free predictor: the draft's cumulative probability of its own tokens,
    Π_{j≤i} q_j(x_j), as the estimate of P(x_1 … x_i accepted). Called like ``IncrementalPredictor``
    with the confidence features (log q(x), H(q)) of tokens ``start …``."""

    def __init__(self):
        self.logs: list[float] = []  # log q_j(x_j) of the draft tokens seen

    def reset(self) -> None:
        self.logs = []

    def __call__(self, hidden, start: int, confidence: Optional[torch.Tensor] = None) -> torch.Tensor:
        if confidence is None:
            raise ValueError("the draft_confidence predictor reads the draft's confidence features")
        del self.logs[start:]
        before = sum(self.logs)
        self.logs.extend(confidence[:, 0].double().tolist())
        return rules.cumulative_confidence(confidence[:, 0], before)


def load_costs(config: PacerStopConfig, resources: Resources) -> CostModel:
    """The throughput rule's cost model: inline, a given cost file, or the cache's for the run's pair.
    A profile prices a draft forward, and the rule a draft token: a block drafter's token costs its
    forward over the block (``Resources.draft_tokens_per_forward``), so a whole block costs one forward."""
    if config.costs is not None:
        return config.costs.model(resources.draft_tokens_per_forward)
    if config.profile is not None:  # priced as the drafter's kind (Component.cost_kind)
        from pacer_core.cost_profiles import load_profile

        profile = load_profile(config.profile)
        kind = resources.draft_cost_kind
        return profile.cost_model(
            kind if kind in profile.draft else None, tokens_per_forward=resources.draft_tokens_per_forward
        )
    key = measured_costs.full_key(measured_costs.run_pair(resources))
    path = Path(config.cost_file) if config.cost_file else measured_costs.cache_file(key)
    return measured_costs.read_costs(path, key)


class PacerStop:
    """Blockwise pre-verification: after each block, the rule judges the predictor's estimates.

    ``predictor(hidden, start, confidence)`` returns the acceptance probabilities of the draft
    tokens ``start..start+k-1`` and remembers them as context for later blocks of the same draft
    (``IncrementalPredictor``, ``DraftConfidence``); ``reset()`` starts a new draft. Tests pass a
    scripted one. ``cost`` (the throughput rule's cost model) is required for ``rule: throughput``.
    """

    def __init__(
        self, config: PacerStopConfig, predictor: Any, reads_confidence: bool = False, cost: Optional[CostModel] = None
    ):
        if config.rule == "throughput" and cost is None:
            raise ValueError("the throughput rule needs a cost model")
        self.config = config
        self.predictor = predictor
        self.reads_confidence = reads_confidence
        self.cost = cost
        self.rate = rules.RunningRate(cost, config.rate_decay) if cost is not None else None
        self.clock = time.perf_counter
        self.threshold = config.t0
        self.checked = 0  # draft tokens judged so far in this step
        self.drafted = 0  # draft tokens drafted in this step (trimmed ones included)
        self.predictions: list[float] = []  # of the judged tokens of this step
        self.blocks_judged: list[tuple[int, int, float, float]] = []  # (start, end, mean, threshold or λ)
        self._reset_totals()

    @classmethod
    def from_config(cls, config: PacerStopConfig, resources: Resources) -> "PacerStop":
        cost = load_costs(config, resources) if config.rule == "throughput" else None
        if config.predictor == "draft_confidence":
            return cls(config, DraftConfidence(), reads_confidence=True, cost=cost)
        predictor = load_predictor(config, resources)
        return cls(config, predictor, reads_confidence=predictor.arch.draft_confidence, cost=cost)

    def _reset_totals(self) -> None:
        self.totals = {"checks": 0, "early_stops": 0, "mb_s": 0.0, "judged": 0, "predicted": 0.0, "accepted": 0}

    def _new_draft(self) -> None:
        self.threshold = self.config.t0
        self.checked = 0
        self.drafted = 0
        self.predictions = []
        self.blocks_judged = []
        self.predictor.reset()

    def start_generation(self, greedy: bool) -> None:
        """A new prompt: fresh totals and draft; λ kept under greedy decoding unless ``transient``."""
        self._reset_totals()
        self._new_draft()
        if self.rate is not None and (self.config.transient or not greedy):
            self.rate.reset()

    @hookimpl
    def pacer_start(self, state) -> None:
        sampling = getattr(state, "sampling", None)  # None: a policy driven without an engine
        self.start_generation(sampling is None or sampling.greedy)

    def _judge(self, draft: Draft, end: int) -> torch.Tensor:
        """M_B's predictions for the draft tokens ``self.checked:end`` ([k])."""
        start = self.checked
        hidden = _rows_since(draft, start, "hidden_states")
        if hidden is None:
            raise InputError(
                "the pacer stop reads the draft's hidden states, which this drafter did not "
                "return: use a drafter that provides them (draft_model, eagle, dflash)"
            )
        confidence = None
        if self.reads_confidence:
            probs = _rows_since(draft, start, "draft_probs")
            if probs is None:
                reader = (
                    "the draft_confidence predictor"
                    if self.config.predictor == "draft_confidence"
                    else "this PACER checkpoint"
                )
                raise InputError(
                    f"{reader} reads the draft's probabilities, which this drafter did not return: "
                    "use a model drafter (draft_model, eagle, dflash)"
                )
            confidence = confidence_features(probs[: end - start], draft.tokens[start:end])
        t = self.clock()
        predicted = self.predictor(hidden[: end - start], start, confidence)
        self.totals["mb_s"] += self.clock() - t
        self.totals["checks"] += 1
        return predicted

    @hookimpl
    def pacer_draft_more(self, state, draft):
        c = self.config
        n = len(draft)  # this step's draft: its state was reset when the last step was observed
        self.drafted = max(self.drafted, n)
        at_max = n >= c.max_draft
        end = min(n, c.max_draft)  # a drafter may return more than asked: judge up to max_draft
        since = end - self.checked
        # judge a complete block (several, if the drafter returned more: one check for all); at
        # max_draft a rule that may trim (throughput, or paper without send_failed_block) also
        # judges the last, possibly partial, block (a sending one would send it either way)
        trims = c.rule == "throughput" or not c.send_failed_block
        if since > 0 and ((since >= c.b and not at_max) or (at_max and trims)):
            start = self.checked
            predicted = self._judge(draft, end)
            self.checked = end
            self.predictions.extend(predicted.tolist())
            keep = self._decide(start, end, predicted)
            if keep is not None:
                self.totals["early_stops"] += 1
                return Stop() if keep >= n else Stop(keep=keep)
            since = 0
        if at_max:
            return Stop() if n == c.max_draft else Stop(keep=c.max_draft)
        return min(c.b - since, c.max_draft - n)

    def _decide(self, start: int, end: int, predicted: torch.Tensor) -> Optional[int]:
        """The rule on the block ``start:end`` just judged: the draft length to send if drafting
        stops here, else None."""
        c = self.config
        mean = float(predicted.mean())
        if c.rule == "throughput":
            rate = self.rate.value * c.margin
            self.blocks_judged.append((start, end, mean, rate))
            p = self.predictions
            if c.recalibrate is not None:
                p = rules.recalibrated(p, self.totals["accepted"], self.totals["predicted"], c.recalibrate)
            if end < c.min_draft or (end < c.max_draft and rules.next_block_pays(p, end, c.b, self.cost, rate)):
                return None
            return rules.send_length(p, c.min_draft, end, self.cost, rate)
        self.blocks_judged.append((start, end, mean, self.threshold))
        if not rules.paper_passes(mean, self.threshold):
            if end >= c.min_draft:
                return end if c.send_failed_block else max(start, c.min_draft)
            return None  # a failed block before min_draft: drafting goes on, the threshold stays
        self.threshold = rules.paper_next_threshold(self.threshold, c.rho, c.t_max)
        return None

    def observe_outcome(self, sent: int, accepted: int, emitted: int) -> None:
        """A step's outcome: ``sent`` draft tokens verified, ``accepted`` of them accepted (the
        main path), ``emitted`` tokens committed. Tallies calibration, updates λ and ends the step:
        the next ``pacer_draft_more`` judges a new draft (from t₀, with a fresh M_B context). The
        step's end is what the policy is told (``pacer_observe_step``, for a step the engine's draft
        gate decodes plainly too), so it never guesses a new step from the draft."""
        judged = self.predictions[:sent]
        self.totals["judged"] += len(judged)
        self.totals["predicted"] += sum(judged)
        self.totals["accepted"] += min(accepted, len(judged))
        if self.rate is not None:
            self.rate.update(emitted, max(self.drafted, sent), sent)
        self._new_draft()

    @hookimpl
    def pacer_step_costs(self) -> Optional[CostModel]:
        """The throughput rule's cost model: the engine's draft gate prices steps with it (docs/costs.md)."""
        return self.cost

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        """Tally predictions against the verifier's decisions (calibration seen while decoding)."""
        self.observe_outcome(len(step.draft), step.main_accepted, len(step.emitted))

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
            **({"pacer_rate": self.rate.value} if self.rate is not None else {}),
        }
