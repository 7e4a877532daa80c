"""Test-wide settings and the shared fixtures (the builders they use are in helpers.py).

Settings: offline hubs, and torch on one thread (tiny models only lose time to thread
synchronisation, badly so when the machine is busy), pinned here for the session and again before
each test (code under test, a bench or a training run, may change it); real-model tests raise it
through the ``real_model_threads`` fixture.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from helpers import REAL_MODEL_THREADS, TEST_THREADS, greedy_pair, pin_threads, torch_threads  # noqa: E402

pin_threads(TEST_THREADS)  # collection and module-scoped fixtures run on it too


@pytest.fixture(autouse=True)
def _test_threads():
    """Every test starts on TEST_THREADS, whatever the previous one left behind."""
    pin_threads(TEST_THREADS)


@pytest.fixture
def real_model_threads(_test_threads):
    """REAL_MODEL_THREADS for one test: real models use both cores (``pytest.mark.usefixtures``)."""
    with torch_threads(REAL_MODEL_THREADS):
        yield


@pytest.fixture(scope="module")
def greedy_models(request):
    """(target, draft, references) for a module's greedy-equality tests: a tiny Llama with its output
    layer scaled by the module's ``GREEDY_SCALE``, a noisy copy of it as the draft (agrees often, not
    always) and the target's greedy decoding of each of the module's ``PROMPTS`` for ``BUDGET`` tokens."""
    module = request.module
    return greedy_pair(module.GREEDY_SCALE, module.PROMPTS, module.BUDGET)


@pytest.fixture
def resolutions(monkeypatch):
    """Counts the stack resolutions (``pacer_core.config.resolve_stack``, which every run plan calls)
    and the plugin managers made, so a test can check that an entry point plans its run once."""
    import pluggy

    from pacer_core import config

    counts = {"plugin_managers": 0, "resolutions": 0}
    original_pm, original_resolve = pluggy.PluginManager, config.resolve_stack

    class CountedPluginManager(original_pm):
        def __init__(self, *args, **kwargs):
            counts["plugin_managers"] += 1
            super().__init__(*args, **kwargs)

    def counted_resolve(*args, **kwargs):
        counts["resolutions"] += 1
        return original_resolve(*args, **kwargs)

    monkeypatch.setattr(pluggy, "PluginManager", CountedPluginManager)
    monkeypatch.setattr(config, "resolve_stack", counted_resolve)
    return counts
