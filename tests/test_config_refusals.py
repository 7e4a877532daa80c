"""Configs that used to hang, or silently mean something else, are refused in one line: YAML alias
bombs (before they are expanded), duplicate keys, negative override indices and NaN/infinite
numbers. Each case through ``load_config`` (and the other readers) and through the command line:
exit 2, exactly one stderr line, no traceback."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List

import attrs
import pytest

from pacer_bench.config import read_bench_config
from pacer_core import ConfigError, cli, load_config
from pacer_core.schema import MAX_YAML_NODES, load_schema, parse_value

from helpers import error_of


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """``levels`` lists of ``width`` aliases of the previous one: width ** levels leaves."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\nstrategy:\n  stop: *a{levels - 1}\n"


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def no_engine(plan):  # a config that should have been refused must not load any model
    raise AssertionError("the config was accepted")


def cli_error(argv, capsys, monkeypatch) -> str:
    monkeypatch.setattr(cli, "build_engine", no_engine)
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pacer: error: "), err
    return lines[0]


# -- alias bombs -------------------------------------------------------------------------------
def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    path = write(tmp_path, alias_bomb())
    start = time.perf_counter()
    message = error_of(path)
    assert time.perf_counter() - start < 5  # expanded, 9 ** 9 nodes would take minutes and gigabytes
    assert "run.yaml" in message and f"more than {MAX_YAML_NODES} nodes" in message and "alias" in message


def test_shared_aliases_within_the_bound_still_load(tmp_path):
    text = (
        "base: &stop {name: fixed, gamma: 3}\n"  # a real use: one entry reused
        "strategy:\n  stop: [*stop]\n"
    )
    message = error_of(write(tmp_path, text))
    assert "unknown config section 'base'" in message  # read fine; only the extra section is wrong
    path = write(tmp_path, "sampling: &s {temperature: 0.5}\n", "ok.yaml")
    assert load_config(path).sampling.temperature == 0.5
    small = alias_bomb(levels=3, width=3)  # 27 leaves: nothing absurd
    assert "unknown config section 'a0'" in error_of(write(tmp_path, small, "small.yaml"))


def test_a_recursive_alias_is_refused(tmp_path):
    message = error_of(write(tmp_path, "strategy:\n  stop: &loop [*loop]\n"))
    assert "recursive alias" in message and "line 2" in message


def test_an_alias_bomb_in_an_override_value_is_refused():
    value = (
        "{a: &a [x, x, x, x, x, x, x, x, x, x], "
        + ", ".join(f"b{i}: &b{i} [" + ", ".join([f"*{'a' if i == 0 else f'b{i - 1}'}"] * 10) + "]" for i in range(6))
        + "}"
    )
    message = error_of(overrides=[f"strategy.stop={value}"])
    assert "override 'strategy.stop=" in message and "more than" in message


def test_every_yaml_reader_refuses_an_alias_bomb(tmp_path):
    bomb = write(tmp_path, alias_bomb())

    with pytest.raises(ConfigError, match="more than"):
        load_schema(Inner, bomb, [], "toy config")  # the training commands' reader
    with pytest.raises(ConfigError, match="more than"):
        read_bench_config(bomb)
    stack = write(tmp_path, f"stacks:\n  a: {{config: '{bomb}'}}\n", "bench.yaml")
    with pytest.raises(ConfigError, match="more than"):
        read_bench_config(stack)


@pytest.mark.parametrize("command", ["validate", "generate", "bench"])
def test_the_commands_refuse_an_alias_bomb_in_one_line(tmp_path, capsys, monkeypatch, command):
    bomb = str(write(tmp_path, alias_bomb()))
    argv = {
        "validate": ["validate", bomb],
        "generate": ["generate", "-c", bomb, "-p", "hello"],
        "bench": ["bench", "--config", bomb, "--out", str(tmp_path / "out")],
    }[command]
    line = cli_error(argv, capsys, monkeypatch)
    assert "more than" in line and "run.yaml" in line
    assert not (tmp_path / "out").exists()


