"""pacer_core.hookcheck: what each hook may return, and who is named when a plugin breaks it."""

from __future__ import annotations

import pytest
import torch

from pacer_core import Component, DraftBlock, Stop, Verdict, hookcheck, hookimpl, load_config
from pacer_core.draft_values import Draft
from pacer_core.engine import Engine
from pacer_core.errors import PluginError
from pacer_core.hf.tiny import tiny_llama, tiny_model

import broken_plugins

DRAFT = Draft().extend(DraftBlock(torch.tensor([4, 5])))  # two main-path tokens


@pytest.mark.parametrize(
    "hook, value, problem",
    [
        ("pacer_draft_more", Stop, "returned the class Stop, not a Stop: return Stop()"),
        ("pacer_draft_more", 1.0, "returned float 1.0: return a positive int"),
        ("pacer_draft_more", 0, "returned 0: return a positive int"),
        ("pacer_draft_more", -5, "returned -5"),
        ("pacer_draft_more", True, "returned bool True"),
        ("pacer_draft_more", [1, 2], "returned list [1, 2]"),
        ("pacer_draft_more", Stop(keep=3), "returned Stop(keep=3) for a draft of 2 tokens"),
        ("pacer_draft_more", Stop(keep=-1), "returned Stop(keep=-1)"),
        ("pacer_draft_more", Stop(keep=1.0), "returned Stop(keep=1.0): keep must be an int"),
        ("pacer_propose", [1, 2], "returned list [1, 2]: return a pacer_core.DraftBlock"),
        ("pacer_propose", DraftBlock(torch.tensor([1.0, 2.0])), "whose tokens are Tensor"),
        ("pacer_verify", (1, 2), "returned tuple (1, 2): return a pacer_core.Verdict"),
        ("pacer_verify", Verdict(3, 1, "bonus"), "accepted 3 of 2 draft tokens"),
        ("pacer_verify", Verdict(1, -1, "recovered"), "returned next_token -1"),
        ("pacer_select_nodes", "01", "returned str '01'"),
        ("pacer_select_nodes", [0, 2], "returned node 2 for a tree of 2 nodes"),
        ("pacer_finish", [("k", 1)], "returned list"),
        ("pacer_components", [1, "x", None], "returned a list whose item 0 is int 1"),
        ("pacer_components", "prob_floor", "returned str 'prob_floor': return a list of pacer_core.Component"),
    ],
)
def test_a_wrong_result_is_named_with_its_fix(hook, value, problem):
    found = hookcheck.result_problem(hook, value, {"draft": DRAFT})
    assert found is not None and problem in found


@pytest.mark.parametrize(
    "hook, value",
    [
        ("pacer_draft_more", 1),
        ("pacer_draft_more", 64),
        ("pacer_draft_more", Stop()),
        ("pacer_draft_more", Stop(keep=0)),
        ("pacer_draft_more", Stop(keep=2)),
        ("pacer_draft_more", torch.tensor(3)),
        ("pacer_propose", DraftBlock(torch.tensor([1, 2]))),
        ("pacer_verify", Verdict(2, 7, "bonus")),
        ("pacer_select_nodes", {0, 1}),
        ("pacer_select_nodes", range(2)),
        ("pacer_finish", {"k": 1}),
        ("pacer_components", [Component("stop", "s", object, object)]),
        ("pacer_observe_step", "anything"),
    ],
)
def test_what_hooks_md_asks_for_passes(hook, value):
    assert hookcheck.result_problem(hook, value, {"draft": DRAFT}) is None


def engine_with(stops: str) -> Engine:
    cfg = load_config(
        overrides=[f"strategy.stop=[{stops}]", "sampling.temperature=0"],
        extra_plugins=[broken_plugins],
        require_models=False,
    )
    return Engine.build(tiny_model(tiny_llama(0)), cfg=cfg, extra_plugins=[broken_plugins])


def test_check_results_names_the_plugin_as_the_engine_registered_it():
    pm = engine_with("{name: fixed, gamma: 3}, {name: returns, value: class}").pm
    # pluggy calls the last registered first: [returns' answer, fixed's answer]
    with pytest.raises(PluginError, match=r"^strategy\.stop\[1\]:returns: pacer_draft_more returned the class Stop"):
        hookcheck.check_results(pm, "pacer_draft_more", [Stop, 3], draft=DRAFT)
    with pytest.raises(PluginError, match=r"^strategy\.stop\[0\]:fixed: pacer_draft_more returned 0"):
        hookcheck.check_results(pm, "pacer_draft_more", [1, 0], draft=DRAFT)
    # one stop answered None (pluggy dropped it): either may have given the wrong value
    with pytest.raises(PluginError, match=r"^strategy\.stop\[1\]:returns or strategy\.stop\[0\]:fixed: "):
        hookcheck.check_results(pm, "pacer_draft_more", [1.0], draft=DRAFT)
    assert hookcheck.check_results(pm, "pacer_draft_more", [Stop(), 2], draft=DRAFT) == [Stop(), 2]


