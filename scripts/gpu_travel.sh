#!/usr/bin/env bash
# What travels to a lent GPU machine (docs/gpu.md#what-travels-to-a-lent-gpu): a call to the device
# carries the working tree (tracked files and untracked files git does not ignore) and at most 64 MiB
# in all; this repository's tracked files are larger (the shipped drafts and corpora). Before such a
# call, set aside what the job there does not read; put it back after the last call.
#   bash scripts/gpu_travel.sh size            the MiB that would travel now (tracked files on disk,
#                                              untracked files not ignored)
#   bash scripts/gpu_travel.sh aside JOB       JOB: check (scripts/gpu_check.sh: no draft weights, no
#                                              corpus), bare (the code alone: a call that only carries
#                                              files) or dflash (scripts/gpu_distill.sh --kind dflash:
#                                              the code, the shipped block draft and the corpus)
#   bash scripts/gpu_travel.sh back            put back what `aside` set aside
# `aside` takes the files out of git's index and moves them into .git/gpu-aside (which never travels):
# `git status` shows them deleted until `back` restores both the files and the index entries. It
# refuses when any of them has changes (commit first), and when something is set aside already. It acts
# on the checkout it is run in.
set -euo pipefail
top=$(git rev-parse --show-toplevel 2>/dev/null) || { echo "gpu_travel.sh: run it inside the checkout whose tree travels" >&2; exit 2; }
cd "$top"
aside_dir="$(git rev-parse --git-dir)/gpu-aside"
limit_mib=64

travelling_bytes() {
  { git ls-files -z; git ls-files -z --others --exclude-standard; } |
    while IFS= read -r -d '' f; do [ -f "$f" ] && stat -c %s -- "$f"; done | awk '{s += $1} END {print s + 0}'
}

report_size() {
  local bytes
  bytes=$(travelling_bytes)
  awk -v b="$bytes" -v l="$limit_mib" 'BEGIN { printf "travels: %.1f MiB (limit %d MiB)%s\n", b / 1048576, l, (b > l * 1048576 ? ": too large" : "") }'
}

job_paths() {  # the tracked files a job does not read
  local weights='(\.safetensors|/tokenizer\.json)$'
  case "$1" in
    check) git ls-files | grep -E "$weights|^plugins/eagle/corpus(-open)?/" ;;
    bare) git ls-files | grep -E "$weights|^plugins/eagle/corpus(-open)?/|^docs/results/|\.png$" ;;
    dflash) git ls-files | grep -E "$weights|^plugins/eagle/corpus-open/|^docs/results/|\.png$" |
              grep -v -E '^plugins/(block_draft/default|eagle/corpus)/' ;;
    *) echo "gpu_travel.sh: JOB must be check, bare or dflash (got '$1')" >&2; return 2 ;;
  esac
}

case "${1:-}" in
  size) report_size ;;
  aside)
    [ $# = 2 ] || { echo "gpu_travel.sh: aside needs a JOB (check, bare or dflash)" >&2; exit 2; }
    if [ -e "$aside_dir" ]; then
      echo "gpu_travel.sh: something is set aside already ($aside_dir): run 'bash scripts/gpu_travel.sh back' first" >&2
      exit 2
    fi
    paths_text=$(job_paths "$2") || exit 2
    mapfile -t paths <<< "$paths_text"
    if [ -n "$(git status --porcelain -- "${paths[@]}")" ]; then
      echo "gpu_travel.sh: some of the files to set aside have changes: commit or restore them first" >&2
      exit 2
    fi
    mkdir -p "$aside_dir"
    printf '%s\n' "${paths[@]}" > "$aside_dir.list"
    git rm -q --cached -- "${paths[@]}"
    for f in "${paths[@]}"; do
      mkdir -p "$aside_dir/$(dirname "$f")"
      mv -- "$f" "$aside_dir/$f"
    done
    echo "gpu_travel.sh: set aside ${#paths[@]} files for '$2'; commit nothing until 'bash scripts/gpu_travel.sh back'"
    report_size ;;
  back)
    if [ ! -e "$aside_dir.list" ]; then
      echo "gpu_travel.sh: nothing is set aside" >&2; exit 2
    fi
    mapfile -t paths < "$aside_dir.list"
    for f in "${paths[@]}"; do
      mkdir -p "$(dirname "$f")"
      mv -- "$aside_dir/$f" "$f"
    done
    git reset -q -- "${paths[@]}"
    rm -rf "$aside_dir" "$aside_dir.list"
    echo "gpu_travel.sh: put back ${#paths[@]} files"
    report_size ;;
  *) echo "gpu_travel.sh: give size, aside JOB (check, bare or dflash) or back" >&2; exit 2 ;;
esac
