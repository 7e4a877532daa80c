"""``pacer bench`` / ``report`` / ``ablate`` and the oracle replay, on tiny seeded models.

``pacer_bench.units.load_models`` is replaced by one returning tests/helpers.py's tiny models and a character
tokenizer, so nothing real loads. Timings on tiny models mean nothing; the tests check bookkeeping:
records, resumption, recomputation, exactness and the oracle's arithmetic.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from pathlib import Path

import pytest

from pacer_bench import units
from pacer_bench.answers import AnswerLog, first_divergence
from pacer_bench.config import (
    HF_BASELINES,
    BenchConfig,
    BenchModelConfig,
    model_config,
    read_ablate_config,
    read_bench_config,
)
from pacer_bench.replay.chains import analyse, captured_share, replay_best, replay_fixed, replay_logged, replay_oracle
from pacer_bench.replay.steplog import LoggedStep, steps_from_metrics
from pacer_bench.run import run_bench
from pacer_core import cli, hookimpl
from pacer_core.cost_profiles import CostModel, cost_model, monotone
from pacer_core.errors import InputError
from pacer_core.hf import hf_generate_traced
from pacer_core.metrics import step_metrics

from helpers import (
    CharTokenizer,
    Crash,
    adapter,
    make_draft,
    read_answers,
    reference_greedy,
    run_cli,
    tiny_llama,
    write_bench_config,
)

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "the cat sat on the mat. the cat sat on the",
    "abc abc abc abc abc",
    "to be or not to be, to be",
    "one two three one two three one",
]


@pytest.fixture(scope="module")
def models():
    return units.Models(adapter(tiny_llama(0)), None, CharTokenizer())


@pytest.fixture
def tiny(monkeypatch, models):
    monkeypatch.setattr(units, "load_models", lambda cfg: models)
    return models


def prompt_file(folder: Path, n: int = 3) -> Path:
    path = folder / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"question_id": f"q{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS[:n]))
    )
    return path


STACKS = """
stacks:
  fixed2: {strategy: {drafter: {name: prompt_lookup}, stop: [{name: fixed, gamma: 2}], verifier: {name: greedy}}}
  heuristic: {config: %s, overrides: ["strategy.stop.0.gamma=3"]}
  long: {strategy: {drafter: {name: prompt_lookup}, stop: [{name: fixed, gamma: 8}], verifier: {name: greedy}}}
