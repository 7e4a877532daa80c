"""Tree drafting in the built-in drafters: ``draft_model`` with ``tree: {topk, depth, nodes}`` (an
EAGLE-2-style dynamic tree, one level per draft forward) and ``prompt_lookup`` with ``branches``.

The models are ``ScriptedLM`` tables (pure torch), mostly wrapped in ``AuditedLM``, which records
the token sequence and position each cache row encodes and fails any forward whose query sees a
row that does not match its own visible prefix (a stale tree row taken for context, a wrong tree
mask or wrong positions). Greedy output must equal the target's plain greedy decoding; the trees
must respect their bounds and be what the draft's distributions say; sampled output must follow the
target's exact distribution (chi-square). Tiny real Llamas check masks and positions through the
HF adapter, and the embedded SmolLM2 pair checks greedy equality end to end.
"""

from __future__ import annotations

import functools
import random
from typing import Optional, Sequence

import attrs
import pytest
import torch

from pacer_core import Component, Draft, Engine, hookimpl, load_config
from pacer_core.config import plan_run
from pacer_core.errors import ConfigError
from pacer_core.schema import load_schema
from pacer_core.testing import ScriptedLM, chisquare_pvalue, exact_continuation_probs
from pacer_core.trees import TreeConfig
from pacer_plugins.pacer_builtins.drafters import (
    DraftModel,
    DraftModelConfig,
    PromptLookup,
    PromptLookupConfig,
    level_layout,
    lookup_continuation,
    lookup_continuations,
)

from helpers import (
    DRAFT_TABLE,
    LENGTH,
    PASS_P,
    PROMPT,
    SCRIPTED_VOCAB,
    TARGET_TABLE,
    adapter,
    build_engine,
    error_of,
    noisy_copy,
    plain_greedy,
    reference_greedy,
    run_cli,
    sample_outputs,
    tiny_llama,
)

BUDGET = 30
PROMPTS = {"plain": [5, 1, 6, 2], "one_token": [3], "repetitive": PROMPT}


