"""``pacer replay``: a recorded run priced under a cost profile. On models whose forwards cost exactly
what a profile says (a fake clock advanced by each forward), the replay's predicted speedup equals the
speedup the run measured; a wrong cost rule is caught."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import attrs
import pytest

from pacer_bench.answers import make_record
from pacer_bench.replay import predictions, profiles, recorded, steplog, trees
from pacer_bench.replay.recorded import RecordedRun
from pacer_core.cost_profiles import profile_from_dict
from pacer_core.testing import ScriptedLM

from helpers import DRAFT_TABLE, PROMPT, TARGET_TABLE, assert_one_line_error, build_engine, run_cli
from helpers import SCRIPTED_VOCAB as VOCAB

PROFILE = {
    "format": 1,
    "name": "fake",
    "kind": "measured",
    "device": "a fake clock",
    "verify_s": {1: 0.020, 2: 0.021, 4: 0.023, 8: 0.026, 16: 0.032, 64: 0.060},
    "tree_verify_s": {1: 0.022, 4: 0.025, 16: 0.035, 64: 0.070},
    "draft_s": {"token": {1: 0.003}},
    "host_s": {"plain": 1e-12, "chain": 1e-12},
    "sources": {"verify_s": "test", "draft_s": "test", "host_s": "test"},
}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Costed:
    """A model whose every forward advances ``clock`` by what the profile says it costs."""

    def __init__(self, model, clock: Clock, cost):
        self.model, self.clock, self.cost = model, clock, cost

    def __getattr__(self, name):
        return getattr(self.model, name)

    @property
    def cached_tokens(self):
        return self.model.cached_tokens

    def forward(self, tokens, **kwargs):
        self.clock.now += self.cost(len(tokens), kwargs.get("tree_mask") is not None)
        return self.model.forward(tokens, **kwargs)


STACKS = {
    "autoregressive": ("autoregressive", ""),
    "chain": ("draft_model", "{name: fixed, gamma: 3}"),
    "tree": ("draft_model, tree: {topk: 3, depth: 3, nodes: 7}", "{name: fixed, gamma: 3}"),
    "lookup": ("prompt_lookup", "{name: heuristic}"),
}
PROMPTS = {"p0": PROMPT, "p1": [3, 5, 7, 1, 2], "p2": [6, 6, 1]}


def recorded_run(profile_data: dict) -> tuple[dict, list[dict]]:
    """Bench-style meta and records of every stack on every prompt, timed by the fake clock."""
    profile = profile_from_dict(profile_data)
    tree_verify = profile.tree_verify or profile.verify
    records, units = [], []
    for name, (drafter, stop) in STACKS.items():
        clock = Clock()
        target = Costed(
            ScriptedLM(VOCAB, table=TARGET_TABLE), clock, lambda k, tree: tree_verify(k) if tree else profile.verify(k)
        )
        draft = Costed(ScriptedLM(VOCAB, table=DRAFT_TABLE), clock, lambda k, tree: profile.draft_forward("token", k))
        engine = build_engine(target, draft, drafter, stop, {"temperature": 0.0}, verifier="greedy")
        engine.clock = clock
        observers = __import__("pacer_plugins.pacer_builtins.observers", fromlist=["Metrics"])
        engine.pm.register(observers.Metrics(None, None))
        units.append(
            {"name": name, "kind": "stack", "config": {"strategy": {"drafter": {"name": drafter.split(",")[0]}}}}
        )
        for question, prompt in PROMPTS.items():
            result = engine.generate(prompt, max_new_tokens=24)
            prompt_obj = type("P", (), {"question_id": question, "category": None})()
            records.append(
                make_record(
                    "set",
                    prompt_obj,
                    name,
                    "stack",
                    0,
                    list(prompt),
                    result.tokens,
                    "",
                    result.metrics,
                    result.finish_reason,
                    None,
                )
            )
    return {"units": units, "prompt_sets": ["set"]}, records


@pytest.fixture(scope="module")
def run():
    return recorded_run(PROFILE)


def test_replay_predicts_the_measured_speedup_when_costs_are_known_exactly(run):
    meta, records = run
    prediction = predictions.predict(RecordedRun.parse(meta, records), profile_from_dict(PROFILE))
    rows = prediction["sets"]["all"]
    assert set(rows) == set(STACKS)
    for name, row in rows.items():
        assert row["predicted_speedup"] == pytest.approx(row["measured_speedup"], rel=1e-6), name
    assert rows["tree"]["tree"] and not rows["chain"]["tree"]
    assert rows["chain"]["tau"] > 1 and rows["tree"]["tau"] > 1
    # under another profile the same steps predict another speedup: flat verification favours trees
    flat = dict(PROFILE, verify_s={1: 0.02, 64: 0.0201}, tree_verify_s={1: 0.02, 64: 0.0201})
    other = predictions.predict(RecordedRun.parse(meta, records), profile_from_dict(flat))["sets"]["all"]
    assert other["tree"]["predicted_speedup"] > rows["tree"]["predicted_speedup"]
    assert "predicted under measured profile 'fake'" in predictions.markdown(prediction)


def test_a_wrong_cost_rule_is_caught(run):
    """Charging a tree step the chain curve (or forgetting the drafter's prompt forward) moves the
    prediction off the measurement, so the test above can fail."""
    meta, records = run
    wrong = predictions.predict(RecordedRun.parse(meta, records), profile_from_dict(dict(PROFILE, tree_verify_s=None)))[
        "sets"
    ]["all"]
    assert wrong["tree"]["predicted_speedup"] != pytest.approx(wrong["tree"]["measured_speedup"], rel=1e-3)


def write_run(folder: Path, meta: dict, records: list[dict]) -> Path:
    from pacer_bench.answers import ANSWERS, META

    folder.mkdir(parents=True, exist_ok=True)
    (folder / META).write_text(json.dumps({"version": 1, "baseline": "autoregressive", "settings": {}, **meta}))
    (folder / ANSWERS).write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_pacer_replay_prints_the_labelled_table(run, tmp_path, capsys):
    folder = write_run(tmp_path / "run", *run)
    profile = tmp_path / "fake.yaml"
    import yaml

    profile.write_text(yaml.safe_dump(PROFILE))
    code, out, err = run_cli(["replay", str(folder), "--profile", str(profile), "--profile", "a100-7b-bf16"], capsys)
    assert code == 0, err
    assert "predicted under measured profile 'fake'" in out
    assert "predicted under published profile 'a100-7b-bf16'" in out
    code, out, err = run_cli(["replay", str(folder), "--profile", str(profile), "--json"], capsys)
    rows = json.loads(out)[0]["sets"]["all"]
    assert rows["chain"]["predicted_speedup"] == pytest.approx(rows["chain"]["measured_speedup"], rel=1e-6)


def test_replay_refuses_bad_input_in_one_line(run, tmp_path, capsys):
    folder = write_run(tmp_path / "run", *run)
    code, _, err = run_cli(["replay", str(folder), "--profile", "no-such-profile"], capsys)
    assert_one_line_error(code, err, "no cost profile 'no-such-profile'", "a100-7b-bf16")
    code, _, err = run_cli(["replay", str(tmp_path), "--profile", "a100-7b-bf16"], capsys)
    assert_one_line_error(code, err, "is not a bench folder")
    meta, records = run
    stripped = [
        dict(r, metrics={k: v for k, v in r["metrics"].items() if not k.endswith("_per_step")}) for r in records
    ]
    old = write_run(tmp_path / "old", meta, stripped)
    code, _, err = run_cli(["replay", str(old), "--profile", "a100-7b-bf16"], capsys)
    assert_one_line_error(code, err, "no recorded steps")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "format: 1\nname: x\nkind: measured\ndevice: d\nverify_s: {1: 0.02, 2: 0.01}\n"
        "draft_s: {}\nhost_s: {plain: 0.001, chain: 0.001}\nsources: {verify_s: a, draft_s: b, host_s: c}\n"
    )
    code, _, err = run_cli(["replay", str(folder), "--profile", str(bad)], capsys)
    assert_one_line_error(code, err, "verify_s falls from 0.02 s at k=1 to 0.01 s at k=2")


# -- tree shapes on logged trees ---------------------------------------------------------------------
def test_a_logged_tree_replays_to_the_run_it_came_from():
    """The tree_log observer's steps, replayed with the logged shape and every node sent, give back
    the run's own τ; a narrower shape or a chain never accepts more."""
    from pacer_core import Engine, load_config

    target, draft = ScriptedLM(VOCAB, table=TARGET_TABLE), ScriptedLM(VOCAB, table=DRAFT_TABLE)
    cfg = load_config(
        overrides=[
            "strategy.drafter={name: draft_model, tree: {topk: 3, depth: 3, nodes: 512}}",
            "strategy.stop=[{name: fixed, gamma: 3}]",
            "strategy.verifier={name: greedy}",
            "strategy.observers=[{name: metrics}, {name: tree_log}]",
            "generation.ignore_eos=true",
        ],
        require_models=False,
    )
    engine = Engine.build(target, draft=draft, cfg=cfg)
    records, emitted, steps = [], 0, 0
    for question, prompt in PROMPTS.items():
        result = engine.generate(prompt, max_new_tokens=24)
        assert len(result.metrics["tree_steps"]) == result.metrics["steps"]  # the scripted draft drafts at once
        # emitted as a step would without the budget's cut: accepted + 1 (the replay's count)
        emitted += sum(a + 1 for a in result.metrics["accepted_per_step"])
        steps += result.metrics["steps"]
        records.append({"model_id": "tree", "prompt_set": "set", "metrics": result.metrics})
    logged = RecordedRun.parse({"units": []}, records).logged_trees("tree")
    result = trees.replay_shapes(logged, profile_from_dict(PROFILE), kind="token")
    table = result["table"]
    assert table["tree k3 d3 all"]["all"]["tau"] == pytest.approx(emitted / steps)
    assert table["oracle tree"]["all"]["tau"] == pytest.approx(emitted / steps)
    assert all(row["all"]["tau"] <= emitted / steps + 1e-9 for row in table.values())
    assert table["chain γ=3"]["all"]["tau"] <= table["tree k3 d3 all"]["all"]["tau"]
    assert "predicted under measured profile 'fake'" in trees.markdown(result)


def synthetic_trees(count: int, topk: int, depth: int, seed: int = 0) -> list:
    """Trees whose draft probabilities are calibrated: a node is accepted, given its parent was,
    with probability q / (sum of its siblings' q) × the chance the target's token is among them."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parents, q, level = [], [], [-1]
        for _d in range(depth):
            nxt = []
            for parent in level:
                weights = sorted((rng.random() ** 3 for _ in range(topk)), reverse=True)
                total = sum(weights) / rng.uniform(0.6, 0.95)
                for w in weights:
                    if len(nxt) >= topk:
                        break
                    parents.append(parent)
                    q.append(w / total)
                    nxt.append(len(parents) - 1)
            level = nxt
        main, node = [], -1
        while True:
            children = [i for i, p in enumerate(parents) if p == node]
            if not children:
                break
            node = children[0]
            main.append(node)
        path, node = [], -1
        while True:
            children = [i for i, p in enumerate(parents) if p == node]
            draw, chosen = rng.random(), None
            for c in children:
                draw -= q[c]
                if draw < 0:
                    chosen = c
                    break
            if chosen is None:
                break
            path.append(chosen)
            node = chosen
        out.append(steplog.LoggedTree(tuple(parents), tuple(q), tuple(main), tuple(path), "set"))
    return out


@pytest.mark.parametrize("profile_name", ["cpu-2core-smollm2-fp32", "a100-7b-bf16"])
def test_auto_is_at_least_about_the_best_fixed_budget(profile_name):
    """On trees whose draft probabilities are calibrated, nodes: auto under a profile is within 3% of
    the best fixed budget and the best chain that hindsight picks under the same profile."""
    from pacer_core.cost_profiles import load_profile

    steps = [attrs.evolve(s, prompt=str(i % 20)) for i, s in enumerate(synthetic_trees(400, topk=6, depth=5))]
    result = trees.replay_shapes(steps, load_profile(profile_name), kind="feature")
    speed = {name: row["all"]["speedup"] for name, row in result["table"].items()}
    best = result["best"]
    assert speed[best["auto"]] >= 0.97 * max(speed[best["tree"]], speed[best["chain"]])
    # valued by acceptance calibrated on the other prompts' steps, too
    assert speed[best["auto calibrated"]] >= 0.97 * max(speed[best["tree"]], speed[best["chain"]])


def test_calibration_reads_acceptance_rates_off_logged_trees():
    from pacer_core.trees import node_values

    steps = [attrs.evolve(s, prompt=str(i % 2)) for i, s in enumerate(synthetic_trees(300, topk=4, depth=3, seed=3))]
    table = trees.fit_calibration(steps, bins=4)
    assert len(table.rate) == 3  # one row per depth
    for rates in table.rate:
        assert list(rates) == sorted(rates) and all(0 <= r <= 1 for r in rates)  # non-decreasing in the probability
    step = steps[0]
    values = node_values(trees._subtree(step, list(range(len(step.parents)))), calibration=table)
    assert all(values[i] <= values[p] for i, p in enumerate(step.parents) if p >= 0)  # never above the parent


# -- replay-stop's options ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--gammas", "0,-1"], "--gammas takes finite numbers >= 1, got 0"),
        (["--b", "0"], "--b takes finite numbers >= 1, got 0"),
        (["--t0", "nan"], "--t0 takes finite numbers >= 0 and <= 1, got nan"),
        (["--margins", "0"], "--margins takes finite numbers > 0, got 0"),
        (["--confidence", ""], "--confidence is empty"),
        (["--draft-token-s", "nan"], "holds no valid cost model"),
    ],
)
def test_replay_stop_refuses_bad_options_in_one_line(tmp_path, capsys, argv, needle):
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"verify_s": [0.05, 0.06], "draft_token_s": 0.005}))
    code, _, err = run_cli(["replay-stop", str(tmp_path / "none"), "--costs", str(costs), *argv], capsys)
    assert_one_line_error(code, err, needle)


def test_replay_stop_takes_a_profile_or_a_cost_file_and_refuses_nan_costs(tmp_path, capsys):
    code, _, err = run_cli(["replay-stop", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "--costs FILE or --profile NAME|FILE")
    nan = tmp_path / "nan.json"
    nan.write_text('{"verify_s": [0.05, NaN], "draft_token_s": 0.005}')
    code, _, err = run_cli(["replay-stop", str(tmp_path), "--costs", str(nan)], capsys)
    assert_one_line_error(code, err, "holds no valid cost model")
    code, _, err = run_cli(["replay-stop", str(tmp_path / "none"), "--profile", "a100-7b-bf16"], capsys)
    assert_one_line_error(code, err, "holds no simulated items")  # the profile was read: the folder is refused


# -- the bench's predicted columns --------------------------------------------------------------------
def test_the_bench_report_predicts_under_the_profiles_it_names(tmp_path):
    from pacer_bench import units
    from pacer_bench.config import read_bench_config
    from pacer_bench.run import run_bench

    from helpers import CharTokenizer, adapter, tiny_llama, write_bench_config

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"question_id": f"q{i}", "prompt": p}) + "\n"
            for i, p in enumerate(["abc abc abc abc abc", "to be or not to be, to be"])
        )
    )
    body = (
        "stacks:\n  fixed2: {strategy: {drafter: {name: prompt_lookup}, stop: [{name: fixed, gamma: 2}], "
        "verifier: {name: greedy}}}\npredict: [a100-7b-bf16, cpu-2core-smollm2-fp32]\nplots: false\n"
    )
    cfg, stacks = read_bench_config(write_bench_config(tmp_path, prompts, 16, body))
    models = units.Models(adapter(tiny_llama(0)), None, CharTokenizer())
    assert run_bench(cfg, stacks, tmp_path / "out", models=models, progress=False) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [p["profile"] for p in results["predicted"]] == ["a100-7b-bf16", "cpu-2core-smollm2-fp32"]
    assert results["predicted"][0]["sets"]["all"]["fixed2"]["predicted_speedup"] > 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "predicted under published profile 'a100-7b-bf16'" in report


def test_a_bench_naming_an_unknown_profile_is_refused_before_models_load(tmp_path, capsys):
    from helpers import write_bench_config

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"question_id": "q0", "prompt": "abc"}) + "\n")
    config = write_bench_config(tmp_path, prompts, 8, "stacks: {}\npredict: [no-such-gpu]\n")
    code, _, err = run_cli(["bench", "--config", str(config), "--out", str(tmp_path / "out")], capsys)
    assert_one_line_error(code, err, "no cost profile 'no-such-gpu'")


def test_a_measured_profile_cached_for_the_device_sizes_trees_there(tmp_path, monkeypatch):
    """`pacer costs --profile` caches the profile per device type and target; `nodes: auto` with no
    profile named reads it there, else the device's shipped profile."""
    import yaml

    from pacer_core.cost_profiles import measured_profile_path
    from pacer_core.trees import TreeConfig, node_budget

    monkeypatch.setenv("PACER_CACHE", str(tmp_path))
    from pacer_core.cost_profiles import load_profile

    shipped = load_profile("cpu-2core-smollm2-fp32").verify(1)
    tree = TreeConfig(nodes="auto")
    assert node_budget(tree, "cpu", "feature", "abc").cost.verify(1) == pytest.approx(shipped)  # the shipped CPU one
    path = measured_profile_path("cpu", "abc")
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(dict(PROFILE, draft_s={"feature": {1: 0.001}})))
    assert node_budget(tree, "cpu", "feature", "abc").cost.verify(1) == pytest.approx(0.020)
    assert node_budget(tree, "cpu", "feature", "other").cost.verify(1) == pytest.approx(shipped)
    assert node_budget(tree, "cpu", "token", "abc").cost.verify(1) == pytest.approx(shipped)  # no token draft there
    named = TreeConfig(nodes="auto", profile="a100-7b-bf16")
    assert node_budget(named, "cpu", "feature", "abc").cost.verify(1) == pytest.approx(0.024)


