"""Tree calibrations (``pacer_core.calibration``): what ``nodes: auto`` values a draft's nodes by.

- The pure fit and apply: per depth, groups of equal size by cumulative probability, rates
  non-decreasing; deeper nodes share the last depth's row.
- The file: written whole, read back equal; a wrong kind or version, a missing field, a falling
  rate, a damaged file are refused in one line naming the fix, also when a config names it.
- ``NodeBudget``: a calibration that says deep nodes are worth less sends fewer deep nodes.
- The engine: the eagle drafter (and a hybrid led by it) picks up its draft folder's
  ``calibration.json``; one fitted on another draft is refused; ``calibration: raw`` turns it off;
  greedy output stays the target's own with it.
- ``pacer replay RUN --save-calibration FILE`` fits one on a run's logged trees, naming its draft.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from pacer_core import Engine, InputError, load_config
from pacer_core import calibration as calibrations
from pacer_core.calibration import Calibration, apply, fit
from pacer_core.cost_profiles import load_profile
from pacer_core.draft_values import TokenTree
from pacer_core.trees import NodeBudget, TreeConfig, node_values

from helpers import adapter, assert_one_line_error, make_draft, reference_greedy, run_cli, tiny_llama


# -- fit and apply -----------------------------------------------------------------------------------
def samples(seed: int = 0, count: int = 3000) -> list[tuple[int, float, bool]]:
    """(depth, cumulative probability, accepted): accepted with probability c ** depth (deep nodes
    are worth less than their probability says)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        depth, c = rng.randint(1, 8), rng.random()
        out.append((depth, c, rng.random() < c**depth))
    return out


def test_fit_reads_a_non_decreasing_rate_per_depth_in_equal_groups():
    data = samples()
    cal = fit(data, bins=5, max_depth=4)
    assert len(cal.upper) == len(cal.rate) == len(cal.nodes) == 4  # depths 4..8 pooled in the last row
    for d, (upper, rate, nodes) in enumerate(zip(cal.upper, cal.rate, cal.nodes), start=1):
        mine = sorted(c for depth, c, _ in data if min(depth, 4) == d)
        assert sum(nodes) == len(mine) and nodes[0] == len(mine) // 5  # groups of len // bins (and a remainder)
        assert list(upper) == sorted(upper) and upper[-1] == mine[-1]
        assert list(rate) == sorted(rate) and all(0.0 <= r <= 1.0 for r in rate)
    # deep nodes are accepted less often than shallow ones at the same probability
    assert apply(cal, 4, 0.5) < apply(cal, 1, 0.5)
    assert apply(cal, 7, 0.5) == apply(cal, 4, 0.5)  # past the table: its last row


def test_fit_pools_violators_and_apply_reads_the_first_group_reaching_the_probability():
    # depth 1: probabilities 0.1..0.6, acceptance 1, 0, 0, 1, 1, 1 -> groups of 2: 0.5, 0.5 (pooled), 1.0
    data = [(1, 0.1, True), (1, 0.2, False), (1, 0.3, False), (1, 0.4, True), (1, 0.5, True), (1, 0.6, True)]
    cal = fit(data, bins=3)
    assert cal.upper == ((0.2, 0.4, 0.6),) and cal.rate == ((0.5, 0.5, 1.0),) and cal.nodes == ((2, 2, 2),)
    assert [apply(cal, 1, c) for c in (0.0, 0.2, 0.21, 0.5, 0.9)] == [0.5, 0.5, 0.5, 1.0, 1.0]
    # a depth without nodes under the deepest one shares the deepest one's row
    gap = fit([(1, 0.5, True), (3, 0.5, False)], bins=1)
    assert gap.rate == ((1.0,), (0.0,), (0.0,))
    with pytest.raises(ValueError, match="no logged tree nodes"):
        fit([])


# -- the file ----------------------------------------------------------------------------------------
def test_a_calibration_file_is_written_whole_and_read_back(tmp_path):
    cal = fit(samples(), bins=4, draft="eagle:t:w", source="pacer replay RUN --save-calibration FILE")
    path = calibrations.save(tmp_path / "sub" / "calibration.json", cal)
    assert calibrations.load(path) == cal
    data = json.loads(path.read_text())
    assert data["kind"] == calibrations.KIND and data["version"] == calibrations.VERSION
    assert data["draft"] == "eagle:t:w" and len(data["depths"]) == len(cal.upper)
    assert [p.name for p in path.parent.iterdir()] == ["calibration.json"]  # no temporary file left


