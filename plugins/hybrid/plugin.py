"""The ``hybrid`` drafter: several draft sources merged into one token tree per step, ranked by value.

``members`` are drafter entries configured as usual. The **main** member is the first one that
drafts with a model (``eagle``, ``draft_model``: it supplies draft probabilities), else the first:
its tokens form the draft's main path (what stop policies judge) and it grows the tree level by
level as it would alone (a tree, or a chain). At the first level of each step every other member
proposes a continuation of the committed text (its main tokens and its own branches, each read as a
phrase), merged into the tree as side nodes: a phrase walks down through existing nodes carrying its
tokens and adds the rest (``pacer_core.trees.merge_phrases``).

Once drafting ends the merged tree is cut to its budget **by value**, not by member order: each node's
value is its estimated probability of being accepted (``pacer_core.trees.node_values``): a model
node's cumulative draft probability; a merged phrase node's, its parent's value times its member's
acceptance rate at that depth, learned while decoding (accepted ÷ tried among the phrase nodes whose
parent was accepted, from an even prior). ``nodes`` is that budget: a number (the most valuable
nodes), ``auto`` (the nodes that maximise expected emitted tokens per second under a cost profile,
``pacer_core.trees.NodeBudget``), or None: the main member's own tree budget (a chain main member:
by device, as a tree's). So member order changes nothing but the numbering of equal-valued nodes.
Model-free members' tokens are point masses for the verifier, so the tree stays lossless under
sampling. When the main member has nothing to propose (``eagle`` before the target has produced a
feature, i.e. step 0, whose forward prefills the prompt), the step decodes plainly, so stop policies
always judge the main member's tokens.
At most one member may use the draft model (its cache is the member's). ``hybrid_accepted_<member>``
metrics count the accepted tokens each source contributed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

import attrs
import torch

from pacer_core import Component, Draft, DraftBlock, DraftInfo, InputError, Resources, SideNodes, hookimpl
from pacer_core.registry import main_member, member_hooks
from pacer_core.tree_hooks import BudgetedTree
from pacer_core.trees import MAX_NODES, TreeConfig, merge_phrases, node_budget
from pacer_core.types import StepWatch


@attrs.define
class HybridConfig:
    members: list[Any] = attrs.field(factory=list)  # drafter entries; the first model drafter gives the main path
    # nodes sent per step, the most valuable: a number, 'auto' (cost-sized) or None (the main member's
    # tree budget; by device for a chain)
    nodes: Any = attrs.field(default=None, validator=lambda i, a, v: TreeConfig(nodes=v))
    profile: Optional[str] = None  # the cost profile 'auto' reads (docs/costs.md); None: the device's
    max_phrase: int = attrs.field(default=8, validator=attrs.validators.ge(1))  # tokens per member phrase


def _phrases(block: DraftBlock) -> list[list[int]]:
    """A member's proposal read as phrases from the root: its main tokens, then each root path to a
    leaf of its side nodes."""
    tree = Draft((block,)).tree
    main = block.tokens.tolist()
    leaves = [i for i in range(len(tree)) if not tree.children[i] and i >= len(block)]
    return [main] + [[int(tree.tokens[j]) for j in tree.path_to(i)] for i in leaves]


class Hybrid(BudgetedTree):
    """Merges its members' proposals into one token tree (see the module)."""

    def __init__(self, config: HybridConfig, resources: Resources):
        self.config = config
        self.names: list[str] = []
        self.members: list[Any] = []
        self.hooks: list[Any] = []  # each member's hooks, called as the engine calls a component's
        seen: Counter[str] = Counter()
        # the main member first (the first model drafter, else the first), the others in their order
        main = main_member(config.members)
        ordered = [main] + [m for m in config.members if m is not main]
        for member in ordered:  # ResolvedComponents (the engine resolves a composite's members)
            self.members.append(member.component.factory(member.config, resources))
            self.hooks.append(member_hooks(self.members[-1]))
            seen[member.component.name] += 1
            name = member.component.name
            self.names.append(name if seen[name] == 1 else f"{name}{seen[name]}")
        users = [m.component.name for m in ordered if "draft_model" in m.component.needs]
        if len(users) > 1:
            raise InputError(
                f"hybrid: at most one member may use the draft model, got {', '.join(users)}; keep one of them"
            )
        # the target states the members read: the inputs of some layers (EAGLE-3) or the last layer's
        readers = [
            (m.component.name, DraftInfo.of(p).target_layers)
            for m, p in zip(ordered, self.members)
            if "target_hidden" in m.component.needs
        ]
        if len({layers for _, layers in readers}) > 1:
            raise InputError(
                "hybrid: members read different target hidden states ("
                + ", ".join(f"{name}: {list(layers) if layers else 'last layer'}" for name, layers in readers)
                + "); keep members that read the same ones"
            )
        # its side channel, read the engine's way from the members: the main member's draft identity and
        # recommended thresholds (stop policies judge its tokens), the target layers its readers share
        main_info = DraftInfo.of(self.members[0])
        self.draft_info = DraftInfo(
            identity=main_info.identity,
            stop_thresholds=main_info.stop_thresholds,
            target_layers=readers[0][1] if readers else None,
            tokens_per_forward=main_info.tokens_per_forward,
        )
        self.accepted: Counter[str] = Counter()
        self._sources: dict[tuple[int, ...], str] = {}  # root path of a merged node -> its member
        # the budget: the hybrid's own, else the main member's tree's (a chain's: by device)
        own_tree = main_info.tree or TreeConfig()
        tree = TreeConfig(
            nodes=config.nodes if config.nodes is not None else own_tree.nodes,
            profile=config.profile or own_tree.profile,
            calibration=own_tree.calibration,
        )
        self.budget = node_budget(
            tree,
            resources.target.device,
            main.cost_kind,
            resources.target.digest,
            main.draft_folder,
            main_info.identity,
            main_info.tokens_per_forward,
        )
        # per (member, depth): [accepted, tried] of its phrase nodes whose parent was accepted
        self.trials: dict[tuple[str, int], list[int]] = {}
        self.step = StepWatch()  # a step's first call merges the other members' phrases

    # -- hooks forwarded to the members ----------------------------------------------------------
    @hookimpl
    def pacer_start(self, state) -> None:
        self.accepted = Counter()
        self.step.restart()
        for hooks in self.hooks:
            hooks.pacer_start(state=state)

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        tree = step.draft.tree
        path: tuple[int, ...] = ()
        accepted = step.verdict.nodes(step.draft)[: max(0, len(step.emitted) - 1)]
        for node in accepted:
            path += (int(tree.tokens[node]),)
            self.accepted[self._sources.get(path, self.names[0])] += 1
        if len(tree):
            self._learn(tree, set(accepted))
        for hooks in self.hooks:
            hooks.pacer_observe_step(state=state, step=step)

    @hookimpl
    def pacer_finish(self, state, result) -> dict:
        metrics: dict[str, Any] = {f"hybrid_accepted_{name}": self.accepted[name] for name in self.names}
        for hooks in self.hooks:
            for extra in hooks.pacer_finish(state=state, result=result):
                metrics.update(extra)
        return metrics

    @hookimpl
    def pacer_select_nodes(self, state, draft) -> Optional[list[int]]:
        """The most valuable nodes of every member within the budget (see the module)."""
        tree = draft.tree
        if not len(tree):
            return None
        members = self._members_of(tree)
        depths = tree.depth_list
        return self.budget.select(tree, self.budget.values(tree, lambda i: self.rate(members[i], depths[i])))

    # -- what a member's phrase nodes are worth --------------------------------------------------
    def rate(self, member: Optional[str], depth: int) -> float:
        """The estimated chance that ``member``'s phrase node at ``depth`` is accepted when its parent is."""
        accepted, tried = self.trials.get((member or self.names[0], depth), (0, 0))
        return (accepted + 1) / (tried + 2)

    def _members_of(self, tree) -> list[Optional[str]]:
        """For each node, the member that merged it (None: the main member's own node)."""
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        paths: list[tuple[int, ...]] = []
        for token, parent in zip(tokens, parents):
            paths.append((paths[parent] if parent >= 0 else ()) + (token,))
        return [self._sources.get(path) for path in paths]

    def _learn(self, tree, accepted: set[int]) -> None:
        """Count each merged phrase node whose parent was accepted (or is the root): tried, and accepted or not."""
        members, depths = self._members_of(tree), tree.depth_list
        if tree.token_probs is None:
            point_mass = [True] * len(tree)
        else:
            point_mass = (tree.token_probs <= 0).tolist()
        for i, parent in enumerate(tree.parents.tolist()):
            if point_mass[i] and (parent < 0 or parent in accepted):
                counts = self.trials.setdefault((members[i] or self.names[0], depths[i]), [0, 0])
                counts[0] += i in accepted
                counts[1] += 1

    # -- drafting ----------------------------------------------------------------------------------
    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        first_level = self.step.starts(state)
        if first_level:
            self._sources = {}
        primary = self.hooks[0].pacer_propose(state=state, draft=draft, num_tokens=num_tokens)
        if primary is None or len(primary) == 0:
            return None
        if not first_level:
            return primary  # later levels: the primary alone
        proposals = []
        for name, hooks in zip(self.names[1:], self.hooks[1:]):
            block = hooks.pacer_propose(state=state, draft=Draft(), num_tokens=self.config.max_phrase)
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
            budget = MAX_NODES - first  # the budget by value comes later (pacer_select_nodes)
            if budget <= 0:
                break
            phrases = [p[: self.config.max_phrase] for p in _phrases(block)]
            added, added_parents, paths = merge_phrases(
                tokens + new_tokens, parents + new_parents, phrases, first, budget
            )
            for phrase, path in zip(phrases, paths):  # phrases start at the root: a node's root path
                for depth, node in enumerate(path, start=1):  # is its phrase's prefix
                    if node >= first:
                        self._sources.setdefault(tuple(phrase[:depth]), name)
            new_tokens += added
            new_parents += added_parents
        if not new_tokens:
            return attrs.evolve(primary, forwards=forwards)
        old_tokens = side.tokens if side is not None else torch.empty(0, dtype=torch.long)
        old_parents = side.parents if side is not None else torch.empty(0, dtype=torch.long)
        probs, vocab = None, None
        if side is not None and side.draft_rows is not None:  # point masses: zero rows, never read
            rows, vocab = side.draft_rows, side.draft_vocab  # at the width they were given
            probs = torch.cat([rows, torch.zeros(len(new_tokens), rows.shape[1])])
        merged = SideNodes(
            torch.cat([old_tokens, torch.tensor(new_tokens, dtype=torch.long)]),
            torch.cat([old_parents, torch.tensor(new_parents, dtype=torch.long)]),
            probs,
            sampled=False,
            draft_vocab=vocab,
        )
        return attrs.evolve(primary, side=merged, forwards=forwards)


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component(
            "drafter",
            "hybrid",
            HybridConfig,
            Hybrid,
            "one token tree from several drafters (members): the first model drafter gives the main path, "
            "the others' continuations join as side nodes; the most valuable nodes are sent",
        )
    ]
