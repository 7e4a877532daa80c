"""The tree passes the linter configured in pyproject.toml (``[tool.ruff]``: line length, pyflakes,
import order), so a lint error fails the suite as it fails CI (.ci/run runs ``ruff check .`` first)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_tree_passes_ruff():
    pytest.importorskip("ruff", reason="ruff is not installed (it comes with the test extra: scripts/bootstrap.sh)")
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--quiet", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, "ruff check . found problems (pyproject's [tool.ruff]):\n" + done.stdout + done.stderr
