"""Built-in observers: ``metrics`` aggregates step records into the result's metrics;
``draft_quality`` tallies how often the draft's top-k holds the target's token, per draft position."""

from __future__ import annotations

from typing import List

import attrs
import torch

from pacer_core import Component, Resources, hookimpl
from pacer_core.metrics import step_metrics


@attrs.define
class MetricsConfig:
    pass


class Metrics:
    """steps, drafted/accepted/emitted counts, τ, acceptance per depth, tree nodes per step and the
    time split of one generation. On a tree, a step's drafted count is the tree's depth and its
    accepted count the accepted path's length; ``main_path_per_step`` is the main path's length (the
    tokens the stop policies asked for), shorter than the depth where side nodes hang below the main
    path's tip (Ouroboros' candidate suffixes)."""

    def __init__(self, config: MetricsConfig, resources: Resources):
        self.reset()

    def reset(self) -> None:
        self.draft_s = self.verify_s = self.stop_s = 0.0
        self.accept_lengths: list[int] = []  # emitted tokens per step
        self.drafted_per_step: list[int] = []
        self.main_path_per_step: list[int] = []  # the main path's length (a chain: its length)
        self.accepted_per_step: list[int] = []
        self.nodes_per_step: list[int] = []  # tokens the target verified (tree nodes)
        self.draft_forwards_per_step: list[int] = []  # what a replay charges the drafter (pacer replay)

    @hookimpl
    def pacer_start(self, state) -> None:
        self.reset()

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        self.accept_lengths.append(len(step.emitted))
        self.drafted_per_step.append(step.draft.depth)
        self.main_path_per_step.append(len(step.draft))
        self.accepted_per_step.append(step.verdict.accepted)
        self.nodes_per_step.append(step.draft.num_nodes)
        self.draft_forwards_per_step.append(step.draft_forwards)
        self.draft_s += step.draft_s
        self.verify_s += step.verify_s
        self.stop_s += step.stop_s

    @hookimpl
    def pacer_finish(self, state, result) -> dict:
        return {
            **step_metrics(self.accept_lengths, self.drafted_per_step, self.accepted_per_step, self.nodes_per_step),
            "draft_forwards_per_step": list(self.draft_forwards_per_step),
            "main_path_per_step": list(self.main_path_per_step),
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "stop_s": self.stop_s,
        }


def _ks(instance, attribute, value) -> None:
    if not value or any(k < 1 for k in value) or list(value) != sorted(set(value)):
        raise ValueError(f"ks must be increasing positive integers, e.g. [1, 2, 4, 8], got {value}")


@attrs.define
class DraftQualityConfig:
    ks: List[int] = attrs.field(factory=lambda: [1, 2, 4, 8], validator=_ks)  # top-k sizes tallied
    depth: int = attrs.field(default=8, validator=attrs.validators.ge(1))  # draft positions tallied


def topk_hits(draft_probs: torch.Tensor, targets: torch.Tensor, ks: torch.Tensor) -> torch.Tensor:
    """Whether each row's target token is among the ``ks`` most probable of its draft distribution:
    ``draft_probs`` [n, vocab], ``targets`` [n] int64, ``ks`` [K] int64 → [n, K] bool. The rank counts
    the tokens strictly more probable than the target's (ties go to the target)."""
    chosen = draft_probs.gather(1, targets[:, None])  # [n, 1]
    rank = (draft_probs > chosen).sum(-1)  # [n]
    return rank[:, None] < ks[None, :]  # [n, K]


class DraftQuality:
    """The draft's agreement with the target per draft position, as a draft-quality report reads it.

    At main-path position j of a step whose positions 1 … j−1 were all accepted (the draft was fed
    the target's own tokens so far), the rank of the target's argmax token in the distribution the
    draft chose position j from (``draft_probs``): top-k agreement at position 1 is the share of
    steps whose target token is among the draft's k best; at position j it is conditional on the
    positions before it being accepted. Under greedy decoding this is exactly "position j given
    1 … j−1 right"; under sampling it still counts the target's most likely token. Needs a
    drafter that provides ``draft_probs`` (model drafts; steps without them are not counted). Reads the target's
    argmax, a host read per step: an opt-in observer, not part of ``metrics``.
    """

    def __init__(self, config: DraftQualityConfig, resources: Resources):
        self.ks = torch.tensor(config.ks, dtype=torch.long)
        self.depth = config.depth
        self.reset()

    def reset(self) -> None:
        self.counts = torch.zeros(self.depth, 1 + len(self.ks), dtype=torch.long)  # [position, (judged, hits@k)]

    @hookimpl
    def pacer_start(self, state) -> None:
        self.reset()

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        draft = step.draft
        if len(draft) == 0 or draft.draft_probs is None or step.target_argmax is None:
            return
        judged = min(step.main_accepted + 1, len(draft), self.depth)
        path = draft.path_nodes
        rows = torch.tensor([0] + [path[j] + 1 for j in range(judged - 1)])  # the row predicting each position
        targets = step.target_argmax[rows.to(step.target_argmax.device)].cpu()  # [judged]
        hits = topk_hits(draft.draft_probs[:judged].float().cpu(), targets, self.ks)  # [judged, K]
        self.counts[:judged, 0] += 1
        self.counts[:judged, 1:] += hits.long()

    @hookimpl
    def pacer_finish(self, state, result) -> dict:
        return {"draft_topk": {"k": self.ks.tolist(), "counts": self.counts.tolist()}}


@attrs.define
class TreeLogConfig:
    pass


class TreeLog:
    """Every step's draft tree, for ``pacer replay``'s tree shapes (docs/costs.md#tree-shapes): per
    step that drafted, each node's parent and draft probability ``q(token | parent)`` (0 for a point
    mass), the main path and the accepted path. Log a stack that grows a wide tree and sends every
    node (``tree: {topk: 10, depth: 8, nodes: 512}`` with ``fixed``): under greedy verification a
    smaller shape's accepted path is the logged one's longest prefix among the nodes it sends."""

    def __init__(self, config: TreeLogConfig, resources: Resources):
        self.steps: list[dict] = []

    @hookimpl
    def pacer_start(self, state) -> None:
        self.steps = []

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        draft = step.draft
        if not draft.num_nodes:
            return
        tree = draft.tree
        if tree.token_probs is None:
            q = [0.0] * len(tree)
        else:
            q = tree.token_probs.float().cpu().tolist()
        self.steps.append(
            {
                "parents": tree.parents.tolist(),
                "q": [round(x, 6) for x in q],
                "main": list(draft.path_nodes),
                "path": list(step.verdict.nodes(draft)),
                "forwards": step.draft_forwards,
            }
        )

    @hookimpl
    def pacer_finish(self, state, result) -> dict:
        return {"tree_steps": self.steps}


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component("observer", "metrics", MetricsConfig, Metrics, "per-generation metrics", provides={"metrics"}),
        Component(
            "observer",
            "draft_quality",
            DraftQualityConfig,
            DraftQuality,
            "the draft's top-k agreement with the target per draft position",
            needs={"draft_probs"},
        ),
        Component(
            "observer",
            "tree_log",
            TreeLogConfig,
            TreeLog,
            "every step's draft tree (parents, draft probabilities, main and accepted paths) for "
            "pacer replay's tree shapes",
        ),
    ]