""" % (ROOT / "configs" / "prompt_lookup_heuristic.yaml")


def write_bench(folder: Path, body: str, n: int = 3) -> Path:
    return write_bench_config(folder, prompt_file(folder, n), 16, body)


# -- a full tiny bench, shared by several tests -------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory, models):
    folder = tmp_path_factory.mktemp("bench")
    config = write_bench(
        folder,
        STACKS + "baselines: [hf_generate, hf_prompt_lookup, hf_assisted_constant]\n"
        "oracle: {log_stack: long, verify_max_k: 4, verify_repeats: 1}\n",
    )
    mp = pytest.MonkeyPatch()
    mp.setattr(units, "load_models", lambda cfg: models)
    try:
        code = cli.main(["bench", "--config", str(config), "--out", str(folder / "out"), "--no-progress"])
    finally:
        mp.undo()
    assert code == 0
    return folder / "out"


def test_tiny_bench_runs_end_to_end(finished):
    for name in (
        "answers.jsonl",
        "bench.json",
        "results.json",
        "report.md",
        "cost_model.json",
        "speedup_per_set.png",
        "draft_lengths.png",
        "per_position_acceptance.png",
        "oracle.png",
    ):
        assert (finished / name).stat().st_size > 0, name
    records = read_answers(finished)
    units = ["autoregressive", "fixed2", "heuristic", "long", "hf_generate", "hf_prompt_lookup"]
    assert [r["model_id"] for r in records] == units * 3  # interleaved per prompt, baseline first
    meta = json.loads((finished / "bench.json").read_text())
    assert "hf_assisted_constant" in meta["skipped"]  # no draft model configured
    for r in records:
        choice = r["choices"][0]
        assert set(choice) >= {"turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"}
        assert choice["new_tokens"] == [len(r["tokens"])] == [16]
        assert sum(choice["accept_lengths"]) == 16 and len(choice["accept_lengths"]) == choice["decoding_steps"][0]
        assert r["identical_to_autoregressive"] and r["first_divergence"] is None  # fp32 greedy: exact
        assert r["question_id"] in {"q0", "q1", "q2"} and r["prompt_set"].endswith("prompts.jsonl")
    drafting = [r for r in records if r["model_id"] in ("fixed2", "long", "hf_prompt_lookup")]
    assert sum(r["metrics"]["drafted"] for r in drafting) > 0  # prompt lookup found something to draft
    report = (finished / "report.md").read_text()
    assert "## Oracle replay" in report and "hf_prompt_lookup" in report and "![oracle](oracle.png)" in report


def test_report_numbers_match_a_recomputation_from_the_jsonl(finished, capsys):
    results = json.loads((finished / "results.json").read_text())
    records = read_answers(finished)
    by_key = {(r["prompt_set"], r["question_id"], r["model_id"]): r for r in records}
    ar = [r for r in records if r["model_id"] == "autoregressive"]
    ar_rate = sum(r["choices"][0]["new_tokens"][0] for r in ar) / sum(r["choices"][0]["wall_time"][0] for r in ar)
    for name in ("fixed2", "heuristic", "long", "hf_generate", "hf_prompt_lookup"):
        mine = [by_key[(r["prompt_set"], r["question_id"], name)] for r in ar]
        rate = sum(r["choices"][0]["new_tokens"][0] for r in mine) / sum(r["choices"][0]["wall_time"][0] for r in mine)
        tau = sum(sum(r["choices"][0]["accept_lengths"]) for r in mine) / sum(
            r["choices"][0]["decoding_steps"][0] for r in mine
        )
        drafted = sum(sum(r["metrics"]["drafted_per_step"]) for r in mine)
        accepted = sum(sum(r["metrics"]["accepted_per_step"]) for r in mine)
        cell = results["table"]["all"][name]
        assert cell["speedup"] == pytest.approx(rate / ar_rate, rel=1e-9), name
        assert cell["tau"] == pytest.approx(tau, rel=1e-9)
        assert cell["acceptance_rate"] == (pytest.approx(accepted / drafted) if drafted else None)
        steps = sum(len(r["metrics"]["drafted_per_step"]) for r in mine)
        assert cell["mean_draft_length"] == pytest.approx(drafted / steps)
        assert cell["identical"] == cell["paired"] == 3
        drafted_at0 = sum(1 for r in mine for d in r["metrics"]["drafted_per_step"] if d > 0)
        accepted_at0 = sum(1 for r in mine for a in r["metrics"]["accepted_per_step"] if a > 0)
        if drafted_at0:
            assert cell["per_position_acceptance"][0] == pytest.approx(accepted_at0 / drafted_at0)
    # the oracle section replays the long stack's log with the stored cost model
    cost_file = json.loads((finished / "cost_model.json").read_text())
    log = [
        LoggedStep(d, a)
        for r in records
        if r["model_id"] == "long"
        for d, a in zip(r["metrics"]["drafted_per_step"], r["metrics"]["accepted_per_step"])
    ]
    long = [r for r in records if r["model_id"] == "long"]
    cost = CostModel(
        monotone(cost_file["verify_s"]),
        sum(r["metrics"]["draft_s"] for r in long) / sum(r["metrics"]["drafted"] for r in long),
    )
    oracle = results["oracle"]["sets"]["all"]
    assert oracle["oracle_speedup"] == pytest.approx(replay_oracle(log, cost).speedup(cost))
    assert oracle["fixed"]["2"] == pytest.approx(replay_fixed(log, 2, cost).speedup(cost))
    # `pacer report DIR` recomputes the same numbers
    before = results["table"]
    code, out, _ = run_cli(["report", str(finished), "--no-plots"], capsys)
    assert code == 0 and "| fixed2 |" in out
    assert json.loads((finished / "results.json").read_text())["table"] == before


# -- token trees ---------------------------------------------------------------------------------
def test_tree_stacks_report_their_size_and_stay_out_of_the_chain_oracle(tmp_path, models, capsys, monkeypatch):
    monkeypatch.setattr(units, "load_models", lambda cfg: models)
    draft = make_draft(tiny_llama(0), tmp_path / "eagle")
    eagle = f"{{name: eagle, path: {draft}"
    config = write_bench(
        tmp_path,
        "stacks:\n"
        f"  chain: {{strategy: {{drafter: {eagle}}}, stop: [{{name: fixed, gamma: 4}}], "
        "verifier: {name: greedy}}}\n"
        f"  tree: {{strategy: {{drafter: {eagle}, tree: {{topk: 3, depth: 3, nodes: 7}}}}, "
        "stop: [{name: fixed, gamma: 3}], verifier: {name: greedy}}}\n"
        "oracle: {log_stack: chain, verify_max_k: 5, verify_repeats: 1, verify_tree_k: [2, 4, 8]}\n",
        n=2,
    )
    code, out, err = run_cli(
        ["bench", "--config", str(config), "--out", str(tmp_path / "out"), "--no-progress"], capsys
    )
    assert code == 0, err
    records = read_answers(tmp_path / "out")
    tree = [r for r in records if r["model_id"] == "tree"]
    assert all(r["identical_to_autoregressive"] for r in records)  # fp32 greedy: trees are exact too
    nodes = [n for r in tree for n in r["metrics"]["nodes_per_step"]]
    depths = [d for r in tree for d in r["metrics"]["drafted_per_step"]]
    assert max(nodes) == 7 and max(depths) == 3 and sum(nodes) > sum(depths)  # side nodes were verified
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    cells = results["table"]["all"]
    assert cells["tree"]["mean_nodes_per_step"] == pytest.approx(sum(nodes) / len(nodes))
    assert cells["tree"]["mean_draft_length"] == pytest.approx(sum(depths) / len(depths))
    assert cells["chain"]["mean_nodes_per_step"] == pytest.approx(cells["chain"]["mean_draft_length"])
    # the cost model holds tree-masked forwards over the configured token counts
    cost = json.loads((tmp_path / "out" / "cost_model.json").read_text())
    assert cost["tree_k"] == [2, 4, 8] and len(cost["tree_verify_s"]) == 3 and len(cost["verify_s"]) == 5
    assert results["tree_verify_cost_ms"]["k"] == [2, 4, 8]
    # the free-draft bound charges the tree's nodes, not its depth
    model = cost_model(cost)
    steps = [s for r in tree for s in steps_from_metrics(r["metrics"])]
    bound = results["verify_bound"]["tree"]
    assert bound["tree"] and not results["verify_bound"]["chain"]["tree"]
    assert bound["verified_tokens_per_step"] == pytest.approx(sum(n + 1 for n in nodes) / len(nodes))
    assert bound["verify_cost_ratio"] == pytest.approx(
        sum(
            model.verify_tree(s.nodes + 1) if s.nodes != s.drafted else model.verify(s.drafted + 1)  # step 0: plain
            for s in steps
        )
        / len(steps)
        / model.verify(1)
    )
    # the chain oracle replays the chain log; the tree stack is named, not replayed as a policy
    oracle = results["oracle"]
    assert oracle["tree_stacks"] == ["tree"] and set(oracle["sets"]["all"]["policies"]) == {"chain"}
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| mean draft | tree size |" in report and "Not replayed: `tree` (token trees" in report
    assert "Token trees: one forward with a tree's positions and ancestor mask" in report
    assert "| tree | tree |" in report  # the verification bill of the tree stack
    row = next(line for line in out.splitlines() if line.startswith("| tree |"))
    assert f"| {cells['tree']['mean_nodes_per_step']:.2f} |" in row


def test_old_answer_logs_and_cost_models_still_report(finished, tmp_path, capsys):
    """Records and cost models written before token trees (no nodes_per_step, no tree costs): the
    tree size is the draft length, the report has no tree-cost table, the oracle replays as before."""
    out = copy_of(finished, tmp_path)
    records = read_answers(out)
    for r in records:
        r["metrics"].pop("nodes_per_step"), r["metrics"].pop("mean_nodes_per_step")
    (out / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    cost = json.loads((out / "cost_model.json").read_text())
    (out / "cost_model.json").write_text(json.dumps({k: v for k, v in cost.items() if not k.startswith("tree")}))
    code, text, err = run_cli(["report", str(out), "--no-plots"], capsys)
    assert code == 0, err
    assert "| mean draft | tree size |" in text
    results = json.loads((out / "results.json").read_text())
    for name, cell in results["table"]["all"].items():
        assert cell["mean_nodes_per_step"] == pytest.approx(cell["mean_draft_length"]), name
    assert results["tree_verify_cost_ms"] is None and results["oracle"]["tree_stacks"] == []
    finished_results = json.loads((finished / "results.json").read_text())
    assert results["oracle"]["sets"]["all"] == finished_results["oracle"]["sets"]["all"]
    assert "Token trees:" not in (out / "report.md").read_text()


def test_a_log_stack_drafting_trees_is_not_replayed(finished, tmp_path, capsys):
    """A log whose steps verified side nodes (a hand-made or other run's log) is named, not replayed."""
    out = copy_of(finished, tmp_path)
    records = read_answers(out)
    for r in records:
        if r["model_id"] == "long":
            r["metrics"]["nodes_per_step"] = [d + 2 if d else 0 for d in r["metrics"]["drafted_per_step"]]
    (out / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    code, _, err = run_cli(["report", str(out)], capsys)
    assert code == 0, err
    results = json.loads((out / "results.json").read_text())
    assert results["oracle"]["sets"] == {} and "token trees" in results["oracle"]["skipped"]
    report = (out / "report.md").read_text()
    assert "Not replayed: log stack `long`: it drafts token trees" in report and "![oracle]" not in report


# -- resumption ---------------------------------------------------------------------------------
def plans(config: Path, *plugins) -> dict:
    """The stacks' run plans of ``config`` with ``plugins``, fresh: a plan builds one engine, so each
    run of the bench reads its config again (as each ``pacer bench`` command does)."""
    return read_bench_config(config, extra_plugins=list(plugins))[1]


def test_resume_after_interruption_loses_nothing_and_duplicates_nothing(tmp_path, models, capsys):
    config = write_bench(tmp_path, STACKS + "baselines: [hf_generate]\n", n=4)
    cfg, stacks = read_bench_config(config)
    total = 4 * 5  # prompts × (autoregressive, 3 stacks, hf_generate)

    clean = tmp_path / "clean"
    assert run_bench(cfg, stacks, clean, models=models, progress=False, report=False) == 0
    expected = {(r["question_id"], r["model_id"]): r["tokens"] for r in read_answers(clean)}
    assert len(expected) == total

    out = tmp_path / "out"
    # Ctrl-C in the 6th engine generation (prompt 2's fixed2): exit 130, the 6 finished records kept
    code = run_bench(cfg, plans(config, Crash(6, KeyboardInterrupt)), out, models=models, progress=False)
    assert code == 130 and "rerun the same command to resume" in capsys.readouterr().err
    assert len(read_answers(out)) == 6 and not (out / "report.md").exists()
    # a crash in prompt 3's first generation, then a kill in the middle of writing a line
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_bench(cfg, plans(config, Crash(4, RuntimeError)), out, models=models, progress=False)
    assert len(read_answers(out)) == 10
    with open(out / "answers.jsonl", "a") as handle:
        handle.write('{"question_id": "q3", "category": "prom')
    assert run_bench(cfg, plans(config), out, models=models, progress=False) == 0
    assert "dropped 1 incomplete line" in capsys.readouterr().err
    records = read_answers(out)
    keys = [(r["question_id"], r["model_id"]) for r in records]
    assert len(keys) == len(set(keys)) == total
    assert {k: r["tokens"] for k, r in zip(keys, records)} == expected
    # a finished run resumed again adds nothing
    assert run_bench(cfg, plans(config), out, models=models, progress=False, report=False) == 0
    assert len(read_answers(out)) == total


def test_the_bench_plans_each_stack_once_and_builds_its_engine_on_that_plan(tmp_path, models, resolutions):
    config = write_bench(tmp_path, STACKS, n=1)
    bench, stacks = read_bench_config(config)
    assert list(stacks) == ["autoregressive", "fixed2", "heuristic", "long"]
    assert resolutions == {"plugin_managers": 4, "resolutions": 4}
    assert run_bench(bench, stacks, tmp_path / "out", models=models, progress=False, report=False) == 0
    assert resolutions == {"plugin_managers": 4, "resolutions": 4}  # each engine built on its stack's plan
    with pytest.raises(InputError, match="has built an engine already"):  # a plan builds one engine
        run_bench(bench, stacks, tmp_path / "again", models=models, progress=False, report=False)
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        f"bench: {config.name}\nstack: {{strategy: {{stop: [{{name: fixed}}]}}}}\n"
        "grid: {strategy.stop.0.gamma: [1, 3]}\n"
    )
    _, points, _ = read_ablate_config(grid)
    assert len(points) == 3 and resolutions == {"plugin_managers": 7, "resolutions": 7}


def test_resume_refuses_other_settings(tmp_path, models):
    config = write_bench(tmp_path, "", n=1)
    cfg, stacks = read_bench_config(config)
    assert run_bench(cfg, stacks, tmp_path / "out", models=models, progress=False, report=False) == 0
    cfg, stacks = read_bench_config(config, ["max_new_tokens=8"])
    with pytest.raises(InputError, match="other settings .*max_new_tokens"):
        run_bench(cfg, stacks, tmp_path / "out", models=models, progress=False)


def test_answer_log_drops_only_a_cut_short_last_line_and_duplicates(tmp_path):
    path = tmp_path / "answers.jsonl"
    good = {
        "prompt_set": "s",
        "question_id": "a",
        "model_id": "m",
        "repeat": 0,
        "tokens": [],
        "metrics": {},
        "choices": [
            {"turns": ["t"], "decoding_steps": [1], "new_tokens": [0], "wall_time": [0.0], "accept_lengths": []}
        ],
    }
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n" + '{"prompt_set": "s", "quest')
    log = AnswerLog(path)
    assert (log.dropped, log.duplicates, len(log.records)) == (1, 1, 1)  # a truncated tail, a duplicate
    assert path.read_text() == json.dumps(good) + "\n"
    log.append({**good, "question_id": "b"})
    with pytest.raises(RuntimeError, match="duplicate"):
        log.append(good)
    assert len(path.read_text().splitlines()) == 2


CHOICES = (
    '"choices": [{"turns": ["t"], "decoding_steps": [1], "new_tokens": [0], "wall_time": [0.0], "accept_lengths": []}]'
)


@pytest.mark.parametrize(
    "line, problem",
    [
        ("not json", "not JSON"),
        ('{"prompt_set": "s", "quest', "not JSON"),  # a cut-short line is an interrupted write only when last
        ("[1, 2]", "a JSON list, not an object"),
        ('{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": []}', "no 'metrics'"),
        ('{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": 5, "metrics": {}}', "'tokens' is a int"),
        (
            '{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": [], "metrics": {}, '
            '"repeat": "1", ' + CHOICES + "}",
            "'repeat'",
        ),
        # nested fields the report reads (a TypeError or KeyError in the report before)
        ('{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": [], "metrics": {}}', "no 'choices'"),
        (
            '{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": [], "metrics": {"wall_s": "slow"}, '
            + CHOICES
            + "}",
            "'metrics.wall_s' is \"slow\", not a number",
        ),
        (
            '{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": [], '
            '"metrics": {"accept_lengths": [1, "2"]}, ' + CHOICES + "}",
            "'metrics.accept_lengths[1]' is \"2\", not a count",
        ),
        (
            '{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": [], "metrics": {}, "choices": [{}]}',
            "'choices[0].turns' is null, not a list of texts",
        ),
        (
            '{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": [], "metrics": {}, "choices": []}',
            "'choices' holds no answer object",
        ),
    ],
)
def test_answer_log_with_a_damaged_middle_line_is_refused_naming_the_line(tmp_path, line, problem):
    path = tmp_path / "answers.jsonl"
    good = {
        "prompt_set": "s",
        "question_id": "a",
        "model_id": "m",
        "repeat": 0,
        "tokens": [],
        "metrics": {},
        "choices": [
            {"turns": ["t"], "decoding_steps": [1], "new_tokens": [0], "wall_time": [0.0], "accept_lengths": []}
        ],
    }
    text = json.dumps(good) + "\n" + line + "\n" + json.dumps({**good, "question_id": "b"}) + "\n"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        AnswerLog(path)
    message = str(info.value)
    assert f"answer log '{path}' line 2 is not a bench record" in message and problem in message, message
    assert "delete line 2" in message and "\n" not in message
    assert path.read_text() == text  # nothing rewritten


def copy_of(finished: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(finished, out)
    return out


def assert_one_line(code, err, *needles):
    assert code == 2 and "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith("pacer: error: "), err
    for needle in needles:
        assert needle in err, (needle, err)


def test_report_refuses_a_damaged_middle_line_of_the_answer_log(finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path)
    lines = (out / "answers.jsonl").read_text().splitlines(keepends=True)
    lines[4] = lines[4][: len(lines[4]) // 2] + "\n"  # line 5 cut in half, lines after it intact
    (out / "answers.jsonl").write_text("".join(lines))
    code, out_text, err = run_cli(["report", str(out), "--no-plots"], capsys)
    assert_one_line(code, err, f"'{out / 'answers.jsonl'}' line 5", "not JSON", "delete line 5")
    assert out_text == ""


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda r: r["metrics"].update(wall_s="slow"), "'metrics.wall_s' is \"slow\", not a number"),
        (lambda r: r.pop("choices"), "no 'choices'"),
    ],
)
def test_report_refuses_a_record_with_a_bad_nested_field(finished, tmp_path, capsys, edit, problem):
    out = copy_of(finished, tmp_path)
    lines = (out / "answers.jsonl").read_text().splitlines()
    record = json.loads(lines[2])
    edit(record)
    lines[2] = json.dumps(record)
    (out / "answers.jsonl").write_text("\n".join(lines) + "\n")
    code, _, err = run_cli(["report", str(out), "--no-plots"], capsys)
    assert_one_line(code, err, f"'{out / 'answers.jsonl'}' line 3", problem, "delete line 3")


