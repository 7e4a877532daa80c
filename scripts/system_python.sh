# Sourced by scripts/gpu_check.sh and scripts/gpu_distill.sh: choose the Python that runs the project.
#
#   PACER_USE_SYSTEM_PYTHON=1 (or the scripts' --system-python): the Python environment at hand, as it
#   is (torch, transformers and the other dependencies already installed): no pip, no venv, nothing
#   downloaded. The packages are imported from this checkout (PYTHONPATH=., plugins/ linked as
#   pacer_plugins), and the plugins and
#   commands that pyproject.toml registers as entry points are registered by a metadata folder written
#   to a temporary directory on PYTHONPATH, so the checkout needs no install. PACER_PYTHON names the
#   interpreter (default: python3 on PATH). Besides torch and transformers the project needs a few
#   pure-Python packages (PACER_NEEDS); where they are missing, PACER_DEPS names a folder of them that
#   scripts/gpu_deps.sh copied from a venv (it goes on PYTHONPATH).
#   Otherwise: scripts/bootstrap.sh creates or updates .venv (or $PACER_VENV; PACER_SKIP_BOOTSTRAP=1 uses
#   it as it is), and that runs.
#
# After `choose_python`: PY (the interpreter) and PACER (the `pacer` command line) are arrays.
# The caller is at the repository root and has `set -euo pipefail`.

# write NAME.dist-info (METADATA and the entry points of pyproject.toml) into the folder $1
register_checkout() {
  "${PY[@]}" - "$1" <<'PY'
import re
import sys
from pathlib import Path

text = Path("pyproject.toml").read_text()
try:
    import tomllib
except ImportError:  # Python 3.10: the entry-point tables are plain `name = "module"` lines
    tomllib = None
if tomllib is not None:
    project = tomllib.loads(text)["project"]
    name, version, groups = project["name"], project["version"], dict(project.get("entry-points", {}))
    groups["console_scripts"] = project.get("scripts", {})
else:
    name = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M).group(1)
    version = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)
    groups, group = {}, None
    for line in text.splitlines():
        header = re.match(r'^\[project\.(?:entry-points\.(?:"([^"]+)"|(\S+))|(scripts))\]$', line.strip())
        if header:
            group = header.group(1) or header.group(2) or "console_scripts"
            groups[group] = {}
        elif line.startswith("["):
            group = None
        elif group and "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            groups[group][key.strip()] = value.split("#")[0].strip().strip('"')
folder = Path(sys.argv[1]) / f"{name.replace('-', '_')}-{version}.dist-info"
folder.mkdir(parents=True, exist_ok=True)
(folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
(folder / "entry_points.txt").write_text("".join(
    f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in entries.items()) + "\n"
    for group, entries in groups.items()))
PY
}

# the modules the project imports besides the standard library (pytest: the check's tests)
PACER_NEEDS=(torch transformers pluggy attrs omegaconf yaml safetensors numpy pytest)

choose_python() {
  if [ "${PACER_USE_SYSTEM_PYTHON:-0}" = 1 ]; then
    read -r -a PY <<< "${PACER_PYTHON:-python3}"
    if [ -n "${PACER_DEPS:-}" ]; then  # pure-Python dependencies copied by scripts/gpu_deps.sh
      [ -d "$PACER_DEPS" ] || { echo "$(basename "$0"): PACER_DEPS '$PACER_DEPS' is not a folder" >&2; exit 2; }
      export PYTHONPATH="$(cd "$PACER_DEPS" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
    fi
    local missing
    missing=$("${PY[@]}" -c "
import importlib.util, sys
print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))" "${PACER_NEEDS[@]}" 2>/dev/null) \
      || missing="python (${PY[*]} does not run)"
    if [ -n "$missing" ]; then
      echo "$(basename "$0"): the system Python (${PY[*]}) lacks $missing: install them, or copy the pure-Python ones" \
           "from a venv with \`bash scripts/gpu_deps.sh DIR\` and set PACER_DEPS=DIR, or name another interpreter" \
           "with PACER_PYTHON, or leave PACER_USE_SYSTEM_PYTHON unset to use the venv" >&2
      exit 2
    fi
    PACER_SITE="$(mktemp -d)"
    trap 'rm -rf "$PACER_SITE"' EXIT
    register_checkout "$PACER_SITE"
    ln -s "$PWD/plugins" "$PACER_SITE/pacer_plugins"  # the folder plugins/ is the package pacer_plugins
    export PYTHONPATH="$PACER_SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    PACER=("${PY[@]}" -m pacer_core)
    echo "system python: $("${PY[@]}" -c 'import sys; print(sys.executable, sys.version.split()[0])'), packages from $PWD"
  else
    [ -n "${PACER_SKIP_BOOTSTRAP:-}" ] || bash scripts/bootstrap.sh
    local venv="${PACER_VENV:-.venv}"
    PY=("$venv/bin/python")
    PACER=("$venv/bin/pacer")
  fi
}
