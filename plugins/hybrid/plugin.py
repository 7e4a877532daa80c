"""The ``hybrid`` drafter: several draft sources merged into one token tree per step.

``members`` are drafter entries configured as usual. The **first** member is the primary: its
tokens form the draft's main path (what stop policies judge) and it grows the tree level by level
as it would alone (``eagle`` or ``draft_model`` with ``tree``, or a chain). At the first level of
each step every other member proposes a continuation of the committed text (its main tokens and
its own branches, each read as a phrase), which is merged into the tree as side nodes: a phrase
walks down through existing nodes carrying its tokens and adds the rest (``pacer_core.trees.
merge_phrases``), in member order, up to ``nodes`` nodes per step. Model-free members' tokens are
point masses for the verifier, so the tree stays lossless under sampling. When the primary has
nothing to propose (``eagle`` before the target has produced a feature, i.e. step 0, whose
forward prefills the prompt), the step decodes plainly, so stop policies always judge the
primary's tokens.
At most one member may use the draft model (its cache is the member's). ``hybrid_accepted_<member>``
metrics count the accepted tokens each source contributed.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from typing import Any, Optional

import attrs
import torch

from pacer_core import Component, Draft, DraftBlock, InputError, Resources, SideNodes, hookimpl
from pacer_core.trees import merge_phrases


@attrs.define
class HybridConfig:
    members: list[Any] = attrs.field(factory=list)  # drafter entries; the first gives the main path
    nodes: int = attrs.field(default=32, validator=attrs.validators.ge(1))  # tree nodes per step at most
    max_phrase: int = attrs.field(default=8, validator=attrs.validators.ge(1))  # tokens per member phrase


def _call(plugin: Any, hook: str, **kwargs: Any) -> Any:
    """Call a member's hook implementation with the arguments it declares (as pluggy would)."""
    method = getattr(plugin, hook, None)
    if method is None or not hasattr(method, "pacer_sd_impl"):
        return None
    accepted = _parameters(getattr(method, "__func__", method))
    return method(**{k: v for k, v in kwargs.items() if k in accepted})


@functools.lru_cache(maxsize=None)
def _parameters(function: Any) -> frozenset[str]:
    """The argument names a hook implementation declares (read once per function, not per call)."""
    return frozenset(inspect.signature(function).parameters)


def _phrases(block: DraftBlock) -> list[list[int]]:
    """A member's proposal read as phrases from the root: its main tokens, then each root path to a
    leaf of its side nodes."""
    tree = Draft((block,)).tree
    main = block.tokens.tolist()
    leaves = [i for i in range(len(tree)) if not tree.children[i] and i >= len(block)]
    return [main] + [[int(tree.tokens[j]) for j in tree.path_to(i)] for i in leaves]