def test_the_pacer_stops_throughput_rule_takes_a_profile():
    from pacer_core import load_config
    from pacer_core.cost_profiles import load_profile
    from pacer_plugins.pacer_stop.policy import PacerStopConfig, load_costs

    config = PacerStopConfig(rule="throughput", profile="a100-7b-bf16")
    profile = load_profile("a100-7b-bf16")
    for kind, per_forward in (("feature", 1), ("token", 1), ("block", 4)):  # the drafter's Component.cost_kind
        resources = SimpleNamespace(draft_cost_kind=kind, draft_tokens_per_forward=per_forward)
        cost = load_costs(config, resources=resources)
        assert cost.verify(1) == pytest.approx(0.024)
        # the profile prices a forward: a block's token costs a quarter of it, the whole block one forward
        assert cost.draft_token_s == pytest.approx(profile.draft_forward(kind) / per_forward), kind
        assert (
            cost.draft(per_forward) == pytest.approx(cost.draft_forward_s) == pytest.approx(profile.draft_forward(kind))
        )
    none = SimpleNamespace(draft_cost_kind=None, draft_tokens_per_forward=1)
    assert load_costs(config, resources=none).draft_token_s == 0  # no draft forward
    with pytest.raises(ValueError, match="one cost source"):
        PacerStopConfig(rule="throughput", profile="a100-7b-bf16", cost_file="x.json")
    with pytest.raises(Exception, match="no cost profile 'nope'"):
        load_costs(PacerStopConfig(rule="throughput", profile="nope"), resources=None)
    load_config(
        overrides=[
            "strategy.drafter={name: draft_model}",
            "strategy.stop=[{name: pacer, rule: throughput, profile: a100-7b-bf16}]",
        ],
        require_models=False,
    )


