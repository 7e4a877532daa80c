"""Built-in verifiers: ``greedy`` and ``speculative_sampling`` (lossless for greedy and sampling)."""

from __future__ import annotations

import attrs
import torch

from pacer_core import Component, Resources, Verdict, hookimpl
from pacer_core.acceptance import greedy_verify_branches, speculative_verify
from pacer_core.sampling import logits_to_probs


@attrs.define
class VerifierConfig:
    pass


class Greedy:
    """Accept while the draft equals the target's argmax; branches are verified too."""

    def __init__(self, config: VerifierConfig, resources: Resources):
        pass

    @hookimpl
    def pacer_verify(self, state, draft, target_logits, branch_logits) -> Verdict:
        return greedy_verify_branches(draft.tokens, target_logits, draft.branches, branch_logits)


class SpeculativeSampling:
    """Speculative sampling with the run's temperature/top-k/top-p on target and draft alike;
    greedy verification (branches included) when the temperature is 0."""

    def __init__(self, config: VerifierConfig, resources: Resources):
        self.sampling = resources.sampling

    @hookimpl
    def pacer_verify(self, state, draft, target_logits, branch_logits) -> Verdict:
        if self.sampling.greedy:
            return greedy_verify_branches(draft.tokens, target_logits, draft.branches, branch_logits)
        if draft.branches:
            raise ValueError("speculative_sampling cannot verify candidate branches under sampling")
        target_probs = logits_to_probs(target_logits, self.sampling)  # [n + 1, vocab]
        uniforms = torch.rand(len(draft), generator=state.generator)  # [n]
        return speculative_verify(draft.tokens, draft.draft_probs, target_probs, uniforms, state.generator)


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component("verifier", "greedy", VerifierConfig, Greedy,
                  "greedy verification (sampling.temperature must be 0)", needs={"greedy"}),
        Component("verifier", "speculative_sampling", VerifierConfig, SpeculativeSampling,
                  "speculative sampling; greedy when sampling.temperature is 0"),
    ]
