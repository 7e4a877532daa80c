#!/usr/bin/env bash
# The GPU check: the tests of the GPU path (marked `gpu`: host syncs per step, models on the device,
# bf16 on CUDA) and a short bench on the embedded pair (configs/bench_gpu.yaml, 2 prompts per set,
# 2 repeats), whose report shows plain decoding beside transformers' generate. On a machine without
# a GPU the same tests run on the CPU and the bench runs there (fp32, 1 prompt per set, no cost probe).
#   bash scripts/gpu_check.sh [OUT]        results in OUT (default runs/gpu_check); rerun to resume
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
venv="${PACER_VENV:-.venv}"
out="${1:-runs/gpu_check}"
if "$venv/bin/python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  "$venv/bin/python" -c "import torch; print('GPU:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
  limit=2; overrides=()
else
  echo "no GPU visible: the same checks on the CPU"
  limit=1; overrides=(dtype=float32 repeats=1 verify_cost=false)
fi
"$venv/bin/python" -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py
"$venv/bin/pacer" bench --config configs/bench_gpu.yaml --limit "$limit" --out "$out" --no-progress "${overrides[@]}"