def test_replay_can_take_this_engines_host_time(run, tmp_path, capsys):
    folder = write_run(tmp_path / "run", *run)
    host = tmp_path / "host.json"
    host.write_text(
        json.dumps({"results": [], "host_s": {"plain": 0.0002, "chain": 0.0004, "tree": {"10": 0.0006, "64": 0.001}}})
    )
    code, out, err = run_cli(
        ["replay", str(folder), "--profile", "a100-7b-bf16", "--host", str(host), "--json"], capsys
    )
    assert code == 0, err
    assert json.loads(out)[0]["profile"] == "a100-7b-bf16 + host time of host.json"
    host.write_text(json.dumps({"host_s": {"plain": -1, "chain": 0.1}}))
    code, _, err = run_cli(["replay", str(folder), "--profile", "a100-7b-bf16", "--host", str(host)], capsys)
    assert_one_line_error(code, err, "host_s.plain must be a positive number of seconds")


def timed_run(run, drafter: str) -> tuple[dict, list[dict], dict]:
    """The fake-clock run as a bench with a verification-cost probe records it: every second in a
    forward (``forward_s``), its chain stack a fixed chain of ``drafter``, its tree stack a tree."""
    meta, records = run
    profile = profile_from_dict(PROFILE)
    timed = [dict(r, metrics=dict(r["metrics"], forward_s=r["metrics"]["wall_s"])) for r in records]
    chain = {"strategy": {"drafter": {"name": drafter}, "stop": [{"name": "fixed", "gamma": 3}]}}
    tree = {"strategy": {"drafter": {"name": drafter, "tree": {"topk": 3, "depth": 3, "nodes": 7}}}}
    meta = {
        **meta,
        "units": [
            dict(u, config={"chain": chain, "tree": tree}[u["name"]]) if u["name"] in ("chain", "tree") else u
            for u in meta["units"]
        ],
    }
    cost_file = {
        "verify_s": [profile.verify(k) for k in range(1, 17)],
        "tree_k": [4, 16, 32],
        "tree_verify_s": [profile.tree_verify(k) for k in (4, 16, 32)],
    }
    return meta, timed, cost_file


