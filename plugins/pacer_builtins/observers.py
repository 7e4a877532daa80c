"""Built-in observer ``metrics``: aggregates step records into the result's metrics."""

from __future__ import annotations

import attrs

from pacer_core import Component, Resources, hookimpl
from pacer_core.metrics import step_metrics


@attrs.define
class MetricsConfig:
    pass


class Metrics:
    """steps, drafted/accepted/emitted counts, τ, acceptance per depth, tree nodes per step and the
    time split of one generation. On a tree, a step's drafted count is the tree's depth and its
    accepted count the accepted path's length."""

    def __init__(self, config: MetricsConfig, resources: Resources):
        self.reset()

    def reset(self) -> None:
        self.draft_s = self.verify_s = self.stop_s = 0.0
        self.accept_lengths: list[int] = []  # emitted tokens per step
        self.drafted_per_step: list[int] = []
        self.accepted_per_step: list[int] = []
        self.nodes_per_step: list[int] = []  # tokens the target verified (tree nodes)

    @hookimpl
    def pacer_start(self, state) -> None:
        self.reset()

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        self.accept_lengths.append(len(step.emitted))
        self.drafted_per_step.append(step.draft.depth)
        self.accepted_per_step.append(step.verdict.accepted)
        self.nodes_per_step.append(step.draft.num_nodes)
        self.draft_s += step.draft_s
        self.verify_s += step.verify_s
        self.stop_s += step.stop_s

    @hookimpl
    def pacer_finish(self, state, result) -> dict:
        return {
            **step_metrics(self.accept_lengths, self.drafted_per_step, self.accepted_per_step,
                           self.nodes_per_step),
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "stop_s": self.stop_s,
        }


@hookimpl
def pacer_components() -> list[Component]:
    return [Component("observer", "metrics", MetricsConfig, Metrics, "per-generation metrics",
                      provides={"metrics"})]
