#!/usr/bin/env bash
# Host time per step of this checkout against an earlier commit's, measured interleaved on this machine
# (docs/host-time.md#against-the-issues-reference-code). The commit is exported to WORK/tree and installed
# into a copy of the virtual environment (WORK/venv, about 1.6 GB); then each round runs the commit's
# `pacer bench-host` and this checkout's back to back, in alternating order, and a table gives each
# stack's range over the rounds and the per-round ratio (this checkout ÷ the commit). A figure measured
# on another machine for the commit scales by that ratio. Resumable: a finished round is kept
# (WORK/ref-N.json, WORK/here-N.json) and run again only when its file is missing.
#
#   bash scripts/host_time_against.sh COMMIT [--rounds N] [--work DIR] [-- BENCH-HOST OPTIONS]
#   (default: 3 rounds, WORK runs/host-against-COMMIT, the shipped pair's shape on the CPU clock:
#    --vocab 49152 --subset 8192 --clock cpu --stacks plain,chain,tree64 --repeats 5)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
name=host_time_against.sh
fail() { echo "$name: $1" >&2; exit 2; }

[ $# -ge 1 ] || fail "give the commit to compare with, e.g. bash scripts/$name 1e817b2"
ref=$1; shift
commit=$(git rev-parse --verify --quiet "$ref^{commit}") \
  || fail "'$ref' is not a commit of this checkout: give a hash or tag from git log (a whole clone, not --depth)"
rounds=3
work=runs/host-against-${commit:0:8}
options=(--vocab 49152 --subset 8192 --clock cpu --stacks plain,chain,tree64 --repeats 5)
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds)
      [ $# -ge 2 ] && [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] && [ "$2" -le 20 ] \
        || fail "--rounds needs a whole number from 1 to 20"
      rounds=$2; shift 2 ;;
    --work)
      [ $# -ge 2 ] || fail "--work needs a folder"
      work=$2; shift 2 ;;
    --) shift; options=("$@"); break ;;
    *) fail "unknown option '$1' (--rounds N, --work DIR, then -- and bench-host's options)" ;;
  esac
done
venv=${PACER_VENV:-.venv}
[ -x "$venv/bin/pacer" ] || fail "no $venv/bin/pacer: run bash scripts/bootstrap.sh first"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

mkdir -p "$work"
work=$(cd "$work" && pwd)
if [ ! -e "$work/tree/.exported" ]; then
  echo "$name: exporting ${commit:0:8} to $work/tree"
  rm -rf "$work/tree" && mkdir "$work/tree"
  git archive "$commit" | tar -x -C "$work/tree"
  touch "$work/tree/.exported"
fi
if [ ! -x "$work/venv/bin/pacer" ]; then
  echo "$name: installing it into a copy of $venv ($work/venv)"
  rm -rf "$work/venv" && cp -a "$venv" "$work/venv"
  (cd "$work/tree" && "$work/venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .) \
    || fail "${commit:0:8} does not install (pip above): choose a commit with a pyproject.toml"
  [ -x "$work/venv/bin/pacer" ] || fail "${commit:0:8} installs no pacer command: choose a later commit"
fi

side() {  # side ref|here ROUND: one bench-host run, kept once finished
  local who=$1 round=$2 out="$work/$1-$2.json"
  [ -e "$out" ] && return
  echo "$name: round $round/$rounds, $who"
  if [ "$who" = ref ]; then
    (cd "$work/tree" && "$work/venv/bin/pacer" bench-host "${options[@]}" --json "$out.part" > "$work/$who-$round.txt")
  else
    "$venv/bin/pacer" bench-host "${options[@]}" --json "$out.part" > "$work/$who-$round.txt"
  fi
  mv "$out.part" "$out"
}
for ((round = 1; round <= rounds; round++)); do
  if ((round % 2)); then side ref "$round"; side here "$round"; else side here "$round"; side ref "$round"; fi
done

"$venv/bin/python" - "$work" "$rounds" "${commit:0:8}" <<'EOF'
import json, sys
from pathlib import Path

work, rounds, ref = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
runs = {who: [json.loads((work / f"{who}-{r}.json").read_text())["results"] for r in range(1, rounds + 1)]
        for who in ("ref", "here")}
def span(values):
    return f"{min(values):.2f}–{max(values):.2f}"
print(f"host ms per step, {rounds} rounds interleaved: {ref} against this checkout\n")
print("| stack | steps, nodes/step | " + ref + " | this checkout | ratio (per round) |\n|---|---|---|---|---|")
for i, first in enumerate(runs["ref"][0]):
    stack = first["stack"]
    ref_ms = [1000 * run[i]["host_s"] for run in runs["ref"]]
    here_ms = [1000 * next(x for x in run if x["stack"] == stack)["host_s"] for run in runs["here"]]
    shapes = {(x["steps"], round(x["nodes_per_step"], 1)) for who in runs for run in runs[who] for x in run
              if x["stack"] == stack}
    same = "{} steps, {}".format(*next(iter(shapes))) if len(shapes) == 1 else "differ: compare with care"
    ratios = [h / r for h, r in zip(here_ms, ref_ms)]
    print(f"| {stack} | {same} | {span(ref_ms)} | {span(here_ms)} | {span(ratios)} |")
EOF
