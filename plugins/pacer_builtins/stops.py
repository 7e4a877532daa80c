"""Built-in stop policies: ``fixed`` (vanilla SD) and ``heuristic`` (transformers' schedule)."""

from __future__ import annotations

import attrs

from pacer_core import Component, Resources, Stop, hookimpl


@attrs.define
class FixedConfig:
    gamma: int = attrs.field(default=4, validator=attrs.validators.ge(0))  # draft tokens per step


class Fixed:
    """Draft exactly ``gamma`` tokens per step (fewer only if the drafter runs out or the budget ends)."""

    def __init__(self, config: FixedConfig, resources: Resources):
        self.gamma = config.gamma

    @hookimpl
    def pacer_draft_more(self, state, draft):
        left = self.gamma - len(draft)
        return left if left > 0 else Stop()


@attrs.define
class HeuristicConfig:
    gamma: int = attrs.field(default=4, validator=attrs.validators.ge(1))  # initial draft length
    max_gamma: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    transient: bool = False  # reset gamma at every prompt (transformers' "heuristic_transient"); always under sampling


class Heuristic:
    """transformers' assisted-generation schedule: gamma += 2 after a step whose gamma draft tokens
    were all accepted, else gamma = max(1, gamma - 1). Kept across prompts under greedy decoding
    unless ``transient``; under sampling every generation starts from ``config.gamma``, so a seed
    reproduces its output (the draft length decides how many random numbers a step draws)."""

    def __init__(self, config: HeuristicConfig, resources: Resources):
        self.config = config
        self.gamma = config.gamma

    @hookimpl
    def pacer_start(self, state) -> None:
        if self.config.transient or not state.sampling.greedy:
            self.gamma = self.config.gamma

    @hookimpl
    def pacer_draft_more(self, state, draft):
        left = self.gamma - len(draft)
        return left if left > 0 else Stop()

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        if step.verdict.accepted >= self.gamma:
            self.gamma = min(self.gamma + 2, self.config.max_gamma)
        else:
            self.gamma = max(1, self.gamma - 1)


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component("stop", "fixed", FixedConfig, Fixed, "draft exactly gamma tokens per step"),
        Component(
            "stop",
            "heuristic",
            HeuristicConfig,
            Heuristic,
            "transformers' schedule: +2 after a fully accepted step, else -1",
        ),
    ]
