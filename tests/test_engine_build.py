"""How an engine is built: from a run plan, the strategy stack resolved once on its one plugin manager, and
the drafter's side channel (``DraftInfo``) read from what the drafter declares, nowhere else.

A probe plugin offers a drafter that declares a ``DraftInfo`` (or, to show it is ignored, sets the
same three things as plain attributes) and a stop that records the ``Resources`` it was built with.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import attrs
import pytest

import pacer_core.hf
from pacer_core import Component, DraftInfo, Engine, GenerationResult, InputError, cli, config, hookimpl, load_plan
from pacer_core.testing import ScriptedLM

from helpers import adapter, tiny_llama


@attrs.define
class ProbeDrafterConfig:
    identity: Optional[str] = None
    thresholds: Dict[str, float] = attrs.field(factory=dict)
    layers: Optional[List[int]] = None
    declared: bool = True  # False: the same values as undeclared attributes, which nothing reads


class ProbeDrafter:
    def __init__(self, config: ProbeDrafterConfig, resources):
        info = DraftInfo(identity=config.identity, stop_thresholds=config.thresholds, target_layers=config.layers)
        if config.declared:
            self.draft_info = info
        else:  # what drafters used to hand on through getattr
            self.draft_identity, self.stop_thresholds, self.target_layers = (
                info.identity,
                dict(info.stop_thresholds),
                info.target_layers,
            )

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens):
        return None


@attrs.define
class RecorderConfig:
    pass


class Recorder:
    built: list = []  # the Resources of every Recorder built

    def __init__(self, config: RecorderConfig, resources):
        Recorder.built.append(resources)

    @hookimpl
    def pacer_draft_more(self, state, draft):
        return None


class ProbePlugin:
    @hookimpl
    def pacer_components(self):
        return [
            Component(
                "drafter", "probe", ProbeDrafterConfig, ProbeDrafter, needs={"target_hidden"}, provides={"draft_probs"}
            ),
            Component("stop", "recorder", RecorderConfig, Recorder),
        ]


PROBE = ProbePlugin()


def probe_engine(drafter: str, target=None, draft=None) -> tuple[Engine, object]:
    """An engine of ``drafter`` with the recorder stop; returns it and the recorder's Resources."""
    Recorder.built.clear()
    plan = load_plan(
        overrides=[f"strategy.drafter={drafter}", "strategy.stop=[{name: recorder}]"],
        extra_plugins=[PROBE],
        require_models=False,
    )
    engine = Engine.build(target or ScriptedLM(16), draft=draft, plan=plan)
    (resources,) = Recorder.built
    return engine, resources


# -- the side channel ---------------------------------------------------------------------------
def test_a_declared_draft_info_reaches_the_stops_and_the_target_pass():
    engine, resources = probe_engine("{name: probe, identity: mine, thresholds: {entropy: 0.7}, layers: [0, 1]}")
    assert resources.draft_identity == "mine" and resources.stop_thresholds == {"entropy": 0.7}
    assert engine.target_hidden == (0, 1)


def test_undeclared_attributes_are_not_read():
    """The three values as plain attributes, no ``draft_info``: the stops get the defaults (the draft
    model's digest as identity) and the target pass returns its last layer."""
    draft = ScriptedLM(16, seed=1)
    draft.digest = "draft-digest"
    engine, resources = probe_engine(
        "{name: probe, identity: mine, thresholds: {entropy: 0.7}, layers: [0, 1], declared: false}", draft=draft
    )
    assert resources.draft_identity == "draft-digest" and resources.stop_thresholds == {}
    assert engine.target_hidden is True


def test_a_draft_info_of_the_wrong_type_is_refused():
    class Odd:
        draft_info = {"identity": "x"}

    with pytest.raises(TypeError, match="Odd.draft_info must be a pacer_core.DraftInfo, got dict"):
        DraftInfo.of(Odd())
    assert DraftInfo.of(object()) == DraftInfo()


