"""Configs: shipped YAML validates, omitted keys keep defaults, overrides reach list items, and
bad input fails early with a one-line message naming the problem and the fix (no model loads)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest
import yaml

from pacer_bench.config import is_bench_config
from pacer_core import Component, ConfigError, PacerConfig, hookimpl, load_config
from pacer_core.config import draft_model_config, load_plan, plan_run
from pacer_core.registry import components, new_plugin_manager

from helpers import error_of

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHIPPED = sorted(p for p in CONFIGS.glob("*.yaml") if not is_bench_config(p))  # bench/ablate: test_bench_config.py


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def resolved(cfg: PacerConfig) -> list[tuple[str, str, object]]:
    return [(r.where, r.component.name, r.config) for r in plan_run(cfg, require_models=False).stack]


# -- shipped configs ---------------------------------------------------------------------------
def test_the_shipped_configs_are_there():
    names = {p.name for p in SHIPPED}
    assert {
        "default.yaml",
        "autoregressive.yaml",
        "prompt_lookup_fixed.yaml",
        "prompt_lookup_heuristic.yaml",
        "sampling.yaml",
    } <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_validates_and_says_what_it_does(path: Path):
    cfg = load_config(path)  # require_models=True: the embedded target's shipped draft fills an omitted draft
    drafter = plan_run(cfg).stack.drafter.component
    if "draft_model" in drafter.needs and cfg.draft is None:
        assert Path(draft_model_config(cfg, drafter).path).is_dir(), "the shipped draft is missing"
    assert isinstance(cfg, PacerConfig)
    assert path.read_text().startswith("#"), f"{path.name} needs a comment header saying what it does"


def test_default_yaml_is_the_builtin_default():
    assert resolved(load_config(CONFIGS / "default.yaml")) == resolved(load_config())
    assert load_config(CONFIGS / "default.yaml").target == load_config().target


def test_shipped_configs_select_what_their_names_say():
    fixed = load_config(CONFIGS / "prompt_lookup_fixed.yaml")
    assert fixed.strategy.drafter["name"] == "prompt_lookup"
    assert [(s["name"], s["gamma"]) for s in fixed.strategy.stop] == [("fixed", 4)]
    assert load_config(CONFIGS / "prompt_lookup_heuristic.yaml").strategy.stop[0]["name"] == "heuristic"
    assert load_config(CONFIGS / "autoregressive.yaml").strategy.drafter["name"] == "autoregressive"
    sampling = load_config(CONFIGS / "sampling.yaml").sampling
    assert (sampling.temperature, sampling.top_p) == (0.7, 0.9)


# -- defaults and overrides --------------------------------------------------------------------
def test_keys_a_yaml_omits_keep_their_defaults(tmp_path):
    cfg = load_config(write(tmp_path, "strategy:\n  stop:\n    - {name: fixed, gamma: 6}\n"))
    default = PacerConfig()
    assert cfg.strategy.stop == [{"name": "fixed", "gamma": 6}]
    assert cfg.strategy.drafter == default.strategy.drafter
    assert cfg.strategy.verifier == default.strategy.verifier
    assert cfg.strategy.observers == default.strategy.observers
    assert (cfg.target, cfg.draft, cfg.sampling, cfg.generation) == (
        default.target,
        default.draft,
        default.sampling,
        default.generation,
    )


def test_an_empty_yaml_is_the_default(tmp_path):
    assert load_config(write(tmp_path, "# nothing set\n")) == PacerConfig()


@pytest.mark.parametrize("key", ["strategy.stop.0.gamma", "strategy.stop[0].gamma"])
def test_overrides_reach_list_items_of_the_default(key):
    cfg = load_config(overrides=[f"{key}=7"])
    assert cfg.strategy.stop == [{"name": "heuristic", "gamma": 7}]


@pytest.mark.parametrize("key", ["strategy.stop.1.gamma", "strategy.stop[1].gamma"])
def test_overrides_reach_list_items_of_the_yaml(tmp_path, key):
    path = write(tmp_path, "strategy:\n  stop:\n    - {name: heuristic}\n    - {name: fixed, gamma: 3}\n")
    cfg = load_config(path, [f"{key}=9"])
    assert cfg.strategy.stop == [{"name": "heuristic"}, {"name": "fixed", "gamma": 9}]


def test_overrides_of_scalars_lists_and_new_sections():
    cfg = load_config(
        overrides=[
            "sampling.temperature=0.8",
            "generation.ignore_eos=true",
            "strategy.stop=[{name: fixed, gamma: 3}]",
            "strategy.drafter.max_ngram_size=5",
            "draft.path=/some/draft",
        ]
    )
    assert cfg.sampling.temperature == 0.8 and cfg.generation.ignore_eos is True
    assert cfg.strategy.stop == [{"name": "fixed", "gamma": 3}]
    assert cfg.strategy.drafter == {"name": "prompt_lookup", "max_ngram_size": 5}
    assert cfg.draft is not None and cfg.draft.path == "/some/draft" and cfg.draft.dtype == "float32"


def test_strategy_entries_in_yaml_carry_options_and_replace_the_default_whole(tmp_path):
    cfg = load_config(write(tmp_path, "strategy:\n  drafter: {name: prompt_lookup, max_ngram_size: 5}\n"))
    assert cfg.strategy.drafter == {"name": "prompt_lookup", "max_ngram_size": 5}
    cfg = load_config(write(tmp_path, "strategy:\n  drafter: {name: autoregressive}\n"))
    assert cfg.strategy.drafter == {"name": "autoregressive"}


def test_later_overrides_win():
    cfg = load_config(overrides=["sampling.seed=1", "sampling.seed=5"])
    assert cfg.sampling.seed == 5


# -- bad input: one line naming the problem and the fix -----------------------------------------
def test_malformed_yaml_names_the_line(tmp_path):
    message = error_of(write(tmp_path, "sampling:\n  temperature: 0.5\nstrategy: {stop: [\n"))
    assert "malformed YAML" in message and "line 4" in message and "run.yaml" in message


def test_a_yaml_that_is_not_a_mapping(tmp_path):
    assert "must hold a mapping" in error_of(write(tmp_path, "- a\n- b\n"))


def test_unknown_section_lists_the_valid_ones(tmp_path):
    message = error_of(write(tmp_path, "strategies:\n  drafter: {name: prompt_lookup}\n"))
    assert "'strategies'" in message and "valid sections: target, draft, sampling, generation, strategy" in message


def test_unknown_plugin_lists_the_available_ones():
    message = error_of(overrides=["strategy.drafter.name=ngram"])
    assert "unknown drafter 'ngram'" in message
    assert all(name in message for name in ("autoregressive", "draft_model", "prompt_lookup"))


def test_unknown_plugin_option_lists_the_valid_options(tmp_path):
    message = error_of(write(tmp_path, "strategy:\n  stop:\n    - {name: heuristic, gama: 3}\n"))
    assert "unknown option 'gama'" in message and "valid options: gamma, max_gamma, transient" in message


def test_unknown_section_option_lists_the_valid_options():
    message = error_of(overrides=["sampling.temp=0.5"])
    assert "'temp'" in message and "temperature" in message and "top_p" in message


@pytest.mark.parametrize(
    "text, key, value, expected",
    [
        ("strategy:\n  stop:\n    - {name: fixed, gamma: abc}\n", "gamma", "abc", "int"),
        ("sampling: {temperature: hot}\n", "temperature", "hot", "float"),
    ],
)
def test_wrong_type_names_the_key_and_the_expected_type(tmp_path, text, key, value, expected):
    message = error_of(write(tmp_path, text))
    assert f"'{key}'" in message and value in message and f"type {expected}" in message


def test_out_of_range_values():
    assert "must be >= 0" in error_of(overrides=["strategy.stop=[{name: fixed, gamma: -1}]"])
    assert "max_new_tokens must be positive" in error_of(overrides=["generation.max_new_tokens=0"])
    assert "top_p" in error_of(overrides=["sampling.top_p=0"])
    assert "unknown dtype" in error_of(overrides=["target.dtype=float8"])


def test_bad_overrides():
    assert "not key=value" in error_of(overrides=["sampling.temperature"])
    assert "strategy.stop.3.gamma=1" in error_of(overrides=["strategy.stop.3.gamma=1"])


def test_overrides_that_are_not_a_list_of_strings():
    from pacer_core.schema import load_schema

    for call in (lambda o: load_config(overrides=o), lambda o: load_schema(PacerConfig, None, o, "run")):
        with pytest.raises(ConfigError, match=r"got a single str 'sampling.seed=3': pass \['sampling.seed=3'\]"):
            call("sampling.seed=3")  # was read one character at a time
        with pytest.raises(ConfigError, match="item 0 is int 5"):
            call([5])
        with pytest.raises(ConfigError, match="got int"):
            call(5)


def test_seeds_outside_64_bits_are_refused():
    assert "sampling.seed must lie in [-2**63, 2**64 - 1]" in error_of(overrides=[f"sampling.seed={2**64}"])
    assert load_config(overrides=[f"sampling.seed={2**64 - 1}"]).sampling.seed == 2**64 - 1


def test_missing_config_file(tmp_path):
    message = error_of(tmp_path / "nope.yaml")
    assert "nope.yaml" in message and "does not exist" in message


def test_greedy_only_verifier_refuses_sampling():
    message = error_of(overrides=["sampling.temperature=0.7", "strategy.verifier.name=greedy"])
    assert "'greedy' supports greedy decoding only" in message and "temperature=0" in message


def test_draft_model_needs_draft_path():
    message = error_of(overrides=["strategy.drafter.name=draft_model", "target.path=/my/target"])
    assert "needs a draft model" in message and "draft.path" in message
    # the embedded target comes with a shipped draft, in the target's dtype
    cfg = load_config(overrides=["strategy.drafter.name=draft_model", "target.dtype=bfloat16"])
    resolved = plan_run(cfg).stack
    draft = draft_model_config(cfg, resolved.drafter.component)
    assert draft.path.endswith("default") and draft.dtype == "bfloat16"
    assert draft_model_config(cfg, components(new_plugin_manager())["drafter"]["prompt_lookup"]) is None
    # in-memory engines pass their draft model directly
    assert load_config(overrides=["strategy.drafter.name=draft_model"], require_models=False)


@attrs.define
class _ProbsStopConfig:
    threshold: float = 0.5


class _ProbsStopPlugin:
    """A stop reading the draft's probabilities, offered as an extra plugin."""

    @hookimpl
    def pacer_components(self):
        return [
            Component(
                "stop", "needs_probs_stop", _ProbsStopConfig, lambda c, r: object(), "test stop", needs={"draft_probs"}
            )
        ]


