#!/usr/bin/env bash
# Copy the pure-Python packages the project needs besides torch and transformers (pluggy, attrs,
# omegaconf, pytest and what pytest needs, gguf) from a Python environment that has them into one folder,
# for a GPU machine whose Python lacks them: no pip, nothing downloaded. Give the folder to the
# scripts there as PACER_DEPS (docs/gpu.md#the-gpu-check):
#   bash scripts/gpu_deps.sh DIR                      # from .venv (or PACER_PYTHON)
#   PACER_DEPS=DIR bash scripts/gpu_check.sh --system-python OUT
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ $# = 1 ] || { echo "usage: bash scripts/gpu_deps.sh DIR" >&2; exit 2; }
read -r -a py <<< "${PACER_PYTHON:-${PACER_VENV:-.venv}/bin/python}"
"${py[@]}" - "$1" <<'PY'
import shutil
import sys
from importlib import metadata
from pathlib import Path

WANTED = ["pluggy", "attrs", "omegaconf", "pytest", "iniconfig", "pygments", "packaging", "exceptiongroup", "tomli",
          "gguf"]  # gguf reads the embedded target (gpu_distill.sh)
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
copied = []
for name in WANTED:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue  # exceptiongroup and tomli exist only before Python 3.11
    files = [f for f in dist.files or () if not str(f).startswith("..") and "__pycache__" not in str(f)]
    if any(str(f).endswith((".so", ".pyd")) for f in files):
        sys.exit(f"gpu_deps.sh: {name} has compiled parts: install it on the GPU machine instead")
    for f in files:
        source = Path(dist.locate_file(f))
        if source.is_file():
            (out / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, out / f)
    copied.append(f"{name} {dist.version}")
size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
print(f"copied into {out} ({size / 2**20:.1f} MB): {', '.join(copied)}")
PY
