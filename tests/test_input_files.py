"""Every file a user names is read by one rule (``pacer_core.jsonfile``): a regular file only, read
with a bound, its JSON or YAML nested at most ``MAX_DEPTH`` deep; anything else is one line, at
once: ``/dev/zero`` is never read to the end, a FIFO never waited on, a small .gz never expanded
without bound, a deeply nested document never a ``RecursionError`` traceback."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from pacer_bench import answers, prompts
from pacer_bench.replay import stop_rules
from pacer_bench.replay.profiles import with_host
from pacer_core import ConfigError, InputError, calibration, cli, cost_profiles, jsonfile, load_config, schema
from pacer_core.hf import load_safetensors, materialize
from pacer_core.jsonfile import MAX_DEPTH, MAX_LINE_BYTES
from pacer_train import read_json as read_run_json

from helpers import one_line_error, special_files, within

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "docs" / "results" / "replay" / "run"  # a recorded bench run, read-only
DEEP_JSON = "[" * 100_000 + "]" * 100_000  # past the parser's recursion: RecursionError before the rule
SHALLOW_DEEP_JSON = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)  # parses, but past the rule


def specials(tmp_path, suffix: str = "") -> dict[str, Path]:
    """``special_files`` under names ending in ``suffix`` (symbolic links to them), for readers that
    choose by the name (a ``.jsonl`` prompt set)."""
    found = special_files(tmp_path)
    if not suffix:
        return found
    named = {}
    for kind, path in found.items():
        link = tmp_path / f"{kind.split()[-1].split('/')[-1]}-link{suffix}"
        if not os.path.lexists(link):
            link.symlink_to(path)
        named[kind] = link
    return named


def refused(call, *needles, error=(InputError, ConfigError)) -> str:
    """The one-line refusal ``call()`` raises within 10 seconds, holding each needle."""
    with within(10), pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


# -- the shared reader ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind,problem",
    [
        ("/dev/zero", "is a device, not a regular file"),
        ("a FIFO", "is a pipe (FIFO), not a regular file"),
        ("a folder", "is a folder, not a file"),
    ],
)
def test_what_is_not_a_regular_file_is_refused_at_once(tmp_path, kind, problem):
    path = special_files(tmp_path)[kind]
    refused(lambda: jsonfile.read_bytes(path, "thing", "give a file"), f"thing '{path}' {problem}: give a file")
    refused(lambda: list(jsonfile.read_lines(path, "thing", "give a file")), problem)
    refused(lambda: jsonfile.read_json(path, "thing", "give a file"), problem)


def test_reads_are_bounded(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 1001)
    refused(lambda: jsonfile.read_bytes(big, "thing", "fix", limit=1000), "is larger than 1000 bytes")
    assert jsonfile.read_bytes(big, "thing", "fix", limit=1001) == b" " * 1001
    lines = tmp_path / "q.jsonl"
    lines.write_bytes(b"ab\r\n" + b"x" * 11 + b"\n")
    refused(lambda: list(jsonfile.read_lines(lines, "thing", "fix", max_line=10)), "line 2 is longer than 10 bytes")
    assert list(jsonfile.read_lines(lines, "thing", "fix", max_line=11)) == [(1, b"ab"), (2, b"x" * 11)]
    refused(lambda: list(jsonfile.read_lines(lines, "thing", "fix", limit=10)), "holds more than 10 bytes")


def test_a_small_gzip_file_is_not_expanded_without_bound(tmp_path):
    """A few kilobytes of .gz holding one line of many megabytes: refused once the line passes the
    bound, before it is read whole; many lines are bounded in all, decompressed."""
    path = tmp_path / "q.jsonl.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(b'{"question_id": 1, "category": "x", "turns": ["' + b"a" * (MAX_LINE_BYTES + 10) + b'"]}\n')
    assert path.stat().st_size < 50_000
    refused(lambda: prompts.load_prompts(f"specbench:{path}"), f"question file '{path}' line 1 is longer than 4 MiB")
    with gzip.open(path, "wb") as handle:
        handle.write(b'{"prompt": "a"}\n' * 1000)
    refused(
        lambda: list(jsonfile.read_lines(path, "prompt file", "fix", limit=10_000)),
        "holds more than 9.76562 KiB once decompressed",
    )


def test_an_over_long_plain_prompt_line_is_refused_when_read(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "' + b"a" * MAX_LINE_BYTES + b'"}\n')
    refused(lambda: prompts.load_prompts(str(path)), f"prompt file '{path}' line 2 is longer than 4 MiB")


@pytest.mark.parametrize("text", [DEEP_JSON, SHALLOW_DEEP_JSON])
def test_deep_json_is_refused_by_the_rule(tmp_path, text):
    path = tmp_path / "deep.json"
    path.write_text(text)
    refused(lambda: jsonfile.read_json(path, "thing", "fix", expect=None), f"nested more than {MAX_DEPTH}")
    assert jsonfile.nesting_depth(json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)) == MAX_DEPTH


# -- every reader of a user-named file --------------------------------------------------------------
PROFILE = cost_profiles.load_profile("a100-7b-bf16")

READERS = {  # name -> (suffix of the path it reads, reader)
    "config": ("", lambda p: schema.read_yaml(p)),
    "cost profile": ("", lambda p: cost_profiles.load_profile(p)),
    "tree calibration": ("", lambda p: calibration.load(p)),
    "--host": ("", lambda p: with_host(PROFILE, str(p))),
    "replay-stop cost file": ("", lambda p: stop_rules.read_cost_file(p, None, None)),
    "prompt .jsonl": (".jsonl", lambda p: prompts.load_prompts(str(p))),
    "specbench: file": (".jsonl", lambda p: prompts.load_prompts(f"specbench:{p}")),
    "answer log": ("", lambda p: answers.read_answers(p)),
    "--prompt-file": ("", lambda p: cli._read_prompt(type("Args", (), {"prompt": None, "prompt_file": str(p)}))),
    "training run file": ("", lambda p: read_run_json(p, "run file")),
    "GGUF target": (".gguf", lambda p: materialize(str(p))),
    "safetensors weights": (".safetensors", lambda p: load_safetensors(p, "fix")),
}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("kind", ["/dev/zero", "a FIFO", "a folder"])
def test_every_reader_refuses_what_is_not_a_regular_file_in_one_line(tmp_path, reader, kind):
    suffix, read = READERS[reader]
    path = specials(tmp_path, suffix)[kind]
    refused(lambda: read(path))


@pytest.mark.parametrize(
    "reader",
    [
        "config",
        "cost profile",
        "tree calibration",
        "--host",
        "replay-stop cost file",
        "prompt .jsonl",
        "specbench: file",
        "answer log",
        "training run file",
    ],
)
@pytest.mark.parametrize("text", [DEEP_JSON, SHALLOW_DEEP_JSON])
def test_every_reader_of_nested_data_refuses_depth_in_one_line(tmp_path, reader, text):
    suffix, read = READERS[reader]
    path = tmp_path / f"deep{suffix}"
    path.write_text(text + "\n")
    if reader == "answer log":
        good = (RUN / "answers.jsonl").read_text().splitlines()[0]
        path.write_text(good + "\n" + text + "\n")
    refused(lambda: read(path), "nested more than")


def test_a_deep_yaml_config_profile_or_host_file_is_refused_before_the_recursion(tmp_path):
    for depth in (MAX_DEPTH + 1, 5000):
        path = tmp_path / "deep.yaml"
        path.write_text("a: " + "[" * depth + "]" * depth + "\n")
        refused(lambda: schema.read_yaml(path), "nested more than", "line 1")
        refused(lambda: cost_profiles.load_profile(path), "nested more than")
        refused(lambda: with_host(PROFILE, str(path)), "nested more than")
    path.write_text("a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, MAX_DEPTH + 2)))
    refused(lambda: schema.read_yaml(path), "aliases nest more than")


# -- the commands, one line each ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["/dev/zero", "a FIFO", "a folder"])
def test_the_commands_refuse_what_is_not_a_regular_file_in_one_line(tmp_path, capsys, kind):
    path = specials(tmp_path)[kind]
    with within(60):
        assert str(path) in one_line_error(capsys, ["validate", str(path)])
        assert str(path) in one_line_error(capsys, ["generate", "-c", str(path), "-p", "hi"])
        for option in ("--host", "--calibration"):
            line = one_line_error(capsys, ["replay", str(RUN), "--profile", "a100-7b-bf16", option, str(path)])
            assert str(path) in line
        line = one_line_error(capsys, ["replay", str(RUN), "--profile", str(path)])
        assert str(path) in line
        override = f"strategy.drafter={{name: draft_model, tree: {{nodes: auto, calibration: '{path}'}}}}"
        with pytest.raises(InputError, match="tree calibration"):
            load_config(overrides=[override], require_models=False)


def test_report_and_replay_refuse_a_deep_or_special_answer_log_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    log = run / "answers.jsonl"
    first = log.read_text().splitlines()[0]
    log.write_text(first + "\n" + DEEP_JSON + "\n" + first + "\n")
    with within(60):
        line = one_line_error(capsys, ["replay", str(run), "--profile", "a100-7b-bf16"])
        assert "line 2 is not a bench record (nested more than" in line
        assert "nested more than" in one_line_error(capsys, ["report", str(run)])
        log.unlink()
        os.mkfifo(log)
        assert "is a pipe (FIFO), not a regular file" in one_line_error(capsys, ["report", str(run)])
    (run / "bench.json").write_text(SHALLOW_DEEP_JSON)
    log.unlink()
    shutil.copy(RUN / "answers.jsonl", log)
    assert "bench file" in one_line_error(capsys, ["report", str(run)])


def test_a_prompt_file_that_is_special_deep_or_too_long_is_refused_before_models_load(tmp_path, capsys, monkeypatch):
    from pacer_bench import units

    def never_load(cfg):
        raise AssertionError("models were loaded")

    monkeypatch.setattr(units, "load_models", never_load)
    long = tmp_path / "long.jsonl"
    long.write_bytes(b'{"prompt": "' + b"a" * (MAX_LINE_BYTES + 1) + b'"}\n')
    deep = tmp_path / "deep.jsonl"
    deep.write_text(DEEP_JSON + "\n")
    gz = tmp_path / "q.jsonl.gz"
    with gzip.open(gz, "wb") as handle:
        handle.write(b'{"question_id": 1, "category": "x", "turns": ["' + b"a" * (MAX_LINE_BYTES + 1) + b'"]}\n')
    cases = [
        (str(long), "line 1 is longer than 4 MiB"),
        (str(deep), "line 1 is nested more than"),
        (f"specbench:{gz}", "line 1 is longer than 4 MiB"),
    ]
    cases += [(str(path), str(path)) for path in specials(tmp_path, ".jsonl").values()]
    for name, needle in cases:
        with within(60):
            line = one_line_error(capsys, ["bench", f"prompt_sets=['{name}']", "--out", str(tmp_path / "out")])
        assert needle in line
        assert not (tmp_path / "out").exists()