def test_a_stop_needing_draft_probabilities_refuses_a_model_free_drafter():
    plugin = _ProbsStopPlugin()
    stop = ["strategy.stop=[{name: needs_probs_stop}]"]
    message = error_of(overrides=stop, extra_plugins=[plugin])
    assert "needs_probs_stop" in message and "prompt_lookup" in message and "draft_model" in message
    # with a model drafter it is fine
    assert load_config(overrides=stop + ["strategy.drafter.name=draft_model", "draft.path=/d"], extra_plugins=[plugin])


# -- the resolved stack and capabilities ---------------------------------------------------------
def test_the_plan_holds_a_typed_stack_in_registration_order():
    stack = load_plan(overrides=["strategy.stop=[{name: fixed}, {name: heuristic}]"]).stack
    assert stack.drafter.component.name == "prompt_lookup" and stack.verifier.where == "strategy.verifier"
    assert [s.component.name for s in stack.stops] == ["fixed", "heuristic"]
    assert [r.where for r in stack] == [
        "strategy.drafter",
        "strategy.verifier",
        "strategy.stop[0]",
        "strategy.stop[1]",
        "strategy.observers[0]",
    ]
    assert not stack.needs("draft_model") and stack.needs("draft_model") is False


class _UnknownNeedPlugin:
    @hookimpl
    def pacer_components(self):
        return [Component("stop", "typo_stop", _ProbsStopConfig, lambda c, r: object(), needs={"draft_prob"})]