def good() -> dict:
    return calibrations.to_dict(Calibration(upper=((0.1, 1.0),), rate=((0.2, 0.9),), draft="d"))


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda d: d.update(kind="pacer-cost-profile"), "is not a tree calibration (kind 'pacer-cost-profile'"),
        (lambda d: d.update(version=2), "has version 2"),
        (lambda d: d.pop("depths"), "lacks depths"),
        (lambda d: d.pop("draft"), "lacks draft"),
        (lambda d: d["depths"][0].pop("rate"), "depth 1 lacks rate"),
        (lambda d: d["depths"][0].update(rate=[0.9, 0.2]), "rate falls from 0.9 to 0.2"),
        (lambda d: d["depths"][0].update(upper=[0.5, 0.1]), "upper falls from 0.5 to 0.1"),
        (lambda d: d["depths"][0].update(rate=[0.2, 1.5]), "rate must be a non-empty list of numbers in [0, 1]"),
        (lambda d: d["depths"][0].update(rate=[0.2]), "upper and rate differ in length"),
        (lambda d: d.update(depths=[]), "depths must be a non-empty list"),
    ],
)
def test_a_bad_calibration_is_refused_in_one_line(tmp_path, change, needle):
    data = good()
    change(data)
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as info:
        calibrations.load(path)
    message = str(info.value)
    assert needle in message and "\n" not in message and "--save-calibration" in message


