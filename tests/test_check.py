"""``pacer check``: it passes the shipped stacks and fails, naming the case, for deliberately broken
components (tests/broken_plugins.py); bad input is one line, exit 2. Also ``sample_match``: every
shipped stack, sampled, is token for token plain sampling with the same seed.

The default suite runs cheap stacks and single cases (``--case``); every shipped config's whole
``--quick`` check is marked slow (CI runs it through .ci/run)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from pacer_bench.config import is_bench_config
from pacer_core.acceptance import sample_match_verify
from pacer_core.sampling import position_noise, sample_with_noise

from helpers import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parents[1]
BROKEN = str(ROOT / "tests" / "broken_plugins.py")
SHIPPED = sorted(p for p in (ROOT / "configs").glob("*.yaml") if not is_bench_config(p))


def check(capsys, *argv) -> tuple[int, dict]:
    code, out, err = run_cli(["check", "--quick", "--json", *argv], capsys)
    assert code in (0, 1), err
    return code, json.loads(out)


def failing(result: dict) -> dict[str, str]:
    return {c["check"]: c["failed"] for c in result["checks"] if c["failed"]}


def test_a_cheap_shipped_stack_passes(capsys):
    code, result = check(capsys, "-c", str(ROOT / "configs" / "sampling.yaml"))
    assert code == 0 and result["passed"], result
    assert {c["check"]: c["cases"] > 0 for c in result["checks"]} == dict.fromkeys(
        ["load", "greedy", "distribution", "sample_match", "repeatability", "isolation", "options"], True
    )


@pytest.mark.slow
@pytest.mark.parametrize("config", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_passes(capsys, config):
    code, result = check(capsys, "-c", str(config))
    assert code == 0, failing(result)


@pytest.mark.parametrize(
    "stack, expected",
    [
        (
            ["strategy.drafter={name: no_rollback}", "strategy.stop=[{name: fixed, gamma: 3}]"],
            {"greedy": "greedy/prompt=plain", "distribution": "distribution/t0.7"},
        ),
        pytest.param(
            ["strategy.drafter={name: draft_model}", "strategy.stop=[{name: fixed, gamma: 3}, {name: one_more}]"],
            {"greedy": "greedy/prompt=plain"},
            marks=pytest.mark.slow,
        ),  # fast: the table test below
    ],
    ids=["drafter-without-rollback", "stop-keeping-one-more"],
)
def test_broken_components_fail_naming_the_case(capsys, stack, expected):
    code, result = check(capsys, "--plugin", BROKEN, *stack)
    assert code == 1 and not result["passed"]
    named = failing(result)
    for name, case in expected.items():
        assert named[name] == case
    rerun = next(c["rerun"] for c in result["checks"] if c["failed"])
    assert "--case" in rerun and "--plugin" in rerun


@pytest.mark.parametrize(
    "stack",
    [
        [
            "strategy.drafter={name: draft_model}",
            "strategy.stop=[{name: fixed, gamma: 3}]",
            "strategy.verifier={name: accept_on_q}",
        ],
        pytest.param(
            ["strategy.drafter={name: wrong_parent}", "strategy.stop=[{name: fixed, gamma: 3}]"], marks=pytest.mark.slow
        ),
    ],
    ids=["verifier-accepting-on-q", "tree-drafter-with-a-wrong-parent"],
)
def test_broken_sampling_fails_the_distribution_case(capsys, stack):
    code, result = check(capsys, "--plugin", BROKEN, *stack, "--case", "distribution/t0.7")
    assert code == 1 and failing(result) == {"distribution": "distribution/t0.7"}


def test_the_table_names_the_failing_case_and_its_rerun(capsys):
    code, out, err = run_cli(
        [
            "check",
            "--quick",
            "--plugin",
            BROKEN,
            "strategy.drafter={name: draft_model}",
            "strategy.stop=[{name: fixed, gamma: 3}, {name: one_more}]",
            "--case",
            "greedy/prompt=plain",
        ],
        capsys,
    )
    assert code == 1
    row = next(line for line in out.splitlines() if line.startswith("greedy"))
    assert "FAIL" in row and "Stop(keep=" in row and "rerun: pacer check" in row


# -- a plugin's bug is a failing row naming the plugin, the hook, the case and the rerun, never a traceback --
def failing_row(capsys, *argv) -> dict:
    """The one failing row of ``pacer check --quick --json argv`` (exit 1, no traceback)."""
    code, out, err = run_cli(["check", "--quick", "--json", *argv], capsys)
    assert code == 1 and "Traceback" not in out + err, err
    result = json.loads(out)
    rows = [c for c in result["checks"] if c["failed"]]
    assert not result["passed"] and len(rows) == 1, rows
    assert "--case" in rows[0]["rerun"] and rows[0]["failed"] in rows[0]["rerun"]
    return rows[0]


@pytest.mark.parametrize(
    "value, needle",
    [
        ("class", "returned the class Stop, not a Stop: return Stop()"),
        ("float", "returned float 1.0: return a positive int"),
        ("zero", "returned 0: return a positive int"),
        ("negative", "returned -5: return a positive int"),
        ("list", "returned list [1, 2]"),
        ("keep", "returned Stop(keep=1.5): keep must be an int"),
        ("raise", "raised ValueError: a bug in the stop at "),
        ("exit", "raised SystemExit(0) at "),
    ],
)
def test_a_stop_returning_a_wrong_value_or_raising_is_a_named_failing_row(capsys, value, needle):
    row = failing_row(
        capsys,
        "--plugin",
        BROKEN,
        f"strategy.stop=[{{name: returns, value: {value}}}]",
        "--case",
        "greedy/prompt=plain",
    )
    assert row["failed"] == "greedy/prompt=plain"
    assert row["reason"].startswith("strategy.stop[0]:returns: pacer_draft_more ") and needle in row["reason"]


def test_a_drafter_proposing_a_list_is_a_named_failing_row(capsys):
    row = failing_row(
        capsys, "--plugin", BROKEN, "strategy.drafter={name: list_proposer}", "--case", "greedy/prompt=plain"
    )
    assert row["reason"].startswith("strategy.drafter:list_proposer: pacer_propose returned list [")
    assert "return a pacer_core.DraftBlock" in row["reason"]


@pytest.mark.parametrize("target, what", [("state", "state.tokens"), ("draft", "the draft's tokens")])
def test_a_stop_writing_into_the_state_or_the_draft_is_a_named_failing_row(capsys, target, what):
    row = failing_row(
        capsys,
        "--plugin",
        BROKEN,
        f"strategy.stop=[{{name: scribble, target: {target}}}]",
        "--case",
        "greedy/prompt=plain",
    )
    assert row["reason"].startswith(f"strategy.stop[0]:scribble: pacer_draft_more changed {what} in place")


def test_a_stop_whose_floor_drifts_across_generations_fails_isolation(capsys):
    """The floor creeps by 1e-9 a generation: no decision changes on the tiny models, the state does."""
    row = failing_row(
        capsys,
        "--plugin",
        BROKEN,
        "strategy.drafter={name: draft_model}",
        "strategy.stop=[{name: drifting}]",
        "--case",
        "isolation/t0.7",
    )
    assert row["failed"] == "isolation/t0.7"
    assert row["reason"].startswith("strategy.stop[0]:drifting starts generation 3 with floor = 0.01")
    assert "reset it in pacer_start" in row["reason"]


def test_isolation_compares_every_hook_decision_with_a_fresh_engine():
    from pacer_bench.check import _same_decisions

    class Watch:
        def names(self, hook):
            return ["strategy.stop[0]:s"]

    want = [("pacer_draft_more", (3,)), ("pacer_propose", ("block", (1, 2, 3))), ("pacer_verify", ("v", 3))]
    _same_decisions(want, list(want), "generation 2's", Watch())
    with pytest.raises(AssertionError, match=r"strategy.stop\[0\]:s: pacer_draft_more decides \(2,\) at step 1"):
        _same_decisions(want + [("pacer_draft_more", (3,))], want + [("pacer_draft_more", (2,))], "x", Watch())
    with pytest.raises(AssertionError, match="makes 2 hook decisions where generation 1 made 3"):
        _same_decisions(want, want[:2], "generation 3's", Watch())


def plugin_file(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text("from pacer_core import hookimpl\n\n" + body)
    return str(path)


@pytest.mark.parametrize(
    "body, needle",
    [
        ("raise SystemExit(0)\n", "raised SystemExit(0) on import at "),
        ("import sys\nsys.exit()\n", "raised SystemExit(None) on import"),
        ("raise RuntimeError('boom')\n", "raised RuntimeError: boom on import"),
        (
            "@hookimpl\ndef pacer_components():\n    return [1, 'x', None]\n",
            "pacer_components returned a list whose item 0 is int 1: every item must be a pacer_core.Component",
        ),
        (
            "@hookimpl\ndef pacer_components():\n    return 'prob_floor'\n",
            "pacer_components returned str 'prob_floor': return a list of pacer_core.Component",
        ),
        ("@hookimpl\ndef pacer_components():\n    raise SystemExit(3)\n", "pacer_components raised SystemExit(3)"),
    ],
    ids=["exit-0", "exit-none", "raises", "list-of-junk", "a-string", "components-exit"],
)
def test_a_broken_plugin_module_fails_the_load_row_and_json_still_prints(capsys, tmp_path, body, needle):
    spec = plugin_file(tmp_path, "broken_module", body)
    code, out, err = run_cli(["check", "--quick", "--json", "--plugin", spec], capsys)
    assert code == 1 and "Traceback" not in out + err
    result = json.loads(out)
    assert not result["passed"] and [c["check"] for c in result["checks"]] == ["load"]
    row = result["checks"][0]
    assert row["failed"] == f"load/plugin={spec}" and needle in row["reason"] and "--case" in row["rerun"]
    code, out, _ = run_cli(["check", "--quick", "--plugin", spec], capsys)  # the table says the same
    assert code == 1 and "load" in out and "FAIL" in out and "rerun: pacer check" in out


def test_an_installed_plugin_offering_a_wrong_list_is_refused_naming_it():
    import types

    from pacer_core import ConfigError, hookimpl, load_config

    for offered, needle in (([1, "x", None], "item 0 is int 1"), ("prob_floor", "returned str 'prob_floor'")):
        module = types.ModuleType("offers_junk")
        module.pacer_components = hookimpl(lambda offered=offered: offered)
        with pytest.raises(ConfigError, match="plugin offers_junk: pacer_components ") as caught:
            load_config(extra_plugins=[module], require_models=False)
        assert needle in str(caught.value)


def test_a_component_list_given_as_a_string_is_refused_not_replaced_by_the_default(capsys):
    for override in ("strategy.stop=fixed", "strategy.stop='[{name: fixed}]'", "strategy.observers=metrics"):
        code, _, err = run_cli(["check", "--quick", override], capsys)
        assert_one_line_error(code, err, "must be a list, got str")


def test_json_prints_a_result_for_a_usage_error_too(capsys):
    code, out, err = run_cli(["check", "--quick", "--json", "strategy.drafter={name: nonesuch}"], capsys)
    assert_one_line_error(code, err, "unknown drafter 'nonesuch'")
    result = json.loads(out)
    assert result["passed"] is False and "unknown drafter 'nonesuch'" in result["error"]


def test_main_never_turns_a_command_s_system_exit_into_success(capsys, monkeypatch):
    from pacer_core import cli
    from pacer_core.commands import COMMANDS

    def setup(parser):
        parser.add_argument("--code", type=int)
        return lambda args: sys.exit(args.code)

    monkeypatch.setitem(COMMANDS, "exits-early", ("a command that calls sys.exit", setup))
    for argv, want in ((["exits-early"], 1), (["exits-early", "--code", "0"], 1), (["exits-early", "--code", "4"], 4)):
        assert cli.main(argv) == want
        err = capsys.readouterr().err
        assert err.startswith("pacer: error: the command stopped early") and len(err.splitlines()) == 1
    assert cli.main(["exits-early", "--help"]) == 0  # argparse's own exits keep their codes


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["strategy.drafter={name: nonesuch}"], ["unknown drafter 'nonesuch'"]),
        (["--plugin", "no_such_module_anywhere"], ["--plugin 'no_such_module_anywhere' does not import"]),
        (["--plugin", "json"], ["--plugin 'json' offers no components"]),
        (["strategy.drafter={name: datastore, corpus: shipped}"], ["cannot build a tiny pair for drafter 'datastore'"]),
        (["--case", "nonesuch/x"], ["--case 'nonesuch/x' names no check"]),
    ],
)
def test_bad_input_is_one_line(capsys, argv, needles):
    code, _, err = run_cli(["check", "--quick", *argv], capsys)
    assert_one_line_error(code, err, *needles)


# -- per-position randomness and sample_match's rule -------------------------------------------------
def test_position_noise_is_a_function_of_seed_and_position():
    assert torch.equal(position_noise(3, 10, 50), position_noise(3, 10, 50))
    assert not torch.equal(position_noise(3, 10, 50), position_noise(3, 11, 50))
    assert not torch.equal(position_noise(3, 10, 50), position_noise(4, 10, 50))


def test_sampling_with_position_noise_draws_the_distribution():
    from pacer_core.testing import chisquare_pvalue

    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    draws = [(int(sample_with_noise(probs, position_noise(0, i, 5))),) for i in range(4000)]
    assert chisquare_pvalue(draws, probs) > 1e-3 and all(d != (4,) for d in draws)


def test_sample_match_keeps_the_draft_while_it_equals_the_target_draw():
    vocab = 6
    noise = torch.stack([position_noise(1, i, vocab) for i in range(4)])  # [depth + 1, vocab]
    probs = torch.softmax(torch.randn(4, vocab, generator=torch.Generator().manual_seed(0)), -1)  # [n + 1, vocab]
    drawn = [int(sample_with_noise(probs[i], noise[i])) for i in range(4)]
    chain = torch.tensor([drawn[0], drawn[1], (drawn[2] + 1) % vocab])
    verdict = sample_match_verify(chain, probs, noise)
    assert (verdict.accepted, verdict.next_token, verdict.next_kind) == (2, drawn[2], "recovered")
    verdict = sample_match_verify(torch.tensor(drawn[:3]), probs, noise)
    assert (verdict.accepted, verdict.next_token, verdict.next_kind) == (3, drawn[3], "bonus")
    # a tree: the root's second child carries the draw; its subtree is followed
    tree = torch.tensor([(drawn[0] + 1) % vocab, drawn[0]])
    rows = torch.stack([probs[0], probs[1], probs[1]])  # row 2 scores after node 1
    verdict = sample_match_verify(tree, rows, noise, parents=torch.tensor([-1, -1]))
    assert verdict.path == (1,) and verdict.next_kind == "bonus"
    assert verdict.next_token == int(sample_with_noise(rows[2], noise[1]))


def test_the_sampling_bench_names_both_verifiers_for_every_stack():
    from pacer_bench.config import read_bench_config

    bench, stacks = read_bench_config(ROOT / "configs" / "bench_sampling.yaml")
    assert bench.sampling.temperature == 1.0 and list(stacks)[0] == "autoregressive"
    names = [name for name in stacks if name != "autoregressive"]
    for name in names:
        verifier = stacks[name].stack.verifier.component.name
        assert name.endswith(f"[{verifier}]")
    bases = {name.rsplit("[", 1)[0] for name in names}
    assert {f"{b}[{v}]" for b in bases for v in ("speculative_sampling", "sample_match")} == set(names)


def test_a_misspelled_hook_is_named_without_blaming_the_tiny_pair(tmp_path, capsys):
    plugin = tmp_path / "typo_stop.py"
    plugin.write_text(
        "import attrs\nfrom pacer_core import Component, hookimpl\n\n\n@attrs.define\nclass Config:\n    pass\n\n\n"
        "class Typo:\n    def __init__(self, config, resources):\n        pass\n\n"
        "    @hookimpl\n    def pacer_draft_mor(self, state, draft):\n        return 1\n\n\n"
        "@hookimpl\ndef pacer_components():\n"
        "    return [Component('stop', 'typo', Config, Typo, 'a misspelled hook')]\n"
    )
    code, _, err = run_cli(["check", "--plugin", str(plugin), "strategy.stop=[{name: typo}]", "--quick"], capsys)
    assert_one_line_error(code, err, "implements unknown hook 'pacer_draft_mor'", "did you mean 'pacer_draft_more'?")
    assert "cannot build a tiny pair" not in err


def _installed(monkeypatch, folder: Path, name: str, body: str):
    """A plugin module ``name`` written to ``folder`` and installed as an entry point of that name (as
    ``pip install -e .`` of a package naming it would); its file."""
    import importlib

    from pacer_core import registry

    folder.mkdir(exist_ok=True)
    path = Path(plugin_file(folder, name, body))
    monkeypatch.syspath_prepend(str(folder))
    module = importlib.import_module(name)
    installed = registry._entry_point_plugins() + ((name, module),)
    monkeypatch.setattr(registry, "_entry_point_plugins", lambda: installed)
    monkeypatch.delitem(sys.modules, name)
    return path


PROB_FLOOR = (
    "import attrs\nfrom pacer_core import Component, Stop\n\n\n@attrs.define\nclass Config:\n"
    "    floor: float = 0.3\n\n\nclass Floor:\n    def __init__(self, config, resources):\n"
    "        self.floor = config.floor\n\n    @hookimpl\n    def pacer_draft_more(self, state, draft):\n"
    "        return None if len(draft.tokens) < 3 else Stop()\n\n\n"
    "@hookimpl\ndef pacer_components():\n    return [Component('stop', 'prob_floor', Config, Floor, 'a floor')]\n"
)


def test_plugin_file_of_an_installed_plugin_is_registered_once(capsys, monkeypatch, tmp_path):
    import importlib.util

    from pacer_core.registry import new_plugin_manager

    path = _installed(monkeypatch, tmp_path, "my_stop_plugin", PROB_FLOOR)
    code, out, err = run_cli(
        ["check", "--plugin", str(path), "strategy.stop=[{name: prob_floor}]", "--case", "load/stack"], capsys
    )
    assert code == 0 and "already registered" not in out + err, out + err
    spec = importlib.util.spec_from_file_location(path.stem, path)
    again = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(again)
    pm = new_plugin_manager([again])  # the installed file imported once more: the installed module stays, once
    assert again not in pm.get_plugins() and pm.get_plugin("my_stop_plugin") is not None


def test_plugin_file_named_as_another_installed_plugin_is_one_line(capsys, monkeypatch, tmp_path):
    _installed(monkeypatch, tmp_path / "installed", "my_stop_plugin", PROB_FLOOR)
    other = plugin_file(tmp_path, "my_stop_plugin", PROB_FLOOR.replace("prob_floor", "prob_floor2"))
    code, _, err = run_cli(["check", "--plugin", other, "--case", "load/stack"], capsys)
    assert_one_line_error(code, err, "'my_stop_plugin'", "installed", "rename")
