"""The ``pacer_sd`` entry point of the training-free stop policies: ``entropy``, ``svip``, ``confidence``."""

from __future__ import annotations

from pacer_core import Component, hookimpl

from .policies import Confidence, ConfidenceConfig, EntropyBound, EntropyConfig, SvipConfig


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component(
            "stop",
            "entropy",
            EntropyConfig,
            EntropyBound.from_entropy_config,
            "AdaEDL: stop when 1 - sqrt(gamma * H(q)) < lambda, lambda calibrated online",
            needs={"draft_probs"},
        ),
        Component(
            "stop",
            "svip",
            SvipConfig,
            EntropyBound.from_svip_config,
            "SVIP: stop when sqrt(gamma * H(q)) > h (fixed threshold)",
            needs={"draft_probs"},
        ),
        Component(
            "stop",
            "confidence",
            ConfidenceConfig,
            Confidence,
            "transformers' assistant_confidence_threshold: stop when q(x) < threshold, fitted online",
            needs={"draft_probs"},
        ),
    ]
