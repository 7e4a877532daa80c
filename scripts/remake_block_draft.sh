#!/usr/bin/env bash
# Remakes the shipped dflash draft (plugins/block_draft/default) the way it was made: three runs of
# `pacer distill` continuing the draft shipped before them (commit 4530caf, read from git history):
#   1. 820 steps on the committed corpus's last shards (corpus.selfdistill_from=84), as runs/dflash-pub2;
#   2. 818 steps on a broader slice of it (shards 50-92), in two legs as it was trained: 286 steps
#      (train.epochs=0.35), then the same run resumed with train.epochs=1, which recomputes the step
#      count and the schedule from step 286 on;
#   3. 577 steps, one pass over the shards no earlier leg read (0-29), the target's states in float32.
# Every run is resumable: run the script again after an interruption and it goes on where it stopped
# (a finished leg is skipped: WORK/leg-N.done). About 5 hours of training on 2 CPU cores in all, after
# each run first extracts the target's states of its shards (about half a minute a shard in bf16, a
# minute in float32). Threads and bf16 make the result equal to the shipped one up to float rounding, not
# bit for bit. The finished draft is WORK/pub4/dflash-draft; install it by copying its config.json,
# draft.safetensors, manifest.json and scaling.* into plugins/block_draft/default/, then retrain the M_B
# (docs/block-drafts.md#pacer-on-blocks).
#
#   bash scripts/remake_block_draft.sh [--work DIR]     (default runs/remake-dflash)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

work=runs/remake-dflash
while [ $# -gt 0 ]; do
  case "$1" in
    --work)
      if [ $# -lt 2 ]; then echo "remake_block_draft.sh: --work needs a folder" >&2; exit 2; fi
      work=$2; shift 2 ;;
    *) echo "remake_block_draft.sh: unknown option '$1' (only --work DIR)" >&2; exit 2 ;;
  esac
done
pacer=${PACER_VENV:-.venv}/bin/pacer
if [ ! -x "$pacer" ]; then
  echo "remake_block_draft.sh: no $pacer: run bash scripts/bootstrap.sh first" >&2; exit 2
fi
base_commit=4530caf  # the shipped draft this one continues
if ! git cat-file -e "$base_commit:plugins/block_draft/default/draft.safetensors" 2>/dev/null; then
  echo "remake_block_draft.sh: commit $base_commit is not in this checkout's history: clone the whole repository (not --depth)" >&2
  exit 2
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

mkdir -p "$work/base"
for file in config.json draft.safetensors manifest.json; do
  git show "$base_commit:plugins/block_draft/default/$file" > "$work/base/$file"
done

common=(student.kind=dflash student.published=true corpus.selfdistill=plugins/eagle/corpus corpus.chat_answers=0
  corpus.stdlib_tokens=60000 corpus.docs_tokens=20000 target.dtype=bfloat16 train.threads=2 student.block=4
  train.anchors=128 train.unroll_decay=0.8 train.lr=0.002 train.checkpoint_every=50)

leg() {  # leg NUMBER TEXT ARGS...: one `pacer distill` run, skipped once it has finished
  local number=$1 text=$2; shift 2
  if [ -e "$work/leg-$number.done" ]; then
    echo "remake_block_draft.sh: $number/4 $text: done before"; return
  fi
  echo "remake_block_draft.sh: $number/4 $text"
  "$pacer" distill "${common[@]}" "$@"  # a leg's own options last: they replace the common ones
  touch "$work/leg-$number.done"
}
leg 1 "continuing the draft of $base_commit on shards 84-92 ($work/pub2)" \
  out="$work/pub2" init="$work/base" corpus.selfdistill_from=84 train.epochs=4
leg 2 "shards 50-92, the first 286 steps ($work/pub3)" \
  out="$work/pub3" init="$work/pub2/dflash-draft" corpus.selfdistill_from=50 train.epochs=0.35
leg 3 "the same run resumed to 818 steps" \
  out="$work/pub3" init="$work/pub2/dflash-draft" corpus.selfdistill_from=50 train.epochs=1
leg 4 "shards 0-29, no earlier leg read, one pass ($work/pub4)" \
  out="$work/pub4" init="$work/pub3/dflash-draft" corpus.selfdistill_from=0 corpus.selfdistill_until=30 \
  target.dtype=float32 train.epochs=1
echo "remake_block_draft.sh: the draft is in $work/pub4/dflash-draft"
