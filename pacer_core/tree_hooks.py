"""The hooks every tree drafter answers alike from its node budget (``pacer_core.trees.NodeBudget``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .hookspecs import hookimpl
from .trees import NodeBudget

if TYPE_CHECKING:
    from .cost_profiles import CostModel
    from .draft_values import Draft


class BudgetedTree:
    """The two hooks every tree drafter answers alike from its ``budget`` (a ``NodeBudget``, or None
    for a chain): the cost model ``nodes: auto`` prices steps with (the engine's draft gate reads it,
    docs/costs.md), and which nodes a grown tree sends (its best ``tree.nodes`` by cumulative draft
    probability, or with ``nodes: auto`` the nodes worth their verification cost). A drafter
    inherits it and sets ``self.budget`` (``node_budget``); one that selects otherwise (``hybrid``)
    overrides ``pacer_select_nodes``."""

    budget: Optional[NodeBudget] = None

    @hookimpl
    def pacer_step_costs(self) -> Optional[CostModel]:
        return None if self.budget is None else self.budget.cost

    @hookimpl
    def pacer_select_nodes(self, draft: Draft) -> Optional[list[int]]:
        return None if self.budget is None else self.budget.select(draft.tree)
