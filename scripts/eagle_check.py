"""The EAGLE check (docs/eagle-checkpoints.md#eagle-check): SafeAILab/EAGLE's own code decodes with the
shipped draft and the embedded target as this project writes them for it, beside our plain decoding.

    .venv/bin/python scripts/eagle_check.py --eagle DIR [--work DIR] [--prompts N] [--max-new-tokens N] [--threads N]

1. stops with the reason (exit 3) when no EAGLE checkout is given (``--eagle DIR`` or
   ``$PACER_EAGLE_SRC``): its code is not part of this project and is not downloaded here
   (``git clone https://github.com/SafeAILab/EAGLE DIR``);
2. installs transformers 4.53.3 (EAGLE's code needs transformers 4) with the CPU build of torch the
   project pins into an environment of its own, once (``$PACER_EAGLE_VENV``, default
   ``$PACER_CACHE/eagle-venv``; never the project's; ``$PACER_EAGLE_PIP_ARGS``: extra pip arguments,
   e.g. ``--find-links DIR`` where pip's index has no torch 2.13.0+cpu);
3. writes ``pacer export plugins/eagle/default OUT --engine eagle`` and ``pacer export-target
   OUT``, decodes ``pacer demo``'s first prompts (token ids: both sides decode the very same input)
   greedily in float32 with EAGLE's ``EaModel.eagenerate`` and ``naivegenerate``
   (scripts/eagle_check_ea.py, run with that environment's Python) and with our plain decoding, and
   prints one line per prompt.

Exit 0 when both of EAGLE's decodings give our tokens for every prompt; 1 when not, or when the install
or EAGLE's code fails; 2 for bad options; 3 without an EAGLE checkout. ``--work`` (default
runs/eagle_check) keeps the exports, prompts, EAGLE's log and each side's JSON; an earlier check's
folder is emptied first, any other non-empty one refused. Not part of .ci/run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "scripts" / "eagle_check_ea.py"
DRAFT = ROOT / "plugins" / "eagle" / "default"
PACKAGES = ("torch==2.13.0+cpu", "transformers==4.53.3")  # the project's torch pin, as a CPU build
MARKER = ".eagle-check"  # marks a work folder this check made (and may empty)


class Stop(Exception):
    """The check cannot go on: ``code`` (1, 2 or 3) and the reason, printed as one line."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code


def whole(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(f"needs a whole number from 1 to 1000, not {text!r}")
    return int(text)


def eagle_checkout(folder: str | None) -> Path:
    """The EAGLE checkout to run, or ``Stop`` (exit 3) saying how to get one."""
    clone = "git clone https://github.com/SafeAILab/EAGLE DIR"
    if not folder:
        raise Stop(3, f"no SafeAILab/EAGLE checkout given: {clone}, then --eagle DIR (or PACER_EAGLE_SRC=DIR)")
    path = Path(folder).expanduser()
    if not all((path / "eagle" / "model" / name).is_file() for name in ("ea_model.py", "cnets1.py")):
        raise Stop(
            3,
            f"'{path}' is not a SafeAILab/EAGLE checkout (no eagle/model/ea_model.py and cnets1.py): "
            f"{clone} and give that folder",
        )
    return path.resolve()


def check_environment(venv: Path) -> Path:
    """The check's environment with ``PACKAGES``, installed once (a stamp records what is in it); its Python."""
    if venv.resolve() == Path(sys.prefix).resolve():
        raise Stop(
            2,
            f"PACER_EAGLE_VENV is the project's environment ({venv}): EAGLE's code needs transformers 4; "
            "give another folder",
        )
    stamp, python = venv / ".pacer-eagle-check", venv / "bin" / "python"
    if stamp.is_file() and stamp.read_text().split() == list(PACKAGES):
        return python
    print(
        f"eagle_check: installing {' with '.join(reversed(PACKAGES))} into {venv} (first run: a minute)",
        file=sys.stderr,
        flush=True,
    )
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    extra = shlex.split(os.environ.get("PACER_EAGLE_PIP_ARGS", ""))
    if subprocess.run([str(python), "-m", "pip", "install", "-q", *extra, *PACKAGES]).returncode != 0:
        raise Stop(
            1,
            f"pip could not install {' and '.join(PACKAGES)} (PyPI's torch 2.13.0 is a CUDA build): give "
            "pip an index or a folder holding the +cpu build in PACER_EAGLE_PIP_ARGS (--extra-index-url "
            "URL or --find-links DIR)",
        )
    stamp.write_text(" ".join(PACKAGES) + "\n")
    return python


def fresh_work(work: Path) -> Path:
    """``work`` made empty: new, empty, or an earlier check's (emptied); anything else is refused."""
    if work.exists() and (not work.is_dir() or any(work.iterdir()) and not (work / MARKER).is_file()):
        raise Stop(2, f"'{work}' holds files of something else: give a new or empty folder (or an earlier check's)")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / MARKER).touch()
    return work


