"""Configs: shipped YAML validates, omitted keys keep defaults, overrides reach list items, and
bad input fails early with a one-line message naming the problem and the fix (no model loads)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from pacer_bench.config import is_bench_config
from pacer_core import Component, ConfigError, PacerConfig, hookimpl, load_config
from pacer_core.config import check, draft_model_config
from pacer_core.registry import components, new_plugin_manager

from helpers import error_of

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHIPPED = sorted(p for p in CONFIGS.glob("*.yaml") if not is_bench_config(p))  # bench/ablate: test_bench.py


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def resolved(cfg: PacerConfig) -> list[tuple[str, str, object]]:
    return [(r.where, r.component.name, r.config) for r in check(cfg, require_models=False)]


# -- shipped configs ---------------------------------------------------------------------------
def test_the_shipped_configs_are_there():
    names = {p.name for p in SHIPPED}
    assert {"default.yaml", "autoregressive.yaml", "prompt_lookup_fixed.yaml",
            "prompt_lookup_heuristic.yaml", "sampling.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_validates_and_says_what_it_does(path: Path):
    cfg = load_config(path)  # require_models=True: the embedded target's shipped draft fills an omitted draft
    drafter = check(cfg).drafter.component
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
        default.target, default.draft, default.sampling, default.generation)


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
    cfg = load_config(overrides=["sampling.temperature=0.8", "generation.ignore_eos=true",
                                 "strategy.stop=[{name: fixed, gamma: 3}]",
                                 "strategy.drafter.max_ngram_size=5", "draft.path=/some/draft"])
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


@pytest.mark.parametrize("text, key, value, expected", [
    ("strategy:\n  stop:\n    - {name: fixed, gamma: abc}\n", "gamma", "abc", "int"),
    ("sampling: {temperature: hot}\n", "temperature", "hot", "float"),
])
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
    resolved = check(cfg)
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
        return [Component("stop", "needs_probs_stop", _ProbsStopConfig, lambda c, r: object(),
                          "test stop", needs={"draft_probs"})]


def test_a_stop_needing_draft_probabilities_refuses_a_model_free_drafter():
    plugin = _ProbsStopPlugin()
    stop = ["strategy.stop=[{name: needs_probs_stop}]"]
    message = error_of(overrides=stop, extra_plugins=[plugin])
    assert "needs_probs_stop" in message and "prompt_lookup" in message and "draft_model" in message
    # with a model drafter it is fine
    assert load_config(overrides=stop + ["strategy.drafter.name=draft_model", "draft.path=/d"],
                       extra_plugins=[plugin])


# -- the resolved stack and capabilities ---------------------------------------------------------
def test_check_returns_a_typed_stack_in_registration_order():
    stack = check(load_config(overrides=["strategy.stop=[{name: fixed}, {name: heuristic}]"]))
    assert stack.drafter.component.name == "prompt_lookup" and stack.verifier.where == "strategy.verifier"
    assert [s.component.name for s in stack.stops] == ["fixed", "heuristic"]
    assert [r.where for r in stack] == ["strategy.drafter", "strategy.verifier", "strategy.stop[0]",
                                        "strategy.stop[1]", "strategy.observers[0]"]
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

    cfg = load_config(overrides=["strategy.stop=[{name: misspelled}]"], extra_plugins=[_MisspelledPlugin()],
                      require_models=False)
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
    monkeypatch.setattr("pacer_core.engine.new_plugin_manager", lambda *a, **k: made.append(1) or real(*a, **k))
    monkeypatch.setattr("pacer_core.config.new_plugin_manager", lambda *a, **k: made.append(1) or real(*a, **k))
    Engine.build(ScriptedLM(vocab_size=8), cfg=cfg)
    assert len(made) == 1
