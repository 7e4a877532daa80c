#!/usr/bin/env bash
# Distil an EAGLE-3-style draft for the embedded target on a lent GPU within a time budget
# (docs/draft.md#on-a-lent-gpu-scriptsgpu_distillsh):
#   1. bootstrap the venv;
#   2. `pacer corpus` grows the self-distillation corpus on the GPU (bfloat16, large batches) for
#      a share of the budget (--corpus-share, default 0.4), shard by shard (default: the committed
#      plugins/feature_draft/corpus);
#   3. `pacer distill` distils the eagle3 family with the training-time test (train.unroll=3) on the
#      GPU from that corpus and the built-in text, until the budget ends (train.max_seconds), then
#      exports OUT/draft (manifest, scaling.json, scaling.png); `pacer distill` options after `--`
#      replace the script's (another student, a learning rate, ...);
#   4. prints the held-out agreement.
# Every stage resumes: the same command continues (more corpus shards, more training steps).
#   bash scripts/gpu_distill.sh [--minutes M] [--out DIR] [--corpus DIR] [--corpus-share F] [--init DRAFT] [--smoke] [-- KEY=VALUE...]
#   --minutes M   the whole budget (default 8)
#   --corpus-share F  the budget's share for growing the corpus (default 0.4; 0 trains on the corpus as it is)
#   --out DIR     the run folder (default runs/gpu_distill); the draft is DIR/draft
#   --corpus DIR  the corpus folder to grow (default plugins/feature_draft/corpus; DIR/corpus with --smoke)
#   --init DRAFT  start a new OUT from a draft folder or checkpoint.pt (continue a shipped or earlier draft)
#   --smoke       tiny settings on the CPU (a few minutes with the embedded target): checks the script
#   -- KEY=VALUE  `pacer distill` overrides after the script's own, e.g. a deeper feature draft grown
#                 from the shipped one: --init plugins/feature_draft/default -- student.kind=feature
#                 student.fused_layers=null train.unroll=2 student.extra_layers=1
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
minutes=8; out=runs/gpu_distill; corpus=""; init=""; smoke=0; share=0.4; overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --corpus-share) share="$2"; shift 2 ;;
    --) shift; overrides=("$@"); break ;;
    --minutes) minutes="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --corpus) corpus="$2"; shift 2 ;;
    --init) init="$2"; shift 2 ;;
    --smoke) smoke=1; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "gpu_distill.sh: unknown argument '$1' (--minutes M, --out DIR, --corpus DIR, --corpus-share F, --init DRAFT, --smoke, -- KEY=VALUE...)" >&2; exit 2 ;;
  esac
done
[ -n "${PACER_SKIP_BOOTSTRAP:-}" ] || bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
venv="${PACER_VENV:-.venv}"
seconds=$("$venv/bin/python" -c "print(int(float('$minutes') * 60))")
corpus_minutes=$("$venv/bin/python" -c "
import sys
try:
    share = float('$share')
except ValueError:
    share = -1.0
if not 0 <= share < 1:
    sys.exit('gpu_distill.sh: --corpus-share must be a number in [0, 1) (got $share): 0.4 is the default, 0 skips the corpus')
print(round(float('$minutes') * share, 2))") || exit 2

if [ "$smoke" = 1 ]; then
  corpus="${corpus:-$out/corpus}"
  device=(device=cpu dtype=float32)
  generate=(tokens=48 batch_size=4 shard_size=4 max_new_tokens=12 threads=2)
  target=(target.device=cpu target.dtype=float32)
  recipe=(corpus.stdlib_tokens=3000 corpus.docs_tokens=1000 corpus.seq_len=32 corpus.heldout_sequences=4
          student.subset_size=2048 student.intermediate_size=128
          train.epochs=1 train.batch_size=4 train.warmup=2 train.checkpoint_every=4 train.threads=2)
else
  if ! "$venv/bin/python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_distill.sh: no GPU visible; --smoke runs tiny settings on the CPU, and \`pacer distill\` runs the CPU recipe" >&2
    exit 2
  fi
  "$venv/bin/python" -c "import torch; print('GPU:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
  corpus="${corpus:-plugins/feature_draft/corpus}"
  device=(device=cuda dtype=bfloat16)
  generate=(tokens=100000000 batch_size=256 shard_size=256)  # stopped by minutes=, not by tokens
  target=(target.device=cuda target.dtype=bfloat16)
  recipe=(train.epochs=20 train.batch_size=32 train.warmup=200 train.checkpoint_every=200)
fi
mkdir -p "$out"
started=$(date +%s)

# 2. the corpus: whole shards until its share of the budget is spent
if [ "$corpus_minutes" != "0.0" ]; then
  "$venv/bin/pacer" corpus out="$corpus" "${device[@]}" "${generate[@]}" minutes="$corpus_minutes"
fi

# 3. the draft, in the time left (train.max_seconds counts from the distill command's start; 30 s are
# kept for the last held-out measurement and the export). A rerun continues the run in OUT/distill on
# the corpus it read first; to train on a grown corpus, start a new OUT with --init OUT/draft.
selfdistill=()
if [ -f "$out/distill/recipe.json" ]; then  # a rerun: the corpus choice is the run's
  recorded=$("$venv/bin/python" -c "import json; print(json.load(open('$out/distill/recipe.json'))['corpus'].get('selfdistill') or '')")
  [ -z "$recorded" ] || selfdistill=(corpus.selfdistill="$recorded")
elif [ -f "$corpus/manifest.json" ]; then
  selfdistill=(corpus.selfdistill="$corpus")
fi
left=$(( seconds - ($(date +%s) - started) - 30 ))
[ "$left" -gt 30 ] || left=30
"$venv/bin/pacer" distill out="$out/distill" export="$out/draft" "${target[@]}" "${selfdistill[@]}" \
  corpus.chat_answers=0 student.kind=eagle3 train.unroll=3 train.max_seconds="$left" "${recipe[@]}" \
  ${init:+init="$init"} "${overrides[@]}"

# 4. what it reached
"$venv/bin/python" - "$out/draft" <<'PY'
import json, sys
from pathlib import Path

draft = Path(sys.argv[1])
manifest = json.loads((draft / "manifest.json").read_text())
training, heldout = manifest["training"], manifest["heldout"]
print(f"draft: {draft} ({manifest['family']})")
print(f"training: {training['steps']}/{training['total_steps']} steps, {training['tokens_total']:,} tokens seen"
      + ("" if training["finished"] else " (time budget reached: rerun to continue)"))
print("held-out top-1 agreement with the target: "
      + ", ".join(f"{key.removeprefix('heldout_top1_')} {value:.3f}" for key, value in heldout.items()))
print("vocabulary coverage of the target's held-out greedy tokens: "
      + ", ".join(f"{size}: {c['heldout_target_greedy']:.3f}" for size, c in manifest["vocab_coverage"].items()))
PY
