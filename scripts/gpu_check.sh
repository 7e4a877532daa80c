#!/usr/bin/env bash
# The GPU check (docs/gpu.md#the-gpu-check): offline, no model weights, one call, under 8 minutes on one
# H100-class GPU. It
#   1. runs the tests marked `gpu` (host syncs per step, models on the device, bf16 on CUDA);
#   2. measures a cost profile on random weights in two real target shapes, the embedded target's
#      (SmolLM2-135M) and Llama-3-8B's, bf16, built on the GPU: chain and tree-masked verification
#      curves (k up to 128 after 512 cached tokens), a draft forward per drafter kind (a one-layer
#      feature head, a token-level draft about a tenth of the target), M_B and the host time per step
#      (python -m pacer_bench.devicecosts);
#   3. replays the recorded CPU runs under each profile (`pacer replay`): predicted GPU speedups.
# Without a GPU the same steps run on the CPU with shrunk shapes (2 layers, small width and vocabulary, fp32).
#
#   bash scripts/gpu_check.sh [--system-python] [OUT]     results in OUT (default runs/gpu_check)
#   --system-python  (or PACER_USE_SYSTEM_PYTHON=1) use the Python at hand as it is: no pip, no venv, no
#                    downloads; PACER_PYTHON names it (default python3); see scripts/system_python.sh
#   PACER_REPLAY_RUNS  the recorded bench runs to replay (folders, space-separated; default: every bench
#                    folder committed under docs/results)
# OUT receives at most 8 files, each under 16 MB: tests.log, profile-<shape>.yaml and raw-<shape>.json
# per shape, replay.md and check.log. Each phase has its own time limit (TESTS_S, PROFILE_S, REPLAY_S).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=runs/gpu_check
while [ $# -gt 0 ]; do
  case "$1" in
    --system-python) export PACER_USE_SYSTEM_PYTHON=1; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option '$1' (--system-python, or the results folder)" >&2; exit 2 ;;
    *) out="$1"; shift ;;
  esac
done
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$out"
if [ -n "$(find "$out" -mindepth 1 -maxdepth 1 ! -name 'tests.log' ! -name 'profile-*.yaml' ! -name 'raw-*.json' \
          ! -name replay.md ! -name check.log -print -quit)" ]; then
  echo "gpu_check.sh: '$out' holds other files; give an empty or new folder" >&2
  exit 2
fi
: > "$out/check.log"
exec > >(tee -a "$out/check.log") 2> >(tee -a "$out/check.log" >&2)
# shellcheck source=scripts/system_python.sh
source scripts/system_python.sh
choose_python

SHAPES=(smollm2-135m llama3-8b)
if "${PY[@]}" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  "${PY[@]}" -c "import torch; print('GPU:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
  # seconds: the tests, each shape's profile (the last 'measure' seconds of it are the timings' budget), the replay
  TESTS_S=120; PROFILE_S=(90 160); MEASURE_S=(45 80); REPLAY_S=60; size=()
else
  echo "no GPU visible: the same check on the CPU, shrunk shapes in float32"
  TESTS_S=300; PROFILE_S=(120 120); MEASURE_S=(20 20); REPLAY_S=120; size=(--small --device cpu --dtype float32)
fi
started=$(date +%s)
phase() { echo "== $1 ($(( $(date +%s) - started )) s so far)"; }

# 1. the tests of the GPU path
phase "tests marked gpu (limit ${TESTS_S} s)"
set +e
timeout -k 10 "$TESTS_S" "${PY[@]}" -m pytest -q -m gpu -p no:cacheprovider -p no:xdist tests/test_gpu.py \
  > "$out/tests.log" 2>&1
tests_rc=$?
set -e
tail -n 3 "$out/tests.log"

# 2. a measured profile per target shape (the host time is measured once, with the first that succeeds)
host=(); failed=()
for i in "${!SHAPES[@]}"; do
  shape="${SHAPES[$i]}"
  phase "profile of $shape (limit ${PROFILE_S[$i]} s)"
  if timeout -k 10 "${PROFILE_S[$i]}" "${PY[@]}" -m pacer_bench.devicecosts --target "$shape" "${size[@]}" \
       --seconds "${MEASURE_S[$i]}" --out "$out/profile-$shape.yaml" --raw "$out/raw-$shape.json" "${host[@]}"; then
    [ "${#host[@]}" -gt 0 ] || host=(--host-from "$out/profile-$shape.yaml")
  else
    failed+=("profile of $shape (exit $?)")
  fi
done

# 3. the recorded CPU runs replayed under the profiles: every committed bench folder (bench.json and
# answers.jsonl) under docs/results, or the folders in PACER_REPLAY_RUNS
phase "replay of the recorded CPU runs (limit ${REPLAY_S} s)"
profiles=()
for shape in "${SHAPES[@]}"; do
  if [ -f "$out/profile-$shape.yaml" ]; then profiles+=(--profile "$out/profile-$shape.yaml"); fi
done
if [ -n "${PACER_REPLAY_RUNS:-}" ]; then
  read -r -a runs <<< "$PACER_REPLAY_RUNS"
else
  mapfile -t runs < <(find docs/results -name bench.json -printf '%h\n' | sort | while read -r d; do
                        if [ -f "$d/answers.jsonl" ]; then echo "$d"; fi; done)
fi
{
  echo "# Predicted speedups under the measured profiles ($(date -u +%F))"
  echo
  if ! "${PACER[@]}" replay --help > /dev/null 2>&1; then
    echo "not replayed: this checkout has no \`pacer replay\` command"
  elif [ "${#profiles[@]}" = 0 ]; then
    echo "not replayed: no profile was measured"
  elif [ "${#runs[@]}" = 0 ]; then
    echo "not replayed: no recorded bench run (a folder with bench.json and answers.jsonl) under docs/results;" \
         "name some in PACER_REPLAY_RUNS"
  else
    replay_end=$(( $(date +%s) + REPLAY_S ))
    for run in "${runs[@]}"; do
      left=$(( replay_end - $(date +%s) ))
      if [ "$left" -le 0 ]; then
        echo "not replayed: the replay's ${REPLAY_S} s were spent before '$run'"
        continue
      fi
      echo "## $run"
      echo
      timeout -k 5 "$left" "${PACER[@]}" replay "$run" "${profiles[@]}" 2>&1 || echo "(pacer replay exited with $?)"
      echo
    done
  fi
} > "$out/replay.md"
cat "$out/replay.md"

# what came out: at most 8 files, each under 16 MB
phase "done"
count=$(find "$out" -type f | wc -l)
big=$(find "$out" -type f -size +16M)
[ "$count" -le 8 ] || { echo "gpu_check.sh: $count files in $out (at most 8)" >&2; exit 1; }
[ -z "$big" ] || { echo "gpu_check.sh: files over 16 MB: $big" >&2; exit 1; }
[ "$tests_rc" = 0 ] || failed+=("the tests marked gpu (exit $tests_rc: see $out/tests.log)")
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'gpu_check.sh: failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "results in $out: $(cd "$out" && ls | tr '\n' ' ')"