def test_hybrid_declares_its_main_members_draft_info():
    members = "[{name: probe, identity: mine, thresholds: {entropy: 0.7}, layers: [1]}, {name: prompt_lookup}]"
    engine, resources = probe_engine(f"{{name: hybrid, members: {members}}}")
    assert resources.draft_identity == "mine" and resources.stop_thresholds == {"entropy": 0.7}
    assert engine.target_hidden == (1,)
    hybrid = engine.pm.get_plugin("strategy.drafter:hybrid")
    assert hybrid.draft_info == DraftInfo("mine", {"entropy": 0.7}, (1,))


def test_hybrid_forwards_nothing_its_main_member_does_not_declare():
    members = "[{name: probe, identity: mine, layers: [1], declared: false}, {name: prompt_lookup}]"
    engine, resources = probe_engine(f"{{name: hybrid, members: {members}}}")
    assert resources.draft_identity is None and engine.target_hidden is True


# -- one resolution, one plugin manager ---------------------------------------------------------
# (the ``resolutions`` spy is in conftest.py; the bench's, the demo's and the other entry points'
# tests are beside their own)
def _fake_load_model(path, dtype, device, device_map, name, pack_weights=None):
    return adapter(tiny_llama(0)), None, "digest"


def test_from_config_resolves_the_stack_once_on_one_plugin_manager(resolutions, monkeypatch):
    monkeypatch.setattr(pacer_core.hf.loading, "load_model", _fake_load_model)
    cfg = config.read_config(overrides=["strategy.stop=[{name: recorder}]"])
    engine = Engine.from_config(cfg, extra_plugins=[PROBE])
    assert resolutions == {"plugin_managers": 1, "resolutions": 1}
    assert engine.pm.get_plugin("strategy.stop[0]:recorder") is not None


def test_a_plan_is_resolved_once_and_builds_its_engine_on_its_plugin_manager(resolutions, monkeypatch):
    monkeypatch.setattr(pacer_core.hf.loading, "load_model", _fake_load_model)
    plan = load_plan(overrides=["strategy.stop=[{name: recorder}]"], extra_plugins=[PROBE])
    engine = Engine.from_plan(plan)
    assert resolutions == {"plugin_managers": 1, "resolutions": 1}
    assert engine.pm is plan.pm and engine.pm.get_plugin("strategy.stop[0]:recorder") is not None


def test_a_plan_builds_one_engine():
    plan = load_plan(overrides=["strategy.stop=[{name: recorder}]"], extra_plugins=[PROBE], require_models=False)
    Engine.build(ScriptedLM(16), plan=plan)
    with pytest.raises(InputError, match="has built an engine already.*plan the run again"):
        Engine.build(ScriptedLM(16), plan=plan)
    with pytest.raises(InputError, match="a plan, or a cfg with its extra_plugins, not both"):
        Engine.build(ScriptedLM(16), plan=plan, cfg=plan.config)


def test_pacer_generate_resolves_the_stack_once_on_one_plugin_manager(resolutions, monkeypatch, capsys):
    """``pacer generate`` with the real ``Engine.from_plan`` (models replaced; the engine built, not run)."""
    monkeypatch.setattr(pacer_core.hf.loading, "load_model", _fake_load_model)
    built = []

    def generate(self, prompt):
        built.append(self)
        return GenerationResult(tokens=[], text="", metrics={}, finish_reason="length")

    monkeypatch.setattr(Engine, "generate", generate)
    assert cli.main(["generate", "-p", "hello", "--json", "strategy.observers=[]"]) == 0, capsys.readouterr().err
    assert resolutions == {"plugin_managers": 1, "resolutions": 1}
    (engine,) = built  # the metrics observer the command adds is in the one resolved stack
    assert engine.pm.get_plugin("strategy.observers[0]:metrics") is not None


def test_the_step_metrics_are_added_by_one_rule_unless_the_stack_has_them():
    """What ``pacer generate`` and the bench ask for (``step_metrics``): the first installed observer
    providing ``metrics``, added once, and nothing when the stack has one."""
    plan = load_plan(overrides=["strategy.observers=[]"], step_metrics=True)
    assert plan.config.strategy.observers == [{"name": "metrics"}]
    assert [o.component.name for o in plan.stack.observers] == ["metrics"]
    assert load_plan(step_metrics=True).config.strategy.observers == [{"name": "metrics"}]  # the default has it
    assert load_plan(overrides=["strategy.observers=[]"]).config.strategy.observers == []