# -- an audited scripted model ---------------------------------------------------------------------
class AuditedLM(ScriptedLM):
    """A ``ScriptedLM`` that checks its cache like real attention would need it.

    Each cache row records the token sequence it encodes (the tokens it attended to, itself last)
    and its position. A query row that sees rows ``v_0 < v_1 < ... < v_m`` (itself last) must find
    row ``v_j`` encoding exactly the visible tokens ``v_0 .. v_j`` at position j, and must sit at
    position m itself; otherwise the forward fails. Without a ``tree_mask`` positions are
    consecutive (the HF adapter ignores ``positions`` then).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rows: list[tuple[tuple[int, ...], int]] = []  # per cache row: (sequence, position)

    def reset(self) -> None:
        super().reset()
        self.rows = []

    def crop(self, length: int, rows: Sequence[int] = ()) -> None:
        kept = [self.rows[int(r)] for r in rows]
        super().crop(length, rows)
        self.rows[length:] = kept

    def forward(self, tokens, *, positions=None, tree_mask=None, logits_from=0, hidden=False):
        tokens = [int(t) for t in tokens]
        past, k = len(self._tokens), len(tokens)
        allowed = torch.ones(k, past + k, dtype=torch.bool)
        if tree_mask is None:
            allowed[:, past:] = torch.tril(torch.ones(k, k, dtype=torch.bool))
            at = list(range(past, past + k))
        else:
            allowed[:, past + k - tree_mask.shape[1] :] = tree_mask
            at = (positions + past).tolist() if positions is not None else list(range(past, past + k))
        context, table = self._tokens + tokens, allowed.tolist()
        new_rows = []
        for i in range(k):
            visible = [c for c, ok in enumerate(table[i]) if ok]
            assert visible and visible[-1] == past + i, f"query {i} must see itself last, sees {visible}"
            sequence = tuple(context[c] for c in visible)
            for j, c in enumerate(visible[:-1]):
                row_sequence, row_position = self.rows[c] if c < past else new_rows[c - past]
                assert row_sequence == sequence[: j + 1], (
                    f"cache row {c} encodes {row_sequence}, but query {i} sees it as {sequence[: j + 1]}"
                )
                assert row_position == j, f"cache row {c} sits at position {row_position}, seen at {j}"
            assert at[i] == len(visible) - 1, f"query {i} at position {at[i]}, after {len(visible) - 1} tokens"
            new_rows.append((sequence, at[i]))
        out = super().forward(tokens, positions=positions, tree_mask=tree_mask, logits_from=logits_from, hidden=hidden)
        self.rows.extend(new_rows)
        return out


def scripted(table: torch.Tensor, seed: int = 0, order: int = 2, audited: bool = True) -> ScriptedLM:
    cls = AuditedLM if audited else ScriptedLM
    return cls(SCRIPTED_VOCAB, seed, order=order, table=table)


# -- an observer checking every step's tree --------------------------------------------------------
@attrs.define
class NoOptions:
    pass


class TreeAudit:
    """Records each step with the draft model's forwards spent on it; checks the draft cache holds
    only committed tokens once the step is observed (the drafter observes first: it is registered
    before the observers, and pluggy calls later registrations first, so the check runs at the
    next step's start instead)."""

    def __init__(self, config, resources):
        self.draft_model = resources.draft
        self.steps: list[tuple] = []  # (StepRecord, draft forwards since the previous step)
        self._forwards = 0

    @hookimpl
    def pacer_start(self, state) -> None:
        self.steps = []
        self._forwards = self.draft_model.num_forwards if self.draft_model is not None else 0

    @hookimpl
    def pacer_draft_more(self, state, draft):
        if self.draft_model is not None and len(draft) == 0:
            cached = list(self.draft_model.cached_tokens)
            assert cached == state.tokens[: len(cached)], "the draft cache holds more than committed tokens"
        return None

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        now = self.draft_model.num_forwards if self.draft_model is not None else 0
        self.steps.append((step, now - self._forwards))
        self._forwards = now


class AuditPlugin:
    def __init__(self):
        self.built: list[TreeAudit] = []

    @hookimpl
    def pacer_components(self):
        def build(config, resources):
            self.built.append(TreeAudit(config, resources))
            return self.built[-1]

        return [Component("observer", "tree_audit", NoOptions, build, "test: records tree steps")]


STOPS = {
    "fixed1": "{name: fixed, gamma: 1}",
    "fixed3": "{name: fixed, gamma: 3}",
    "fixed6": "{name: fixed, gamma: 6}",
    "heuristic": "{name: heuristic, gamma: 2}",
}


def tree_engine(
    target,
    draft,
    drafter: str,
    stop: str,
    verifier: str,
    overrides=(),
    observers: str = "[{name: metrics}, {name: tree_audit}]",
) -> tuple[Engine, Optional[TreeAudit]]:
    plugin = AuditPlugin()
    cfg = load_config(
        overrides=[
            f"strategy.drafter={drafter}",
            f"strategy.stop=[{STOPS[stop]}]",
            f"strategy.verifier={{name: {verifier}}}",
            f"strategy.observers={observers}",
            *overrides,
        ],
        extra_plugins=[plugin],
        require_models=False,
    )
    engine = Engine.build(target, draft=draft, cfg=cfg, extra_plugins=[plugin])
    return engine, plugin.built[0] if plugin.built else None


def goes_off_the_main_path(step) -> bool:
    return any(node not in step.draft.path_nodes for node in step.verdict.nodes(step.draft))


# -- config -----------------------------------------------------------------------------------------
def drafter_config(*overrides):
    cfg = load_config(overrides=list(overrides), require_models=False)
    return plan_run(cfg, require_models=False).stack.drafter.config


def test_tree_option_loads_and_defaults():
    assert drafter_config("strategy.drafter={name: draft_model}").tree is None
    assert drafter_config("strategy.drafter={name: draft_model, tree: null}").tree is None
    assert drafter_config("strategy.drafter={name: draft_model, tree: {}}").tree == TreeConfig()
    config = drafter_config("strategy.drafter={name: draft_model, tree: {topk: 3}}")
    assert config.tree == TreeConfig(topk=3, depth=8, nodes=None) and isinstance(config, DraftModelConfig)
    assert config.tree.budget("cpu") == 10 and config.tree.budget("cuda:0") == "auto"
    config = drafter_config(
        "strategy.drafter={name: draft_model}", "strategy.drafter.tree.depth=2", "strategy.drafter.tree.nodes=5"
    )
    assert config.tree == TreeConfig(topk=6, depth=2, nodes=5)
    assert drafter_config("strategy.drafter={name: prompt_lookup, branches: 3}").branches == 3
    assert drafter_config("strategy.drafter={name: prompt_lookup}").branches == 1


def test_pacer_validate_accepts_a_tree_drafter(tmp_path, capsys):
    path = tmp_path / "tree.yaml"
    path.write_text(
        "strategy:\n  drafter: {name: draft_model, tree: {topk: 3}}\n"
        "  stop: [{name: fixed, gamma: 4}]\n  verifier: {name: greedy}\n"
    )
    lookup = tmp_path / "lookup.yaml"
    lookup.write_text("strategy:\n  drafter: {name: prompt_lookup, branches: 4}\n")
    code, out, err = run_cli(["validate", str(path), str(lookup)], capsys)
    assert code == 0, err
    assert out.splitlines() == [f"ok: {path}", f"ok: {lookup}"]


@pytest.mark.parametrize(
    "override, message",
    [
        ("{name: draft_model, tree: {topk: 0}}", "strategy.drafter (draft_model): tree: 'topk' must be >= 1: 0"),
        ("{name: draft_model, tree: {depth: 0}}", "strategy.drafter (draft_model): tree: 'depth' must be >= 1: 0"),
        (
            "{name: draft_model, tree: {nodes: -2}}",
            "strategy.drafter (draft_model): tree: tree.nodes must be 'auto' or a whole number in 1..512, got -2",
        ),
        (
            "{name: draft_model, tree: {nodes: many}}",
            "strategy.drafter (draft_model): tree: tree.nodes must be 'auto' or a whole number in 1..512, got 'many'",
        ),
        (
            "{name: draft_model, tree: {nodes: 100000}}",
            "strategy.drafter (draft_model): tree: tree.nodes must be 'auto' or a whole number in 1..512, got 100000",
        ),
        (
            "{name: draft_model, tree: {topk: 100000}}",
            "strategy.drafter (draft_model): tree: 'topk' must be <= 64: 100000",
        ),
        ("{name: draft_model, tree: {depth: 999}}", "strategy.drafter (draft_model): tree: 'depth' must be <= 32: 999"),
        (
            "{name: draft_model, tree: {tpk: 3}}",
            "strategy.drafter (draft_model): unknown option 'tree.tpk'; valid options: topk, depth, nodes, profile, "
            "calibration",
        ),
        (
            "{name: draft_model, tree: 3}",
            "strategy.drafter (draft_model): 'tree' must be a mapping of options (topk, depth, nodes, profile, "
            "calibration), got int 3",
        ),
        (
            "{name: draft_model, tree: {topk: x}}",
            "strategy.drafter (draft_model): bad value for 'tree.topk': Value 'x' of type 'str' could not be "
            "converted to Integer; give a value of type int",
        ),
        (
            "{name: draft_model, tree: {topk: .inf}}",
            "strategy.drafter (draft_model): 'tree.topk' must be a finite number, got inf",
        ),
        ("{name: prompt_lookup, branches: 0}", "strategy.drafter (prompt_lookup): 'branches' must be >= 1: 0"),
    ],
)
def test_bad_tree_options_are_refused_in_one_line(override, message):
    assert error_of(overrides=[f"strategy.drafter={override}"], require_models=False) == message


@attrs.define
class Leaf:
    rate: float = attrs.field(default=0.5, validator=attrs.validators.le(1.0))


@attrs.define
class Branch:
    leaf: Leaf = attrs.field(factory=Leaf)
    spare: Optional[Leaf] = None


@attrs.define
class Root:
    branch: Optional[Branch] = None
    size: int = 1


def test_nested_config_classes_validate_at_any_depth():
    """Any option whose type is an attrs class (or Optional of one) takes a mapping of its options."""
    assert load_schema(Root, None, [], "toy") == Root()
    assert load_schema(Root, None, ["branch={}"], "toy").branch == Branch()
    cfg = load_schema(Root, None, ["branch={spare: {rate: 0.25}}"], "toy")
    assert cfg.branch == Branch(spare=Leaf(0.25))
    assert load_schema(Root, None, ["branch.leaf.rate=0.1"], "toy").branch.leaf.rate == 0.1
    for override, message in [
        ("branch={leaf: {rate: 2.0}}", "toy: branch.leaf: 'rate' must be <= 1.0: 2.0"),
        ("branch={leaf: {rat: 1}}", "toy: unknown option 'branch.leaf.rat'; valid options: rate"),
        ("branch={sparse: {}}", "toy: unknown option 'branch.sparse'; valid options: leaf, spare"),
        ("branch={leaf: 4}", "toy: 'branch.leaf' must be a mapping of options (rate), got int 4"),
        ("branch={leaf: null}", "toy: 'branch.leaf' must be a mapping of options (rate), got NoneType None"),
    ]:
        with pytest.raises(ConfigError) as info:
            load_schema(Root, None, [override], "toy")
        assert str(info.value) == message, override


# -- draft_model trees: unit pieces -----------------------------------------------------------------
def test_level_layout_sees_context_ancestors_and_itself():
    # context of 3 rows, then 2 tree rows (nodes a, b of level 1); level 2 feeds 3 nodes: two under a, one under b
    positions, mask = level_layout([[3], [3], [4]], context=3, cached=5, depth=2)
    assert positions.tolist() == [-1, -1, -1]  # absolute position 3 - 1 + 2 = 4 = 5 + (-1)
    assert mask.tolist() == [
        [True, True, True, True, False, True, False, False],
        [True, True, True, True, False, False, True, False],
        [True, True, True, False, True, False, False, True],
    ]


def greedy_state(tokens, eos=()):
    class State:
        pass

    state = State()
    state.tokens, state.eos_token_ids = list(tokens), frozenset(eos)
    state.step_index = 0  # one step: a drafter's first call of it grows from the root
    state.sampling = None
    state.generator = torch.Generator().manual_seed(0)
    return state


def grow(drafter, state, levels: int = 100) -> Draft:
    draft = Draft()
    for _ in range(levels):
        block = drafter.pacer_propose(state=state, draft=draft, num_tokens=1)
        if block is None:
            break
        draft = draft.extend(block)
    return draft


def tree_drafter(draft_model, topk=3, depth=4, nodes=10, hidden=True, sampling=None) -> DraftModel:
    from pacer_core import Resources, SamplingParams

    resources = Resources(target=draft_model, draft=draft_model, sampling=sampling or SamplingParams())
    drafter = DraftModel(DraftModelConfig(hidden_states=hidden, tree=TreeConfig(topk, depth, nodes)), resources)
    drafter.pacer_start(state=None)
    return drafter


def test_a_new_step_is_told_by_the_step_index_not_by_an_empty_draft():
    """``StepWatch`` (docs/hooks.md#decodestate): True at a step's first call only, afresh after
    ``restart``. A tree drafter grows from the root at a step's first call; asked again in the same step
    with a draft it did not grow (an empty one), it refuses instead of silently starting over, and at
    the next step index it grows from the root again."""
    from pacer_core.types import StepWatch

    watch, state = StepWatch(), greedy_state([5, 1, 6])
    answers = []
    for step in (0, 0, 0, 1, 1):
        state.step_index = step
        answers.append(watch.starts(state))
    assert answers == [True, False, False, True, False]
    watch.restart()  # pacer_start: the next generation counts from 0 again
    assert watch.starts(state) and not watch.starts(state)
    drafter = tree_drafter(scripted(DRAFT_TABLE, seed=3), topk=2, depth=3, nodes=6)
    state = greedy_state([5, 1, 6, 2, 7])
    first = drafter.pacer_propose(state=state, draft=Draft(), num_tokens=1)
    with pytest.raises(RuntimeError, match="not the one this drafter grew"):
        drafter.pacer_propose(state=state, draft=Draft(), num_tokens=1)
    state.step_index = 1
    again = drafter.pacer_propose(state=state, draft=Draft(), num_tokens=1)
    assert torch.equal(again.tokens, first.tokens) and torch.equal(again.side.tokens, first.side.tokens)


@pytest.mark.parametrize("topk, depth, nodes", [(1, 4, 24), (2, 3, 5), (3, 4, 10), (4, 6, 24), (3, 5, 2)])
def test_tree_levels_are_the_drafts_top_children(topk, depth, nodes):
    """Each level: the main token is the tip's argmax, every node is among the topk of its parent's
    distribution (no duplicate siblings), draft_probs rows are the parent's softmax, hidden states
    the parent's row; topk nodes a level, depth levels, one forward per level; the nodes sent are
    the best ``nodes`` by cumulative probability."""
    model = scripted(DRAFT_TABLE, seed=3)
    drafter = tree_drafter(model, topk, depth, nodes)
    context = [5, 1, 6, 2, 7]
    before = model.num_forwards
    draft = grow(drafter, greedy_state(context))
    tree = draft.tree
    levels, total = depth, depth * topk  # every level offers enough children: it takes topk nodes
    assert (len(draft), len(tree)) == (levels, total)
    assert int(tree.depths.max()) == len(draft) <= depth
    assert model.num_forwards - before == draft.forwards == len(draft)  # one forward per level
    assert all(b.forwards == 1 and len(b) == 1 and not b.sampled for b in draft.blocks)
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    for level in range(1, len(draft) + 1):
        assert int((tree.depths == level).sum()) <= topk
    for node in range(len(tree)):
        prefix = context + [tokens[i] for i in tree.path_to(parents[node])]
        probs = torch.softmax(model.next_logits(prefix), -1)
        assert torch.allclose(tree.draft_probs[node], probs)
        assert tokens[node] in probs.topk(topk).indices.tolist()
        siblings = [tokens[i] for i in tree.children[parents[node]]]
        assert len(siblings) == len(set(siblings))
    main = [tokens[i] for i in draft.path_nodes]
    for d, token in enumerate(main):  # the main path is the draft's greedy chain
        prefix = context + main[:d]
        assert token == int(model.next_logits(prefix).argmax())
        assert torch.equal(draft.hidden_states[d], model.hidden_table[model.key(prefix)])
    if topk > 1:
        assert len(tree) > len(draft)  # side nodes were grown
    sent = drafter.pacer_select_nodes(draft=draft)
    if total <= nodes:
        assert sent is None
    else:  # the best `nodes` by cumulative probability, each with its parent
        q = tree.draft_probs.gather(1, tree.tokens[:, None])[:, 0]
        score = [0.0] * len(tree)
        for i, p in enumerate(parents):
            score[i] = float(q[i]) * (score[p] if p >= 0 else 1.0)
        assert len(sent) == nodes and all(p < 0 or p in sent for p in (parents[i] for i in sent))
        assert min(score[i] for i in sent) >= max(score[i] for i in range(len(tree)) if i not in sent)
        assert draft.select(sent).num_nodes == nodes


def test_tree_nodes_follow_the_cumulative_beam():
    """Side nodes of each level are the best other children by cumulative log-probability."""
    model = scripted(DRAFT_TABLE, seed=3)
    draft = grow(tree_drafter(model, topk=3, depth=3, nodes=24), greedy_state([4, 4, 2]))
    tree = draft.tree
    logp = tree.draft_probs[torch.arange(len(tree)), tree.tokens].log()
    score = [float(sum(logp[i] for i in tree.path_to(n))) for n in range(len(tree))]
    for level in range(2, len(draft) + 1):
        previous = [n for n in range(len(tree)) if int(tree.depths[n]) == level - 1]
        chosen = [n for n in range(len(tree)) if int(tree.depths[n]) == level]
        main = draft.path_nodes[level - 1]
        candidates = []  # every child of the previous level among each node's top 3
        for p in previous:
            prefix = [4, 4, 2] + [int(tree.tokens[i]) for i in tree.path_to(p)]
            probs = torch.softmax(model.next_logits(prefix), -1)
            top = probs.topk(3)
            for pr, tok in zip(top.values.tolist(), top.indices.tolist()):
                candidates.append(((score[p] + torch.tensor(pr).log()).item(), p, tok))
        others = sorted(
            (c for c in candidates if (c[1], c[2]) != (tree.parents[main].item(), int(tree.tokens[main]))),
            key=lambda c: -c[0],
        )[:2]
        got = [(int(tree.parents[n]), int(tree.tokens[n])) for n in chosen if n != main]
        assert got == [(p, tok) for _, p, tok in others]


def test_nothing_grows_past_eos():
    model = scripted(DRAFT_TABLE, seed=3)
    context = [5, 1, 6]
    first = int(model.next_logits(context).argmax())
    draft = grow(tree_drafter(model, topk=2, depth=5), greedy_state(context, eos=[first]))
    assert len(draft) == 1 and draft.tokens.tolist() == [first]
    second = int(model.next_logits(context).topk(2).indices[1])  # EOS as a level-1 side node: a leaf
    draft = grow(tree_drafter(model, topk=3, depth=3), greedy_state(context, eos=[second]))
    tree = draft.tree
    (side,) = [i for i in range(len(tree)) if int(tree.tokens[i]) == second and int(tree.parents[i]) == -1]
    assert len(draft) == 3 and not tree.children[side] and len(tree) == 9


def test_tree_drafting_under_sampling_uses_the_processed_distribution():
    from pacer_core import SamplingParams
    from pacer_core.sampling import logits_to_probs

    params = SamplingParams(temperature=0.7, top_k=2)
    model = scripted(DRAFT_TABLE, seed=3)
    context = [5, 1, 6]
    draft = grow(tree_drafter(model, topk=4, depth=3, nodes=24, sampling=params), greedy_state(context))
    tree = draft.tree
    assert not bool(tree.sampled.any())
    for node in range(len(tree)):
        prefix = context + [int(tree.tokens[i]) for i in tree.path_to(int(tree.parents[node]))]
        expected = logits_to_probs(model.next_logits(prefix), params)
        assert torch.allclose(tree.draft_probs[node], expected)
        assert float(expected[int(tree.tokens[node])]) > 0  # top_k=2: filtered tokens never chosen
    assert int((tree.depths == 1).sum()) == 2  # only 2 tokens survive top-k, though topk is 4


def test_chain_is_unchanged_without_tree():
    """No ``tree``: blocks are the sampled chain of old (no side nodes, ``sampled``, one block per call)."""
    from pacer_core import Resources, SamplingParams

    model = scripted(DRAFT_TABLE, seed=3, audited=False)
    drafter = DraftModel(DraftModelConfig(), Resources(target=model, draft=model, sampling=SamplingParams()))
    drafter.pacer_start(state=None)
    block = drafter.pacer_propose(state=greedy_state([5, 1, 6]), draft=Draft(), num_tokens=4)
    assert len(block) == 4 and block.side is None and block.sampled and block.forwards == 4
    assert block.tokens.tolist() == plain_greedy(model, [5, 1, 6], 4)


# -- draft_model trees through the engine ----------------------------------------------------------
TREES = {
    "k1": "{topk: 1, depth: 4, nodes: 4}",
    "k2": "{topk: 2, depth: 3, nodes: 5}",
    "k3": "{topk: 3, depth: 6, nodes: 12}",
    "k4": "{topk: 4, depth: 4, nodes: 24}",
    "few_nodes": "{topk: 4, depth: 6, nodes: 3}",
    # cost-sized: the CPU profile sends few nodes, the GPU one many
    "auto_cpu": "{topk: 3, depth: 4, nodes: auto, profile: cpu-2core-smollm2-fp32}",
    "auto_gpu": "{topk: 4, depth: 4, nodes: auto, profile: a100-7b-bf16}",
}


@functools.cache
def references(prompt: tuple[int, ...]) -> list[int]:
    return plain_greedy(scripted(TARGET_TABLE, audited=False), list(prompt), BUDGET)


def grid():
    """Every tree × stop with the greedy verifier; ``speculative_sampling`` (which verifies with
    the same greedy rule at temperature 0) on the k3 tree only."""
    for tree in TREES:
        for stop in ("fixed1", "fixed3", "heuristic"):
            for verifier in ("greedy", "speculative_sampling") if tree == "k3" else ("greedy",):
                yield pytest.param(tree, stop, verifier, id=f"{tree}-{stop}-{verifier}")


@pytest.mark.parametrize("tree, stop, verifier", grid())
def test_greedy_tree_drafting_equals_plain_decoding(tree, stop, verifier):
    spec = load_config(overrides=[f"strategy.drafter={{name: draft_model, tree: {TREES[tree]}}}"], require_models=False)
    bounds = plan_run(spec, require_models=False).stack.drafter.config.tree
    target, draft = scripted(TARGET_TABLE), scripted(DRAFT_TABLE, seed=1)
    engine, audit = tree_engine(target, draft, f"{{name: draft_model, tree: {TREES[tree]}}}", stop, verifier)
    side = off_path = 0
    fixed_budget = isinstance(bounds.nodes, int)  # else 'auto': at most every node grown
    cap = bounds.nodes if fixed_budget else bounds.topk * bounds.depth
    for name, prompt in PROMPTS.items():  # one engine, several prompts: state must not leak
        result = engine.generate(prompt, max_new_tokens=BUDGET)
        assert result.tokens == references(tuple(prompt)), name
        assert result.metrics["draft_forwards"] == sum(f for _, f in audit.steps)
        gated = 0
        for step, forwards in audit.steps:
            d = step.draft
            if forwards == 0 and d.num_nodes == 0:  # decoded plainly by the draft gate ('auto' only)
                gated += 1
                continue
            # one draft forward per level grown; the best `nodes` of them are sent, so the main
            # path (len(d)) may end above the deepest node sent
            assert forwards == step.draft_forwards <= bounds.depth
            assert d.num_nodes <= cap and len(d) <= d.depth <= forwards
            if len(d):
                assert all(int((d.tree.depths == lv).sum()) <= bounds.topk for lv in range(1, d.depth + 1))
            if stop.startswith("fixed"):  # the stop's gamma, unless depth or the budget end it
                expected = min(int(stop[5:]), bounds.depth, BUDGET - (step.committed_before - len(prompt)))
                assert forwards == expected
                # everything grown fits: the whole tree is sent
                if fixed_budget and bounds.nodes >= expected * bounds.topk:
                    assert len(d) == forwards
            side += d.num_nodes - len(d)
            off_path += goes_off_the_main_path(step)
        assert gated == result.metrics.get("skipped_steps", 0), name
    if fixed_budget and bounds.topk > 1 and bounds.nodes > 1 and stop != "fixed1":
        assert side > 0  # the tree has side nodes
        if bounds.nodes >= bounds.topk:
            assert off_path > 0  # and the target took some (with 3 nodes sent here it takes none)
    if bounds.topk == 1:
        assert side == 0


def aligned_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """Order-1 tables on which every level-1 side node's token is committed right after the main one:
    the draft prefers t + 1, then t + 2 after token t; the target always continues with t + 1."""
    model = ScriptedLM(SCRIPTED_VOCAB, order=1)
    draft, target = torch.zeros(model.buckets, SCRIPTED_VOCAB), torch.zeros(model.buckets, SCRIPTED_VOCAB)
    for t in range(SCRIPTED_VOCAB):
        draft[model.key([t]), (t + 1) % SCRIPTED_VOCAB] = 4.0
        draft[model.key([t]), (t + 2) % SCRIPTED_VOCAB] = 3.0
        target[model.key([t]), (t + 1) % SCRIPTED_VOCAB] = 4.0
    return target, draft


def test_side_node_rows_never_pass_for_context():
    """A committed token equal to a level-1 side node's token (t + 2 after t + 1): a drafter leaving
    its tree rows in the draft cache would have ``sync_cache`` keep that side node's row (computed at
    the wrong position, without its real predecessor) as context; the audited draft refuses it."""
    target_table, draft_table = aligned_tables()
    target, draft = scripted(target_table, order=1), scripted(draft_table, order=1)
    engine, audit = tree_engine(
        target, draft, "{name: draft_model, tree: {topk: 2, depth: 3, nodes: 6}}", "fixed3", "greedy"
    )
    prompt = [0, 1, 2]
    result = engine.generate(prompt, max_new_tokens=BUDGET)
    assert result.tokens == plain_greedy(scripted(target_table, order=1, audited=False), prompt, BUDGET)
    hits = 0
    for step, _ in audit.steps[:-1]:
        tree = step.draft.tree
        level1_side = [
            int(tree.tokens[i])
            for i in range(len(tree))
            if int(tree.parents[i]) == -1 and i not in step.draft.path_nodes
        ]
        hits += len(step.emitted) > 1 and step.emitted[1] in level1_side
    assert hits >= 3  # the situation arises at (almost) every step
    assert result.metrics["acceptance_rate"] == 1.0


@pytest.mark.parametrize(
    "observers, caught",
    [
        ("[]", "cache row 4 encodes \\(0, 1, 2, 4\\), but query 0 sees it as \\(0, 1, 2, 3, 4\\)"),
        ("[{name: tree_audit}]", "the draft cache holds more than committed tokens"),
    ],
)
def test_the_audit_catches_tree_rows_left_in_the_draft_cache(monkeypatch, observers, caught):
    """The checks above can fail: with the crop disabled, the stale side-node row (token 4 at
    position 3, right after the context 0 1 2) is caught by the audited draft when ``sync_cache``
    keeps it as context, and, earlier, by the observer's check of the draft cache."""

    def forget_rows(self):  # the bug: bookkeeping reset, cache not cropped
        self._context, self._seen, self._level, self._scores, self._nodes = None, {}, [], [], 0

    monkeypatch.setattr(DraftModel, "_drop_tree_rows", forget_rows)
    target_table, draft_table = aligned_tables()
    target, draft = scripted(target_table, order=1), scripted(draft_table, order=1)
    engine, _ = tree_engine(
        target,
        draft,
        "{name: draft_model, tree: {topk: 2, depth: 3, nodes: 6}}",
        "fixed3",
        "greedy",
        observers=observers,
    )
    with pytest.raises(AssertionError, match=caught):
        engine.generate([0, 1, 2], max_new_tokens=BUDGET)


def test_sampled_tree_decoding_is_seeded():
    target, draft = scripted(TARGET_TABLE), scripted(DRAFT_TABLE, seed=1)
    engine, _ = tree_engine(
        target,
        draft,
        "{name: draft_model, tree: {topk: 3, depth: 4}}",
        "fixed3",
        "speculative_sampling",
        ["sampling.temperature=0.8", "sampling.top_p=0.9"],
    )
    first = engine.generate(PROMPT, max_new_tokens=BUDGET, seed=5).tokens
    assert engine.generate(PROMPT, max_new_tokens=BUDGET, seed=5).tokens == first
    assert len({tuple(engine.generate(PROMPT, max_new_tokens=BUDGET, seed=s).tokens) for s in (6, 7, 8)}) > 1


@pytest.mark.parametrize(
    "drafter, stop, sampling, samples",
    [
        ("draft_model, tree: {topk: 3, depth: 3, nodes: 8}", "{name: fixed, gamma: 3}", {"temperature": 1.0}, 700),
        pytest.param(
            "draft_model, tree: {topk: 4, depth: 2}",
            "{name: heuristic, gamma: 2}",
            {"temperature": 0.6, "top_k": 3},
            20_000,
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "prompt_lookup, branches: 3",
            "{name: fixed, gamma: 3}",
            {"temperature": 1.0, "top_p": 0.8},
            20_000,
            marks=pytest.mark.slow,
        ),
    ],
)
def test_sampled_trees_follow_the_target_distribution(drafter, stop, sampling, samples):
    from pacer_core import SamplingParams

    target, draft = scripted(TARGET_TABLE, audited=False), scripted(DRAFT_TABLE, seed=1, audited=False)
    engine = build_engine(target, draft, drafter, stop, sampling)
    samples, _ = sample_outputs(engine, PROMPT, samples)
    expected = exact_continuation_probs(target, PROMPT, LENGTH, SamplingParams(**sampling))
    assert chisquare_pvalue(samples, expected) > PASS_P


def test_top_k_children_claimed_as_sampled_fail_the_distribution_test(monkeypatch):
    """The test above can fail: the same tree with its top-k children claimed to be drawn at random
    (``sampled=True``, so the verifier divides by q) is far from the target's distribution."""
    from pacer_core import SamplingParams

    grow_levels = DraftModel._propose_levels
    monkeypatch.setattr(
        DraftModel,
        "_propose_levels",
        lambda self, state, draft, num_tokens: (
            lambda block: None if block is None else attrs.evolve(block, sampled=True)
        )(grow_levels(self, state, draft, num_tokens)),
    )
    target, draft = scripted(TARGET_TABLE, audited=False), scripted(DRAFT_TABLE, seed=1, audited=False)
    engine = build_engine(
        target,
        draft,
        "draft_model, tree: {topk: 3, depth: 3, nodes: 8}",
        "{name: fixed, gamma: 3}",
        {"temperature": 1.0},
    )
    samples, _ = sample_outputs(engine, PROMPT, 500)
    expected = exact_continuation_probs(target, PROMPT, LENGTH, SamplingParams(temperature=1.0))
    assert chisquare_pvalue(samples, expected) < 1e-6


# -- real models --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_pair():
    target = tiny_llama(0, scale=3.0)
    return target, noisy_copy(target, std=0.03)


def test_tree_levels_match_plain_forwards_on_a_real_model(llama_pair):
    """Through the HF adapter (real attention, rotary positions): each node's draft_probs row is the
    draft's softmax after a plain causal forward over context + the node's ancestors."""
    _, draft_model = llama_pair
    draft = adapter(draft_model, eos=False)
    context = [5, 9, 13, 7, 22, 5, 9]
    tree_draft = grow(tree_drafter(draft, topk=3, depth=4, nodes=16), greedy_state(context))
    tree = tree_draft.tree
    assert len(tree) > len(tree_draft) == 4
    fresh = adapter(draft_model, eos=False)
    for node in range(len(tree)):
        prefix = context + [int(tree.tokens[i]) for i in tree.path_to(int(tree.parents[node]))]
        fresh.reset()
        logits = fresh.forward(prefix, logits_from=len(prefix) - 1).logits[-1]
        assert torch.allclose(tree.draft_probs[node], torch.softmax(logits, -1), atol=1e-5), node


@pytest.mark.parametrize("verifier", ["greedy", "speculative_sampling"])
def test_greedy_tree_drafting_on_tiny_llamas(llama_pair, verifier):
    target_model, draft_model = llama_pair
    target, draft = adapter(target_model, eos=False), adapter(draft_model, eos=False)
    engine, audit = tree_engine(
        target, draft, "{name: draft_model, tree: {topk: 3, depth: 4, nodes: 10}}", "heuristic", verifier
    )
    off_path = 0
    for prompt in ([5, 9, 13, 7, 22], [17], [5, 9, 13, 5, 9, 13, 5, 9]):
        result = engine.generate(prompt, max_new_tokens=24)
        assert result.tokens == reference_greedy(target_model, prompt, 24, eos=False)
        off_path += sum(goes_off_the_main_path(step) for step, _ in audit.steps)
        assert all(len(step.draft) <= step.draft.depth <= f and step.draft.num_nodes <= 10 for step, f in audit.steps)
    assert off_path > 0


@pytest.mark.slow  # loads SmolLM2 and decodes on CPU: 20 s to minutes
@pytest.mark.usefixtures("real_model_threads")
@pytest.mark.filterwarnings("ignore")
def test_embedded_pair_tree_drafting_equals_plain_decoding():
    """The embedded SmolLM2 target with its shipped token-level draft, drafting trees: fp32 greedy
    output equals plain decoding."""
    from pacer_core.config import draft_model_config
    from pacer_core.hf import hf_generate, load_model

    target, tokenizer, _ = load_model(None, "float32", "cpu", None, "target")
    cfg = load_config(
        overrides=[
            "strategy.drafter={name: draft_model, tree: {topk: 3, depth: 4, nodes: 10}}",
            "strategy.stop=[{name: fixed, gamma: 4}]",
            "strategy.verifier={name: greedy}",
        ]
    )
    section = draft_model_config(cfg, plan_run(cfg).stack.drafter.component)
    draft, _, _ = load_model(section.path, "float32", "cpu", None, "draft")
    ids = tokenizer.encode("Write a Python function that adds two numbers.")
    reference = hf_generate(target, ids, 32)
    plugin = AuditPlugin()
    cfg = load_config(
        overrides=[
            "strategy.drafter={name: draft_model, tree: {topk: 3, depth: 4, nodes: 10}}",
            "strategy.stop=[{name: fixed, gamma: 4}]",
            "strategy.verifier={name: greedy}",
            "strategy.observers=[{name: metrics}, {name: tree_audit}]",
        ],
        extra_plugins=[plugin],
    )
    engine = Engine.build(target, draft=draft, tokenizer=tokenizer, cfg=cfg, extra_plugins=[plugin])
    result = engine.generate(ids, max_new_tokens=32)
    assert result.tokens == reference
    steps = plugin.built[0].steps
    # one forward per level grown; the best 10 nodes are sent, so the main path may end above them
    assert all(len(step.draft) <= step.draft.depth <= f <= 4 for step, f in steps)
    assert sum(step.draft.num_nodes - len(step.draft) for step, _ in steps) > 0
    assert result.metrics["acceptance_rate"] > 0.0


# -- prompt_lookup branches ---------------------------------------------------------------------
def brute_force_continuations(context: list[int], max_n: int, min_n: int, num_tokens: int, limit: int):
    found = []
    L = len(context)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = context[L - n :]
        for start in range(L - 1 - n, -1, -1):  # occurrences ending before the last token, latest first
            if context[start : start + n] == suffix:
                candidate = context[start + n : start + n + num_tokens]
                if not any(t[: len(candidate)] == candidate for t in found):
                    found.append(candidate)
    return found[:limit]


def test_lookup_continuations_on_a_worked_example():
    context = torch.tensor([2, 8, 5, 1, 2, 3, 4, 1, 2, 6, 1, 2])
    # (1, 2) occurs at 3 and 7 (latest first: 6 1, then 3 4); (2) adds 8 5 (its others repeat)
    assert lookup_continuations(context, 3, 1, 2, 5) == [[6, 1], [3, 4], [8, 5]]
    assert lookup_continuations(context, 3, 1, 2, 2) == [[6, 1], [3, 4]]
    assert lookup_continuations(context, 3, 2, 2, 5) == [[6, 1], [3, 4]]
    assert lookup_continuations(torch.tensor([1, 2, 3]), 3, 1, 2, 5) == []


def test_lookup_continuations_match_a_brute_force_search():
    rng = random.Random(0)
    for _ in range(300):
        context = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        max_n = rng.randrange(1, 5)
        min_n = rng.randrange(1, max_n + 1)
        num, limit = rng.randrange(1, 6), rng.randrange(1, 6)
        found = lookup_continuations(torch.tensor(context), max_n, min_n, num, limit)
        assert found == brute_force_continuations(context, max_n, min_n, num, limit), context
        first = lookup_continuation(torch.tensor(context), max_n, min_n, num).tolist()
        assert (found[0] if found else []) == first  # the main path is today's continuation


def test_lookup_branches_become_a_trie_of_side_nodes():
    #           0  1  2  3  4  5  6  7  8  9 10 11 12 13
    context = [1, 2, 3, 4, 1, 2, 6, 3, 1, 2, 6, 1, 1, 2]
    # (1, 2) at 8, 4, 0: continuations 6 1 1 (main), 6 3 1 (shares the 6), 3 4 1
    lookup = PromptLookup(PromptLookupConfig(branches=3), None)
    block = lookup.pacer_propose(state=greedy_state(context), draft=Draft(), num_tokens=3)
    assert block.tokens.tolist() == [6, 1, 1] and block.draft_probs is None and not block.sampled
    assert block.side.tokens.tolist() == [3, 1, 3, 4, 1]
    assert block.side.parents.tolist() == [0, 3, -1, 5, 6]  # 3 under the main 6; 3 4 1 off the root
    # a later call continues the main path's tip, numbering after the draft's nodes
    draft = Draft((block,))
    more = lookup.pacer_propose(state=greedy_state(context), draft=draft, num_tokens=2)
    full = torch.tensor(context + [6, 1, 1])
    expected = lookup_continuations(full, 3, 1, 2, 3)
    assert more.tokens.tolist() == expected[0]
    tree = draft.extend(more).tree
    tip = draft.path_nodes[-1]
    for phrase in expected:  # every continuation is a root path hanging off the tip
        node = tip
        for token in phrase:
            node = next(c for c in tree.children[node] if int(tree.tokens[c]) == token)
    assert int(tree.parents[draft.num_nodes]) == tip


def test_one_branch_is_the_plain_lookup():
    lookup = PromptLookup(PromptLookupConfig(), None)
    context = [1, 2, 3, 4, 1, 2, 6, 3, 1, 2, 6, 1, 1, 2]
    block = lookup.pacer_propose(state=greedy_state(context), draft=Draft(), num_tokens=3)
    assert block.tokens.tolist() == [6, 1, 1] and block.side is None and block.sampled


BRANCH_PROMPTS = {
    "alternating": [0, 1, 2, 3, 0, 1, 5, 6, 0, 1, 2, 3, 0, 1, 5, 7, 0, 1],
    "repetitive": PROMPT,
    "one_token": [3],
}


@pytest.mark.parametrize("verifier", ["greedy", "speculative_sampling"])
@pytest.mark.parametrize("stop", ["fixed3", "heuristic"])
@pytest.mark.parametrize("branches", [2, 4])
def test_greedy_lookup_branches_equal_plain_decoding(branches, stop, verifier):
    target = scripted(TARGET_TABLE)
    engine, audit = tree_engine(target, None, f"{{name: prompt_lookup, branches: {branches}}}", stop, verifier)
    side = off_path = 0
    for name, prompt in BRANCH_PROMPTS.items():
        result = engine.generate(prompt, max_new_tokens=BUDGET)
        assert result.tokens == references(tuple(prompt)), name
        for step, _ in audit.steps:
            side += step.draft.num_nodes - len(step.draft)
            off_path += goes_off_the_main_path(step)
    assert side > 0 and off_path > 0
