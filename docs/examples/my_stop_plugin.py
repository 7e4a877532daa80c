"""A stop policy: stop drafting after a token the draft model itself was unsure of."""

import attrs
import torch

from pacer_core import Component, Resources, Stop, hookimpl


@attrs.define
class ProbFloorConfig:
    floor: float = 0.5  # stop after a draft token whose draft probability is below this
    max_tokens: int = attrs.field(default=16, validator=attrs.validators.ge(1))  # the length bound


class ProbFloor:
    def __init__(self, config: ProbFloorConfig, resources: Resources):
        self.config = config

    @hookimpl
    def pacer_draft_more(self, state, draft):
        n = len(draft)
        if n:  # judge every token drafted so far: a drafter may return several per call
            chosen = draft.draft_probs[torch.arange(n), draft.tokens]  # [n]: each token's draft probability
            unsure = (chosen < self.config.floor).nonzero()
            if len(unsure):
                return Stop(keep=int(unsure[0]) + 1)  # send up to the first unsure token, drop the rest
        if n >= self.config.max_tokens:
            return Stop(keep=self.config.max_tokens)  # the length bound, even if a call overshot it
        return 1  # one token at a time, so each token is checked before the next is drafted


@hookimpl
def pacer_components():
    return [
        Component(
            "stop",
            "prob_floor",
            ProbFloorConfig,
            ProbFloor,
            "stop after a draft token with probability below floor",
            needs={"draft_probs"},
        )
    ]