def test_a_component_needing_an_unknown_capability_is_refused_in_one_line():
    message = error_of(extra_plugins=[_UnknownNeedPlugin()])
    assert "typo_stop" in message and "'draft_prob'" in message and "draft_probs" in message
    assert "\n" not in message


class _MisspelledStop:
    """A strategy object whose hook name has a typo: it would never be called."""

    @hookimpl
    def pacer_draft_mor(self, state, draft):  # noqa: D102 - deliberately misspelled
        return None


class _MisspelledPlugin:
    @hookimpl
    def pacer_components(self):
        return [Component("stop", "misspelled", _ProbsStopConfig, lambda c, r: _MisspelledStop())]


def test_a_misspelled_hook_on_a_strategy_object_is_a_one_line_error():
    from pacer_core import Engine
    from pacer_core.testing import ScriptedLM

    cfg = load_config(
        overrides=["strategy.stop=[{name: misspelled}]"], extra_plugins=[_MisspelledPlugin()], require_models=False
    )
    with pytest.raises(ConfigError) as caught:
        Engine.build(ScriptedLM(vocab_size=8), cfg=cfg, extra_plugins=[_MisspelledPlugin()])
    message = str(caught.value)
    assert "'pacer_draft_mor'" in message and "did you mean 'pacer_draft_more'" in message
    assert "strategy.stop[0]:misspelled" in message and "\n" not in message


