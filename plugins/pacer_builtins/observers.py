"""Built-in observer ``metrics``: aggregates step records into the result's metrics."""

from __future__ import annotations

from collections import Counter

import attrs

from pacer_core import Component, Resources, hookimpl


@attrs.define
class MetricsConfig:
    pass


class Metrics:
    """steps, drafted/accepted/emitted counts, τ, acceptance rates and time split of one generation."""

    def __init__(self, config: MetricsConfig, resources: Resources):
        self.reset()

    def reset(self) -> None:
        self.steps = self.drafted = self.accepted = self.emitted = 0
        self.draft_s = self.verify_s = self.stop_s = 0.0
        self.drafted_at: Counter[int] = Counter()
        self.accepted_at: Counter[int] = Counter()
        self.draft_lengths: Counter[int] = Counter()
        self.accept_lengths: list[int] = []  # emitted tokens per step
        self.drafted_per_step: list[int] = []
        self.accepted_per_step: list[int] = []

    @hookimpl
    def pacer_start(self, state) -> None:
        self.reset()

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        n, a = step.drafted, step.verdict.accepted
        self.steps += 1
        self.drafted += n
        self.accepted += a
        self.emitted += len(step.emitted)
        self.accept_lengths.append(len(step.emitted))
        self.drafted_per_step.append(n)
        self.accepted_per_step.append(a)
        self.draft_lengths[n] += 1
        for i in range(n):
            self.drafted_at[i] += 1
            self.accepted_at[i] += int(i < a)
        self.draft_s += step.draft_s
        self.verify_s += step.verify_s
        self.stop_s += step.stop_s

    @hookimpl
    def pacer_finish(self, state, result) -> dict:
        positions = range(max(self.drafted_at, default=-1) + 1)
        return {
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "emitted": self.emitted,
            "mean_accepted_length": self.emitted / self.steps if self.steps else 0.0,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "per_position_acceptance": [self.accepted_at[i] / self.drafted_at[i] for i in positions],
            "mean_draft_length": self.drafted / self.steps if self.steps else 0.0,
            "draft_length_histogram": {int(k): v for k, v in sorted(self.draft_lengths.items())},
            "accept_lengths": list(self.accept_lengths),
            "drafted_per_step": list(self.drafted_per_step),
            "accepted_per_step": list(self.accepted_per_step),
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "stop_s": self.stop_s,
        }


@hookimpl
def pacer_components() -> list[Component]:
    return [Component("observer", "metrics", MetricsConfig, Metrics, "per-generation metrics",
                      provides={"metrics"})]
