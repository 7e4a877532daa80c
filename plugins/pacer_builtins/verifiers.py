"""Built-in verifiers: ``greedy`` and ``speculative_sampling`` (lossless for greedy and sampling)."""

from __future__ import annotations

import attrs
import torch

from pacer_core import Component, Resources, Verdict, hookimpl
from pacer_core.acceptance import greedy_verify, speculative_verify
from pacer_core.sampling import logits_to_probs


@attrs.define
class VerifierConfig:
    pass


class Greedy:
    """Accept the longest path of the draft tree that follows the target's argmax (a chain's prefix)."""

    def __init__(self, config: VerifierConfig, resources: Resources):
        pass

    @hookimpl
    def pacer_verify(self, state, draft, target_logits) -> Verdict:
        tree = draft.tree
        return greedy_verify(tree.tokens, target_logits, None if tree.is_chain else tree.parents)


class SpeculativeSampling:
    """Speculative sampling with the run's temperature/top-k/top-p on target and draft alike, on
    chains and trees (multi-candidate rule at each node); greedy verification at temperature 0."""

    def __init__(self, config: VerifierConfig, resources: Resources):
        self.sampling = resources.sampling

    @hookimpl
    def pacer_verify(self, state, draft, target_logits) -> Verdict:
        tree = draft.tree
        parents = None if tree.is_chain else tree.parents
        if self.sampling.greedy:
            return greedy_verify(tree.tokens, target_logits, parents)
        # [n + 1, vocab], computed where the logits are, read on the host once (the walk is sequential)
        target_probs = logits_to_probs(target_logits, self.sampling).cpu()
        uniforms = torch.rand(len(tree), generator=state.generator)  # [n], one per node
        return speculative_verify(tree.tokens, tree.draft_probs, target_probs, uniforms, state.generator,
                                  parents, tree.sampled)


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component("verifier", "greedy", VerifierConfig, Greedy,
                  "greedy verification (sampling.temperature must be 0)", needs={"greedy"}),
        Component("verifier", "speculative_sampling", VerifierConfig, SpeculativeSampling,
                  "speculative sampling; greedy when sampling.temperature is 0"),
    ]
