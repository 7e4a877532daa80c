#!/usr/bin/env bash
# The main job: plain decoding vs speculative decoding on the embedded target and real prompts.
# Extra arguments go to `pacer demo` (e.g. --prompts 5 --max-new-tokens 256 --repeats 5). Each speedup is the
# median of paired, interleaved rounds (docs/benchmarks.md#the-demo).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "${PACER_VENV:-.venv}/bin/pacer" demo "$@"
