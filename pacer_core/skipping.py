"""Skipping drafting for a step when it does not pay: the engine's draft gate (docs/costs.md#skipping-drafting).

A cost-aware stack (a tree drafter with ``nodes: auto``, the ``pacer`` stop's throughput rule) prices
its steps with a cost model (``pacer_core.cost_profiles.CostModel``, declared through the
``pacer_step_costs`` hook). Before each step, before any draft hook runs and so before any draft
forward is paid, the gate decides whether the step drafts or decodes plainly (an empty draft: the
target scores the pending token alone, as in a prompt's first step when a drafter has nothing yet).

The rule prices each drafted step of this generation against plain decoding: its **gain** is the
tokens it emitted minus the tokens plain decoding would have emitted in the seconds it cost under the
cost model (its draft forwards, its nodes and their verification; ``margin`` above 1 asks drafting to
be that much faster). Over the latest ``window`` drafted steps, the gate skips only when drafting is
confidently losing: the mean gain is below 0 by more than ``confidence`` standard errors. One
rejected step is noise; a run of them on text the draft cannot write is evidence. It then skips the
next ``wait`` steps and drafts one step again (a probe) so the estimate can recover where the text
becomes easier: ``wait`` starts at 1 and doubles after every probe that leaves drafting losing, up
to ``max_wait``, and falls back to 0 once it is not.

Skipping never changes what is emitted: a plain step is the target's own decoding (greedy, or a draw
from its distribution), and the decision is a function of earlier steps only (their emitted tokens,
draft forwards and nodes: what the generation has accepted so far), never of the current step's
draft, and never of a clock, so a seed reproduces a sampled generation.

The rules are pure functions (``step_gain``, ``drafting_loses``, ``drafted``, ``drafted_step_seconds``,
``next_wait``); ``DraftGate`` holds one generation's state and calls them (``pacer replay --gate``
replays the same gate over a recorded run).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Optional, Sequence

import attrs

from .cost_profiles import CostModel
from .errors import InputError

MAX_WAIT = 1 << 16  # steps skipped between probes, at most (far beyond any generation's budget)
MAX_WINDOW = 4096  # drafted steps the rule reads, at most


def _margin(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 100.0:
        raise ValueError(
            f"skip_drafting.margin must be a number in (0, 100] (1: skip when drafting is expected to "
            f"be slower than plain decoding; 1.05: unless 5% faster), got {value!r}"
        )


WINDOW_KEYS = {"window": "the latest drafted steps the rule reads", "min_steps": "drafted steps before a verdict"}


def _window(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WINDOW:
        raise ValueError(
            f"skip_drafting.{attribute.name} must be a whole number of drafted steps in 1..{MAX_WINDOW} "
            f"({WINDOW_KEYS[attribute.name]}), got {value!r}"
        )


def _confidence(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 10.0:
        raise ValueError(
            f"skip_drafting.confidence must be a number in [0, 10] (standard errors by which the mean "
            f"gain must be below 0 before a step is skipped; 0: the mean alone), got {value!r}"
        )


def _max_wait(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WAIT:
        raise ValueError(
            f"skip_drafting.max_wait must be a whole number of steps in 1..{MAX_WAIT} (the most steps "
            f"skipped before drafting is tried again), got {value!r}"
        )


@attrs.define
class SkipConfig:
    """``generation.skip_drafting``: when a step decodes plainly instead of drafting."""

    # null (the default): on for a cost-aware stack (some component declares a cost model), off
    # otherwise; false: never skip; true: on, refused in one line when no component declares one
    # (measured on writing, code and math prompts: docs/costs.md#never-slower-per-prompt)
    enabled: Optional[bool] = None
    margin: float = attrs.field(default=1.0, validator=_margin)  # plain decoding's rate, times this, to beat
    window: int = attrs.field(default=32, validator=_window)  # the latest drafted steps the rule reads
    # skip when the window's mean gain is below 0 by more than this many standard errors
    confidence: float = attrs.field(default=1.0, validator=_confidence)
    min_steps: int = attrs.field(default=4, validator=_window)  # drafted steps the rule needs before a verdict
    max_wait: int = attrs.field(default=32, validator=_max_wait)  # steps skipped between probes, at most

    def __attrs_post_init__(self) -> None:
        if self.min_steps > self.window:
            raise ValueError(
                f"skip_drafting.min_steps={self.min_steps} exceeds skip_drafting.window={self.window}: the "
                "rule could never find drafting losing; give min_steps <= window"
            )


# -- the rules ----------------------------------------------------------------------------------------
def step_gain(tokens: int, seconds: float, plain_seconds: float, margin: float = 1.0) -> float:
    """A drafted step's gain in tokens: the ``tokens`` it emitted minus those plain decoding (one per
    ``plain_seconds``, asked to be ``margin`` times faster) would have emitted in its ``seconds``."""
    return tokens - margin * seconds / plain_seconds


def drafting_loses(gains: Sequence[float], confidence: float, min_steps: int = 4) -> bool:
    """Whether drafting is confidently slower than plain decoding: at least ``min_steps`` gains whose
    mean is below 0 by more than ``confidence`` standard errors (sample standard deviation / √n; a
    single gain has no spread)."""
    n = len(gains)
    if n < max(1, min_steps):
        return False
    mean = sum(gains) / n
    spread = math.sqrt(sum((g - mean) ** 2 for g in gains) / (n - 1)) if n > 1 else 0.0
    return mean + confidence * spread / math.sqrt(n) < 0.0


def drafted(forwards: int, nodes: int) -> bool:
    """Whether a step drafted: one with no draft forward and no node sent (a drafter without target
    states yet) teaches the gate nothing."""
    return forwards > 0 or nodes > 0


def drafted_step_seconds(cost: CostModel, forwards: int, nodes: int, chain: bool) -> float:
    """A drafted step's seconds under ``cost``: ``forwards`` draft forwards (each ``draft_forward_s``,
    a block drafter's whole block), then one target forward over the pending token and the ``nodes``
    draft nodes sent (a causal chain, or a tree-masked forward with a tree step's host time by nodes)."""
    drafting = forwards * cost.draft_forward_s
    return drafting + (cost.step(0, sent=nodes) if chain else cost.step(0, nodes=nodes))


def next_wait(wait: int, loses: bool, longest: int) -> int:
    """Steps to skip after a drafted step: none unless drafting loses; else 1 after drafting every
    step, twice the last wait after a probe that leaves it losing, at most ``longest``."""
    return min(max(1, 2 * wait), longest) if loses else 0


# -- the gate -----------------------------------------------------------------------------------------
class DraftGate:
    """One engine's draft gate: ``drafts()`` before a step (False: decode it plainly), ``observe(step)``
    after it. State lasts one generation (``restart``)."""

    def __init__(self, cost: CostModel, config: SkipConfig):
        self.cost, self.config = cost, config
        self.plain_seconds = cost.plain_step()
        self.restart()

    def restart(self) -> None:
        """A new generation: nothing learned, drafting on."""
        self.gains: deque[float] = deque(maxlen=self.config.window)  # the latest drafted steps' gains
        self.wait = 0  # the current back-off
        self.skip_left = 0  # steps still to skip before the next probe
        self.skipped = 0  # steps decoded plainly by the gate in this generation
        self._drafting = True

    def drafts(self) -> bool:
        """Whether the coming step drafts: decided from earlier steps only (no draft exists yet)."""
        self._drafting = self.skip_left == 0
        if not self._drafting:
            self.skip_left -= 1
            self.skipped += 1
        return self._drafting

    def observe(self, step: Any) -> None:
        """Learn from a committed step (a ``StepRecord``) that drafted: its emitted tokens against its
        price. The prefill (step 0, priced by the prompt's forward) and steps in which nothing was
        drafted (a drafter without target states yet) teach nothing."""
        if not self._drafting or step.index == 0 or not drafted(step.draft_forwards, step.draft.num_nodes):
            return
        seconds = drafted_step_seconds(self.cost, step.draft_forwards, step.draft.num_nodes, step.draft.tree.is_chain)
        self.learn(len(step.emitted), seconds)

    def learn(self, tokens: int, seconds: float) -> None:
        """A drafted step that emitted ``tokens`` in ``seconds``: its gain joins the window, and the
        back-off follows (``pacer replay --gate`` calls this with the replay's own step prices)."""
        self.gains.append(step_gain(tokens, seconds, self.plain_seconds, self.config.margin))
        loses = drafting_loses(self.gains, self.config.confidence, self.config.min_steps)
        self.wait = next_wait(self.wait, loses, self.config.max_wait)
        self.skip_left = self.wait


def draft_gate(config: SkipConfig, costs: Sequence[Optional[CostModel]]) -> Optional[DraftGate]:
    """The engine's gate: priced by the first cost model ``costs`` gives (the components' answers to
    ``pacer_step_costs``, in stack order), or None when skipping is off; ``InputError`` when
    ``config.enabled`` is true and no component gives one."""
    given = [c for c in costs if c is not None]
    if config.enabled is False or (config.enabled is None and not given):
        return None
    if not given:
        raise InputError(
            "generation.skip_drafting.enabled=true needs a cost-aware stack (a tree drafter with "
            "nodes: auto, or the pacer stop with rule: throughput): use one, or leave it null"
        )
    return DraftGate(given[0], config)
