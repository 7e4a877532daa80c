"""scripts/host_time_against.sh (docs/host-time.md#against-the-issues-reference-code): the rounds run
interleaved, a finished round is kept, the table gives each stack's ranges and per-round ratio, and
bad requests are refused in one line. Both sides are stand-in ``pacer`` commands that write a
bench-host JSON with a fixed host time, so nothing here is timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "host_time_against.sh"


def _stand_in(venv: Path, who: str, host_ms: float, calls: Path) -> None:
    """A venv folder whose bin/pacer records ``who`` and writes a bench-host JSON (two stacks) to --json."""
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    writer = (
        "import json, sys\n"
        "out = sys.argv[sys.argv.index('--json') + 1]\n"
        f"rows = [dict(stack=s, steps=57, nodes_per_step=n, step_s=0.01, forward_s=0.005,\n"
        f"             host_s={host_ms} * k / 1000)\n"
        "        for s, n, k in (('chain', 3.9, 1), ('tree64', 62.1, 5))]\n"
        "json.dump({'results': rows, 'host_s': {}}, open(out, 'w'))\n"
    )
    (venv / "writer.py").write_text(writer)
    pacer = venv / "bin" / "pacer"
    writes = f'exec {sys.executable} {venv / "writer.py"} "$@"'
    pacer.write_text(f'#!/usr/bin/env bash\necho "{who} $*" >> {calls}\n{writes}\n')
    pacer.chmod(0o755)
    python = venv / "bin" / "python"
    if not python.exists():
        python.symlink_to(sys.executable)


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    calls = tmp_path / "calls.txt"
    _stand_in(tmp_path / "here-venv", "here", 1.0, calls)
    work = tmp_path / "work"
    (work / "tree").mkdir(parents=True, exist_ok=True)
    (work / "tree" / ".exported").touch()  # the commit's export is taken as done: nothing is copied
    _stand_in(work / "venv", "ref", 2.0, calls)
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**os.environ, "PACER_VENV": str(tmp_path / "here-venv")},
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_rounds_alternate_and_the_table_gives_ranges_and_ratios(tmp_path):
    work = tmp_path / "work"
    done = _run(tmp_path, "HEAD", "--rounds", "3", "--work", str(work), "--", "--stacks", "chain,tree64")
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["ref", "here", "here", "ref", "ref", "here"]
    assert all(c.split()[1:4] == ["bench-host", "--stacks", "chain,tree64"] for c in calls)
    assert "| chain | 57 steps, 3.9 | 2.00–2.00 | 1.00–1.00 | 0.50–0.50 |" in done.stdout
    assert "| tree64 | 57 steps, 62.1 | 10.00–10.00 | 5.00–5.00 | 0.50–0.50 |" in done.stdout
    assert json.loads((work / "ref-2.json").read_text())["results"][0]["stack"] == "chain"

    (work / "here-2.json").unlink()  # an interrupted round: only its missing side runs again
    again = _run(tmp_path, "HEAD", "--rounds", "3", "--work", str(work), "--", "--stacks", "chain,tree64")
    assert again.returncode == 0, again.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 7 and calls[-1].startswith("here ")


def test_a_bad_request_is_refused_in_one_line(tmp_path):
    for args, needle in [
        ((), "give the commit"),
        (("no-such-commit",), "'no-such-commit' is not a commit"),
        (("HEAD", "--rounds", "0"), "--rounds needs a whole number"),
        (("HEAD", "--rounds", "x"), "--rounds needs a whole number"),
        (("HEAD", "--wrok", "x"), "unknown option '--wrok'"),
    ]:
        result = _run(tmp_path, *args)
        assert result.returncode == 2 and needle in result.stderr and result.stderr.count("\n") == 1, args
    assert not (tmp_path / "calls.txt").exists()