def test_one_plugin_manager_per_engine_build(monkeypatch):
    from pacer_core import Engine, registry
    from pacer_core.testing import ScriptedLM

    cfg = load_config(require_models=False)
    made = []
    real = registry.new_plugin_manager
    monkeypatch.setattr("pacer_core.config.new_plugin_manager", lambda *a, **k: made.append(1) or real(*a, **k))
    Engine.build(ScriptedLM(vocab_size=8), cfg=cfg)
    assert len(made) == 1


# -- PACER's settings: one documented default, every shipped difference explained ----------------------
def _pacer_table() -> dict[str, tuple[str, str]]:
    """docs/pacer.md's "Which settings are PACER's" table: each file named in its first cell → (b, t0)."""
    text = (CONFIGS.parent / "docs" / "pacer.md").read_text()
    start = text.index("### Which settings are PACER's")
    section = text[start : text.index("\n## ", start)]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 4 and not set(cells[1]) <= set("-"):
            for name in re.findall(r"`(configs/[\w.*]+\.yaml|plugins/pacer_stop/policy\.py)`", cells[0]):
                rows.setdefault(name, (cells[1], cells[2]))
    return rows


def _pacer_stops(path: Path) -> list[dict]:
    cfg = load_config(path, require_models=False)
    return [s for s in cfg.strategy.stop if s.get("name") == "pacer" and s.get("rule", "paper") == "paper"]