def pacer(*argv: str) -> None:
    """A ``pacer`` command as a user runs it; its error line ends the check."""
    done = subprocess.run([sys.executable, "-m", "pacer_core", *argv], capture_output=True, text=True)
    if done.returncode != 0:
        said = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        raise Stop(1, f"`pacer {' '.join(argv)}` failed: {said[-1] if said else f'exit {done.returncode}'}")
    print(done.stdout.strip(), flush=True)


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where ``a`` and ``b`` differ (the shorter length when one is a prefix); -1 if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def verdict(difference: int) -> str:
    return "identical" if difference < 0 else f"DIFFERENT from token {difference}"


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as every refusal of the check
        print(f"eagle_check: {message} (--help lists the options)", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="eagle_check.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "--eagle",
        default=os.environ.get("PACER_EAGLE_SRC"),
        help="a SafeAILab/EAGLE checkout (default $PACER_EAGLE_SRC)",
    )
    p.add_argument(
        "--work",
        default=str(ROOT / "runs" / "eagle_check"),
        help="the exports, prompts, EAGLE's log and the results (default runs/eagle_check)",
    )
    p.add_argument("--prompts", type=whole, default=2, help="demo prompts (default 2)")
    p.add_argument("--max-new-tokens", type=whole, default=32, help="tokens compared per prompt (default 32)")
    p.add_argument("--threads", type=whole, default=1, help="torch threads on both sides (default 1)")
    args = p.parse_args(argv)
    try:
        return run_check(args)
    except Stop as stop:
        print(f"eagle_check: {stop}", file=sys.stderr)
        return stop.code


def run_check(args: argparse.Namespace) -> int:
    eagle = eagle_checkout(args.eagle)
    try:
        import pacer_bench  # noqa: F401  (the project's environment)
    except ImportError:
        raise Stop(
            2,
            "run it with the project's Python: .venv/bin/python scripts/eagle_check.py (bash "
            "scripts/bootstrap.sh makes .venv)",
        ) from None
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cache = Path(os.environ.get("PACER_CACHE", "~/.cache/pacer-sd")).expanduser()
    work = fresh_work(Path(args.work).expanduser())
    python = check_environment(Path(os.environ.get("PACER_EAGLE_VENV", cache / "eagle-venv")).expanduser())

    import torch

    from pacer_bench.demo import demo_prompts
    from pacer_core.config import load_plan
    from pacer_core.engine import Engine, load_stack_draft
    from pacer_core.hf import load_model

    torch.set_num_threads(args.threads)
    pacer("export", str(DRAFT), str(work / "draft"), "--engine", "eagle")
    pacer("export-target", str(work / "target"))
    target, tokenizer, _ = load_model(None, "float32", "cpu", None, "target")
    plan = load_plan(
        overrides=[
            "strategy.drafter={name: autoregressive}",
            "strategy.stop=[]",
            "target.dtype=float32",
            f"generation.max_new_tokens={args.max_new_tokens}",
        ]
    )
    engine = Engine.build(target, draft=load_stack_draft(plan, tokenizer), tokenizer=tokenizer, plan=plan)
    prompts = [engine.encode(prompt.text) for prompt in demo_prompts(args.prompts)]  # chat template, as `pacer demo`
    (work / "prompts.json").write_text(json.dumps(prompts))
    ours = [list(engine.generate(list(ids)).tokens) for ids in prompts]
    (work / "ours.json").write_text(json.dumps(ours))

    command = [
        str(python),
        str(RUNNER),
        "--eagle",
        str(eagle),
        "--target",
        str(work / "target"),
        "--draft",
        str(work / "draft"),
        "--prompts",
        str(work / "prompts.json"),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--threads",
        str(args.threads),
        "--out",
        str(work / "eagle.json"),
    ]
    with open(work / "eagle.log", "w") as log:
        if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
            tail = (work / "eagle.log").read_text().strip().splitlines()[-1:]
            raise Stop(
                1, f"EAGLE's code failed ({tail[0] if tail else 'no output'}; its whole log: {work / 'eagle.log'})"
            )
    theirs = json.loads((work / "eagle.json").read_text())
    commit = "commit unknown (not a git checkout)"
    if (eagle / ".git").exists():  # its own repository, not one it lies inside
        head = subprocess.run(["git", "-C", str(eagle), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        commit = head.stdout.strip() or commit
    tree = theirs["tree"]
    print(
        f"SafeAILab/EAGLE {commit}, transformers {theirs['transformers']}, torch {theirs['torch']}; the target "
        f"as EAGLE's code read it: rope_theta {theirs['rope_theta']:g}; EAGLE-2 tree total_token "
        f"{tree['total_token']}, depth {tree['depth']}, top_k {tree['top_k']}; greedy, float32",
        flush=True,
    )
    passed = True
    for n, (ids, mine, spec, naive, steps, made) in enumerate(
        zip(prompts, ours, theirs["eagle"], theirs["naive"], theirs["steps"], theirs["eagle_new_tokens"]), 1
    ):
        spec_at, naive_at = first_difference(mine, spec), first_difference(mine, naive)
        passed = passed and spec_at < 0 and naive_at < 0

        print(
            f"prompt {n} ({len(ids)} tokens), {len(mine)} new tokens: EaModel.eagenerate {verdict(spec_at)} "
            f"({made} tokens in {steps} target forwards), naivegenerate {verdict(naive_at)} to ours plain",
            flush=True,
        )
    print(
        f"eagle check: {'passed' if passed else 'FAILED'} ({theirs['cpu_seconds']:.0f} s of CPU time in EAGLE's "
        "process)",
        flush=True,
    )
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
