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