class Hybrid:
    """Merges its members' proposals into one token tree (see the module)."""

    def __init__(self, config: HybridConfig, resources: Resources):
        self.config = config
        self.names: list[str] = []
        self.members: list[Any] = []
        seen: Counter[str] = Counter()
        for member in config.members:  # ResolvedComponents (the engine resolves a composite's members)
            self.members.append(member.component.factory(member.config, resources))
            seen[member.component.name] += 1
            name = member.component.name
            self.names.append(name if seen[name] == 1 else f"{name}{seen[name]}")
        users = [m.component.name for m in config.members if "draft_model" in m.component.needs]
        if len(users) > 1:
            raise InputError(f"hybrid: at most one member may use the draft model, got {', '.join(users)}; "
                             "keep one of them")
        self.draft_identity = getattr(self.members[0], "draft_identity", None)
        # stop policies judge the primary's tokens, so they take its draft's recommended thresholds
        self.stop_thresholds = dict(getattr(self.members[0], "stop_thresholds", None) or {})
        # the target states the members read: the inputs of some layers (EAGLE-3) or the last layer's
        readers = [(m.component.name, getattr(p, "target_layers", None))
                   for m, p in zip(config.members, self.members) if "target_hidden" in m.component.needs]
        if len({layers for _, layers in readers}) > 1:
            raise InputError("hybrid: members read different target hidden states ("
                             + ", ".join(f"{name}: {list(layers) if layers else 'last layer'}" for name, layers in readers)
                             + "); keep members that read the same ones")
        self.target_layers = readers[0][1] if readers else None  # the engine asks the target for these
        self.accepted: Counter[str] = Counter()
        self._sources: dict[tuple[int, ...], str] = {}  # root path of a merged node -> its member

    # -- hooks forwarded to the members ----------------------------------------------------------
    @hookimpl
    def pacer_start(self, state) -> None:
        self.accepted = Counter()
        for member in self.members:
            _call(member, "pacer_start", state=state)

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        tree = step.draft.tree
        path: tuple[int, ...] = ()
        for node in step.verdict.nodes(step.draft)[: max(0, len(step.emitted) - 1)]:
            path += (int(tree.tokens[node]),)
            self.accepted[self._sources.get(path, self.names[0])] += 1
        for member in self.members:
            _call(member, "pacer_observe_step", state=state, step=step)

    @hookimpl
    def pacer_finish(self, state, result) -> dict:
        metrics: dict[str, Any] = {f"hybrid_accepted_{name}": self.accepted[name] for name in self.names}
        for member in self.members:
            extra = _call(member, "pacer_finish", state=state, result=result)
            if extra:
                metrics.update(extra)
        return metrics

    @hookimpl
    def pacer_select_nodes(self, state, draft) -> Optional[list[int]]:
        """The primary's choice (a tree sends its best nodes; the others' phrases are all kept)."""
        return _call(self.members[0], "pacer_select_nodes", state=state, draft=draft)

    # -- drafting ----------------------------------------------------------------------------------
    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        if draft.num_nodes == 0:
            self._sources = {}
        primary = _call(self.members[0], "pacer_propose", state=state, draft=draft, num_tokens=num_tokens)
        if primary is None or len(primary) == 0:
            return None
        if draft.num_nodes:
            return primary  # later levels: the primary alone
        proposals = []
        for name, member in zip(self.names[1:], self.members[1:]):
            block = _call(member, "pacer_propose", state=state, draft=Draft(), num_tokens=self.config.max_phrase)
            if block is not None and len(block):
                proposals.append((name, block))
        return self._merge(draft, primary, proposals)

    def _merge(self, draft: Draft, primary: DraftBlock, proposals: list[tuple[str, DraftBlock]]) -> DraftBlock:
        """``primary`` with every other proposal merged in as side nodes, within the node budget."""
        tree = Draft(draft.blocks + (primary,)).tree
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        side = primary.side
        if side is not None and (primary.sampled if side.sampled is None else side.sampled):
            return primary  # sampled side nodes cannot share a block with point masses: keep them alone
        new_tokens: list[int] = []
        new_parents: list[int] = []
        forwards = primary.forwards
        for name, block in proposals:
            forwards += block.forwards
            first = len(tokens) + len(new_tokens)
            budget = self.config.nodes - first
            if budget <= 0:
                break
            phrases = [p[: self.config.max_phrase] for p in _phrases(block)]
            added, added_parents, paths = merge_phrases(tokens + new_tokens, parents + new_parents, phrases,
                                                        first, budget)
            for phrase, path in zip(phrases, paths):  # phrases start at the root: a node's root path
                for depth, node in enumerate(path, start=1):  # is its phrase's prefix
                    if node >= first:
                        self._sources.setdefault(tuple(phrase[:depth]), name)
            new_tokens += added
            new_parents += added_parents
        if not new_tokens:
            return attrs.evolve(primary, forwards=forwards)
        vocab = None if primary.draft_probs is None else primary.draft_probs.shape[1]
        old_tokens = side.tokens if side is not None else torch.empty(0, dtype=torch.long)
        old_parents = side.parents if side is not None else torch.empty(0, dtype=torch.long)
        probs = None
        if side is not None and side.draft_probs is not None:  # point masses: zero rows, never read
            probs = torch.cat([side.draft_probs, torch.zeros(len(new_tokens), vocab)])
        merged = SideNodes(torch.cat([old_tokens, torch.tensor(new_tokens, dtype=torch.long)]),
                           torch.cat([old_parents, torch.tensor(new_parents, dtype=torch.long)]),
                           probs, sampled=False)
        return attrs.evolve(primary, side=merged, forwards=forwards)


@hookimpl
def pacer_components() -> list[Component]:
    return [Component(
        "drafter", "hybrid", HybridConfig, Hybrid,
        "one token tree from several drafters (members): the first gives the main path, the others' "
        "continuations join as side nodes",
    )]
