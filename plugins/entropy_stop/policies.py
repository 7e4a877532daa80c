"""The stop policies ``entropy``, ``svip`` and ``confidence``: each checks every draft token.

Each asks for one token at a time (``pacer_draft_more`` returns 1), so the latest token is judged
before the next is drafted, and stops right after the first token its rule flags (that token is
still verified: it costs nothing more to draft and may be accepted). A drafter that returns several
tokens per call is handled too: every new token is judged and the draft is trimmed after the first
flagged one (``Stop(keep=...)``). The new tokens are the latest block's (``draft.last_block``): the
engine asks after every block, so the policies keep nothing within a step. ``max_tokens`` bounds the
draft. The rules are in ``pacer_plugins.entropy_stop.rules``; docs/stop-policies.md states them with
their defaults.

A ``threshold`` left unset (None) is the one the drafter's draft recommends for the stop
(``Resources.stop_thresholds``, e.g. the shipped eagle draft's manifest), else the stop's default
(``DEFAULT_THRESHOLDS``).
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import attrs
import torch

from pacer_core import Resources, Stop, hookimpl

from . import rules

_unit = [attrs.validators.ge(0.0), attrs.validators.le(1.0)]
_optional_unit = attrs.validators.optional(_unit)

DEFAULT_THRESHOLDS = {"entropy": 0.5, "svip": 0.45, "confidence": 0.4}
"""Each stop's threshold when neither its config nor the draft sets one (chosen by the sweeps of
configs/ablate_*.yaml; confidence: transformers' value)."""


def threshold_for(name: str, threshold: Optional[float], resources: Optional[Resources]) -> float:
    """The threshold stop ``name`` uses: as configured, else the draft's recommendation for it
    (``resources.stop_thresholds``), else ``DEFAULT_THRESHOLDS[name]``."""
    if threshold is not None:
        return float(threshold)
    recommended = {} if resources is None else resources.stop_thresholds
    return float(recommended.get(name, DEFAULT_THRESHOLDS[name]))


def _draft_probs(draft, name: str) -> torch.Tensor:
    if draft.draft_probs is None:
        raise ValueError(
            f"stop '{name}' needs the draft's probabilities, but the drafter returned none; "
            "use a model drafter such as draft_model"
        )
    return draft.draft_probs  # [n, vocab]


def judge_new_tokens(
    draft, max_tokens: int, scores: Callable[[int, int], torch.Tensor], threshold: float
) -> Union[int, Stop]:
    """One ``pacer_draft_more`` decision: judge the tokens the latest block added (``draft.last_block``:
    the engine asks again after each block, so the earlier ones passed), up to ``max_tokens``, and
    stop after the first whose score is below ``threshold``. Nothing is kept between calls: the draft
    says which tokens are new.

    ``scores(start, end)`` returns the scores of tokens ``start:end`` ([end - start]). Returns the
    hook's answer: 1 (draft one more token), or a ``Stop`` trimming the draft after the flagged token
    or at ``max_tokens`` when the drafter returned more.
    """
    n, start = len(draft), draft.last_block.start
    end = min(n, max_tokens)
    if start < end:
        flagged = rules.first_below(scores(start, end), threshold)
        if flagged is not None:
            keep = start + flagged + 1
            return Stop(keep=keep if keep < n else None)
    if n >= max_tokens:
        return Stop(keep=max_tokens if n > max_tokens else None)
    return 1


# -- entropy and svip ------------------------------------------------------------------------------
@attrs.define
class EntropyConfig:
    gamma: float = attrs.field(default=0.2, validator=attrs.validators.gt(0.0))  # γ_e in 1 − sqrt(γ_e · H)
    # λ₀: stop when the bound falls below it; None = the draft's recommendation, else 0.5 (swept)
    threshold: Optional[float] = attrs.field(default=None, validator=_optional_unit)
    adapt: bool = True  # calibrate λ online from the observed acceptance
    adapt_rate: float = attrs.field(default=0.05, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)])
    transient: bool = False  # forget the calibration at every prompt (always under sampling)
    max_tokens: int = attrs.field(default=20, validator=attrs.validators.ge(1))


@attrs.define
class SvipConfig:
    gamma: float = attrs.field(default=0.2, validator=attrs.validators.gt(0.0))  # γ in sqrt(γ · H)
    # h: stop when sqrt(γ · H) > h; None = the draft's recommendation, else 0.45 (swept)
    threshold: Optional[float] = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(0.0))
    )
    max_tokens: int = attrs.field(default=20, validator=attrs.validators.ge(1))