def test_pacers_settings_are_one_default_and_each_shipped_difference_is_documented():
    from pacer_bench.demo import DEMO_STACKS
    from pacer_plugins.pacer_stop.policy import PacerStopConfig

    table = _pacer_table()
    default = PacerStopConfig()
    assert table["plugins/pacer_stop/policy.py"] == (str(default.b), str(default.t0)) == ("2", "0.8")
    config_md = (CONFIGS.parent / "docs" / "config.md").read_text()
    assert f"| `b` | int | `{default.b}` |" in config_md and f"| `t0` | float | `{default.t0}` |" in config_md
    named = 0
    for path in SHIPPED:
        for stop in _pacer_stops(path):
            named += 1
            key = f"configs/{path.name}"
            assert key in table, f"{key} runs the pacer stop but docs/pacer.md's settings table does not list it"
            b, t0 = stop.get("b", default.b), stop.get("t0", default.t0)
            assert table[key] == (str(b), str(t0)), f"{key}: b {b}, t0 {t0}; docs/pacer.md says {table[key]}"
            assert "docs/pacer.md#which-settings-are-pacers" in path.read_text(), f"{key} does not say why its settings"
    assert named >= 3
    shipped = load_config(CONFIGS / "pacer.yaml", require_models=False).strategy.stop[0]
    demo = load_config(overrides=DEMO_STACKS["draft(eagle)+pacer"], require_models=False).strategy.stop[0]
    assert (demo["b"], demo["t0"]) == (shipped["b"], shipped["t0"])  # the demo's PACER is the shipped stack's


# -- commented examples in the shipped files run as written ---------------------------------------------
_TOP = re.compile(r"^(stack|grid|labels|strategy|sampling|generation|target|draft|bench|overrides):")


def commented_yaml_blocks(text: str) -> list[dict]:
    """Mappings written in comments: from a comment line `# KEY:` (a config or grid section at the
    comment's left margin) through the comment lines indented under it or starting another section;
    prose that happens to start with such a word (`# target: distill a draft ...`) is no mapping."""
    body = [line[2:] if line.startswith("# ") else None for line in text.splitlines()]
    blocks, i = [], 0
    while i < len(body):
        if body[i] is not None and _TOP.match(body[i]):
            j = i + 1
            while j < len(body) and body[j] is not None and (body[j].startswith(" ") or _TOP.match(body[j])):
                j += 1
            blocks.append(yaml.safe_load("\n".join(body[i:j])))
            i = j
        else:
            i += 1
    return [b for b in blocks if isinstance(b, dict) and all(isinstance(v, (dict, list)) for v in b.values())]


def test_the_commented_examples_in_shipped_configs_validate(tmp_path):
    from pacer_bench.config import read_ablate_config

    checked = 0
    for path in sorted(CONFIGS.glob("*.yaml")):
        text = path.read_text()
        live = yaml.safe_load(text)
        for block in commented_yaml_blocks(text):
            if {"stack", "grid"} & set(block):  # a grid written in comments: in place of the file's own
                data = {**live, **block}
                data["bench"] = str(CONFIGS / data["bench"]) if data.get("bench") else None
                config = (data.get("stack") or {}).get("config")
                if config:
                    data["stack"]["config"] = str(CONFIGS / config)
                grid = tmp_path / f"{path.stem}-{checked}.yaml"
                grid.write_text(yaml.safe_dump(data))
                read_ablate_config(grid)
            elif set(block) <= {f.name for f in attrs.fields(PacerConfig)} and not is_bench_config(path):
                load_config(overrides=[f"{k}={json.dumps(v)}" for k, v in block.items()], require_models=False)
            else:
                continue
            checked += 1
        if not is_bench_config(path):  # `strategy.…=value` overrides in the comments of a run config
            comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
            for override in re.findall(r"\b(strategy\.[\w.]+=[^\s,()]+)", comments):
                load_config(path, overrides=[override.strip("'\"")], require_models=False)
                checked += 1
    assert checked >= 4  # ablate.yaml's PACER grid, pacer.yaml's three ablation overrides


def test_a_commented_grid_naming_an_option_that_does_not_exist_is_caught(tmp_path):
    from pacer_bench.config import read_ablate_config

    text = "# stack:\n#   config: pacer.yaml\n# grid:\n#   strategy.stop.0.block_size: [2, 4]\n"
    (block,) = commented_yaml_blocks(text)
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({**block, "stack": {"config": str(CONFIGS / "pacer.yaml")}}))
    with pytest.raises(ConfigError, match="block_size"):
        read_ablate_config(grid)