@pytest.mark.parametrize("drafter, kind", [("draft_model", "token"), ("dflash", "block")])
def test_the_runs_own_profile_recovers_the_costs_it_ran_under(run, drafter, kind):
    """profile_from_run reads the probe's curves and fits the draft forward and host time from the
    fixed chains and plain decoding; on the fake-clock run (all time in forwards) it recovers the
    draft's cost under the drafter's cost kind (a block drafter's one forward a block included),
    and every stack's prediction is its measurement."""
    meta, timed, cost_file = timed_run(run, drafter)
    measured = profiles.profile_from_run(RecordedRun.parse(meta, timed, cost_file))
    assert measured.draft_forward(kind) == pytest.approx(0.003, rel=1e-6)
    assert set(measured.draft) == {kind}
    rows = predictions.predict(RecordedRun.parse(meta, timed), measured)["sets"]["all"]
    for name in ("chain", "tree"):
        assert rows[name]["predicted_speedup"] == pytest.approx(rows[name]["measured_speedup"], rel=1e-4), name
    with pytest.raises(Exception, match="verification-cost probe"):
        profiles.profile_from_run(RecordedRun.parse(meta, timed, None))


def test_pacer_replay_parses_each_record_once_and_measures_the_runs_profile_once(run, tmp_path, capsys, monkeypatch):
    """However many profiles it prices under (the run's own among them, also saved), ``pacer replay``
    reads each record's steps once and measures the run's profile once; the saved profile is the
    one it priced under, named after its file."""
    from pacer_core.cost_profiles import load_profile

    meta, timed, cost_file = timed_run(run, "draft_model")
    folder = write_run(tmp_path / "run", meta, timed)
    (folder / "cost_model.json").write_text(json.dumps(cost_file))
    parsed, measured = [], []  # every LoggedStep made, wherever: a record parsed twice makes its steps twice
    init, measure = steplog.LoggedStep.__init__, profiles.profile_from_run
    monkeypatch.setattr(steplog.LoggedStep, "__init__", lambda self, *a: parsed.append(a) or init(self, *a))
    monkeypatch.setattr(
        "pacer_bench.replay.command.profile_from_run", lambda *a, **k: measured.append(a) or measure(*a, **k)
    )
    saved = tmp_path / "mine.yaml"
    code, out, err = run_cli(
        [
            "replay",
            str(folder),
            "--profile",
            "run",
            "--profile",
            "a100-7b-bf16",
            "--profile",
            "run",
            "--save-profile",
            str(saved),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    assert len(parsed) == sum(len(r["metrics"]["accepted_per_step"]) for r in timed) and len(measured) == 1
    priced = json.loads(out)
    assert [p["profile"] for p in priced] == ["run", "a100-7b-bf16", "run"]
    assert priced[0] == priced[2]
    written = load_profile(saved)
    assert written.name == "mine" and written.draft_forward("token") == pytest.approx(0.003, rel=1e-6)


# -- damaged records and unbounded costs are refused in one line ---------------------------------------
def _damaged(record: dict, field: str, value) -> dict:
    """``record`` with ``field`` (``metrics.x``, ``metrics.x[0]``, or a top-level key) set to ``value``."""
    record = json.loads(json.dumps(record))
    where, _, key = field.rpartition(".")
    target = record["metrics"] if where == "metrics" else record
    if key.endswith("]"):
        name, index = key[:-1].split("[")
        target[name][int(index)] = value
    else:
        target[key] = value
    return record


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("metrics.accepted_per_step[0]", float("nan"), "'metrics.accepted_per_step[0]' is NaN, not a count"),
        ("metrics.drafted_per_step[1]", -2, "'metrics.drafted_per_step[1]' is -2, not a count"),
        ("metrics.nodes_per_step[0]", 1e30, "'metrics.nodes_per_step[0]' is 1e+30, not a count from 0 to 1048576"),
        ("metrics.nodes_per_step[0]", 10**30, "not a count from 0 to 1048576"),
        ("metrics.draft_forwards", -1, "'metrics.draft_forwards' is -1, not a count"),
        ("metrics.steps", float("inf"), "'metrics.steps' is Infinity, not a count"),
        ("metrics.wall_s", float("nan"), "'metrics.wall_s' is NaN, not a number of seconds"),
        ("metrics.forward_s", "x", "'metrics.forward_s' is \"x\", not a number of seconds"),
        ("prompt_tokens", "12", "'prompt_tokens' is \"12\", not a count"),
        ("metrics.accepted_per_step[0]", 99, "more than the"),
        (
            "metrics.tree_steps",
            [{"parents": [-1, 5], "q": [0.5, 0.5], "main": [0], "path": []}],
            "'metrics.tree_steps[0]' has a parent that is not -1 (the root) or an earlier node",
        ),
        ("metrics.tree_steps", [{"parents": [-1], "q": [2.0], "main": [0], "path": []}], "not one probability"),
        ("metrics.tree_steps", [{"parents": [-1], "q": [0.5], "main": [3], "path": []}], "has main [3]"),
        ("metrics.tree_steps", "x", "not the tree_log observer's list of steps"),
    ],
)
def test_replay_refuses_a_record_field_it_cannot_price_naming_the_file_record_and_field(
    run, tmp_path, capsys, field, value, needle
):
    meta, records = run
    at = next(i for i, r in enumerate(records) if r["model_id"] == "tree")
    damaged = list(records)
    damaged[at] = _damaged(records[at], field, value)
    folder = write_run(tmp_path / "run", meta, damaged)
    code, _, err = run_cli(["replay", str(folder), "--profile", "a100-7b-bf16"], capsys)
    assert_one_line_error(code, err, f"answer log '{folder / 'answers.jsonl'}' line {at + 1}", needle)