def test_report_reads_a_run_in_progress(finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path)
    text = (out / "answers.jsonl").read_text()
    (out / "answers.jsonl").write_text(text + text.splitlines()[0][:40])  # a write in progress
    code, _, err = run_cli(["report", str(out), "--no-plots"], capsys)
    assert code == 0, err


@pytest.mark.parametrize(
    "content, problem",
    [
        ("{not json", "not JSON"),
        ("[]", "a JSON list, not an object"),
        ('{"settings": {}, "baseline": "autoregressive", "prompt_sets": []}', "no 'units'"),
        (
            '{"settings": {}, "baseline": "autoregressive", "prompt_sets": "humaneval", "units": []}',
            "'prompt_sets' is a str, not a list",
        ),
        (
            '{"settings": {}, "baseline": "autoregressive", "prompt_sets": [], "units": [{"kind": "stack"}]}',
            "a unit is not an object with a 'name' and a 'kind'",
        ),
        ('{"settings": {}, "baseline": 3, "prompt_sets": [], "units": []}', "'baseline' is a int, not an str"),
        (None, "is a folder, not a file"),
    ],
)
def test_report_refuses_a_malformed_bench_json_in_one_line(finished, tmp_path, capsys, content, problem):
    out = copy_of(finished, tmp_path)
    (out / "bench.json").unlink()
    if content is None:
        (out / "bench.json").mkdir()
    else:
        (out / "bench.json").write_text(content)
    code, _, err = run_cli(["report", str(out), "--no-plots"], capsys)
    assert_one_line(code, err, f"'{out / 'bench.json'}'", problem, "restore it, or delete it and rerun")


@pytest.mark.parametrize(
    "content",
    [
        "{",
        '{"verify_s": "fast"}',
        '{"verify_s": []}',
        "[0.1]",
        '{"verify_s": [0.1], "tree_k": [4, 2], "tree_verify_s": [0.1, 0.2]}',
        '{"verify_s": [0.1], "tree_k": [2, 4], "tree_verify_s": [0.1]}',
        '{"verify_s": [0.1], "tree_k": [1], "tree_verify_s": [0.1]}',
    ],
)
def test_report_refuses_a_malformed_cost_model_in_one_line(finished, tmp_path, capsys, content):
    out = copy_of(finished, tmp_path)
    (out / "cost_model.json").write_text(content)
    code, _, err = run_cli(["report", str(out), "--no-plots"], capsys)
    assert_one_line(code, err, f"'{out / 'cost_model.json'}'", "delete it")


def never_load(cfg):
    raise AssertionError("models were loaded")


