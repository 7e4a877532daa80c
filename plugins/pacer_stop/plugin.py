"""The ``pacer_sd`` entry point of PACER's stop policy (``pacer``)."""

from __future__ import annotations

from pacer_core import Component, hookimpl

from .policy import PacerStop, PacerStopConfig


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component(
            "stop",
            "pacer",
            PacerStopConfig,
            PacerStop.from_config,
            "PACER: blockwise pre-verification by M_B (or the draft's confidence); rule paper (threshold) or "
            "throughput (gain vs cost)",
            needs={"draft_hidden"},
        )
    ]