def test_check_results_names_the_one_drafter_and_verifier():
    pm = engine_with("{name: fixed, gamma: 3}").pm
    with pytest.raises(PluginError, match=r"^strategy\.drafter:prompt_lookup: pacer_propose returned list"):
        hookcheck.check_results(pm, "pacer_propose", [1, 2])
    with pytest.raises(PluginError, match=r"^strategy\.verifier:\w+: pacer_verify accepted 5 of 2"):
        hookcheck.check_results(pm, "pacer_verify", Verdict(5, 1, "bonus"), draft=DRAFT)
    assert hookcheck.check_results(pm, "pacer_propose", None) is None


class Raises:
    @hookimpl
    def pacer_draft_more(self, state, draft):
        return helper()


def helper():
    raise ValueError("deep inside")


def test_blame_finds_the_implementation_an_exception_came_from():
    engine = engine_with("{name: fixed, gamma: 3}")
    engine.pm.register(Raises(), name="strategy.stop[1]:raises")
    impls = engine.pm.hook.pacer_draft_more.get_hookimpls()
    with pytest.raises(ValueError) as caught:
        engine.pm.hook.pacer_draft_more(state=None, draft=DRAFT)
    assert hookcheck.blame(caught.value, impls).plugin_name == "strategy.stop[1]:raises"
    assert hookcheck.describe(caught.value) == "ValueError: deep inside"
    assert hookcheck.origin(caught.value).endswith(f"test_hookcheck.py:{helper.__code__.co_firstlineno + 1}")
    assert hookcheck.blame(ValueError("elsewhere"), impls) is None
    assert hookcheck.describe(SystemExit(0)) == "SystemExit(0)"


@pytest.mark.parametrize(
    "value, message",
    [
        ("class", "returned the class Stop"),
        ("float", "returned float 1.0"),
        ("zero", "returned 0"),
        ("negative", "returned -5"),
    ],
)
def test_the_engine_refuses_a_wrong_return_naming_the_plugin(value, message):
    """The engine checks what the stop policies, the drafter and the verifier return (hookcheck),
    so a plugin's bug is one line naming it, not a traceback deep in the loop."""
    engine = engine_with(f"{{name: returns, value: {value}}}")
    with pytest.raises(PluginError, match=rf"strategy\.stop\[0\]:returns: pacer_draft_more {message}"):
        engine.generate([5, 9, 5, 9, 5, 9, 5], max_new_tokens=8)  # prompt lookup drafts from the repeats


def test_shipped_data_is_found_by_name_and_a_wrong_answer_or_a_clash_is_refused(tmp_path):
    """``pacer_shipped``: the installed plugins' folders by name (the token draft, the corpora); a plugin
    answering anything but names → folders, or shipping a name another plugin ships, is one line."""
    import types

    from pacer_core.draft_model_helpers import TOKEN_DRAFT, shipped_draft
    from pacer_core.errors import ConfigError
    from pacer_core.registry import new_plugin_manager, shipped_by, shipped_folder
    from pacer_train.corpus.loaders import OPEN_CHAT_CORPUS, SELFDISTILL_CORPUS, shipped_corpus

    assert shipped_folder(TOKEN_DRAFT) is not None and (shipped_folder(TOKEN_DRAFT) / "config.json").is_file()
    assert str(shipped_folder(TOKEN_DRAFT)) == shipped_draft()
    assert shipped_corpus() == shipped_folder(SELFDISTILL_CORPUS) and (shipped_corpus() / "manifest.json").is_file()
    assert (shipped_folder(OPEN_CHAT_CORPUS) / "manifest.json").is_file()
    assert shipped_folder("nothing_ships_this") is None

    def plugin(name: str, answer) -> types.ModuleType:
        module = types.ModuleType(name)
        module.pacer_shipped = hookimpl(lambda: answer)
        return module

    mine = plugin("ships_mine", {"mine": tmp_path})
    assert shipped_by(new_plugin_manager([mine]))["mine"] == tmp_path
    with pytest.raises(ConfigError, match=r"^two plugins ship data named 'token_draft' \(one is "):
        shipped_by(new_plugin_manager([plugin("ships_again", {TOKEN_DRAFT: tmp_path})]))
    for answer, problem in (([tmp_path], "returned list"), ({"x": 3}, "returned dict")):
        with pytest.raises(ConfigError, match=rf"^plugin ships_bad: pacer_shipped {problem}.*names to folders"):
            shipped_by(new_plugin_manager([plugin("ships_bad", answer)]))
