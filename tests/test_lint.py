"""The tree passes the linter configured in pyproject.toml (``[tool.ruff]``: line length, pyflakes,
import order, blank lines), is formatted as ``ruff format .`` writes it, and ``pacer_core`` passes the
type checker (``[tool.mypy]``), so a lint, format or type error fails the suite as it fails CI
(.ci/run runs ``ruff check .``, ``ruff format --check .`` and ``mypy`` first)."""

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


def test_the_tree_is_formatted():
    pytest.importorskip("ruff", reason="ruff is not installed (it comes with the test extra: scripts/bootstrap.sh)")
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "--quiet", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, "files `ruff format .` would change (run it):\n" + done.stdout + done.stderr


def test_pacer_core_passes_mypy():
    pytest.importorskip("mypy", reason="mypy is not installed (it comes with the test extra: scripts/bootstrap.sh)")
    # the files and options are pyproject's [tool.mypy]; its cache (.mypy_cache, ignored by git) is the
    # one .ci/run's mypy leaves, so the check is quick after it
    done = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, "mypy found type errors (pyproject's [tool.mypy]):\n" + done.stdout + done.stderr