def test_resume_refuses_damaged_files_before_models_load(finished, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(units, "load_models", never_load)
    config = write_bench(tmp_path, "", n=1)
    out = copy_of(finished, tmp_path)
    (out / "bench.json").write_text("{oops")
    code, _, err = run_cli(["bench", "--config", str(config), "--out", str(out), "--no-progress"], capsys)
    assert_one_line(code, err, "bench.json", "not JSON")
    out = tmp_path / "copy2"
    shutil.copytree(finished, out)
    with open(out / "answers.jsonl", "r+") as handle:
        handle.write("garbage\n")  # over the start of line 1
    code, _, err = run_cli(["bench", "--config", str(config), "--out", str(out), "--no-progress"], capsys)
    assert_one_line(code, err, "answers.jsonl' line 1", "delete line 1")


@pytest.mark.parametrize(
    "setting, needle", [("", "the prompt sets are empty;"), ("skip=5", "empty after skipping 5 per set")]
)
def test_no_prompt_to_run_is_refused_before_models_load(tmp_path, capsys, monkeypatch, setting, needle):
    monkeypatch.setattr(units, "load_models", never_load)
    config = write_bench(tmp_path, "", n=2)
    if not setting:
        (tmp_path / "prompts.jsonl").write_text("")
    argv = ["bench", "--config", str(config), "--out", str(tmp_path / "out")] + ([setting] if setting else [])
    code, _, err = run_cli(argv, capsys)
    assert_one_line(code, err, "no prompt to run", needle, "check skip, --limit and the files")
    assert not (tmp_path / "out").exists()


def out_places_that_cannot_hold_results(tmp_path: Path) -> list[tuple[Path, str]]:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    places = [
        (a_file, "is a file, not a folder"),
        (a_file / "out", "lies under"),
        (Path(os.devnull), "is a device, not a folder"),
    ]
    if os.geteuid() != 0:  # root writes anywhere: a read-only file system below stands in
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        places.append((locked / "out", "cannot be written"))
    for candidate in (Path("/proc/pacer-out"), Path("/sys/pacer-out")):  # read-only file systems
        if candidate.parent.is_dir():
            places.append((candidate, "cannot be written"))
    return places


@pytest.mark.parametrize("command", ["bench", "ablate"])
def test_an_out_that_cannot_hold_results_is_refused_before_models_load(tmp_path, capsys, monkeypatch, command):
    monkeypatch.setattr(units, "load_models", never_load)
    config = write_bench(tmp_path, "", n=1)
    if command == "ablate":
        grid = tmp_path / "grid.yaml"
        grid.write_text(
            f"bench: {config}\nstack: {{strategy: {{drafter: {{name: prompt_lookup}}}}}}\n"
            "grid: {strategy.drafter.max_ngram_size: [2]}\n"
        )
        config = grid
    places = out_places_that_cannot_hold_results(tmp_path)
    assert len(places) >= 4
    for place, problem in places:
        code, _, err = run_cli([command, "--config", str(config), "--out", str(place), "--no-progress"], capsys)
        assert_one_line(code, err, f"--out '{place}'", problem, "give --out a folder that can be written")
    assert (tmp_path / "a-file").read_text() == "x"


@pytest.mark.parametrize(
    "content, problem",
    [
        (b'{"prompt": "caf\xe9"}\n', "is not UTF-8 text (byte 0xe9)"),
        (b'{"prompt": "a"}\nnot json\n', "line 2 is not JSON"),
        (b'["a"]\n', "line 1 is a JSON list, not an object"),
        (b'{"prompt": "a"}\n\n{"turns": "b"}\n', "line 3 has 'turns' that is not a list of texts"),
        (b'{"question_id": 81, "turns": ["a", 5]}\n', "line 1 has 'turns' that is not a list of texts"),
        (b'{"turns": []}\n', "line 1 has 'turns' that is not a list of texts"),
        (b'{"question_id": "q"}\n', "line 1 has no text under 'prompt' or 'turns'"),
        (b'{"prompt": 5}\n', "line 1 has no text"),
        (
            b'{"question_id": [1], "prompt": "a"}\n',
            "line 1 has a question_id that is a list: give text or a whole number",
        ),
        (
            b'{"question_id": 81, "turns": ["a"]}\n{"question_id": "81", "turns": ["b"]}\n',
            "line 2 repeats question_id 81 of line 1: give each question its own id",
        ),
        (None, "is a folder, not a file"),
    ],
)
def test_a_bad_prompt_file_is_one_line_before_models_load(tmp_path, capsys, monkeypatch, content, problem):
    monkeypatch.setattr(units, "load_models", never_load)
    prompts = tmp_path / "mine.jsonl"
    if content is None:
        prompts.mkdir()
    else:
        prompts.write_bytes(content)
    code, _, err = run_cli(["bench", f"prompt_sets=[{prompts}]", "--out", str(tmp_path / "out")], capsys)
    assert_one_line(code, err, f"prompt file '{prompts}'", problem)
    assert not (tmp_path / "out").exists()
    code, _, err = run_cli(
        ["bench", f"prompt_sets=[{tmp_path / 'gone.jsonl'}]", "--out", str(tmp_path / "out")], capsys
    )
    assert_one_line(code, err, "gone.jsonl' does not exist", "give the path of a .jsonl file")


# -- oracle replay: hand-computed ---------------------------------------------------------------
# verify(k) for k = 1..5 tokens; 0.1 s per draft token; a step drafting n costs 0.1 n + verify(n + 1):
# n = 0: 1.0, 1: 1.3, 2: 1.6, 3: 1.9, 4: 2.2. Log of a γ = 4 stack: (drafted, accepted before the
# first rejection) = (4, 4), (4, 1), (4, 0), (2, 2) (the drafter ran out after 2).
COST = CostModel((1.0, 1.2, 1.4, 1.6, 1.8), 0.1)
LOG = [LoggedStep(4, 4), LoggedStep(4, 1), LoggedStep(4, 0), LoggedStep(2, 2)]


def test_oracle_replay_matches_the_hand_computation():
    # γ = 1: each step drafts 1; emitted 2 + 2 + 1 + 2 = 7 in 4 × 1.3 s → 7 / 5.2 tokens/s × verify(1)
    assert replay_fixed(LOG, 1, COST).speedup(COST) == pytest.approx(7 / 5.2)
    # γ = 2: emitted 3 + 2 + 1 + 3 = 9 in 4 × 1.6 s
    assert replay_fixed(LOG, 2, COST).speedup(COST) == pytest.approx(9 / 6.4)
    # γ = 4: emitted 5 + 2 + 1 + 3 = 11 in 2.2 × 3 + 1.6 (the last step drafts only 2)
    assert replay_fixed(LOG, 4, COST).speedup(COST) == pytest.approx(11 / 8.2)
    # oracle: draft 4, 1, 0, 2 → emitted 5 + 2 + 1 + 3 = 11 in 2.2 + 1.3 + 1.0 + 1.6 = 6.1 s
    assert replay_oracle(LOG, COST).speedup(COST) == pytest.approx(11 / 6.1)
    assert replay_best(LOG, COST).speedup(COST) == pytest.approx(11 / 6.1)  # extending always pays here
    result = analyse(
        LOG,
        COST,
        [1, 2, 3, 4],
        {
            "policy": [LoggedStep(1, 1), LoggedStep(4, 1), LoggedStep(0, 0), LoggedStep(2, 2)],
            "oracle-like": [LoggedStep(4, 4), LoggedStep(1, 1), LoggedStep(0, 0), LoggedStep(2, 2)],
        },
    )
    assert result["fixed"][3] == pytest.approx(10 / 7.3)  # 4 + 2 + 1 + 3 in 1.9 × 3 + 1.6
    assert result["best_fixed_gamma"] == 2 and result["best_fixed_speedup"] == pytest.approx(9 / 6.4)
    assert result["oracle_over_best_fixed"] == pytest.approx((11 / 6.1) / (9 / 6.4))
    # the policy: emitted 2 + 2 + 1 + 3 = 8 in 1.3 + 2.2 + 1.0 + 1.6 = 6.1 s; worse than γ = 2
    policy = result["policies"]["policy"]
    assert policy["simulated_speedup"] == pytest.approx(8 / 6.1)
    assert policy["captured"] == pytest.approx((8 / 6.1 - 9 / 6.4) / (11 / 6.1 - 9 / 6.4))
    assert result["policies"]["oracle-like"]["captured"] == pytest.approx(1.0)


def test_tree_steps_are_charged_their_nodes_and_refused_by_chain_replays():
    # tree-masked forwards measured at k = 2, 4, 8 tokens: 1.5, 2.0, 3.0 s
    cost = CostModel((1.0, 1.2, 1.4, 1.6, 1.8), 0.1, (2, 4, 8), (1.5, 2.0, 3.0))
    assert cost.verify_tree(2) == 1.5 and cost.verify_tree(3) == pytest.approx(1.75)
    assert cost.verify_tree(6) == pytest.approx(2.5) and cost.verify_tree(10) == pytest.approx(3.5)  # beyond: slope
    assert cost.verify_tree(1) == 1.5  # below the first measured count: its cost
    assert CostModel((1.0, 1.2)).verify_tree(2) == 1.2  # no tree measurements: a chain's cost
    # a chain step costs a causal forward, a tree step (depth 2, 5 nodes) a tree-masked one over 6 tokens
    assert cost.step(2) == cost.step(2, 2) == pytest.approx(0.2 + 1.4)
    assert cost.step(2, 5) == pytest.approx(0.2 + 2.5)
    tree_log = [LoggedStep(2, 2, 5), LoggedStep(3, 1, 3)]  # the second step is a chain (nodes = depth)
    assert replay_logged(tree_log, cost).speedup(cost) == pytest.approx((3 + 2) / (2.7 + 0.3 + 1.6))
    for replay in (
        lambda log: replay_fixed(log, 2, cost),
        lambda log: replay_oracle(log, cost),
        lambda log: replay_best(log, cost),
    ):
        with pytest.raises(ValueError, match="chain log, but a step verified 5 tree nodes for depth 2"):
            replay(tree_log)
    result = analyse(LOG, COST, [1, 2], {"tree": [LoggedStep(4, 4, 12)] * 4, "chain": LOG})
    assert result["policies"]["tree"]["tree"] and result["policies"]["tree"]["captured"] is None
    assert not result["policies"]["chain"]["tree"] and result["policies"]["chain"]["captured"] is not None
    with pytest.raises(ValueError, match="ascending"):
        CostModel((1.0,), 0.0, (4, 2), (1.0, 2.0))
    # logs: nodes_per_step where recorded (older logs lack it: chains)
    assert steps_from_metrics({"drafted_per_step": [2, 0], "accepted_per_step": [1, 0]}) == [
        LoggedStep(2, 1),
        LoggedStep(0, 0),
    ]
    assert steps_from_metrics({"drafted_per_step": [2], "accepted_per_step": [1], "nodes_per_step": [6]}) == [
        LoggedStep(2, 1, 6)
    ]
    # the report's cost model: each measured curve made non-decreasing
    model = cost_model({"verify_s": [1.0, 0.8, 1.2], "tree_k": [2, 4, 8], "tree_verify_s": [1.5, 1.3, 3.0]})
    assert model.verify_s == pytest.approx((0.9, 0.9, 1.2)) and model.tree_verify_s == pytest.approx((1.4, 1.4, 3.0))


def test_cost_optimal_oracle_stops_early_when_verifying_more_is_dear():
    cost = CostModel((1.0, 1.0, 5.0), 0.0)
    log = [LoggedStep(2, 2)]
    assert replay_oracle(log, cost).speedup(cost) == pytest.approx(3 / 5.0)
    assert replay_best(log, cost).speedup(cost) == pytest.approx(2 / 1.0)  # draft 1 of the 2


def test_cost_model_and_helpers():
    assert COST.verify(7) == pytest.approx(1.8 + 2 * 0.2)  # extrapolated from the last two
    assert monotone([1.0, 3.0, 2.0, 4.0]) == pytest.approx((1.0, 2.5, 2.5, 4.0))
    assert captured_share(1.5, 1.5, 1.5) is None and captured_share(1.2, 1.5, 1.505) is None  # no room
    assert captured_share(1.6, 1.5, 1.7) == pytest.approx(0.5)
    assert replay_logged([], COST).speedup(COST) == 0.0
    with pytest.raises(ValueError):
        CostModel(())


# -- transformers' baselines traced ------------------------------------------------------------
def test_hf_trace_counts_steps_and_drafts_with_an_identical_assistant():
    target, assistant = adapter(tiny_llama(0)), adapter(tiny_llama(0))
    prompt = [1, 5, 6, 7, 8, 5, 6, 7]
    before = assistant.model.generation_config.num_assistant_tokens
    settings = {
        "num_assistant_tokens": 3,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    tokens, trace, after = hf_generate_traced(
        target, prompt, 12, ignore_eos=True, assistant=assistant, assistant_settings=settings
    )
    assert tokens == reference_greedy(target.model, prompt, 12, eos=False)
    assert trace["accept_lengths"] == [4, 4, 4]  # 3 accepted + the bonus, every step
    assert trace["drafted_per_step"] == [3, 3, 3]
    assert trace["target_forwards"] == 3 and trace["draft_forwards"] >= 9
    assert assistant.model.generation_config.num_assistant_tokens == before  # restored after the call
    _, trace, after = hf_generate_traced(
        target,
        prompt,
        12,
        ignore_eos=True,
        assistant=assistant,
        assistant_settings={**settings, "num_assistant_tokens_schedule": "heuristic"},
    )
    assert after["num_assistant_tokens"] > 3  # all accepted: transformers' schedule grew γ; carried over


# -- configs and errors -------------------------------------------------------------------------
def shipped_bench(path: Path):
    """A shipped bench config read: the bench and each stack's run config (of its run plan)."""
    bench, plans = read_bench_config(path)
    return bench, {name: plan.config for name, plan in plans.items()}


def shipped_ablate(path: Path):
    bench, plans, ablation = read_ablate_config(path)
    return bench, {name: plan.config for name, plan in plans.items()}, ablation


def _hybrids_beside_their_model_member(stacks) -> list[str]:
    """The config's hybrid stacks, after checking each has a stack of its model member (the first)
    under the same stop beside it."""
    hybrids = [name for name, c in stacks.items() if c.strategy.drafter["name"] == "hybrid"]
    for name in hybrids:
        c = stacks[name]
        model = c.strategy.drafter["members"][0]
        assert any(s.strategy.drafter == model and s.strategy.stop == c.strategy.stop for s in stacks.values()), name
    return hybrids


def test_shipped_bench_and_ablate_configs_validate():
    cfg, stacks = shipped_bench(ROOT / "configs" / "bench.yaml")
    assert list(stacks)[0] == "autoregressive" and len(stacks) >= 6
    log = stacks[cfg.oracle.log_stack].strategy.stop
    assert log == [{"name": "fixed", "gamma": 16}] and cfg.oracle.verify_max_k >= 17
    assert stacks["prompt_lookup+heuristic"].strategy.stop[0]["name"] == "heuristic"
    # the hf_assisted_* baselines and the draft_model/ouroboros stacks use the shipped token-level draft
    assert "hf_assisted_constant" in cfg.baselines and set(cfg.baselines) <= set(HF_BASELINES)
    assert cfg.draft.path.endswith("default")
    # token-tree rows beside the chains, for both drafts, in the same run; the oracle's log is a chain
    trees = {name: c.strategy.drafter for name, c in stacks.items() if c.strategy.drafter.get("tree") is not None}
    assert 6 <= len(trees) <= 8 and {d["name"] for d in trees.values()} == {"eagle", "draft_model"}
    assert all("+tree(" in name for name in trees) and cfg.oracle.log_stack not in trees
    assert {s["name"] for name in trees for s in stacks[name].strategy.stop} == {"fixed", "confidence", "pacer"}
    assert max(cfg.oracle.verify_tree_k) >= max(d["tree"]["nodes"] for d in trees.values()) + 1
    # the hybrid rows: each beside its members (the model member's tree with the same stop, prompt lookup)
    assert _hybrids_beside_their_model_member(stacks) and "prompt_lookup+heuristic" in stacks
    # the tree-shape sweep (exact columns) and the timed shapes beside the best chains and generate
    cfg, stacks = shipped_bench(ROOT / "configs" / "bench_tree_sweep.yaml")
    shapes = {
        (d["tree"]["topk"], d["tree"]["depth"]) for d in (c.strategy.drafter for c in stacks.values()) if d.get("tree")
    }
    assert len(shapes) >= 8 and any(
        c.strategy.drafter.get("tree") is None and c.strategy.drafter["name"] == "eagle" for c in stacks.values()
    )
    cfg, stacks = shipped_bench(ROOT / "configs" / "bench_tree_shapes.yaml")
    assert cfg.dtype == "bfloat16" and cfg.baselines == ["hf_generate"] and list(stacks)[0] == "autoregressive"
    assert {"eagle+pacer", "eagle+confidence", "prompt_lookup+heuristic"} <= set(stacks)
    assert any(c.strategy.drafter["name"] == "hybrid" for c in stacks.values())
    # the goals' stacks in one run: the eagle chain at γ 1-4, each adaptive stop on it, trees, hybrids beside members
    cfg, stacks = shipped_bench(ROOT / "configs" / "bench_goals.yaml")
    assert cfg.dtype == "bfloat16" and cfg.baselines == ["hf_generate"] and list(stacks)[0] == "autoregressive"
    chains = [c for c in stacks.values() if c.strategy.drafter == {"name": "eagle"}]
    assert {s["gamma"] for c in chains for s in c.strategy.stop if s["name"] == "fixed"} == {1, 2, 3, 4}
    assert {s["name"] for c in chains for s in c.strategy.stop} == {"fixed", "confidence", "entropy", "pacer"}
    assert max(cfg.oracle.verify_tree_k) >= max(
        c.strategy.drafter["tree"]["nodes"] for c in stacks.values() if c.strategy.drafter.get("tree")
    )
    assert _hybrids_beside_their_model_member(stacks)
    # the quick tree-vs-chain bench: fp32 (outputs must be identical), chains and trees of both drafts
    cfg, stacks = shipped_bench(ROOT / "configs" / "bench_trees.yaml")
    assert cfg.dtype == "float32" and cfg.verify_cost and list(stacks)[0] == "autoregressive"
    kinds = {(c.strategy.drafter["name"], c.strategy.drafter.get("tree") is not None) for c in stacks.values()}
    assert {("eagle", False), ("eagle", True), ("draft_model", False), ("draft_model", True)} <= kinds
    cfg, stacks, ablation = shipped_ablate(ROOT / "configs" / "ablate.yaml")
    assert len(stacks) == 1 + len(ablation["points"]) == 10 and cfg.baselines == []
    assert stacks["gamma=8·max_ngram_size=2"].strategy.stop[0]["gamma"] == 8
    assert stacks["gamma=8·max_ngram_size=2"].strategy.drafter["max_ngram_size"] == 2


def test_every_shipped_bench_config_validates_and_the_engine_and_gpu_benches_compare_with_generate():
    from pacer_bench.config import is_bench_config

    for path in sorted((ROOT / "configs").glob("*.yaml")):
        if is_bench_config(path) and not path.name.startswith("ablate"):
            read_bench_config(path)  # raises ConfigError in one line if a shipped bench config broke
    cfg, stacks = shipped_bench(ROOT / "configs" / "bench_engine.yaml")  # the engine's own overhead
    assert list(stacks) == ["autoregressive"] and cfg.baselines == ["hf_generate"] and cfg.repeats >= 3
    cfg, stacks = shipped_bench(ROOT / "configs" / "bench_gpu.yaml")  # scripts/gpu_check.sh
    assert cfg.device == "auto" and cfg.dtype == "bfloat16" and "hf_generate" in cfg.baselines
    assert list(stacks)[0] == "autoregressive" and any(c.strategy.drafter.get("tree") for c in stacks.values())


def test_ablate_runs_a_grid_into_one_table(tmp_path, tiny, capsys):
    base = write_bench(tmp_path, "", n=2)
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        f"bench: {base.name}\noverrides: [max_new_tokens=8]\n"
        "stack: {strategy: {drafter: {name: prompt_lookup}, stop: [{name: fixed}], "
        "verifier: {name: greedy}}}\n"
        "grid: {strategy.stop.0.gamma: [1, 3]}\n"
    )
    code, out, err = run_cli(["ablate", "--config", str(grid), "--out", str(tmp_path / "out"), "--no-progress"], capsys)
    assert code == 0, err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = results["ablation"]["rows"]
    assert [r["strategy.stop.0.gamma"] for r in rows] == [1, 3] and all(r["records"] == 2 for r in rows)
    table = (tmp_path / "out" / "ablation.md").read_text()
    assert table.count("\n") == 4 and "| stack | strategy.stop.0.gamma |" in table and table in out + "\n"
    records = read_answers(tmp_path / "out")
    assert {r["model_id"] for r in records} == {"autoregressive", "gamma=1", "gamma=3"}
    assert max(d for r in records if r["model_id"] == "gamma=1" for d in r["metrics"]["drafted_per_step"]) <= 1


@pytest.mark.parametrize(
    "text, needles",
    [
        ("stackz: {}\n", ["unknown option 'stackz'", "valid options", "stacks"]),
        (
            "stacks: {a: {strategyy: {}}}\n",
            ["unknown option 'stacks.a.strategyy'; valid options: config, strategy, generation, overrides"],
        ),
        ("stacks: {a: {strategy: {drafter: {name: nope}}}}\n", ["stacks.a", "unknown drafter 'nope'", "prompt_lookup"]),
        (
            "target: {path: /my/target}\nstacks: {a: {strategy: {drafter: {name: draft_model}}}}\n",
            ["stacks.a", "needs a draft model", "draft.path"],
        ),
        ("stacks: {a: {overrides: [strategy.stop.0.gama=3]}}\n", ["stacks.a", "gama"]),
        ("baselines: [hf_nope]\n", ["unknown baseline 'hf_nope'", "hf_generate"]),
        ("oracle: {log_stack: missing}\n", ["oracle.log_stack 'missing'"]),
        ("max_new_tokens: 0\n", ["max_new_tokens must be >= 1"]),
        ("max_new_tokens: lots\n", ["bad value", "max_new_tokens"]),
        ("prompt_sets: [nope]\n", ["unknown prompt set 'nope'", "humaneval"]),
        ("target: {pth: x}\n", ["unknown option 'target.pth'; valid options: path, dtype"]),
        ("baseline_options: {gamma: 3}\n", ["unknown option 'baseline_options.gamma'; valid options: assisted_gamma"]),
        ("dtype: float8\n", ["unknown dtype 'float8'"]),
        ("stacks: [1, 2\n", ["malformed YAML", "line"]),
        ("- humaneval\n", ["must hold a mapping"]),
        ("target: 3\n", ["'target' must be a mapping of options (path, dtype", "got int 3"]),
        ("stacks: [a, b]\n", ["'stacks' must be a mapping", "got list"]),
        ("stacks: {mine: 3}\n", ["'stacks.mine' must be a mapping of options (config, strategy", "got int 3"]),
        ("stacks: {a: {strategy: 3}}\n", ["'stacks.a.strategy' must be a mapping, got int 3"]),
        ("stacks: {a: {overrides: strategy.stop.0.gamma=3}}\n", ["'stacks.a.overrides' must be a list", "got str"]),
        ("prompt_sets: humaneval\n", ["'prompt_sets' must be a list", "got str"]),
        ("oracle: 5\n", ["'oracle' must be a mapping of options (log_stack", "got int 5"]),
        ("oracle: {verify_tree_k: 4}\n", ["'oracle.verify_tree_k' must be a list, got int 4"]),
        ("sampling: {temperature: hot}\n", ["bad value for 'sampling.temperature'", "give a value of type float"]),
        ("draft: null\nrepeats: 0\n", ["repeats must be >= 1"]),
        ("oracle: {verify_tree_k: [1, 4]}\n", ["oracle.verify_tree_k must list token counts >= 2"]),
        ("oracle: {verify_tree_k: [4, 4]}\n", ["oracle.verify_tree_k names a token count twice"]),
        (
            "stacks: {t: {strategy: {drafter: {name: eagle, tree: {topk: 2}}, stop: [{name: fixed, gamma: 8}]}}}\n"
            "oracle: {log_stack: t}\n",
            ["oracle.log_stack 't' drafts a token tree", "log a stack drafting a long fixed chain"],
        ),
    ],
)
def test_bad_bench_yaml_is_a_one_line_error(tmp_path, capsys, text, needles):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code, out, err = run_cli(["bench", "--config", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not (tmp_path / "out").exists()  # failed before anything ran


def test_the_bench_config_is_validated_as_every_config_is(tmp_path):
    """One validator (``pacer_core.schema.validate_typed``) for the run, bench and ablation configs:
    an unknown key at any depth is named with the options valid there, in one wording."""
    from pacer_core import ConfigError, load_config

    refusals = [
        (lambda: load_config(overrides=["target.pth=x"]), "target: unknown option 'pth'; valid options: path"),
        (
            lambda: read_bench_config(None, ["target.pth=x"]),
            "bench config: unknown option 'target.pth'; valid options: path",
        ),
        (
            lambda: read_bench_config(None, ["stacks.a.confg=x"]),
            "bench config: unknown option 'stacks.a.confg'; valid options: config, strategy",
        ),
        (
            lambda: read_bench_config(None, ["max_new_tokens"]),
            "bench config: override 'max_new_tokens' is not key=value (e.g. max_new_tokens=32)",
        ),
    ]
    grid = tmp_path / "grid.yaml"
    grid.write_text("grid: {strategy.stop.0.gamma: [1]}\nstack: {overides: []}\n")
    refusals.append(
        (
            lambda: read_ablate_config(grid),
            f"ablate config '{grid}': unknown option 'stack.overides'; valid options: config, strategy",
        )
    )
    grid_value = tmp_path / "grid_value.yaml"
    grid_value.write_text("grid: {strategy.stop.0.gamma: 3}\n")
    refusals.append(
        (
            lambda: read_ablate_config(grid_value),
            f"ablate config '{grid_value}': 'grid.strategy.stop.0.gamma' must be a list, got int 3",
        )
    )
    for read, start in refusals:
        with pytest.raises(ConfigError) as refused:
            read()
        message = str(refused.value)
        assert message.startswith(start) and "\n" not in message and "unknown key" not in message, message


def test_other_command_errors_are_one_line(tmp_path, capsys):
    code, _, err = run_cli(["report", str(tmp_path)], capsys)
    assert code == 2 and "not a bench folder" in err and len(err.splitlines()) == 1
    grid = tmp_path / "grid.yaml"
    grid.write_text("grid: {}\n")
    code, _, err = run_cli(["ablate", "--config", str(grid)], capsys)
    assert code == 2 and "grid is empty" in err and len(err.splitlines()) == 1
    code, _, err = run_cli(["bench", "--config", str(grid), "max_new_tokens"], capsys)
    assert code == 2 and "not key=value" in err


def test_first_divergence_and_step_metrics():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    m = step_metrics([3, 1, 2], [2, 2, 0], [2, 0, 0])
    assert m["mean_accepted_length"] == 2.0 and m["acceptance_rate"] == 0.5
    assert m["per_position_acceptance"] == [0.5, 0.5] and m["draft_length_histogram"] == {0: 1, 2: 2}
    assert statistics.mean(m["drafted_per_step"]) == pytest.approx(4 / 3)


def test_the_embedded_target_gets_its_shipped_draft_when_a_stack_or_baseline_needs_one(tmp_path):
    from pacer_plugins.pacer_builtins.drafters import DEFAULT_DRAFT

    for name in "abcd":
        (tmp_path / name).mkdir()
    needs = write_bench(tmp_path / "a", "stacks: {d: {strategy: {drafter: {name: draft_model}}}}\n")
    cfg, _ = read_bench_config(needs)
    assert cfg.draft.path == DEFAULT_DRAFT and cfg.draft.dtype is None  # the bench's dtype
    assisted = write_bench(tmp_path / "b", "baselines: [hf_assisted_constant]\n")
    assert read_bench_config(assisted)[0].draft.path == DEFAULT_DRAFT
    free = write_bench(
        tmp_path / "c", "stacks: {p: {strategy: {drafter: {name: prompt_lookup}}}}\nbaselines: [hf_generate]\n"
    )
    assert read_bench_config(free)[0].draft is None  # nothing needs a draft: none is loaded
    mine = write_bench(
        tmp_path / "d", "draft: {path: /my/draft}\nstacks: {d: {strategy: {drafter: {name: draft_model}}}}\n"
    )
    assert read_bench_config(mine)[0].draft.path == "/my/draft"


def test_skip_leaves_out_the_first_prompts_of_each_set(tmp_path, tiny):
    from pacer_bench.prompts import load_prompts

    prompts = prompt_file(tmp_path, 3)
    assert [p.question_id for p in load_prompts(str(prompts), limit=1, skip=1)] == ["q1"]
    assert [p.question_id for p in load_prompts(str(prompts), skip=2)] == ["q2"]
    config = write_bench(tmp_path, "skip: 1\nlimit: 1\nstacks: {}\n")
    cfg, stacks = read_bench_config(config)
    assert run_bench(cfg, stacks, tmp_path / "out", progress=False, report=False) == 0
    assert {r["question_id"] for r in read_answers(tmp_path / "out")} == {"q1"}
    with pytest.raises(Exception, match="skip must be >= 0"):
        read_bench_config(config, ["skip=-1"])


def test_verify_cost_is_measured_and_reported_without_an_oracle(tmp_path, tiny, capsys):
    config = write_bench(tmp_path, STACKS + "verify_cost: true\noracle: {verify_max_k: 3, verify_repeats: 1}\n", n=1)
    code, _, err = run_cli(["bench", "--config", str(config), "--out", str(tmp_path / "out"), "--no-progress"], capsys)
    assert code == 0, err
    cost = json.loads((tmp_path / "out" / "cost_model.json").read_text())
    assert len(cost["verify_s"]) == 3 and all(v > 0 for v in cost["verify_s"])
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["verify_cost_ms"] == pytest.approx([1000 * v for v in cost["verify_s"]])
    assert results["oracle"] is None
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Verification cost" in report and "## Oracle replay" not in report
    # without it (and without an oracle) nothing is measured
    (tmp_path / "plain").mkdir()
    plain = write_bench(tmp_path / "plain", STACKS, n=1)
    assert run_cli(["bench", "--config", str(plain), "--out", str(tmp_path / "out2"), "--no-progress"], capsys)[0] == 0
    assert not (tmp_path / "out2" / "cost_model.json").exists()


def test_the_chain_and_tree_cost_probes_run_interleaved_so_drift_hits_both_alike():
    """Every repeat times every chain and tree probe in turn, so a machine whose speed drifts during
    the probe slows chain and tree forwards alike (one after the other, the trees would see only
    the later speed); medians come back per probe, in the order given."""
    from pacer_bench.timing import measure_verify_costs

    class Target:  # one forward of k tokens takes k ms, a tree-masked one 1 ms more
        def __init__(self):
            self.cached_tokens, self.calls, self.now = [], [], 0.0

        def reset(self):
            self.cached_tokens = []

        def crop(self, n):
            del self.cached_tokens[n:]

        def forward(self, tokens, positions=None, tree_mask=None, logits_from=0):
            tree = tree_mask is not None
            assert not tree or (positions is not None and tuple(tree_mask.shape) == (len(tokens),) * 2)
            self.calls.append((len(tokens), tree))
            self.now += (len(tokens) + tree) / 1000
            self.cached_tokens += list(tokens)

    target = Target()
    chain, tree = measure_verify_costs(target, [5, 6, 7], [1, 4], 3, lambda: target.now, tree_ks=[4, 8])
    assert target.calls[2:] == [(1, False), (4, False), (4, True), (8, True)] * 3  # after the context and a warm-up
    assert chain == pytest.approx([0.001, 0.004]) and tree == pytest.approx([0.005, 0.009])
    assert target.cached_tokens == []
    assert measure_verify_costs(Target(), [5], [1, 2], 1, lambda: 0.0)[1] == []
    with pytest.raises(ValueError):
        measure_verify_costs(Target(), [5], [1], 1, lambda: 0.0, tree_ks=[1])


def test_the_report_compares_each_tree_with_its_chains_and_each_hybrid_with_its_members():
    from pacer_bench.report import comparisons_markdown
    from pacer_bench.results import comparisons

    def unit(name, drafter):
        return {"name": name, "kind": "stack", "config": {"strategy": {"drafter": drafter, "stop": []}}}

    tree = {"topk": 4, "depth": 8, "nodes": 24}
    units = [
        unit("plain", {"name": "autoregressive"}),
        unit("chain2", {"name": "eagle"}),
        unit("chain4", {"name": "eagle"}),
        unit("tree", {"name": "eagle", "tree": tree}),
        unit("tree-other", {"name": "eagle", "tree": {"topk": 6}}),
        unit("lookup", {"name": "prompt_lookup"}),
        unit("hybrid", {"name": "hybrid", "members": [{"name": "eagle", "tree": tree}, {"name": "prompt_lookup"}]}),
        unit("orphan", {"name": "hybrid", "members": [{"name": "datastore"}]}),
        unit("draft-chain", {"name": "draft_model"}),
        {"name": "hf_generate", "kind": "baseline"},
    ]
    speed = {
        "code": {
            "plain": 1.0,
            "chain2": 1.2,
            "chain4": 1.3,
            "tree": 1.5,
            "tree-other": 1.4,
            "lookup": 1.8,
            "hybrid": 2.16,
            "orphan": 3.0,
            "draft-chain": 1.1,
            "hf_generate": 1.0,
        },
        "chat": {
            "plain": 1.0,
            "chain2": 1.25,
            "chain4": 1.2,
            "tree": 1.3,
            "tree-other": 1.5,
            "lookup": 1.0,
            "hybrid": 1.4,
        },
        "all": {"plain": 1.0, "chain2": 1.2},
    }
    table = {s: {n: {"speedup": v} for n, v in row.items()} for s, row in speed.items()}
    found = comparisons(units, table)
    assert set(found["trees"]) == {"eagle"}  # the token draft has no tree stack here
    code, chat = found["trees"]["eagle"]["code"], found["trees"]["eagle"]["chat"]
    assert (code["stack"], code["against"], code["ratio"]) == ("tree", "chain4", pytest.approx(1.5 / 1.3))
    assert (chat["stack"], chat["against"], chat["ratio"]) == ("tree-other", "chain2", pytest.approx(1.5 / 1.25))
    assert "all" not in found["trees"]["eagle"]  # no tree stack timed on that row
    assert set(found["hybrids"]) == {"hybrid"}  # the orphan's member has no stack of its own
    # members: the tree with the member's own tree section (not tree-other) and lookup, any stop
    assert found["hybrids"]["hybrid"]["code"]["against"] == "lookup"
    assert found["hybrids"]["hybrid"]["code"]["ratio"] == pytest.approx(1.2)
    assert found["hybrids"]["hybrid"]["chat"]["against"] == "tree"
    assert found["hybrids"]["hybrid"]["chat"]["ratio"] == pytest.approx(1.4 / 1.3)
    text = "\n".join(comparisons_markdown({"prompt_sets": ["code", "chat"], "comparisons": found}))
    assert "## Trees vs chains, hybrids vs members" in text and "1.20× (hybrid 2.16× / lookup 1.80×)" in text
    assert comparisons_markdown({"prompt_sets": ["code"], "comparisons": {"trees": {}, "hybrids": {}}}) == []


def test_bench_model_sections_take_the_bench_dtype_and_device_unless_they_set_their_own():
    cfg = BenchConfig(dtype="bfloat16", device="cpu")
    mine = model_config(BenchModelConfig(path="x", device_map=None, pack_weights=False), cfg)
    assert (mine.path, mine.dtype, mine.device, mine.pack_weights) == ("x", "bfloat16", "cpu", False)
    own = model_config(BenchModelConfig(dtype="float32", device="meta"), cfg)
    assert (own.path, own.dtype, own.device, own.pack_weights) == (None, "float32", "meta", None)


def test_the_report_gives_each_hybrid_members_share_of_the_accepted_tokens():
    from pacer_bench.report import sources_markdown
    from pacer_bench.results import source_shares

    records = [
        {"metrics": {"hybrid_accepted_eagle": 6, "hybrid_accepted_prompt_lookup": 2, "accepted": 8}},
        {"metrics": {"hybrid_accepted_eagle": 0, "hybrid_accepted_prompt_lookup": 2, "accepted": 2}},
    ]
    assert source_shares(records) == {"eagle": 0.6, "prompt_lookup": 0.4}
    assert source_shares([{"metrics": {"accepted": 3}}]) == {}  # a stack without members
    assert source_shares([{"metrics": {"hybrid_accepted_eagle": 0}}]) == {"eagle": 0.0}
    results = {
        "prompt_sets": ["gsm8k"],
        "table": {
            "gsm8k": {"plain": {"source_shares": {}}, "hybrid": {"source_shares": {"eagle": 0.6, "datastore": 0.4}}},
            "all": {"hybrid": {"source_shares": {"eagle": 0.5, "datastore": 0.5}}},
        },
    }
    lines = sources_markdown(results)
    assert "| gsm8k | hybrid | eagle 60%, datastore 40% |" in lines
    assert "| all | hybrid | eagle 50%, datastore 50% |" in lines
    assert not any("plain" in line for line in lines)
    assert sources_markdown({"prompt_sets": ["gsm8k"], "table": {"gsm8k": {"plain": {"source_shares": {}}}}}) == []


def test_the_report_gives_m_bs_own_share_of_the_wall_time_beside_the_stop_time():
    from pacer_bench.report import _stop
    from pacer_bench.results import mb_share

    records = [{"metrics": {"pacer_mb_s": 0.2, "stop_s": 0.5}}, {"metrics": {"pacer_mb_s": 0.1, "stop_s": 0.3}}]
    assert mb_share(records, 10.0) == pytest.approx(0.03)
    assert mb_share([{"metrics": {"stop_s": 0.5}}], 10.0) is None  # no PACER stop
    assert _stop({"stop_share": 0.08, "mb_share": 0.03}) == "8.0% (M_B 3.0%)"
    assert _stop({"stop_share": 0.08, "mb_share": None}) == "8.0%"


# -- 95% intervals and --compare ---------------------------------------------------------------------
def test_every_speedup_and_tau_of_the_report_carries_its_interval(finished):
    results = json.loads((finished / "results.json").read_text())
    text = (finished / "report.md").read_text()
    for set_name, row in results["table"].items():
        for name, c in row.items():
            low, high = c["speedup_ci"]
            assert low <= c["speedup"] + 1e-9 and c["speedup"] - 1e-9 <= high, (set_name, name)
            assert c["tau_ci"][0] <= c["tau"] + 1e-9 <= c["tau_ci"][1] + 2e-9, (set_name, name)
    assert results["table"]["all"]["autoregressive"]["speedup_ci"] == [1.0, 1.0]
    c = results["table"]["all"]["fixed2"]
    assert (
        f"| fixed2 | {c['records']} | {c['tokens_per_s']:.1f} | {c['speedup']:.2f}× "
        f"[{c['speedup_ci'][0]:.2f}, {c['speedup_ci'][1]:.2f}] | {c['tau']:.2f} [{c['tau_ci'][0]:.2f}, "
        f"{c['tau_ci'][1]:.2f}] |"
    ) in text
    # rebuilt from the same log: the same intervals (the generators are seeded)
    again = finished.parent / "again"
    shutil.copytree(finished, again, dirs_exist_ok=True)
    from pacer_bench.report import write_report

    assert write_report(again, plots=False)["table"] == results["table"]


def test_report_compare_says_whether_two_stacks_differ_beyond_the_noise(finished, capsys):
    code, out, err = run_cli(["report", str(finished), "--compare", "fixed2", "long"], capsys)
    assert code == 0, err
    assert "| prompt set | prompts | generations | fixed2 ÷ long | τ fixed2 | τ long | verdict |" in out
    rows = [line for line in out.splitlines() if line.startswith("| all |")]
    assert len(rows) == 1 and rows[0].split(" | ")[-1].rstrip(" |") == "too few prompts to tell (3 < 8)"
    code, _, err = run_cli(["report", str(finished), "--compare", "fixed2", "nope"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("pacer: error: --compare: 'nope' has no record in") and "fixed2" in err
    code, _, err = run_cli(["report", str(finished), "--compare", "long", "long"], capsys)
    assert code == 2 and "names 'long' twice" in err


# -- one bench per folder; SIGTERM ----------------------------------------------------------------------
def test_a_second_bench_on_a_locked_folder_is_refused_in_one_line(tmp_path, tiny, capsys):
    """Another process holding the folder's lock (a bench running there): `pacer bench` on the same
    --out is refused before anything is read or run, naming the holder; once it is gone, it runs."""
    import subprocess
    import sys

    config = write_bench(tmp_path, STACKS, n=1)
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import fcntl, os, sys, time\n"
                f"fd = os.open({str(out / '.bench.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
                "fcntl.flock(fd, fcntl.LOCK_EX)\n"
                "os.write(fd, f'{os.getpid()}\\n'.encode())\n"
                "print('locked', flush=True)\n"
                "sys.stdin.read()\n"
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, _, err = run_cli(["bench", "--config", str(config), "--out", str(out), "--no-progress"], capsys)
        assert_one_line(
            code,
            err,
            f"--out '{out}' is being written by another pacer bench (pid {holder.pid})",
            "choose another --out",
        )
        assert not (out / "answers.jsonl").exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    code, _, err = run_cli(["bench", "--config", str(config), "--out", str(out), "--no-progress"], capsys)
    assert code == 0, err


def test_the_lock_is_held_for_the_run_and_released_after(tmp_path, models):
    from pacer_bench.run import folder_lock

    config = write_bench(tmp_path, STACKS, n=1)
    cfg, stacks = read_bench_config(config)
    out = tmp_path / "out"
    out.mkdir()
    with folder_lock(out):  # a bench running there (flock conflicts across open files, in one process too)
        with pytest.raises(InputError, match="is being written by another pacer bench"):
            run_bench(cfg, stacks, out, models=models, progress=False, report=False)
    assert run_bench(cfg, stacks, out, models=models, progress=False, report=False) == 0
    with folder_lock(out):  # released when the run returned
        pass


class Terminate:
    """Sends this process SIGTERM when the ``after``-th engine generation finishes."""

    def __init__(self, after: int):
        self.after, self.count = after, 0

    @hookimpl
    def pacer_finish(self, state, result):
        import os
        import signal

        self.count += 1
        if self.count == self.after:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigtermed_bench_says_so_keeps_its_records_and_exits_143(tmp_path, models, capsys):
    import signal

    config = write_bench(tmp_path, STACKS, n=2)
    cfg, stacks = read_bench_config(config)
    out = tmp_path / "out"
    before = signal.getsignal(signal.SIGTERM)
    code = run_bench(cfg, plans(config, Terminate(3)), out, models=models, progress=False)
    err = capsys.readouterr().err
    assert code == 143 and "terminated (SIGTERM): 2/8 generations kept" in err and "rerun the same command" in err
    assert len(read_answers(out)) == 2 and signal.getsignal(signal.SIGTERM) is before
    assert run_bench(cfg, plans(config), out, models=models, progress=False, report=False) == 0  # resumes
    assert len(read_answers(out)) == 8


def test_mean_draft_counts_the_main_path_and_shows_a_deeper_tree_apart():
    """Ouroboros' candidate suffixes hang below the main path's tip: the depth (5.83 with fixed γ=3)
    is not the draft length the stop asked for; the report gives the main path, the depth beside it."""
    from types import SimpleNamespace

    from pacer_bench.report import _draft
    from pacer_bench.results import cell
    from pacer_plugins.pacer_builtins.observers import Metrics, MetricsConfig

    class Draft:  # a main path of `main` tokens, side nodes reaching `depth`
        def __init__(self, main: int, depth: int):
            self.main, self.depth, self.num_nodes = main, depth, depth + 2

        def __len__(self) -> int:
            return self.main

    metrics = Metrics(MetricsConfig(), None)
    for depth in (6, 5, 3):
        step = SimpleNamespace(
            emitted=[1, 2],
            draft=Draft(3, depth),
            verdict=SimpleNamespace(accepted=1),
            draft_forwards=1,
            draft_s=0.0,
            verify_s=0.0,
            stop_s=0.0,
        )
        metrics.pacer_observe_step(state=None, step=step)
    m = metrics.pacer_finish(state=None, result=None)
    assert m["main_path_per_step"] == [3, 3, 3] and m["drafted_per_step"] == [6, 5, 3]
    record = {"prompt_set": "s", "question_id": "q", "tokens": [0] * 6, "metrics": {**m, "wall_s": 1.0}}
    c = cell([record], {})
    assert c["mean_main_path"] == 3.0 and c["mean_draft_length"] == pytest.approx(14 / 3)
    assert _draft(c) == "3.00 (depth 4.67)"
    assert _draft({"mean_main_path": 2.0, "mean_draft_length": 2.0}) == "2.00"  # a chain: one figure
    assert _draft({"mean_main_path": None, "mean_draft_length": 2.5}) == "2.50"  # an older record


def test_spec_bench_mean_accepted_tokens_is_told_apart_from_tau():
    from pacer_bench.specbench import TAU_NOTE, leaderboard_markdown, speed_markdown

    figures = {
        "overall": {
            "questions": 2,
            "tokens_per_s": 10.0,
            "baseline_tokens_per_s": 5.0,
            "speedup": 2.0,
            "mean_accepted_tokens": 2.27,
        }
    }
    specbench = {"files": {"a": "specbench/a.jsonl"}, "speed": {"autoregressive": {"a": figures}}}
    speed = "\n".join(speed_markdown(specbench))
    assert TAU_NOTE in speed and speed.index(TAU_NOTE) < speed.index("| stack | task |")  # read before the table
    assert "not the report's τ" in TAU_NOTE and "prefill" in TAU_NOTE
    board = "\n".join(leaderboard_markdown(specbench, ["specbench"]))
    assert TAU_NOTE in board and "Mean accepted tokens (τ)" not in board


def test_the_report_shows_a_draft_inside_the_working_folder_by_its_relative_path(tmp_path, monkeypatch):
    from pacer_bench.report import _shown

    monkeypatch.chdir(tmp_path)
    assert _shown(tmp_path / "plugins" / "draft") == str(Path("plugins") / "draft")
    assert _shown("/elsewhere/draft") == "/elsewhere/draft"
    assert _shown("tiny-draft") == "tiny-draft"
