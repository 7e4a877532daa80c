"""``pacer bench``'s run (``pacer_bench.run``) on tiny seeded models: a full bench end to end,
resumption after an interruption, refusals before models load, the verification cost measured
without an oracle, one bench per folder (its lock) and SIGTERM.

``pacer_bench.units.load_models`` is replaced by one returning tests/helpers.py's tiny models and a character
tokenizer, so nothing real loads. Timings on tiny models mean nothing; the tests check bookkeeping.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pacer_bench import units
from pacer_bench.config import read_ablate_config, read_bench_config
from pacer_bench.run import run_bench
from pacer_core import hookimpl
from pacer_core.errors import InputError

from helpers import (
    STACKS,
    Crash,
    assert_one_line_error,
    bench_models,
    copy_of,
    finished_bench,
    never_load,
    read_answers,
    run_cli,
    write_bench,
)


@pytest.fixture(scope="module")
def models():
    return bench_models()


@pytest.fixture
def tiny(monkeypatch, models):
    monkeypatch.setattr(units, "load_models", lambda cfg: models)
    return models


# -- a full tiny bench, shared by several tests -------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory, models):
    return finished_bench(tmp_path_factory.mktemp("bench"), models)


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


def test_each_unit_records_the_draft_it_reads(tmp_path, monkeypatch):
    """bench.json's units record the draft weights each read, as the engine resolved them
    (``Engine.draft_source``): an eagle draft's folder and identity, a draft model's, none for a lookup."""
    from pacer_plugins.eagle.drafter import draft_identity

    from helpers import CharTokenizer, adapter, make_draft, tiny_llama

    monkeypatch.chdir(tmp_path)  # a folder inside the working folder is recorded relative to it
    target_model = tiny_llama(0)
    draft = make_draft(target_model, tmp_path / "eagle-draft")
    draft_model = adapter(tiny_llama(1))
    draft_model.digest, draft_model.folder = "tiny-draft-digest", tmp_path / "draft-model"
    models = units.Models(adapter(target_model), draft_model, CharTokenizer())
    chain = "stop: [{name: fixed, gamma: 2}], verifier: {name: greedy}"
    config = write_bench(
        tmp_path,
        "stacks:\n"
        f"  eagle: {{strategy: {{drafter: {{name: eagle, path: '{draft}'}}, {chain}}}}}\n"
        f"  tokens: {{strategy: {{drafter: {{name: draft_model}}, {chain}}}}}\n"
        f"  lookup: {{strategy: {{drafter: {{name: prompt_lookup}}, {chain}}}}}\n"
        "baselines: [hf_generate, hf_assisted_constant]\n",
        n=1,
    )
    bench, stacks = read_bench_config(config)
    assert run_bench(bench, stacks, tmp_path / "out", models=models, progress=False, report=False) == 0
    recorded = {u["name"]: u["draft"] for u in json.loads((tmp_path / "out" / "bench.json").read_text())["units"]}
    model_draft = {"folder": "draft-model", "identity": "tiny-draft-digest"}
    assert recorded == {
        "autoregressive": None,
        "eagle": {"folder": "eagle-draft", "identity": draft_identity(draft)},
        "tokens": model_draft,
        "lookup": None,
        "hf_generate": None,
        "hf_assisted_constant": model_draft,
    }


def test_resume_refuses_a_unit_whose_draft_changed(tmp_path, monkeypatch):
    """A unit's results are kept only for the draft they were made with: a resumption whose stack reads
    other weights at the same path is refused (the records would mix two drafts)."""
    from pacer_plugins.eagle.drafter import draft_identity

    from helpers import CharTokenizer, adapter, make_draft, tiny_llama

    monkeypatch.chdir(tmp_path)
    target_model = tiny_llama(0)
    first = make_draft(target_model, tmp_path / "draft-a")
    models = units.Models(adapter(target_model), None, CharTokenizer())
    stack = "stop: [{name: fixed, gamma: 2}], verifier: {name: greedy}"
    config = write_bench(
        tmp_path, f"stacks:\n  eagle: {{strategy: {{drafter: {{name: eagle, path: draft}}, {stack}}}}}\n", n=1
    )
    shutil.copytree(first, tmp_path / "draft")
    bench, stacks = read_bench_config(config)
    assert run_bench(bench, stacks, tmp_path / "out", models=models, progress=False, report=False) == 0
    shutil.rmtree(tmp_path / "draft")  # the same path now holds another draft
    shutil.copytree(make_draft(tiny_llama(0), tmp_path / "draft-b", seed=1), tmp_path / "draft")
    assert draft_identity(tmp_path / "draft") != draft_identity(first)
    bench, stacks = read_bench_config(config)
    with pytest.raises(InputError, match="'eagle' made with draft .* this run reads draft"):
        run_bench(bench, stacks, tmp_path / "out", models=models, progress=False, report=False)


def test_resume_refuses_other_settings(tmp_path, models):
    config = write_bench(tmp_path, "", n=1)
    cfg, stacks = read_bench_config(config)
    assert run_bench(cfg, stacks, tmp_path / "out", models=models, progress=False, report=False) == 0
    cfg, stacks = read_bench_config(config, ["max_new_tokens=8"])
    with pytest.raises(InputError, match="other settings .*max_new_tokens"):
        run_bench(cfg, stacks, tmp_path / "out", models=models, progress=False)


def test_resume_refuses_damaged_files_before_models_load(finished, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(units, "load_models", never_load)
    config = write_bench(tmp_path, "", n=1)
    out = copy_of(finished, tmp_path)
    (out / "bench.json").write_text("{oops")
    code, _, err = run_cli(["bench", "--config", str(config), "--out", str(out), "--no-progress"], capsys)
    assert_one_line_error(code, err, "bench.json", "not JSON")
    out = tmp_path / "copy2"
    shutil.copytree(finished, out)
    with open(out / "answers.jsonl", "r+") as handle:
        handle.write("garbage\n")  # over the start of line 1
    code, _, err = run_cli(["bench", "--config", str(config), "--out", str(out), "--no-progress"], capsys)
    assert_one_line_error(code, err, "answers.jsonl' line 1", "delete line 1")


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
    assert_one_line_error(code, err, "no prompt to run", needle, "check skip, --limit and the files")
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
        assert_one_line_error(code, err, f"--out '{place}'", problem, "give --out a folder that can be written")
    assert (tmp_path / "a-file").read_text() == "x"


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
        assert_one_line_error(
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
