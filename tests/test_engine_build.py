"""How an engine is built: the strategy stack resolved once, on the engine's one plugin manager."""

from __future__ import annotations

import pluggy
import pytest

import pacer_core.hf
from pacer_core import Engine, GenerationResult, cli, config, engine as engine_module

from helpers import adapter, tiny_llama


# -- one resolution, one plugin manager ---------------------------------------------------------
@pytest.fixture
def counted(monkeypatch):
    """Counts plugin managers made and stack resolutions (``config.check`` calls, wherever imported)."""
    counts = {"plugin_managers": 0, "resolutions": 0}
    original_pm, original_check = pluggy.PluginManager, config.check

    class CountedPluginManager(original_pm):
        def __init__(self, *args, **kwargs):
            counts["plugin_managers"] += 1
            super().__init__(*args, **kwargs)

    def counted_check(*args, **kwargs):
        counts["resolutions"] += 1
        return original_check(*args, **kwargs)

    monkeypatch.setattr(pluggy, "PluginManager", CountedPluginManager)
    for module in (config, engine_module, cli):
        monkeypatch.setattr(module, "check", counted_check)
    return counts


def _fake_load_model(path, dtype, device, device_map, name, pack_weights=None):
    return adapter(tiny_llama(0)), None, "digest"


def test_from_config_resolves_the_stack_once_on_one_plugin_manager(counted, monkeypatch):
    monkeypatch.setattr(pacer_core.hf.loading, "load_model", _fake_load_model)
    engine = Engine.from_config(config.read_config())
    assert counted == {"plugin_managers": 1, "resolutions": 1}
    assert engine.pm.get_plugin("strategy.stop[0]:heuristic") is not None


def test_pacer_generate_resolves_the_stack_once_on_one_plugin_manager(counted, monkeypatch, capsys):
    """``pacer generate`` with the real ``Engine.from_config`` (models replaced; the engine built, not run)."""
    monkeypatch.setattr(pacer_core.hf.loading, "load_model", _fake_load_model)
    built = []

    def generate(self, prompt):
        built.append(self)
        return GenerationResult(tokens=[], text="", metrics={}, finish_reason="length")

    monkeypatch.setattr(Engine, "generate", generate)
    assert cli.main(["generate", "-p", "hello", "--json", "strategy.observers=[]"]) == 0, capsys.readouterr().err
    assert counted == {"plugin_managers": 1, "resolutions": 1}
    (engine,) = built  # the metrics observer the command adds is in the one resolved stack
    assert engine.pm.get_plugin("strategy.observers[0]:metrics") is not None
