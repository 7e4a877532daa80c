"""Skipping drafting for a step when it does not pay: the engine's draft gate (docs/costs.md#skipping-drafting).

A cost-aware stack (a tree drafter with ``nodes: auto``, the ``pacer`` stop's throughput rule) prices
its steps with a cost model (``pacer_core.cost_profiles.CostModel``, declared through the
``pacer_step_costs`` hook). Before each step, before any draft hook runs and so before any draft
forward is paid, the gate decides whether the step drafts or decodes plainly (an empty draft: the
target scores the pending token alone, as in a prompt's first step when a drafter has nothing yet).

The rule compares two rates: drafting's, the tokens a drafted step of this generation emitted
(a running mean) over the seconds such a step costs under the cost model (a running mean of each
step's price: its draft forwards, its nodes and their verification), and plain decoding's, one token
per plain step. When drafting's is below ``margin`` × plain decoding's, the gate skips the next
``wait`` steps, then drafts one step again (a probe) so the estimate can recover where the text
becomes easier: ``wait`` starts at 1 and doubles after every probe that does not pay, up to
``max_wait``, and falls back to 0 once drafting pays again.

Skipping never changes what is emitted: a plain step is the target's own decoding (greedy, or a draw
from its distribution), and the decision is a function of earlier steps only (their emitted tokens,
draft forwards and nodes: what the generation has accepted so far), never of the current step's
draft, and never of a clock, so a seed reproduces a sampled generation.

The rules are pure functions (``drafting_pays``, ``drafted_step_seconds``, ``next_wait``,
``running_mean``); ``DraftGate`` holds one generation's state and calls them.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import attrs

from .cost_profiles import CostModel
from .errors import InputError

MAX_WAIT = 1 << 16  # steps skipped between probes, at most (far beyond any generation's budget)


def _margin(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 100.0:
        raise ValueError(
            f"skip_drafting.margin must be a number in (0, 100] (1: skip when drafting is expected to "
            f"be slower than plain decoding; 1.05: unless 5% faster), got {value!r}"
        )


def _decay(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        raise ValueError(
            f"skip_drafting.decay must be a number in (0, 1] (the weight of each drafted step in the "
            f"running estimate), got {value!r}"
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

    # false (the default: measured slower than drafting every step, docs/costs.md#skipping-drafting):
    # never skip; null: on for a cost-aware stack (some component declares a cost model), off
    # otherwise; true: on, refused in one line when no component declares one
    enabled: Optional[bool] = False
    margin: float = attrs.field(default=1.0, validator=_margin)  # draft while its rate >= margin × plain's
    decay: float = attrs.field(default=0.25, validator=_decay)  # weight of the latest drafted step
    max_wait: int = attrs.field(default=32, validator=_max_wait)  # steps skipped between probes, at most


# -- the rules ----------------------------------------------------------------------------------------
def drafting_pays(tokens: float, seconds: float, plain_seconds: float, margin: float = 1.0) -> bool:
    """Whether drafting's rate, ``tokens`` emitted per drafted step of ``seconds``, reaches ``margin``
    times plain decoding's, one token per ``plain_seconds``."""
    return tokens * plain_seconds >= margin * seconds


def drafted_step_seconds(cost: CostModel, forwards: int, nodes: int, chain: bool) -> float:
    """A drafted step's seconds under ``cost``: ``forwards`` draft forwards, then one target forward
    over the pending token and the ``nodes`` draft nodes sent (a causal chain, or a tree-masked
    forward with a tree step's host time by nodes)."""
    if chain:
        return cost.step(forwards, sent=nodes)
    return cost.step(forwards, nodes=nodes)


def next_wait(wait: int, pays: bool, longest: int) -> int:
    """Steps to skip after a drafted step: none when drafting pays; else 1 after a paying step,
    twice the last wait after a probe that did not pay, at most ``longest``."""
    return 0 if pays else min(max(1, 2 * wait), longest)


def running_mean(mean: float, value: float, count: int, decay: float) -> float:
    """An exponential moving average with weight ``decay``, a plain mean over its first 1 / decay
    values (``count``: values seen, this one included): the first value is taken whole."""
    return mean + max(decay, 1.0 / count) * (value - mean)


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
        self.tokens = self.seconds = 0.0  # running means over the drafted steps: emitted, priced seconds
        self.steps = 0  # drafted steps learned from
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
        if not self._drafting or step.index == 0 or (step.draft_forwards == 0 and step.draft.num_nodes == 0):
            return
        seconds = drafted_step_seconds(self.cost, step.draft_forwards, step.draft.num_nodes, step.draft.tree.is_chain)
        self.steps += 1
        self.tokens = running_mean(self.tokens, len(step.emitted), self.steps, self.config.decay)
        self.seconds = running_mean(self.seconds, seconds, self.steps, self.config.decay)
        pays = drafting_pays(self.tokens, self.seconds, self.plain_seconds, self.config.margin)
        self.wait = next_wait(self.wait, pays, self.config.max_wait)
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
