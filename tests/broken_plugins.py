"""Deliberately broken components for ``pacer check`` (loaded with ``--plugin tests/broken_plugins.py``):
each breaks one thing a lossless stack must keep, and the check must fail naming the case."""

from __future__ import annotations

import attrs
import torch

from pacer_core import Component, DraftBlock, SideNodes, Stop, Verdict, hookimpl
from pacer_core.acceptance import greedy_verify, residual_distribution
from pacer_core.sampling import choose, logits_to_probs, sample


@attrs.define
class NoOptions:
    pass


class AcceptOnQ:
    """WRONG: accepts draft token x with probability q(x) instead of min(1, p(x) / q(x))."""

    def __init__(self, config, resources):
        self.sampling = resources.sampling

    @hookimpl
    def pacer_verify(self, state, draft, target_logits):
        tokens = draft.tree.tokens
        if self.sampling.greedy or draft.draft_probs is None:
            return greedy_verify(tokens, target_logits)
        p = logits_to_probs(target_logits, self.sampling)  # [n + 1, vocab]
        for i, x in enumerate(tokens.tolist()):
            q = draft.draft_probs[i]
            if float(torch.rand(1, generator=state.generator)) >= float(q[x]):
                return Verdict(i, int(sample(residual_distribution(p[i], q), state.generator)), "recovered")
        return Verdict(len(tokens), int(sample(p[len(tokens)], state.generator)), "bonus")


class NoRollback:
    """WRONG: a draft-model drafter that feeds only what its cache lacks, never cropping the rejected
    tokens it drafted (its drafts then continue a text that was never emitted)."""

    def __init__(self, config, resources):
        self.model, self.sampling = resources.draft, resources.sampling

    @hookimpl
    def pacer_start(self, state):
        self.model.reset()

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens):
        context = state.tokens + draft.tokens.tolist()
        feed = context[len(self.model.cached_tokens) :] or context[-1:]
        tokens, probs = [], []
        for _ in range(num_tokens):
            logits = self.model.forward(feed, logits_from=len(feed) - 1).logits[-1]
            token, token_probs = choose(logits, self.sampling, state.generator)
            tokens.append(token)
            probs.append(torch.softmax(logits, -1) if token_probs is None else token_probs)
            feed = [token]
        return DraftBlock(torch.tensor(tokens), torch.stack(probs), forwards=len(tokens))


class OneMore:
    """WRONG: a stop that, from two drafted tokens on, keeps one token more than was drafted."""

    def __init__(self, config, resources):
        pass

    @hookimpl
    def pacer_draft_more(self, state, draft):
        return Stop(keep=len(draft) + 1) if len(draft) >= 2 else None


class WrongParent:
    """WRONG: a tree drafter that draws two root children a1, a2 from q(root) and a child c of a2
    from q(a2), but files c under a1 (its parent and its draft distribution row)."""

    def __init__(self, config, resources):
        self.model, self.sampling = resources.draft, resources.sampling

    def _q(self, context):  # [vocab], the draft's distribution after context (fresh cache)
        self.model.reset()
        logits = self.model.forward(context, logits_from=len(context) - 1).logits[-1]
        return torch.softmax(logits, -1) if self.sampling.greedy else logits_to_probs(logits, self.sampling)

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens):
        if len(draft):
            return None
        q0 = self._q(state.tokens)
        if self.sampling.greedy:
            a1, a2 = torch.topk(q0, 2).indices.tolist()
        else:
            a1, a2 = (int(sample(q0, state.generator)) for _ in range(2))
        q2 = self._q(state.tokens + [a2])
        c = int(q2.argmax()) if self.sampling.greedy else int(sample(q2, state.generator))
        q1 = self._q(state.tokens + [a1])
        side = SideNodes(torch.tensor([a2, c]), torch.tensor([-1, 0]), torch.stack([q0, q1]))
        return DraftBlock(torch.tensor([a1]), q0[None], sampled=not self.sampling.greedy, side=side, forwards=3)


@attrs.define
class ReturnsConfig:
    value: str = "class"  # which wrong value: a key of Returns.VALUES


class Returns:
    """WRONG: a stop returning what pacer_draft_more may not (the class Stop, a float, 0, -5, a list),
    from the second token on, or raising (``raise``) or exiting (``exit``) there."""

    VALUES = {"class": Stop, "float": 1.0, "zero": 0, "negative": -5, "list": [1, 2], "keep": Stop(keep=1.5)}

    def __init__(self, config, resources):
        self.value = config.value

    @hookimpl
    def pacer_draft_more(self, state, draft):
        if len(draft) < 1:
            return 1
        if self.value == "raise":
            raise ValueError("a bug in the stop")
        if self.value == "exit":
            raise SystemExit(0)
        return self.VALUES[self.value]


class ListProposer:
    """WRONG: a drafter returning a list of token ids instead of a DraftBlock."""

    def __init__(self, config, resources):
        pass

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens):
        return [state.tokens[-1]] * num_tokens


@attrs.define
class DriftingConfig:
    floor: float = 0.01
    max_tokens: int = 4


class Drifting:
    """WRONG under sampling: a probability-floor stop whose floor creeps up by 1e-9 every generation,
    too little to change one decision on any model within a check, but state carried across
    generations all the same (a seed no longer reproduces its output once it has crept far enough)."""

    def __init__(self, config, resources):
        self.config, self.floor = config, config.floor

    @hookimpl
    def pacer_start(self, state):
        self.floor += 1e-9

    @hookimpl
    def pacer_draft_more(self, state, draft):
        n = len(draft)
        if n >= self.config.max_tokens or n and draft.draft_probs[n - 1, draft.tokens[n - 1]] < self.floor:
            return Stop()
        return 1


@attrs.define
class ScribbleConfig:
    target: str = "state"  # "state": overwrites a committed token; "draft": a draft token


class Scribble:
    """WRONG: a stop that writes into what only the engine writes: ``state.tokens`` or the draft."""

    def __init__(self, config, resources):
        self.target = config.target

    @hookimpl
    def pacer_draft_more(self, state, draft):
        if self.target == "state":
            state.tokens[-1] = 0
        elif len(draft):
            draft.tokens[-1] = 0
        return 2


@hookimpl
def pacer_components():
    return [
        Component("verifier", "accept_on_q", NoOptions, AcceptOnQ, "WRONG: accepts with q(x)"),
        Component(
            "drafter",
            "no_rollback",
            NoOptions,
            NoRollback,
            "WRONG: never crops its draft cache",
            needs={"draft_model"},
            provides={"draft_probs"},
        ),
        Component("stop", "one_more", NoOptions, OneMore, "WRONG: keeps one token more than drafted"),
        Component(
            "drafter",
            "wrong_parent",
            NoOptions,
            WrongParent,
            "WRONG: files a node under the wrong parent",
            needs={"draft_model"},
            provides={"draft_probs"},
        ),
        Component("stop", "returns", ReturnsConfig, Returns, "WRONG: returns a value pacer_draft_more may not"),
        Component("drafter", "list_proposer", NoOptions, ListProposer, "WRONG: proposes a list, not a DraftBlock"),
        Component(
            "stop",
            "drifting",
            DriftingConfig,
            Drifting,
            "WRONG: its floor drifts from one generation on",
            needs={"draft_probs"},
        ),
        Component("stop", "scribble", ScribbleConfig, Scribble, "WRONG: writes into state.tokens or the draft"),
    ]