def test_a_per_step_list_of_another_length_is_refused(run, tmp_path, capsys):
    meta, records = run
    damaged = [dict(records[0], metrics=dict(records[0]["metrics"], nodes_per_step=[1]))] + list(records[1:])
    folder = write_run(tmp_path / "run", meta, damaged)
    code, _, err = run_cli(["replay", str(folder), "--profile", "a100-7b-bf16"], capsys)
    assert_one_line_error(code, err, "line 1", "the per-step lists differ in length")


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"verify_s": {1: 1e308, 2: 1e308}}, "verify_s.1 must be a positive number of seconds (1e-15 to 3600)"),
        ({"host_s": {"plain": 1e-12, "chain": 1e-12, "tree": {10: 1e308}}}, "host_s.tree.10 must be a positive number"),
        ({"draft_s": {"token": {1: 5e-324}}}, "draft_s.token.1 must be a positive number"),
        ({"verify_s": {1: 0.02, 2**40: 0.03}}, "token counts are integers from 1 to 1048576"),
        ({"context": 10**12}, "context must be a whole number of cached tokens (0 to 1048576)"),
    ],
)
def test_a_profile_with_costs_no_replay_can_price_is_refused(run, tmp_path, capsys, change, needle):
    import yaml

    folder = write_run(tmp_path / "run", *run)
    profile = tmp_path / "huge.yaml"
    profile.write_text(yaml.safe_dump(dict(PROFILE, **change)))
    code, _, err = run_cli(["replay", str(folder), "--profile", str(profile)], capsys)
    assert_one_line_error(code, err, needle)
    host = tmp_path / "host.json"  # the --host file is bounded the same way
    host.write_text(json.dumps({"host_s": {"plain": 0.0002, "chain": 0.0004, "tree": {"10": 1e308}}}))
    code, _, err = run_cli(["replay", str(folder), "--profile", "a100-7b-bf16", "--host", str(host)], capsys)
    assert_one_line_error(code, err, "host_s.tree.10 must be a positive number of seconds")