# -- duplicate keys ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, key, line",
    [
        ("sampling:\n  temperature: 0.5\n  temperature: 0.7\n", "temperature", 3),
        ("sampling: {seed: 1}\ngeneration: {}\nsampling: {seed: 2}\n", "sampling", 3),
        ("strategy:\n  stop:\n    - {name: fixed, gamma: 3, gamma: 5}\n", "gamma", 3),
    ],
)
def test_a_duplicate_key_is_refused_naming_the_key_and_line(tmp_path, text, key, line):
    message = error_of(write(tmp_path, text))
    assert f"duplicate key '{key}'" in message and f"line {line}," in message and "run.yaml" in message


def test_merge_keys_may_be_overridden_beside_them(tmp_path):
    text = "sampling:\n  <<: {temperature: 0.5, top_k: 3}\n  temperature: 0.7\n"
    cfg = load_config(write(tmp_path, text))
    assert (cfg.sampling.temperature, cfg.sampling.top_k) == (0.7, 3)  # YAML's rule, not a duplicate


def test_a_duplicate_key_in_an_override_value_is_refused():
    message = error_of(overrides=["strategy.stop=[{name: fixed, gamma: 3, gamma: 5}]"])
    assert "duplicate key 'gamma'" in message and "override 'strategy.stop=" in message
    assert parse_value("{a: 1, b: 2}") == {"a": 1, "b": 2}
    assert parse_value("[unclosed") == "[unclosed"  # not YAML: plain text, as before


def test_the_commands_refuse_a_duplicate_key_in_one_line(tmp_path, capsys, monkeypatch):
    path = str(write(tmp_path, "generation:\n  max_new_tokens: 8\n  max_new_tokens: 9\n"))
    for argv in (["validate", path], ["generate", "-c", path, "-p", "hi"]):
        line = cli_error(argv, capsys, monkeypatch)
        assert "duplicate key 'max_new_tokens'" in line and "line 3" in line


# -- negative override indices -----------------------------------------------------------------
@pytest.mark.parametrize(
    "override", ["strategy.stop.-1.gamma=3", "strategy.stop[-1].gamma=3", "strategy.observers.-2={name: metrics}"]
)
def test_a_negative_override_index_is_refused(override):
    message = error_of(overrides=["strategy.stop=[{name: fixed}, {name: heuristic}]", override])
    assert f"override '{override}'" in message and "negative" in message and "from 0" in message


def test_the_command_refuses_a_negative_override_index(capsys, monkeypatch):
    line = cli_error(["generate", "-p", "hi", "strategy.stop.-1.gamma=3"], capsys, monkeypatch)
    assert "strategy.stop.-1.gamma=3" in line and "negative" in line


# -- NaN and infinity --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, where, key",
    [
        ("sampling.temperature=.nan", "sampling", "temperature"),
        ("sampling.temperature=.inf", "sampling", "temperature"),
        ("sampling.temperature=nan", "sampling", "temperature"),  # text OmegaConf reads as a float
        ("sampling.top_p=.nan", "sampling", "top_p"),
        ("sampling.temperature=-.inf", "sampling", "temperature"),
    ],
)
def test_non_finite_run_config_numbers_are_refused(override, where, key):
    message = error_of(overrides=[override])
    assert message.startswith(f"{where}: '{key}' must be a finite number")


@pytest.mark.parametrize(
    "entry, where, key",
    [
        ("{name: entropy, gamma: .inf}", "strategy.stop[0] (entropy)", "gamma"),
        ("{name: entropy, threshold: .nan}", "strategy.stop[0] (entropy)", "threshold"),
        ("{name: confidence, fn_cost: .inf}", "strategy.stop[0] (confidence)", "fn_cost"),
        ("{name: svip, threshold: .inf}", "strategy.stop[0] (svip)", "threshold"),
        ("{name: pacer, rho: .inf}", "strategy.stop[0] (pacer)", "rho"),
    ],
)
def test_non_finite_plugin_options_are_refused(entry, where, key):
    message = error_of(
        overrides=["strategy.drafter={name: draft_model}", f"strategy.stop=[{entry}]"], require_models=False
    )
    assert message.startswith(f"{where}: '{key}' must be a finite number"), message