def test_a_damaged_or_missing_file_is_refused_in_one_line(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    for name, needle in (("bad.json", "is not valid JSON"), ("missing.json", "does not exist")):
        with pytest.raises(InputError, match=needle):
            calibrations.load(tmp_path / name)


def test_a_config_naming_a_bad_calibration_is_refused_when_checked(tmp_path):
    data = good()
    data["kind"] = "other"
    (tmp_path / "c.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="is not a tree calibration"):
        load_config(
            overrides=[
                f"strategy.drafter={{name: draft_model, tree: {{nodes: auto, calibration: '{tmp_path / 'c.json'}'}}}}"
            ],
            require_models=False,
        )
    with pytest.raises(Exception, match="tree.calibration must be a calibration file or 'raw'"):
        TreeConfig(calibration=3)
    assert TreeConfig(calibration="raw").calibration == "raw"


# -- NodeBudget --------------------------------------------------------------------------------------
def chain_tree(depth: int, q: float = 0.9, point_mass: int = -1) -> TokenTree:
    """A chain of ``depth`` confident nodes, each with one unlikely sibling (node ``point_mass``
    without a draft probability)."""
    parents, probs = [], []
    for d in range(depth):
        main = 2 * (d - 1) if d else -1
        parents += [main, main]
        probs += [q, 0.05]
    if point_mass >= 0:
        probs[point_mass] = 0.0
    n = len(parents)
    return TokenTree(
        torch.zeros(n, dtype=torch.long),
        torch.tensor(parents, dtype=torch.long),
        torch.tensor(probs, dtype=torch.float64)[:, None],
        torch.zeros(n, dtype=torch.bool),
    )


# acceptance as the raw probability says up to depth 2, nearly nothing below
SHALLOW = Calibration(upper=((0.5, 1.0), (0.5, 1.0), (1.0,)), rate=((0.05, 0.9), (0.05, 0.81), (0.01,)), draft="d")


def test_node_values_through_a_calibration_never_exceed_the_parent():
    tree = chain_tree(6)
    raw, cal = node_values(tree), node_values(tree, calibration=SHALLOW)
    assert [raw[0], raw[2]] == pytest.approx([cal[0], cal[2]])  # depths 1-2: the calibration agrees
    assert all(v <= 0.01 for v in cal[4:]) and raw[4] == pytest.approx(0.729)
    assert all(cal[i] <= cal[p] for i, p in enumerate(tree.parents.tolist()) if p >= 0)
    # a point mass (no draft probability) stays its parent's value times its rate
    assert node_values(chain_tree(6, point_mass=3), lambda i: 0.5, SHALLOW)[3] == pytest.approx(0.5 * cal[0])


def test_a_calibration_that_deep_nodes_are_worth_less_sends_fewer_deep_nodes():
    cost = load_profile("cpu-2core-smollm2-fp32").cost_model("feature")  # a node's row costs something here
    tree = chain_tree(8)
    auto = TreeConfig(nodes="auto")
    raw = NodeBudget(auto, "cuda", cost).select(tree)
    calibrated = NodeBudget(auto, "cuda", cost, SHALLOW).select(tree)
    deepest = lambda nodes: max(tree.depth_list[i] for i in (range(len(tree)) if nodes is None else nodes))  # noqa: E731
    assert deepest(raw) > 2 and deepest(calibrated) == 2
    assert calibrated != raw
    # a fixed budget ignores calibrations (it sends its best nodes by probability)
    assert NodeBudget(TreeConfig(nodes=4), "cuda", cost, SHALLOW).calibration is None


def test_auto_weighs_the_host_time_each_sent_node_adds():
    """A profile whose tree host time grows with the nodes sent makes each node dearer: ``auto``
    sends fewer nodes than under the same profile with a flat host time, and what it predicts for a
    step counts the host time of the nodes it sends."""
    import attrs

    from pacer_core.cost_profiles import Curve

    flat = load_profile("cpu-2core-smollm2-fp32").cost_model("feature")
    steep = attrs.evolve(flat, tree_step_s=Curve((1, 64), (0.001, 0.001 + 63 * 0.004)))  # 4 ms a node
    tree = chain_tree(8, q=0.97)
    auto = TreeConfig(nodes="auto")
    calm = NodeBudget(auto, "cuda", attrs.evolve(flat, tree_step_s=Curve((1, 64), (0.001, 0.001))))
    dear = NodeBudget(auto, "cuda", steep)
    sent_calm, sent_dear = calm.select(tree) or list(range(len(tree))), dear.select(tree) or list(range(len(tree)))
    assert len(sent_dear) < len(sent_calm)
    assert dear.sending_seconds(5) == pytest.approx(steep.verify_tree(5) + steep.host(4))


# -- the engine --------------------------------------------------------------------------------------
PROMPTS = ([1, 7, 9, 7, 9, 7], list(range(3, 40)), [50, 7, 61, 9, 50, 61, 7])


def eagle_engine(target_model, folder, tree: str, drafter: str = "eagle"):
    target = adapter(target_model)
    entry = f"{{name: eagle, path: '{folder}', tree: {tree}}}"
    if drafter == "hybrid":
        entry = f"{{name: hybrid, members: [{entry}, {{name: prompt_lookup}}]}}"
    cfg = load_config(
        overrides=[f"strategy.drafter={entry}", "strategy.stop=[{name: fixed, gamma: 4}]"], require_models=False
    )
    return Engine.build(target, cfg=cfg)


def draft_with_calibration(tmp_path, target_model, cal: Calibration):
    from pacer_plugins.eagle.drafter import draft_identity

    folder = make_draft(target_model, tmp_path / "draft")
    calibrations.save(folder / calibrations.FILE, Calibration(cal.upper, cal.rate, draft=draft_identity(folder)))
    return folder


def budget_of(engine):
    drafter = next(p for p in engine.pm.get_plugins() if type(p).__name__ in ("EagleDrafter", "Hybrid"))
    return drafter.budget


TREE = "{topk: 3, depth: 4, nodes: auto, profile: a100-7b-bf16}"


@pytest.mark.parametrize("drafter", ["eagle", "hybrid"])
def test_the_engine_takes_the_draft_folders_calibration_and_stays_greedy(tmp_path, drafter):
    target_model = tiny_llama(0, scale=6.0)
    folder = draft_with_calibration(tmp_path, target_model, SHALLOW)
    engine = eagle_engine(target_model, folder, TREE, drafter)
    assert budget_of(engine).calibration.upper == SHALLOW.upper
    for prompt in PROMPTS:
        result = engine.generate(prompt, max_new_tokens=30)
        assert result.tokens == reference_greedy(target_model, prompt, 30)
        assert result.metrics["drafted"] > 0
    # 'raw' turns it off; a fixed budget never reads it
    assert budget_of(eagle_engine(target_model, folder, TREE[:-1] + ", calibration: raw}", drafter)).calibration is None
    assert budget_of(eagle_engine(target_model, folder, "{topk: 3, depth: 4, nodes: 6}", drafter)).calibration is None


def test_a_calibration_fitted_on_another_draft_is_refused_in_one_line(tmp_path, capsys):
    target_model = tiny_llama(0, scale=6.0)
    folder = make_draft(target_model, tmp_path / "draft")
    other = tmp_path / "other.json"
    calibrations.save(other, Calibration(SHALLOW.upper, SHALLOW.rate, draft="eagle:none:0123"))
    with pytest.raises(InputError) as info:
        eagle_engine(target_model, folder, TREE[:-1] + f", calibration: '{other}'}}")
    message = str(info.value)
    assert "fitted on the trees of draft eagle:none:0123" in message and "tree.calibration: raw" in message
    # the same file in the draft folder is refused the same way
    (folder / calibrations.FILE).write_bytes(other.read_bytes())
    with pytest.raises(InputError, match="fitted on the trees of draft eagle:none:0123"):
        eagle_engine(target_model, folder, TREE)
    # a drafter that cannot name its draft (draft_model) cannot use a named calibration
    with pytest.raises(InputError, match="does not name its draft"):
        calibrations.check_draft(SHALLOW, None, other)


# -- pacer replay --save-calibration ----------------------------------------------------------------------
def tree_steps(count: int, seed: int = 0) -> list[dict]:
    """Logged-tree records' steps: two levels of three nodes, the first child of each accepted
    with probability q."""
    rng = random.Random(seed)
    steps = []
    for _ in range(count):
        q = sorted((rng.random() for _ in range(3)), reverse=True)
        parents, probs = [-1, -1, -1, 0, 0, 0], [round(x / sum(q), 6) for x in q] * 2
        path = [0, 3] if rng.random() < probs[0] else []
        steps.append({"parents": parents, "q": probs, "main": [0, 3], "path": path, "forwards": 2})
    return steps


def write_tree_run(folder, drafter: dict, steps: list[dict], **draft):
    """A run of one stack ``tree`` logging ``steps``; its unit records ``draft=`` where given (else
    it is a run recorded before bench.json recorded the draft)."""
    from pacer_bench.answers import ANSWERS, META

    folder.mkdir(parents=True, exist_ok=True)
    meta = {
        "version": 1,
        "baseline": "autoregressive",
        "settings": {},
        "prompt_sets": ["set"],
        "units": [{"name": "tree", "kind": "stack", "config": {"strategy": {"drafter": drafter}}, **draft}],
    }
    (folder / META).write_text(json.dumps(meta))
    from pacer_bench.answers import make_record

    records = [
        make_record(
            "set",
            type("P", (), {"question_id": str(i), "category": None})(),
            "tree",
            "stack",
            0,
            [1],
            [2],
            "",
            {"tree_steps": steps[i::3]},
            "length",
            None,
        )
        for i in range(3)
    ]
    (folder / ANSWERS).write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_replay_saves_a_calibration_fitted_on_the_runs_trees(tmp_path, capsys):
    from pacer_plugins.eagle.drafter import draft_identity

    draft = make_draft(tiny_llama(0), tmp_path / "draft")
    steps = tree_steps(60)
    run = write_tree_run(tmp_path / "run", {"name": "eagle", "path": str(draft), "tree": {"topk": 3}}, steps)
    out = tmp_path / "calibration.json"
    code, _, err = run_cli(["replay", str(run), "--save-calibration", str(out)], capsys)
    assert code == 0, err
    saved = calibrations.load(out)
    assert saved.draft == draft_identity(draft) and f"--save-calibration {out}" in saved.source
    assert sum(saved.nodes[0]) == 180 and sum(saved.nodes[1]) == 180  # every logged node, by depth
    # a run without logged trees, or with another drafter's, is refused in one line
    bare = write_tree_run(tmp_path / "bare", {"name": "eagle", "path": str(draft)}, [])
    code, _, err = run_cli(["replay", str(bare), "--save-calibration", str(out)], capsys)
    assert_one_line_error(code, err, "holds no logged trees", "tree_log")
    other = write_tree_run(tmp_path / "other", {"name": "draft_model", "tree": {"topk": 3}}, steps)
    code, _, err = run_cli(["replay", str(other), "--save-calibration", str(out)], capsys)
    assert_one_line_error(code, err, "names an eagle draft")
    code, _, err = run_cli(["replay", str(run)], capsys)
    assert_one_line_error(code, err, "give a cost profile")


def test_replay_fits_a_hybrid_stacks_trees_on_its_main_members_draft(tmp_path, capsys):
    """A hybrid's main member is the engine's (the first model drafter, not the first member): its
    logged trees are fitted and checked as the eagle draft's own."""
    draft = make_draft(tiny_llama(0), tmp_path / "draft")
    eagle = {"name": "eagle", "path": str(draft), "tree": {"topk": 3}}
    hybrid = {"name": "hybrid", "members": [{"name": "prompt_lookup"}, eagle]}
    own = tmp_path / "eagle.json"
    code, _, err = run_cli(
        ["replay", str(write_tree_run(tmp_path / "e", eagle, tree_steps(30))), "--save-calibration", str(own)], capsys
    )
    assert code == 0, err
    # the eagle draft's calibration is taken for the hybrid's trees, and theirs is fitted on that draft
    run, out = write_tree_run(tmp_path / "h", hybrid, tree_steps(30)), tmp_path / "hybrid.json"
    code, _, err = run_cli(["replay", str(run), "--calibration", str(own), "--save-calibration", str(out)], capsys)
    assert code == 0, err
    assert calibrations.load(out).draft == calibrations.load(own).draft


def test_replay_names_the_draft_the_run_recorded_not_the_folder_as_it_is_now(tmp_path, capsys):
    """A bench run records the identity of the draft each stack read (bench.json's ``draft``): the
    calibration fitted on its trees names that draft even when its folder has changed since. A run
    recorded before the field existed has it derived from the folder as it is now (its fallback)."""
    import shutil

    from pacer_bench.answers import META
    from pacer_bench.config import read_bench_config
    from pacer_bench.run import run_bench
    from pacer_bench.units import Models
    from pacer_plugins.eagle.drafter import draft_identity

    from helpers import CharTokenizer, write_bench

    target_model = tiny_llama(0)
    draft = make_draft(target_model, tmp_path / "draft")
    grown_with = draft_identity(draft)
    config = write_bench(
        tmp_path,
        "stacks:\n"
        f"  tree: {{strategy: {{drafter: {{name: eagle, path: '{draft}', tree: {{topk: 3, depth: 3, nodes: 8}}}}, "
        "stop: [{name: fixed, gamma: 3}], verifier: {name: greedy}, observers: [{name: metrics}, {name: tree_log}]}}\n",
    )
    bench, stacks = read_bench_config(config)
    run = tmp_path / "run"
    models = Models(adapter(target_model), None, CharTokenizer())
    assert run_bench(bench, stacks, run, models=models, progress=False, report=False) == 0
    shutil.rmtree(draft)
    make_draft(target_model, draft, seed=1)  # the folder now holds another draft
    assert draft_identity(draft) != grown_with
    out = tmp_path / "calibration.json"
    code, _, err = run_cli(["replay", str(run), "--save-calibration", str(out)], capsys)
    assert code == 0, err
    assert calibrations.load(out).draft == grown_with
    # a run recorded before bench.json recorded the draft: derived from the folder as it is now
    meta = json.loads((run / META).read_text())
    for unit in meta["units"]:
        del unit["draft"]
    (run / META).write_text(json.dumps(meta))
    code, _, err = run_cli(["replay", str(run), "--save-calibration", str(out)], capsys)
    assert code == 0, err
    assert calibrations.load(out).draft == draft_identity(draft)


def test_replay_reads_the_recorded_draft_identity_and_refuses_a_unit_recording_none(tmp_path, capsys):
    draft = make_draft(tiny_llama(0), tmp_path / "draft")
    eagle = {"name": "eagle", "path": str(draft), "tree": {"topk": 3}}
    recorded = {"folder": "draft", "identity": "eagle:t:w"}
    run, out = write_tree_run(tmp_path / "run", eagle, tree_steps(30), draft=recorded), tmp_path / "c.json"
    code, _, err = run_cli(["replay", str(run), "--save-calibration", str(out)], capsys)
    assert code == 0, err
    assert calibrations.load(out).draft == "eagle:t:w"  # the recorded one, not the folder's
    damaged = write_tree_run(tmp_path / "damaged", eagle, tree_steps(30), draft={"folder": "draft", "identity": None})
    code, _, err = run_cli(["replay", str(damaged), "--save-calibration", str(out)], capsys)
    assert_one_line_error(code, err, "records no identity of the draft it read", "rerun the bench")


def test_the_shipped_calibration_is_the_committed_runs_and_names_the_shipped_draft():
    """plugins/eagle/default/calibration.json: valid, fitted for the shipped draft, and what
    the command its manifest records makes from the committed recordings."""
    from pathlib import Path

    from pacer_bench.replay.calibration import run_calibration
    from pacer_bench.replay.recorded import RecordedRun
    from pacer_plugins.eagle.drafter import DEFAULT_DRAFT, draft_identity

    shipped = calibrations.load(DEFAULT_DRAFT / calibrations.FILE)
    assert shipped.draft == draft_identity(DEFAULT_DRAFT)
    manifest = json.loads((DEFAULT_DRAFT / "manifest.json").read_text())
    assert manifest["tree_calibration"] == calibrations.FILE
    assert manifest["tree_calibration_fitted_by"].startswith(shipped.source + ":")
    run = shipped.source.split()[2]  # pacer replay RUN --save-calibration FILE
    recorded = RecordedRun.load(Path(__file__).resolve().parents[1] / run)
    assert run_calibration(recorded, shipped.source) == shipped


def test_replay_refuses_a_calibration_fitted_on_another_draft_as_the_engine_does(tmp_path, capsys):
    """--calibration prices nodes: auto on the run's logged trees: a calibration fitted on another
    draft's trees (or named for a drafter that names no draft) is refused in one line, as
    tree.calibration is by the engine; the run's own draft's calibration is used."""
    draft = make_draft(tiny_llama(0), tmp_path / "draft")
    steps = tree_steps(60)
    run = write_tree_run(tmp_path / "run", {"name": "eagle", "path": str(draft), "tree": {"topk": 3}}, steps)
    other = tmp_path / "other.json"
    calibrations.save(other, Calibration(SHALLOW.upper, SHALLOW.rate, draft="eagle:none:0123"))
    code, _, err = run_cli(["replay", str(run), "--profile", "a100-7b-bf16", "--calibration", str(other)], capsys)
    assert_one_line_error(
        code,
        err,
        f"--calibration '{other}' was fitted on the trees of draft eagle:none:0123",
        "stack 'tree' logged its trees with draft eagle:",
        "--save-calibration",
    )
    own = tmp_path / "own.json"
    code, _, err = run_cli(["replay", str(run), "--save-calibration", str(own)], capsys)
    assert code == 0, err
    from pacer_bench.replay.calibration import check_calibration
    from pacer_bench.replay.recorded import RecordedRun

    check_calibration(RecordedRun.load(run), calibrations.load(own), str(own))  # the run's own draft: used
    token = write_tree_run(tmp_path / "token", {"name": "draft_model", "tree": {"topk": 3}}, steps)
    code, _, err = run_cli(["replay", str(token), "--profile", "a100-7b-bf16", "--calibration", str(own)], capsys)
    assert_one_line_error(code, err, "a draft_model drafter, which names no draft")


def test_a_calibration_that_cannot_be_saved_is_named_as_given(tmp_path, capsys):
    """atomic writes name the path given, never the temporary file beside it."""
    from pathlib import Path

    from pacer_core.atomic import atomic_write

    if not Path("/proc").is_dir():
        pytest.skip("needs /proc, where no file can be made")
    with pytest.raises(OSError) as info:
        atomic_write(Path("/proc/pacer-calibration.json"), lambda f: f.write(b"{}"))
    assert info.value.filename == "/proc/pacer-calibration.json"
    draft = make_draft(tiny_llama(0), tmp_path / "draft")
    run = write_tree_run(tmp_path / "run", {"name": "eagle", "path": str(draft), "tree": {"topk": 3}}, tree_steps(30))
    code, _, err = run_cli(["replay", str(run), "--save-calibration", "/proc/pacer-calibration.json"], capsys)
    assert_one_line_error(code, err, "/proc/pacer-calibration.json")
    assert ".tmp" not in err


@pytest.mark.parametrize("depth, per_forward, forwards", [(3, 1, 3), (3, 4, 1), (4, 4, 1), (6, 4, 2)])
def test_auto_prices_a_tree_by_the_draft_forwards_that_grew_it(depth, per_forward, forwards):
    """A level a forward for a one-token drafter; a block drafter's whole block is one forward, so a
    tree over a block costs one forward up to the block's depth and another per block beyond."""
    profile = load_profile("a100-7b-bf16")
    cost = profile.cost_model("block", tokens_per_forward=per_forward)
    budget = NodeBudget(TreeConfig(nodes="auto"), "cuda", cost)
    tree = chain_tree(depth)
    nodes = budget.select(tree)
    sent = len(tree) if nodes is None else len(nodes)
    drafting = budget.seconds - budget.sending_seconds(sent + 1)
    assert drafting == pytest.approx(forwards * profile.draft_forward("block"))
