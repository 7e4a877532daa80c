"""A stop policy: stop drafting after a token the draft model itself was unsure of."""

import attrs

from pacer_core import Component, Resources, Stop, hookimpl


@attrs.define
class ProbFloorConfig:
    floor: float = 0.5  # stop after a draft token whose draft probability is below this
    max_tokens: int = attrs.field(default=16, validator=attrs.validators.ge(1))


class ProbFloor:
    def __init__(self, config: ProbFloorConfig, resources: Resources):
        self.config = config

    @hookimpl
    def pacer_draft_more(self, state, draft):
        n = len(draft)
        if n >= self.config.max_tokens:
            return Stop()
        if n and draft.draft_probs[n - 1, draft.tokens[n - 1]] < self.config.floor:
            return Stop()
        return 1  # one token at a time, so each token is checked before the next is drafted


@hookimpl
def pacer_components():
    return [Component("stop", "prob_floor", ProbFloorConfig, ProbFloor,
                      "stop after a draft token with probability below floor",
                      needs={"draft_probs"})]
