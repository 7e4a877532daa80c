"""``pacer report`` (``pacer_bench.report``, the figures of ``pacer_bench.results``) on tiny benches:
its numbers recomputed from the answer log, token trees, older logs, damaged files refused in one
line, trees against chains and hybrids against members, shares, intervals and ``--compare``.

``pacer_bench.units.load_models`` is replaced by one returning tests/helpers.py's tiny models and a character
tokenizer, so nothing real loads. Timings on tiny models mean nothing; the tests check bookkeeping.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pacer_bench import units
from pacer_bench.replay.chains import replay_fixed, replay_oracle
from pacer_bench.replay.steplog import LoggedStep, steps_from_metrics
from pacer_core.cost_profiles import CostModel, cost_model, monotone

from helpers import (
    assert_one_line_error,
    bench_models,
    copy_of,
    finished_bench,
    make_draft,
    read_answers,
    run_cli,
    tiny_llama,
    write_bench,
)


@pytest.fixture(scope="module")
def models():
    return bench_models()


# -- a full tiny bench, shared by several tests -------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory, models):
    return finished_bench(tmp_path_factory.mktemp("bench"), models)


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


def test_report_refuses_a_damaged_middle_line_of_the_answer_log(finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path)
    lines = (out / "answers.jsonl").read_text().splitlines(keepends=True)
    lines[4] = lines[4][: len(lines[4]) // 2] + "\n"  # line 5 cut in half, lines after it intact
    (out / "answers.jsonl").write_text("".join(lines))
    code, out_text, err = run_cli(["report", str(out), "--no-plots"], capsys)
    assert_one_line_error(code, err, f"'{out / 'answers.jsonl'}' line 5", "not JSON", "delete line 5")
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
    assert_one_line_error(code, err, f"'{out / 'answers.jsonl'}' line 3", problem, "delete line 3")


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
    assert_one_line_error(code, err, f"'{out / 'bench.json'}'", problem, "restore it, or delete it and rerun")


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
    assert_one_line_error(code, err, f"'{out / 'cost_model.json'}'", "delete it")


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


def test_the_report_names_each_stacks_slowest_prompts(finished):
    from pacer_bench.stats import prompt_speedups

    results = json.loads((finished / "results.json").read_text())
    records = read_answers(finished)
    baseline = [r for r in records if r["model_id"] == "autoregressive"]
    reference = {(r["prompt_set"], r["question_id"], r["repeat"], r["turn"]): r for r in baseline}
    text = (finished / "report.md").read_text()
    assert "## Per prompt: the slowest" in text
    for name, c in results["table"]["all"].items():
        speedups = prompt_speedups([r for r in records if r["model_id"] == name], reference)
        expected = sorted(speedups.items(), key=lambda item: item[1])
        assert c["prompts"] == len(speedups) >= 2 and c["prompts_below_one"] == sum(v < 1 for v in speedups.values())
        assert [tuple(pair) for pair in c["slowest_prompts"]] == expected[:3]
        if name != "autoregressive":
            prompt, speedup = expected[0]
            assert f"| {name} | {c['prompts']} | {c['prompts_below_one']} | {speedup:.3f}× ({prompt})" in text


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


def test_the_report_shows_a_draft_inside_the_working_folder_by_its_relative_path(tmp_path, monkeypatch):
    from pacer_bench.answers import shown_path  # bench.json's units record a draft folder the same way

    monkeypatch.chdir(tmp_path)
    assert shown_path(tmp_path / "plugins" / "draft") == str(Path("plugins") / "draft")
    assert shown_path("/elsewhere/draft") == "/elsewhere/draft"
    assert shown_path("tiny-draft") == "tiny-draft"
