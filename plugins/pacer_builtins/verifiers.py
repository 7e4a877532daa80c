"""Built-in verifiers: ``greedy``, ``speculative_sampling`` (lossless for greedy and sampling) and
``sample_match`` (keeps what plain sampling would emit: the same seed gives plain decoding's text).

The token a sampling verifier draws at a position uses that position's own randomness
(``pacer_core.sampling.position_noise``: a function of the generation's seed and the position), so
plain decoding, which the ``autoregressive`` drafter runs through the same verifiers, draws each
position from the same noise whatever stack decodes.
"""

from __future__ import annotations

import attrs
import torch

from pacer_core import Component, Resources, Verdict, hookimpl
from pacer_core.acceptance import greedy_verify, sample_match_verify, speculative_verify
from pacer_core.sampling import logits_to_probs, position_noise


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
        seed, start, vocab = state.generator.initial_seed(), len(state.tokens), target_probs.shape[-1]
        return speculative_verify(
            tree.tokens,
            tree.draft_probs,
            target_probs,
            uniforms,
            state.generator,
            parents,
            tree.sampled,
            next_noise=lambda depth: position_noise(seed, start + depth, vocab),
        )


class SampleMatch:
    """Keep draft tokens while they equal the token the target's own sampling draws at their position
    (that position's noise, as plain decoding draws it): with the same seed the output is plain
    sampling's, token for token, whatever the drafter and stop. Accepts less often than
    ``speculative_sampling`` (a draft token must match the one draw, not the distribution);
    greedy verification at temperature 0."""

    def __init__(self, config: VerifierConfig, resources: Resources):
        self.sampling = resources.sampling

    @hookimpl
    def pacer_verify(self, state, draft, target_logits) -> Verdict:
        tree = draft.tree
        parents = None if tree.is_chain else tree.parents
        if self.sampling.greedy:
            return greedy_verify(tree.tokens, target_logits, parents)
        target_probs = logits_to_probs(target_logits, self.sampling).cpu()  # [n + 1, vocab]
        seed, start, vocab = state.generator.initial_seed(), len(state.tokens), target_probs.shape[-1]
        depth = int(tree.depths.max()) if len(tree) else 0
        noise = torch.stack([position_noise(seed, start + d, vocab) for d in range(depth + 1)])  # [depth + 1, vocab]
        return sample_match_verify(tree.tokens, target_probs, noise, parents)


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component(
            "verifier",
            "greedy",
            VerifierConfig,
            Greedy,
            "greedy verification (sampling.temperature must be 0)",
            needs={"greedy"},
        ),
        Component(
            "verifier",
            "speculative_sampling",
            VerifierConfig,
            SpeculativeSampling,
            "speculative sampling; greedy when sampling.temperature is 0",
        ),
        Component(
            "verifier",
            "sample_match",
            VerifierConfig,
            SampleMatch,
            "keeps draft tokens equal to the target's own draw there: sampled output = plain sampling's "
            "with the same seed; greedy when sampling.temperature is 0",
        ),
    ]