def test_cost_models_are_bounded_and_a_speedup_without_tokens_is_no_number(run, tmp_path, capsys):
    from pacer_core.cost_profiles import CostModel

    for bad in ([1e308], [0.01, float("inf")], [-1.0]):
        with pytest.raises(ValueError, match="verify_s needs times from 1e-15 to 3600 s"):
            CostModel(bad)
    with pytest.raises(ValueError, match="step_s must be 0 or a time"):
        CostModel([0.01], step_s=1e300)
    meta, records = run
    folder = write_run(tmp_path / "run", meta, records)
    (folder / "cost_model.json").write_text(json.dumps({"verify_s": [0.01, 1e308]}))
    code, _, err = run_cli(["replay", str(folder), "--profile", "run"], capsys)
    assert_one_line_error(code, err, "cost model", "under 'verify_s'")
    # plain decoding that emitted nothing: no rate to compare with, "—" rather than a ZeroDivisionError
    empty = [dict(r, tokens=[]) if r["model_id"] == "autoregressive" else r for r in records]
    rows = predictions.predict(RecordedRun.parse(meta, empty), profile_from_dict(PROFILE))["sets"]["all"]
    assert rows["chain"]["predicted_speedup"] is None and rows["chain"]["measured_speedup"] is None
    assert "| set | chain | " in predictions.markdown(
        {"profile": "p", "kind": "k", "device": "d", "oracle": None, "sets": {"set": rows}, "trees": {}}
    )


def test_the_runs_own_profile_is_bounded_as_a_profile_file_is(run):
    meta, records = run
    timed = [dict(r, metrics=dict(r["metrics"], forward_s=0.0, wall_s=9e6)) for r in records]
    with pytest.raises(Exception, match="measured from the run.*host_s.* must be a positive number of seconds"):
        profiles.profile_from_run(RecordedRun.parse(meta, timed, {"verify_s": [0.02, 0.021]}))


def test_a_run_recorded_without_cost_kinds_has_each_stack_planned_once(resolutions):
    """An older run's units carry no ``cost_kind``: each distinct stack is planned once to read it."""
    eagle = {"name": "eagle-old", "config": {"strategy": {"drafter": {"name": "eagle", "path": "x"}}}}
    token = {"name": "token-old", "config": {"strategy": {"drafter": {"name": "draft_model"}}}}
    recorded._resolved_cost_kind.cache_clear()
    assert [recorded.drafter_kind(u) for u in (eagle, token, eagle, token)] == ["feature", "token"] * 2
    assert resolutions == {"plugin_managers": 2, "resolutions": 2}
