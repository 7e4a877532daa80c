"""The docs' runnable examples run as written: the example stop of writing-plugins.md (every new
token judged, a length bound), its `pacer check` line, and the README's Python API example.

(tests/test_docs.py keeps the docs' text true to the code; this module runs what they show.)
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import torch

from pacer_core import Engine, Stop

from helpers import CharTokenizer, adapter, tiny_llama

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("my_stop_plugin", EXAMPLES / "my_stop_plugin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _draft(probs: list[float]) -> "_Draft":
    """A draft of len(probs) tokens, token i drafted with probability probs[i]."""
    tokens = torch.arange(len(probs)) % 8
    rows = torch.full((len(probs), 8), 0.0)
    rows[torch.arange(len(probs)), tokens] = torch.tensor(probs)
    return _Draft(tokens, rows)


class _Draft:
    def __init__(self, tokens, rows):
        self.tokens, self.draft_probs = tokens, rows

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def _stop(example, floor: float = 0.3, max_tokens: int = 16):
    return example.ProbFloor(example.ProbFloorConfig(floor=floor, max_tokens=max_tokens), None)


def test_the_example_stop_judges_every_new_token(example):
    stop = _stop(example)
    assert stop.pacer_draft_more(state=None, draft=_draft([])) == 1
    assert stop.pacer_draft_more(state=None, draft=_draft([0.9])) == 1
    # a drafter returned three tokens in one call: the unsure one in the middle is caught
    assert stop.pacer_draft_more(state=None, draft=_draft([0.9, 0.1, 0.9])) == Stop(keep=2)
    assert stop.pacer_draft_more(state=None, draft=_draft([0.05, 0.9, 0.9, 0.9])) == Stop(keep=1)
    assert stop.pacer_draft_more(state=None, draft=_draft([0.9, 0.9, 0.2])) == Stop(keep=3)


def test_the_example_stop_has_a_length_bound(example):
    stop = _stop(example, max_tokens=4)
    assert stop.pacer_draft_more(state=None, draft=_draft([0.9] * 3)) == 1
    assert stop.pacer_draft_more(state=None, draft=_draft([0.9] * 4)) == Stop(keep=4)
    assert stop.pacer_draft_more(state=None, draft=_draft([0.9] * 9)) == Stop(keep=4)  # a call overshot it


def _documented_check_line() -> list[str]:
    text = (ROOT / "docs" / "writing-plugins.md").read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("pacer check --plugin my_stop_plugin.py")]
    return shlex.split(line)


def test_the_documented_check_line_passes_as_written(monkeypatch, capsys):
    from pacer_core import cli

    argv = _documented_check_line()
    assert "strategy.drafter={name: draft_model}" in argv  # a drafter with probabilities
    monkeypatch.chdir(EXAMPLES)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    code = cli.main(argv[1:])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "all checks pass" in out and "Traceback" not in err


def _readme_python() -> str:
    (block,) = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.S | re.M)
    return block


def test_the_readme_python_example_runs_on_tiny_models(monkeypatch, capsys, resolutions):
    """As written, with Engine.from_plan building on a tiny model (no download, no model load); the
    stack is resolved once, on the plan's one plugin manager."""
    built = []

    def from_plan(cls, plan):
        built.append(plan.config)
        return cls.build(adapter(tiny_llama(0)), tokenizer=CharTokenizer(), plan=plan)

    monkeypatch.setattr(Engine, "from_plan", classmethod(from_plan))
    monkeypatch.chdir(ROOT)
    exec(compile(_readme_python(), "README.md", "exec"), {})
    (cfg,) = built
    assert cfg.generation.max_new_tokens == 64 and cfg.strategy.stop[0]["name"] == "heuristic"
    assert resolutions == {"plugin_managers": 1, "resolutions": 1}
    printed = capsys.readouterr().out.strip()
    assert printed and float(printed.split()[-1]) >= 1.0  # the text, then τ


@pytest.mark.slow
def test_the_readme_python_example_runs_as_written(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    exec(compile(_readme_python(), "README.md", "exec"), {})
    printed = capsys.readouterr().out.strip()
    assert printed and float(printed.split()[-1]) >= 1.0
