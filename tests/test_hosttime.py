"""Host time per step (pacer_bench/hosttime.py, docs/host-time.md): the forward clock counts exactly
the model forwards, the measurement splits each step into forwards and the rest, and bad requests
are refused in one line. Nothing here asserts on wall-clock time."""

from __future__ import annotations

import json

import pytest

from pacer_bench.hosttime import STACKS, ForwardClock, HostTime, Shape, host_profile, measure_host_time
from pacer_core import InputError
from pacer_core.testing import ScriptedLM

from helpers import SCRIPTED_VOCAB, assert_one_line_error, build_engine, run_cli


class TickClock:
    """A clock that advances one second per reading: a timed forward reads it twice, so it adds 1."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.mark.parametrize("drafter", ["draft_model", "draft_model, tree: {topk: 3, depth: 3, nodes: 6}"])
def test_the_forward_clock_times_each_forward_of_target_and_draft_once(drafter):
    target, draft = ScriptedLM(SCRIPTED_VOCAB, seed=0), ScriptedLM(SCRIPTED_VOCAB, seed=1)
    engine = build_engine(target, draft, drafter, "{name: fixed, gamma: 3}", {"temperature": 0.0})
    clock = ForwardClock(TickClock()).watch_engine(engine)
    clock.watch_engine(engine)  # watching twice must not count a forward twice
    before = target.num_forwards + draft.num_forwards
    engine.generate([1, 2, 3], max_new_tokens=12)
    assert clock.seconds == target.num_forwards + draft.num_forwards - before > 0


def test_the_forward_clock_counts_a_nested_network_once():
    import torch

    inner = torch.nn.Linear(2, 2)
    outer = torch.nn.Sequential(inner)
    clock = ForwardClock(TickClock())
    clock.watch_module(outer)
    clock.watch_module(inner)
    outer(torch.zeros(1, 2))
    assert clock.seconds == 1.0


def test_the_forward_clock_counts_a_networks_model_work_outside_forward():
    """A block draft's context keys and values and an EAGLE-3 draft's fused features are computed by
    methods other than ``forward`` (``model_work``): they are model time, counted once each."""
    import torch

    from pacer_plugins.block_draft.model import BlockDraft
    from pacer_plugins.eagle.model import FeatureDraft

    class Draft(torch.nn.Module):
        model_work = ("fuse",)

        def fuse(self, x):
            return self(x)  # a nested forward inside model work still counts once

        def forward(self, x):
            return x

        def untimed(self, x):
            return x

    draft = Draft()
    clock = ForwardClock(TickClock())
    clock.watch_module(draft)
    clock.watch_module(draft)  # watching twice must not wrap twice
    draft.fuse(torch.zeros(1))
    assert clock.seconds == 1.0
    draft.untimed(torch.zeros(1))
    draft(torch.zeros(1))
    assert clock.seconds == 2.0
    assert set(BlockDraft.model_work) == {"extend_context", "block_inputs"}
    assert all(callable(getattr(BlockDraft, name)) for name in BlockDraft.model_work)
    assert FeatureDraft.model_work == ("fuse",)


def test_host_time_splits_each_step_into_forwards_and_the_rest(resolutions):
    results = measure_host_time(["plain", "chain", "tree10"], shape=Shape(vocab=64, hidden=32), new_tokens=8, repeats=1)
    assert [r.stack for r in results] == ["plain", "chain", "tree10"]
    assert resolutions["resolutions"] == 3  # each stack planned once, its engine built on the plan
    for r in results:
        assert r.steps >= 1
        assert 0.0 < r.forward_s <= r.step_s
        assert r.host_s == pytest.approx(r.step_s - r.forward_s)
    by = {r.stack: r for r in results}
    assert by["plain"].nodes_per_step == 0.0  # one target forward per step, nothing drafted
    assert 1.0 < by["tree10"].nodes_per_step <= 10.0  # step 0 (the prefill) drafts nothing
    profile = host_profile(results)
    assert set(profile) == {"plain", "chain", "tree"} and list(profile["tree"]) == [10]
    assert profile["tree"][10] == by["tree10"].host_s


def test_block_draft_stacks_draft_chains_and_trees_over_one_block():
    """The dflash stacks run on the tiny models: a chain of up to 4 tokens a step, a tree of up to 64
    nodes over one block; the profile's entry leaves them out (its trees are the eagle stacks')."""
    results = measure_host_time(
        ["block_chain", "block_tree64"], shape=Shape(vocab=64, hidden=32, subset=48), new_tokens=8, repeats=1
    )
    by = {r.stack: r for r in results}
    assert 1.0 < by["block_chain"].nodes_per_step <= 4.0
    assert by["block_chain"].nodes_per_step < by["block_tree64"].nodes_per_step <= 64.0
    assert all(0.0 < r.forward_s <= r.step_s for r in results)
    assert host_profile(results) == {}


def test_the_profile_entry_has_the_cost_profile_layout():
    made = [HostTime(name, 4, 1.0, 0.003, 0.002, 0.001) for name in ("tree64", "plain", "tree10", "hybrid")]
    assert host_profile(made) == {"plain": 0.001, "tree": {10: 0.001, 64: 0.001}}
    assert all(STACKS[name][1] in (None, 10, 32, 64) for name in STACKS)


def test_bad_requests_are_refused_before_any_model_is_built(capsys):
    with pytest.raises(InputError, match="unknown host-time stack 'trees'"):
        measure_host_time(["trees"])
    with pytest.raises(InputError, match="at least 1"):
        measure_host_time(["plain"], repeats=0)
    with pytest.raises(InputError, match="threads=1"):
        measure_host_time(["plain"], clock="cpu", threads=2)
    code, out, err = run_cli(["bench-host", "--stacks", "plain,nope"], capsys)
    assert_one_line_error(code, err, "unknown host-time stack 'nope'", "plain")
    assert out == ""  # refused before the table's head is printed
    code, _, err = run_cli(["bench-host", "--vocab", "2"], capsys)
    assert_one_line_error(code, err, "--vocab")
    with pytest.raises(InputError, match="threads must be from 1 to 256"):
        measure_host_time(["plain"], threads=-2)
    code, _, err = run_cli(["bench-host", "--vocab", "64", "--subset", "128"], capsys)
    assert_one_line_error(code, err, "--subset must be between 8 and --vocab (64)")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--threads", "-2"], "--threads: must be from 1 to 256, not -2"),
        (["--threads", "0"], "--threads: must be from 1 to 256, not 0"),
        (["--vocab", str(10**9)], "--vocab: must be from 8 to 262144"),
        (["--subset", str(10**9)], "--subset: must be from 8 to 262144"),
        (["--new-tokens", "0"], "--new-tokens: must be from 1 to 4096"),
        (["--repeats", "1e9"], "--repeats: must be a whole number from 1 to 1000"),
    ],
)
def test_bench_host_numeric_options_have_ranges(capsys, monkeypatch, argv, needle):
    from pacer_bench import hosttime

    monkeypatch.setattr(hosttime, "measure_host_time", lambda *a, **k: pytest.fail("measured a bad option"))
    code, out, err = run_cli(["bench-host", *argv], capsys)
    assert_one_line_error(code, err, needle)
    assert out == ""


def test_bench_host_refuses_a_json_folder_before_measuring(tmp_path, capsys, monkeypatch):
    from pacer_bench import hosttime

    monkeypatch.setattr(hosttime, "measure_host_time", lambda *a, **k: pytest.fail("measured before checking --json"))
    code, out, err = run_cli(["bench-host", "--json", str(tmp_path)], capsys)
    assert_one_line_error(code, err, f"--json '{tmp_path}' is a folder")
    assert out == ""


def test_a_draft_over_a_vocabulary_subset_drafts_only_its_tokens():
    """``--subset``: the eagle draft's head covers that many of the vocabulary's ids (as the shipped
    draft's 8,192 of 49,152), and its trees hold only those tokens and the context's (the drafter
    adds the context's tokens to its vocabulary)."""
    import tempfile
    from pathlib import Path

    import torch

    from pacer_bench.hosttime import prompt_ids, stack_engine, tiny_models
    from pacer_core import hookimpl

    class Seen:
        def __init__(self):
            self.tokens: set[int] = set()

        @hookimpl
        def pacer_observe_step(self, state, step):
            self.tokens.update(step.draft.tree.tokens.tolist())
            self.context = set(state.tokens)

    shape, seen = Shape(vocab=96, hidden=32, subset=24), Seen()
    with tempfile.TemporaryDirectory() as folder:
        target, draft, paths = tiny_models(shape, Path(folder))
        engine = stack_engine("tree10", target, draft, paths)
        engine.pm.register(seen, "seen")
        engine.generate(prompt_ids(shape.vocab), max_new_tokens=12)
    subset = set(torch.linspace(0, shape.vocab - 1, 24).round().long().tolist())
    assert seen.tokens <= subset | seen.context
    # a level chosen over the draft's own columns picks the tokens a choice over the whole
    # vocabulary picks (the columns mapped back to token ids)
    from pacer_core.trees import grow_level

    drafter = next(p for _, p in engine.pm.list_name_plugin() if hasattr(p, "_draft_distribution"))
    features = torch.randn(3, shape.hidden, generator=torch.Generator().manual_seed(0))
    narrow = drafter._draft_distribution(features, None)  # [3, draft vocabulary]
    assert narrow.shape[1] < shape.vocab
    scores = torch.tensor([0.0, -0.5, -1.0])
    by_column = grow_level(scores, narrow, 0, 6, 6)
    whole = grow_level(scores, drafter.columns.draft_vocab.widen(narrow), 0, 6, 6)
    assert [(c.row, int(drafter.columns.ids[c.token])) for c in by_column] == [(c.row, c.token) for c in whole]
    assert grow_level(scores, narrow, 0, 6, 6, drafter.columns.id_list) == whole


def test_the_command_prints_a_table_and_writes_json(capsys, tmp_path):
    out = tmp_path / "host.json"
    code, text, _ = run_cli(
        [
            "bench-host",
            "--stacks",
            "plain",
            "--new-tokens",
            "4",
            "--repeats",
            "1",
            "--clock",
            "cpu",
            "--vocab",
            "64",
            "--json",
            str(out),
        ],
        capsys,
    )
    assert code == 0
    assert "| plain |" in text and "host_s:" in text
    written = json.loads(out.read_text())
    assert written["results"][0]["stack"] == "plain" and set(written["host_s"]) == {"plain"}


# -- the cuts keep the results: vectorised tree bookkeeping against brute force ------------------
def random_draft(seed: int):
    """A draft of 1-4 blocks, each of 1-3 main-path tokens and 0-4 side nodes hanging anywhere earlier."""
    import torch

    from pacer_core.draft_values import Draft, DraftBlock, SideNodes

    g = torch.Generator().manual_seed(seed)
    blocks, total = [], 0

    def pick(high: int) -> int:
        return int(torch.randint(high, (1,), generator=g))

    for _ in range(1 + pick(4)):
        n, s = 1 + pick(3), pick(5)
        parents = [pick(total + n + j + 1) - 1 for j in range(s)]  # -1 .. any earlier node
        side = SideNodes(torch.randint(50, (s,), generator=g), torch.tensor(parents, dtype=torch.long)) if s else None
        blocks.append(DraftBlock(torch.randint(50, (n,), generator=g), side=side, forwards=1, sampled=False))
        total += n + s
    return Draft(tuple(blocks))


@pytest.mark.parametrize("seed", range(40))
def test_tree_masks_depths_and_selections_match_brute_force(seed):
    import torch

    from pacer_core.engine import tree_layout

    draft = random_draft(seed)
    tree = draft.tree
    parents = tree.parents.tolist()

    def ancestors(i):
        out = []
        while i >= 0:
            out.append(i)
            i = parents[i]
        return out

    n = len(tree)
    expected = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        expected[i, ancestors(i)] = True
    assert torch.equal(tree.ancestor_mask(), expected)
    assert tree.depths.tolist() == [len(ancestors(i)) for i in range(n)]
    assert tree.is_chain == (len(tree.main_path) == n and parents == list(range(-1, n - 1)))
    for pending in (1, 3):  # the verification forward's layout: causal pending tokens, then the tree
        positions, mask = tree_layout(pending, tree)
        assert positions.tolist() == list(range(pending)) + [pending - 1 + len(ancestors(i)) for i in range(n)]
        assert torch.equal(mask[:pending, :pending], torch.ones(pending, pending, dtype=torch.bool).tril())
        assert not mask[:pending, pending:].any() and mask[pending:, :pending].all()
        assert torch.equal(mask[pending:, pending:], expected)
    assert draft.num_nodes == n and len(draft) == sum(len(b) for b in draft.blocks)

    wanted = set(torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: n // 2 + 1].tolist())
    kept = [i for i in range(n) if all(a in wanted for a in ancestors(i))]
    chosen = draft.select(wanted)
    new = {old: k for k, old in enumerate(kept)}
    assert chosen.tree.tokens.tolist() == [int(tree.tokens[i]) for i in kept]
    assert chosen.tree.parents.tolist() == [new.get(parents[i], -1) for i in kept]
    assert chosen.forwards == draft.forwards
    everything = draft.select(range(n))
    assert everything is draft


def reference_grow_level(scores, probs, tip_row, topk, room):
    """``grow_level`` as tensor operations, to compare against: each row's top-k, cumulative float32
    scores, the main-path child first, then the best others (ties in flat order)."""
    import torch

    k = min(topk, probs.shape[1])
    top_p, top_x = probs.topk(k, dim=-1)
    totals = (torch.tensor(scores, dtype=torch.float32)[:, None] + top_p.clamp_min(1e-38).log()).flatten()
    p, tokens = top_p.flatten(), top_x.flatten()
    tip = tip_row * k if tip_row is not None and float(p[tip_row * k]) > 0 else -1
    chosen = [(tip_row, int(tokens[tip]), float(totals[tip]))] if tip >= 0 else []
    others = sorted((i for i in range(len(p)) if float(p[i]) > 0 and i != tip), key=lambda i: (-float(totals[i]), i))
    return chosen + [(i // k, int(tokens[i]), float(totals[i])) for i in others[: min(topk, room) - len(chosen)]]


@pytest.mark.parametrize("seed", range(30))
def test_grow_level_matches_tensor_operations(seed):
    """``grow_level`` reads the candidates on the host (numpy's float32 sums for the cumulative
    scores): the same children, tokens and scores, bit for bit, as the tensor operations; filtered-out
    (zero) tokens are never chosen; ``token_ids`` maps columns to token ids."""
    import torch

    from pacer_core.trees import grow_level

    g = torch.Generator().manual_seed(seed)
    f, width = 1 + seed % 5, 4 + seed % 40
    probs = torch.softmax(3 * torch.randn(f, width, generator=g), -1)
    probs[torch.rand(f, width, generator=g) < 0.3] = 0.0  # filtered out by top-k / top-p
    scores = (-5 * torch.rand(f, generator=g)).tolist()
    topk, room = 1 + seed % 7, 1 + (seed * 3) % 9
    tip_row = None if seed % 4 == 3 else seed % f
    got = grow_level(scores, probs, tip_row, topk, room)
    assert [tuple(c) for c in got] == reference_grow_level(scores, probs, tip_row, topk, room)
    ids = torch.randperm(1000, generator=g)[:width].tolist()
    mapped = grow_level(scores, probs, tip_row, topk, room, token_ids=ids)
    assert [tuple(c) for c in mapped] == [(c.row, ids[c.token], c.score) for c in got]


@pytest.mark.parametrize("seed", range(12))
def test_grow_level_breaks_ties_in_flat_order(seed):
    """Candidates with equal cumulative scores (equal probabilities in rows of equal scores) are
    chosen as the tensor operations choose them: in flat order, row by row, each row's top-k in order."""
    import torch

    from pacer_core.trees import grow_level

    g = torch.Generator().manual_seed(seed)
    f, width = 2 + seed % 4, 64 + seed
    levels = torch.tensor([0.3, 0.2, 0.1, 0.05, 0.0])  # a handful of values: every row repeats them
    probs = levels[torch.randint(len(levels), (f, width), generator=g)]
    scores = [-1.0 if seed % 2 else 0.0] * f  # equal scores: equal probabilities tie across rows too
    tip_row = None if seed % 3 == 2 else seed % f
    for topk, room in ((4, 4), (6, 3), (8, 8)):
        got = grow_level(scores, probs, tip_row, topk, room)
        assert [tuple(c) for c in got] == reference_grow_level(scores, probs, tip_row, topk, room)


def test_a_bench_unit_records_its_forward_seconds_and_the_report_the_host_time_per_step():
    from pacer_bench.config import BenchConfig
    from pacer_bench.results import host_ms_per_step
    from pacer_bench.units import Models, engine_unit
    from pacer_core import load_plan

    target, draft = ScriptedLM(SCRIPTED_VOCAB, seed=0), ScriptedLM(SCRIPTED_VOCAB, seed=1)
    plan = load_plan(
        overrides=[
            "strategy.drafter={name: draft_model}",
            "strategy.stop=[{name: fixed, gamma: 2}]",
            "generation.ignore_eos=true",
        ],
        require_models=False,
    )
    forwards = ForwardClock(TickClock())
    unit = engine_unit("s", plan, Models(target, draft), BenchConfig(), TickClock(), forwards)
    before = target.num_forwards + draft.num_forwards
    _, metrics, _ = unit.run([1, 2, 3], 0, 6)
    assert metrics["forward_s"] == target.num_forwards + draft.num_forwards - before
    records = [
        {"metrics": {"wall_s": 10.0, "forward_s": 4.0, "steps": 3}},
        {"metrics": {"wall_s": 5.0, "forward_s": 1.0, "steps": 1}},
        {"metrics": {"wall_s": 7.0, "steps": 2}},
    ]  # a GPU run: no forward_s, left out
    assert host_ms_per_step(records) == pytest.approx(1000 * (15.0 - 5.0) / 4)
    assert host_ms_per_step(records[2:]) is None


# -- rows of draft probabilities at the draft's own width (DraftVocab) -----------------------------
def test_a_draft_vocab_reads_its_columns_from_a_growing_list_as_from_its_map():
    """``DraftVocab.column_of`` (a drafter's token → column list, which grows at the end) gives each
    token's probability as ``columns`` does: tokens outside the ids, and tokens the list gained after
    this vocabulary was made (a column past its width), read 0."""
    import torch

    from pacer_core import DraftVocab

    column_of = [-1] * 12
    ids = [3, 9, 0, 7]
    for column, token in enumerate(ids):
        column_of[token] = column
    column_of[5] = 4  # a token added later, by a wider vocabulary
    rows = torch.rand(3, 4, generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([3, 5, 7, 1, 0, 9])
    row_map = torch.tensor([0, 2, 1, 1, 0, 2])
    plain, listed = DraftVocab(torch.tensor(ids), 12), DraftVocab(torch.tensor(ids), 12, column_of)
    expected = plain.widen(rows[row_map]).gather(1, tokens[:, None])[:, 0]
    assert torch.equal(listed.token_probs(rows, tokens, row_map), expected)
    assert torch.equal(plain.token_probs(rows, tokens, row_map), expected)
    assert torch.equal(listed.token_probs(rows[row_map], tokens), expected)  # a row per token, no map
    assert torch.equal(listed.token_probs(rows.double(), tokens, row_map), expected.double())


def _narrow_draft():
    """A two-block draft whose rows cover tokens (2, 5, 7) of a vocabulary of 9, with side nodes."""
    import torch

    from pacer_core import Draft, DraftBlock, DraftVocab, SideNodes

    vocab = DraftVocab(torch.tensor([2, 5, 7]), 9)
    rows = torch.softmax(torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), -1)  # [5, 3]
    first = DraftBlock(
        torch.tensor([5]),
        rows[:1],
        side=SideNodes(torch.tensor([2, 4]), torch.tensor([-1, -1]), rows[1:3], draft_vocab=vocab),
        sampled=False,
        draft_vocab=vocab,
    )
    second = DraftBlock(
        torch.tensor([7]),
        rows[3:4],
        side=SideNodes(torch.tensor([2]), torch.tensor([0]), rows[4:], draft_vocab=vocab),
        sampled=False,
        draft_vocab=vocab,
    )
    return Draft((first, second)), vocab, rows


def test_draft_rows_at_the_drafts_width_read_as_the_wide_rows():
    import torch

    draft, vocab, rows = _narrow_draft()
    wide = torch.zeros(5, 9)
    wide[:, [2, 5, 7]] = rows  # the tree's nodes: 5, side 2, 4 (outside the subset: 0), 7, side 2
    tree = draft.tree
    assert torch.equal(tree.draft_probs, wide)
    assert torch.equal(tree.token_probs, wide.gather(1, tree.tokens[:, None])[:, 0])
    assert float(tree.token_probs[2]) == 0.0  # token 4 is outside the draft's vocabulary
    assert torch.equal(draft.draft_probs, wide[[0, 3]])  # the main path, widened
    assert torch.equal(draft.blocks[0].draft_rows, rows[:1]) and draft.blocks[0].draft_probs.shape == (1, 9)
    # selection and truncation keep the rows at their width, with their vocabulary
    kept = draft.select([0, 1, 3])
    assert kept.blocks[0].side.draft_vocab is vocab and kept.blocks[0].side.draft_rows.shape == (1, 3)
    assert torch.equal(kept.tree.draft_probs, wide[[0, 1, 3]])
    assert torch.equal(draft.truncate(1).tree.draft_probs, wide[:3])


@pytest.mark.parametrize("seed", range(30))
def test_row_mapped_rows_read_as_rows_copied_per_node(seed):
    """Blocks whose tokens and side nodes share rows through ``row_map`` (a tree's siblings, a block's
    depths) read exactly as the same blocks with every node's row copied out: the tree's rows and
    each node's probability, the main path's rows, and after any selection or truncation."""
    import attrs
    import torch

    from pacer_core import Draft, DraftVocab

    g = torch.Generator().manual_seed(seed)
    vocab = DraftVocab(torch.randperm(50, generator=g)[:7], 50) if seed % 2 else None
    width = 7 if vocab is not None else 50
    mapped_blocks, copied_blocks = [], []
    for block in random_draft(seed).blocks:
        table = torch.softmax(torch.randn(3, width, generator=g), -1)  # [m, w]: shared by the block's nodes
        side = block.side
        row_map = torch.randint(3, (len(block),), generator=g)
        side_map = None if side is None else torch.randint(3, (len(side),), generator=g)
        mapped_blocks.append(
            attrs.evolve(
                block,
                draft_probs=table,
                row_map=row_map,
                draft_vocab=vocab,
                side=None
                if side is None
                else attrs.evolve(side, draft_probs=table, row_map=side_map, draft_vocab=vocab),
            )
        )
        copied_blocks.append(
            attrs.evolve(
                block,
                draft_probs=table[row_map],
                draft_vocab=vocab,
                side=None if side is None else attrs.evolve(side, draft_probs=table[side_map], draft_vocab=vocab),
            )
        )
    mapped, copied = Draft(tuple(mapped_blocks)), Draft(tuple(copied_blocks))
    n = len(copied.tree)
    wanted = torch.randperm(n, generator=g)[: n // 2 + 1].tolist()
    for a, b in [
        (mapped, copied),
        (mapped.select(wanted), copied.select(wanted)),
        (mapped.truncate(2), copied.truncate(2)),
    ]:
        assert torch.equal(a.tree.tokens, b.tree.tokens) and torch.equal(a.tree.parents, b.tree.parents)
        assert torch.equal(a.tree.token_probs, b.tree.token_probs)
        assert torch.equal(a.tree.draft_probs, b.tree.draft_probs)
        assert torch.equal(a.draft_probs, b.draft_probs)
        for x, y in zip(a.blocks, b.blocks):
            assert torch.equal(x.draft_rows, y.draft_rows)
            assert (x.side is None) == (y.side is None)
            assert x.side is None or torch.equal(x.side.draft_rows, y.side.draft_rows)
    # selecting maps the kept nodes' rows: the shared table is never copied
    chosen = mapped.select(wanted)
    assert all(any(x.draft_table is y.draft_table for y in mapped.blocks) for x in chosen.blocks)


def test_levels_written_into_one_table_read_as_levels_given_row_by_row():
    """A tree drafter may write every level's rows into one table and map each node to its parent's
    row (the eagle tree); the block reads as the one built from each node's row given separately,
    and keeps only the table's rows up to the last one a node maps to, without copying them."""
    import torch

    from pacer_core import Draft
    from pacer_core.trees import Candidate, GrownLevels

    table = torch.softmax(torch.randn(8, 5, generator=torch.Generator().manual_seed(0)), -1)
    levels = [
        ([Candidate(0, 1, -0.1), Candidate(0, 2, -0.5)], 0),  # the root's row 0
        ([Candidate(0, 3, -0.2), Candidate(1, 4, -0.6), Candidate(1, 0, -0.7)], 1),  # rows 1, 2
        ([Candidate(2, 2, -0.9)], 3),
    ]  # rows 3..5 written, its node maps to row 5
    shared, separate = GrownLevels(), GrownLevels()
    for chosen, first in levels:
        row_map = [first + c.row for c in chosen]
        shared.add(chosen, table, None, row_map)
        separate.add(chosen, [table[r] for r in row_map])
    one, _ = shared.block(first=0, forwards=3)
    each, _ = separate.block(first=0, forwards=3)
    assert one.draft_table.shape == (6, 5) and one.draft_table.data_ptr() == table.data_ptr()
    a, b = Draft((one,)).tree, Draft((each,)).tree
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
    assert torch.equal(a.draft_probs, b.draft_probs) and torch.equal(a.token_probs, b.token_probs)


def test_a_sampled_verdict_is_the_same_on_narrow_and_wide_rows():
    """The verifier reads the same rows from a tree of narrow blocks as from the same blocks widened
    by hand, so a sampled verification is unchanged, draw for draw."""
    import attrs
    import torch

    from pacer_core import Draft
    from pacer_core.acceptance import speculative_verify

    narrow, _, _ = _narrow_draft()
    narrow = Draft(tuple(attrs.evolve(b, sampled=True) for b in narrow.blocks))  # the rows are read
    wide = Draft(
        tuple(
            attrs.evolve(
                b,
                draft_probs=b.draft_probs,
                draft_vocab=None,
                side=attrs.evolve(b.side, draft_probs=b.side.draft_probs, draft_vocab=None),
            )
            for b in narrow.blocks
        )
    )
    verdicts = []
    for draft in (narrow, wide):
        tree = draft.tree
        target = torch.softmax(torch.randn(len(tree) + 1, 9, generator=torch.Generator().manual_seed(1)), -1)
        uniforms = torch.rand(len(tree), generator=torch.Generator().manual_seed(2))
        verdicts.append(
            speculative_verify(
                tree.tokens,
                tree.draft_probs,
                target,
                uniforms,
                torch.Generator().manual_seed(3),
                tree.parents,
                tree.sampled,
            )
        )
    assert verdicts[0] == verdicts[1]
    assert torch.equal(narrow.tree.token_probs, wide.tree.token_probs)


def test_a_greedy_tree_step_never_widens_the_drafts_rows(monkeypatch):
    """The eagle tree over a head of a subset ranks, selects and verifies greedily without copying a
    row into the target's vocabulary; an observer that reads ``draft_probs`` gets them widened."""
    import tempfile
    from pathlib import Path

    import torch

    from pacer_bench.hosttime import prompt_ids, stack_engine, tiny_models
    from pacer_core import DraftVocab, hookimpl

    widened = []
    original = DraftVocab.widen
    monkeypatch.setattr(DraftVocab, "widen", lambda self, rows: widened.append(rows.shape) or original(self, rows))
    shape = Shape(vocab=96, hidden=32, subset=24)
    with tempfile.TemporaryDirectory() as folder:
        target, draft, paths = tiny_models(shape, Path(folder))
        engine = stack_engine("tree10", target, draft, paths)
        plain = engine.generate(prompt_ids(shape.vocab), max_new_tokens=12)
        assert widened == [] and plain.metrics["steps"] > 1

        class Reads:
            rows: list = []

            @hookimpl
            def pacer_observe_step(self, state, step):
                probs = step.draft.tree.draft_probs
                if probs is not None and len(probs):
                    self.rows.append(probs)

        reads = Reads()
        engine.pm.register(reads, "reads")
        again = engine.generate(prompt_ids(shape.vocab), max_new_tokens=12)
    assert again.tokens == plain.tokens
    assert widened and all(p.shape[1] == shape.vocab for p in reads.rows)
    assert all(torch.allclose(p.sum(-1), torch.ones(len(p))) for p in reads.rows)


# -- a step's large buffers reuse freed memory (pacer_core.hostmemory) -----------------------------
def test_the_environment_keeps_its_own_allocator_settings(monkeypatch):
    from pacer_core import hostmemory

    for name, value in [("MALLOC_TRIM_THRESHOLD_", "1000"), ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=4096")]:
        with monkeypatch.context() as env:
            env.setenv(name, value)
            hostmemory.reuse_freed_memory.cache_clear()
            assert hostmemory.tuned_by_environment() and hostmemory.reuse_freed_memory() is False
    hostmemory.reuse_freed_memory.cache_clear()


def test_a_large_buffer_comes_from_the_heap_once_tuned():
    """After ``reuse_freed_memory`` a buffer of megabytes (a tree step's logits) is served from glibc's
    heap, not mapped afresh: the mapped bytes (mallinfo2's hblkhd) do not grow while it lives."""
    import ctypes
    import sys

    import torch

    from pacer_core import hostmemory

    if not sys.platform.startswith("linux") or hostmemory.tuned_by_environment():
        pytest.skip("glibc's allocator on Linux, not tuned by the environment")
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        pytest.skip("glibc >= 2.33 (mallinfo2)")

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    mallinfo2.restype = MallInfo2
    hostmemory.reuse_freed_memory.cache_clear()
    assert hostmemory.reuse_freed_memory()
    mapped = mallinfo2().hblkhd
    logits = torch.empty(65, 49152)  # a 64-node tree's logits over the embedded target's vocabulary
    assert mallinfo2().hblkhd == mapped
    del logits


def test_the_engine_tunes_the_allocator(monkeypatch):
    import pacer_core.engine

    calls = []
    monkeypatch.setattr(pacer_core.engine, "reuse_freed_memory", lambda: calls.append(1))
    build_engine(
        ScriptedLM(SCRIPTED_VOCAB, seed=0), None, "autoregressive", "{name: fixed, gamma: 1}", {"temperature": 0.0}
    )
    assert calls == [1]