class EntropyBound:
    """Stop after a draft token whose acceptance bound ``1 − sqrt(γ · H(q))`` is below λ.

    ``q`` is the row of ``draft.draft_probs`` the token came from. With ``adapt``, λ is calibrated
    online: ``λ = clip(λ₀ − δ, 0, 1)`` where δ is an exponential moving average over judged tokens
    of (outcome − bound) (``rules.calibrated_offset``); δ is kept across prompts under greedy
    decoding unless ``transient``, and reset at every prompt under sampling (so a seed reproduces
    the output). ``svip`` is this class with adaptation off and λ₀ = 1 − h.
    """

    def __init__(
        self,
        *,
        gamma: float,
        threshold: float,
        adapt: bool = False,
        adapt_rate: float = 0.05,
        transient: bool = False,
        max_tokens: int = 20,
        name: str = "entropy",
    ):
        self.gamma, self.initial_threshold, self.name, self.max_tokens = gamma, threshold, name, max_tokens
        self.adapt, self.adapt_rate, self.transient = adapt, adapt_rate, transient
        self.offset = 0.0  # δ: how far observed acceptance lies above the bound, on average

    @classmethod
    def from_entropy_config(cls, config: EntropyConfig, resources: Optional[Resources] = None) -> "EntropyBound":
        return cls(
            gamma=config.gamma,
            threshold=threshold_for("entropy", config.threshold, resources),
            adapt=config.adapt,
            adapt_rate=config.adapt_rate,
            transient=config.transient,
            max_tokens=config.max_tokens,
        )

    @classmethod
    def from_svip_config(cls, config: SvipConfig, resources: Optional[Resources] = None) -> "EntropyBound":
        # sqrt(γ·H) > h  ⇔  1 − sqrt(γ·H) < 1 − h: SVIP's rule is the bound with λ = 1 − h, fixed
        h = threshold_for("svip", config.threshold, resources)
        return cls(gamma=config.gamma, threshold=1.0 - h, max_tokens=config.max_tokens, name="svip")

    @property
    def threshold(self) -> float:
        """The λ in use now."""
        if not self.adapt:
            return self.initial_threshold
        return min(1.0, max(0.0, self.initial_threshold - self.offset))

    def bounds(self, draft_probs: torch.Tensor) -> torch.Tensor:
        """``1 − sqrt(γ · H)`` for each row of ``draft_probs`` ([n, vocab] → [n])."""
        return rules.acceptance_bound(rules.entropy(draft_probs), self.gamma)

    @hookimpl
    def pacer_draft_more(self, state, draft):
        if len(draft) == 0:
            return 1  # nothing drafted yet
        probs = _draft_probs(draft, self.name)  # [n, vocab]
        return judge_new_tokens(draft, self.max_tokens, lambda a, b: self.bounds(probs[a:b]), self.threshold)

    @hookimpl
    def pacer_start(self, state) -> None:
        if self.transient or not state.sampling.greedy:
            self.offset = 0.0

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        n, accepted = step.drafted, step.main_accepted
        if not self.adapt or n == 0:
            return
        outcomes = rules.verified_outcomes(n, accepted)
        bounds = self.bounds(_draft_probs(step.draft, self.name)[: len(outcomes)]).tolist()
        self.offset = rules.calibrated_offset(self.offset, bounds, outcomes, self.adapt_rate)

    @hookimpl
    def pacer_finish(self, state, result) -> Optional[dict]:
        # the threshold in use, in the config's terms (svip: h = 1 − λ), whichever set it
        return {f"{self.name}_threshold": 1.0 - self.threshold if self.name == "svip" else self.threshold}


# -- confidence ------------------------------------------------------------------------------------
@attrs.define
class ConfidenceConfig:
    # stop after a token with p below it; None = the draft's recommendation, else 0.4 (transformers')
    threshold: Optional[float] = attrs.field(default=None, validator=_optional_unit)
    adapt: bool = False  # re-fit the threshold after every step from (p, accepted) pairs (off: swept)
    fp_cost: float = attrs.field(default=1.0, validator=attrs.validators.ge(0.0))
    fn_cost: float = attrs.field(default=3.0, validator=attrs.validators.ge(0.0))
    min_pairs: int = attrs.field(default=6, validator=attrs.validators.ge(2))
    transient: bool = False  # reset the threshold at every prompt (always under sampling)
    max_tokens: int = attrs.field(default=20, validator=attrs.validators.ge(1))


class Confidence:
    """transformers' ``assistant_confidence_threshold``: stop after a draft token whose own draft
    probability ``q(x)`` is below the threshold.

    With ``adapt``, after every step the (probability, accepted) pairs of the judged tokens are
    recorded and, once there are ``min_pairs`` of them with both outcomes present, the threshold is
    re-fit by ``rules.best_confidence_threshold``. The pairs are cleared at every prompt (transformers
    collects them per ``generate`` call); the fitted threshold is kept under greedy decoding unless
    ``transient``, and reset at every prompt under sampling (so a seed reproduces the output).
    """

    name = "confidence"

    def __init__(self, config: ConfidenceConfig, resources: Optional[Resources] = None):
        self.config = config
        self.initial_threshold = threshold_for(self.name, config.threshold, resources)
        self.threshold = self.initial_threshold
        self.probs: list[float] = []  # q(x) of each judged draft token of this prompt
        self.accepted: list[int] = []  # its outcome: 1 accepted, 0 rejected

    @hookimpl
    def pacer_draft_more(self, state, draft):
        if len(draft) == 0:
            return 1  # nothing drafted yet
        probs = _draft_probs(draft, self.name)  # [n, vocab]
        return judge_new_tokens(
            draft,
            self.config.max_tokens,
            lambda a, b: rules.chosen_probs(probs[a:b], draft.tokens[a:b]),
            self.threshold,
        )

    @hookimpl
    def pacer_start(self, state) -> None:
        self.probs, self.accepted = [], []
        if self.config.transient or not state.sampling.greedy:
            self.threshold = self.initial_threshold

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        n = step.drafted
        if not self.config.adapt or n == 0:
            return
        outcomes = rules.verified_outcomes(n, step.main_accepted)
        m = len(outcomes)
        probs = rules.chosen_probs(_draft_probs(step.draft, self.name)[:m], step.draft.tokens[:m])
        self.probs.extend(probs.tolist())
        self.accepted.extend(outcomes)
        if len(self.probs) >= self.config.min_pairs:
            fitted = rules.best_confidence_threshold(
                self.probs, self.accepted, self.config.fp_cost, self.config.fn_cost
            )
            if fitted is not None:
                self.threshold = fitted

    @hookimpl
    def pacer_finish(self, state, result) -> Optional[dict]:
        return {"confidence_threshold": self.threshold}  # in use: configured, the draft's, or re-fit