@attrs.define
class Inner:
    rate: float = 0.1


@attrs.define
class Outer:  # a training-like config with nested options
    inner: Inner = attrs.field(factory=Inner)
    weights: List[float] = attrs.field(factory=lambda: [1.0, 2.0])
    table: Dict[str, Any] = attrs.field(factory=dict)


def test_non_finite_numbers_are_found_in_nested_options():
    assert load_schema(Outer, None, [], "toy").inner.rate == 0.1
    for override, key in [
        ("inner.rate=.inf", "inner.rate"),
        ("weights=[1.0, .nan]", "weights.1"),
        ("table={a: {b: .inf}}", "table.a.b"),
    ]:
        with pytest.raises(ConfigError, match=rf"^toy: '{key}' must be a finite number"):
            load_schema(Outer, None, [override], "toy")


def test_a_config_built_in_python_is_checked_too():
    from pacer_core import Engine, PacerConfig
    from pacer_core.config import SamplingConfig, plan_run

    cfg = PacerConfig(sampling=SamplingConfig(temperature=float("nan")))
    with pytest.raises(ConfigError, match="'temperature' must be a finite number"):
        plan_run(cfg, require_models=False)
    with pytest.raises(ConfigError, match="finite"):
        Engine.build(object(), cfg=cfg)  # refused before the model is touched


@pytest.mark.parametrize("command", ["validate", "generate", "bench"])
def test_the_commands_refuse_non_finite_numbers_in_one_line(tmp_path, capsys, monkeypatch, command):
    path = str(write(tmp_path, "sampling:\n  temperature: .nan\n"))
    argv = {
        "validate": ["validate", path],
        "generate": ["generate", "-c", path, "-p", "hi"],
        "bench": ["bench", "--config", path, "--out", str(tmp_path / "out")],
    }[command]
    line = cli_error(argv, capsys, monkeypatch)
    assert "temperature' must be a finite number, got nan" in line
    line = cli_error(["generate", "-p", "hi", "sampling.temperature=.inf"], capsys, monkeypatch)
    assert "'temperature' must be a finite number, got inf" in line


def test_a_config_file_that_is_not_utf8_is_one_line_through_the_cli(tmp_path, capsys):
    from pacer_core.cli import main

    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("sampling: {seed: 1}  # caf\xe9\n".encode("latin1"))
    code = main(["validate", str(bad)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not UTF-8" in err[0] and "Traceback" not in err[0]


def test_a_config_file_holding_a_list_names_what_it_holds(tmp_path):
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping of sections, not a list"):
        load_config(listed)


def test_bench_only_options_refuse_non_finite_numbers_and_negative_indices(tmp_path):
    bench = tmp_path / "bench.yaml"
    bench.write_text("stacks:\n  a: {strategy: {drafter: {name: prompt_lookup}}}\n")
    with pytest.raises(ConfigError, match="finite"):
        read_bench_config(bench, ["baseline_options.confidence_threshold=.nan"])
    with pytest.raises(ConfigError, match="index -1 is negative"):
        read_bench_config(bench, ["prompt_sets.-1=x"])


@attrs.define
class Student:
    kind: str = attrs.field(default="feature", validator=attrs.validators.in_(["feature", "token"]))


@attrs.define
class Recipe:
    student: Student = attrs.field(factory=Student)


def test_a_value_an_attrs_validator_refuses_is_named_in_one_readable_line(tmp_path, capsys):
    """attrs' validators raise with the attribute, the options and the value as extra arguments; the
    refusal shows only their message (``pacer distill student.kind=bogus`` printed the whole tuple)."""
    with pytest.raises(ConfigError) as refused:
        load_schema(Recipe, None, ["student.kind=bogus"], where="distill config")
    message = str(refused.value)
    assert "'kind' must be in ['feature', 'token'] (got 'bogus')" in message
    assert "Attribute(" not in message and "\n" not in message
    code = cli.main(["distill", f"out={tmp_path / 'run'}", "student.kind=bogus"])
    err = capsys.readouterr().err
    assert code == 2 and "(got 'bogus')" in err and "Attribute(" not in err and len(err.strip().splitlines()) == 1
