"""The step log every replay reads: one bench record's per-step lists parsed into steps, once.

A bench record's metrics log, for every step of a generation, the draft's depth
(``drafted_per_step``), the tokens accepted before the first rejection (``accepted_per_step``), the
nodes the target verified (``nodes_per_step``: a token tree's size; absent in logs from before token
trees, which are chains) and the draft forwards (``draft_forwards_per_step``; older runs only logged
their total ``draft_forwards``). A stack with the ``tree_log`` observer also logs every step's wide
draft tree (``tree_steps``: each node's parent and draft probability, the main path, the accepted
path).

``steps_from_metrics`` reads the per-step lists as ``LoggedStep`` s, and ``Generation.parse`` reads a
whole record (its steps, its draft forwards per step and its logged trees) so that each replay of a
run (``RecordedRun``) prices the parsed steps instead of parsing the record again.
"""

from __future__ import annotations

from typing import Iterable, Optional

import attrs


@attrs.frozen
class LoggedStep:
    drafted: int  # draft length; a tree's depth
    accepted: int  # accepted before the first rejection (a tree: the accepted path), <= drafted
    nodes: Optional[int] = None  # nodes the target verified: a tree's size; None = drafted (a chain)

    @property
    def is_tree(self) -> bool:
        return self.nodes is not None and self.nodes != self.drafted

    @property
    def sent(self) -> int:
        """The draft nodes the target verified (a chain logged without nodes: its drafted tokens)."""
        return self.drafted if self.nodes is None else self.nodes


def is_tree_log(log: Iterable[LoggedStep]) -> bool:
    """Whether any logged step verified more nodes than its depth (side nodes: a token tree)."""
    return any(s.is_tree for s in log)


def steps_from_metrics(metrics: dict) -> list[LoggedStep]:
    """The logged steps of one generation's metrics (``drafted_per_step``, ``accepted_per_step``,
    and ``nodes_per_step`` where recorded: logs from before token trees lack it, chains all)."""
    drafted, accepted = metrics.get("drafted_per_step", ()), metrics.get("accepted_per_step", ())
    nodes = metrics.get("nodes_per_step")
    if nodes is None:
        return [LoggedStep(int(d), int(a)) for d, a in zip(drafted, accepted)]
    return [LoggedStep(int(d), int(a), int(n)) for d, a, n in zip(drafted, accepted, nodes)]


@attrs.frozen
class LoggedTree:
    """One step's draft tree as the ``tree_log`` observer logged it."""

    parents: tuple[int, ...]
    q: tuple[float, ...]
    main: tuple[int, ...]
    path: tuple[int, ...]
    group: str  # the prompt set
    prompt: str = ""  # the question it came from (calibration is fitted on the other prompts)

    @property
    def depths(self) -> list[int]:
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    @property
    def cumulative(self) -> list[float]:
        out: list[float] = []
        for p, q in zip(self.parents, self.q):
            out.append(q * (1.0 if p < 0 else out[p]))
        return out


def trees_from_record(record: dict) -> list[LoggedTree]:
    """The tree steps ``tree_log`` recorded in one bench record (none without the observer)."""
    return [
        LoggedTree(
            tuple(s["parents"]),
            tuple(s["q"]),
            tuple(s["main"]),
            tuple(s["path"]),
            record["prompt_set"],
            str(record.get("question_id", "")),
        )
        for s in record["metrics"].get("tree_steps") or ()
    ]


def draft_forwards_per_step(metrics: dict, steps: list[LoggedStep]) -> list:
    """Each step's draft forwards (``draft_forwards_per_step``); in older runs, which logged only the
    total, the total spread over the steps by their drafted tokens."""
    forwards = metrics.get("draft_forwards_per_step")
    if forwards is not None and len(forwards) == len(steps):
        return list(forwards)
    total, drafted = int(metrics.get("draft_forwards", 0) or 0), sum(s.drafted for s in steps)
    return [round(total * s.drafted / drafted) if drafted else 0 for s in steps]


@attrs.frozen
class Generation:
    """One bench record with its step log parsed (``parse``)."""

    record: dict
    steps: tuple[LoggedStep, ...]
    draft_forwards: tuple[int, ...]  # per step
    trees: tuple[LoggedTree, ...]  # the tree_log observer's steps (none without it)
    is_tree: bool  # a step verified side nodes

    @classmethod
    def parse(cls, record: dict) -> "Generation":
        steps = steps_from_metrics(record["metrics"])
        return cls(
            record,
            tuple(steps),
            tuple(draft_forwards_per_step(record["metrics"], steps)),
            tuple(trees_from_record(record)),
            is_tree_log(steps),
        )

    @property
    def stack(self) -> str:
        return self.record["model_id"]

    @property
    def prompt_set(self) -> str:
        return self.record["prompt_set"]

    @property
    def metrics(self) -> dict:
        return self.record["metrics"]

    @property
    def prompt_tokens(self) -> int:
        """The prompt's length (1 where not recorded)."""
        return max(1, int(self.record.get("prompt_tokens") or 1))

    @property
    def has_steps(self) -> bool:
        """Whether the record logged its steps (transformers' generate, or runs before the step log, did not)."""
        return "accepted_per_step" in self.metrics
