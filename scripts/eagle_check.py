"""The EAGLE check's comparison (scripts/eagle_check.sh, docs/eagle-checkpoints.md#eagle-check), run with
the project's Python: the shipped draft and the embedded target written as EAGLE's code reads them
(``pacer export DRAFT OUT --engine eagle``, ``pacer export-target OUT``), EAGLE's own code decoding with
them (scripts/eagle_check_ea.py, in the check's environment) and this project's plain greedy decoding
of the same prompts (token ids: both decode the very same input), float32, compared token for token.

Prints one line per prompt and exits 0 when EAGLE's speculative decoding (``EaModel.eagenerate``) and
its plain decoding (``naivegenerate``) both give our tokens for every prompt, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "scripts" / "eagle_check_ea.py"
DRAFT = ROOT / "plugins" / "feature_draft" / "default"


def pacer(*argv: str) -> None:
    """A ``pacer`` command as a user runs it; its error line ends the check."""
    done = subprocess.run([sys.executable, "-m", "pacer_core", *argv], capture_output=True, text=True)
    if done.returncode != 0:
        said = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        raise SystemExit(f"eagle_check: `pacer {' '.join(argv)}` failed: {said[-1] if said else done.returncode}")
    print(done.stdout.strip(), flush=True)


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where ``a`` and ``b`` differ (the shorter length when one is a prefix); -1 if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", required=True, help="the check environment's Python (transformers 4.53)")
    p.add_argument("--eagle", required=True, help="a SafeAILab/EAGLE checkout")
    p.add_argument("--work", required=True, help="a folder for the exports, prompts and results")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import torch

    from pacer_bench.demo import demo_prompts
    from pacer_core.config import check, load_config
    from pacer_core.engine import Engine, load_stack_draft
    from pacer_core.hf import load_model

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    pacer("export", str(DRAFT), str(work / "draft"), "--engine", "eagle")
    pacer("export-target", str(work / "target"))

    target, tokenizer, _ = load_model(None, "float32", "cpu", None, "target")
    cfg = load_config(overrides=["strategy.drafter={name: autoregressive}", "strategy.stop=[]", "target.dtype=float32",
                                 f"generation.max_new_tokens={args.max_new_tokens}"])
    engine = Engine.build(target, draft=load_stack_draft(cfg, check(cfg), tokenizer), tokenizer=tokenizer, cfg=cfg)
    prompts = [engine.encode(prompt.text) for prompt in demo_prompts(args.prompts)]  # chat template, as `pacer demo`
    (work / "prompts.json").write_text(json.dumps(prompts))
    ours = [list(engine.generate(list(ids)).tokens) for ids in prompts]
    (work / "ours.json").write_text(json.dumps(ours))

    command = ["nice", "-n", "15", args.python, str(RUNNER), "--eagle", args.eagle, "--target", str(work / "target"),
               "--draft", str(work / "draft"), "--prompts", str(work / "prompts.json"),
               "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads),
               "--out", str(work / "eagle.json")]
    with open(work / "eagle.log", "w") as log:
        if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
            tail = (work / "eagle.log").read_text().strip().splitlines()[-1:]
            print(f"eagle_check: EAGLE's code failed ({tail[0] if tail else 'no output'}; all of it in "
                  f"{work / 'eagle.log'})", file=sys.stderr)
            return 1
    theirs = json.loads((work / "eagle.json").read_text())
    commit = "commit unknown (not a git checkout)"
    if (Path(args.eagle) / ".git").exists():  # its own repository, not one it lies inside
        said = subprocess.run(["git", "-C", args.eagle, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        commit = said.stdout.strip() or commit
    tree = theirs["tree"]
    print(f"SafeAILab/EAGLE {commit}, transformers {theirs['transformers']}, torch {theirs['torch']}; the target "
          f"as EAGLE's code read it: rope_theta {theirs['rope_theta']:g}; EAGLE-2 tree total_token "
          f"{tree['total_token']}, depth {tree['depth']}, top_k {tree['top_k']}; greedy, float32", flush=True)
    passed = True
    for n, (ids, mine, spec, naive, steps, made) in enumerate(zip(
            prompts, ours, theirs["eagle"], theirs["naive"], theirs["steps"], theirs["eagle_new_tokens"]), 1):
        spec_at, naive_at = first_difference(mine, spec), first_difference(mine, naive)
        passed = passed and spec_at < 0 and naive_at < 0

        def said(at: int) -> str:
            return "identical" if at < 0 else f"DIFFERENT from token {at}"

        print(f"prompt {n} ({len(ids)} tokens), {len(mine)} new tokens: EaModel.eagenerate {said(spec_at)} "
              f"({made} tokens in {steps} target forwards), naivegenerate {said(naive_at)} to ours plain", flush=True)
    print(f"eagle check: {'passed' if passed else 'FAILED'} ({theirs['cpu_seconds']:.0f} s of CPU time in EAGLE's "
          "process)", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
