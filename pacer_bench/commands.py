"""The harness's commands: ``pacer demo``, ``pacer bench``, ``pacer report`` and ``pacer ablate``.

Registered with the command API (pacer_core/commands.py) and listed under the ``pacer_sd.commands``
entry-point group in pyproject.toml, which is how ``pacer`` finds them.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from pacer_core.commands import Runner, command

from .compare import compare_run
from .config import read_ablate_config, read_bench_config
from .demo import DEMO_SETS, REPEATS, run_demo
from .report import write_report
from .run import run_bench


@command("demo", "the main job: plain decoding vs speculative decoding on the embedded target, real prompts")
def _setup_demo(p: argparse.ArgumentParser) -> Runner:
    p.add_argument(
        "--prompts", type=int, default=4, help=f"how many prompts, in turn from {', '.join(DEMO_SETS)} (default 4)"
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument(
        "--repeats",
        type=int,
        default=REPEATS,
        help=f"interleaved rounds per prompt; each speedup is a median of paired rounds (default {REPEATS})",
    )

    def run(args: argparse.Namespace) -> int:
        return run_demo(args.prompts, args.max_new_tokens, args.dtype, args.repeats)

    return run


def _default_out(config: Optional[str], prefix: str) -> Path:
    stem = Path(config).stem if config else prefix
    return Path("runs") / stem


@command("bench", "benchmark strategy stacks against autoregressive decoding (resumable; writes a report)")
def _setup_bench(p: argparse.ArgumentParser) -> Runner:
    p.add_argument(
        "--config", "-c", metavar="YAML", help="bench config (see docs/benchmarks.md); defaults apply to keys it omits"
    )
    p.add_argument("--limit", type=int, metavar="N", help="first N prompts of each prompt set (overrides limit)")
    p.add_argument("--out", metavar="DIR", help="results folder (default runs/<config name>); rerun to resume")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="bench config overrides, e.g. max_new_tokens=32 dtype=bfloat16",
    )

    def run(args: argparse.Namespace) -> int:
        bench, stacks = read_bench_config(args.config, args.overrides, args.limit)
        out = Path(args.out) if args.out else _default_out(args.config, "bench")
        return run_bench(bench, stacks, out, progress=not args.no_progress)

    return run


@command("report", "write report.md, results.json and plots from a bench's answers.jsonl")
def _setup_report(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("dir", metavar="DIR", help="a folder written by `pacer bench` or `pacer ablate`")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        help="only compare two stacks of DIR: their tokens/s ratio with a 95%% interval, and whether "
        "they differ beyond the noise (writes nothing)",
    )

    def run(args: argparse.Namespace) -> int:
        if args.compare:
            _, text = compare_run(Path(args.dir), *args.compare)
            print(text)
            return 0
        results = write_report(Path(args.dir), plots=not args.no_plots)
        print(results["markdown_table"])
        print(f"\nreport: {Path(args.dir) / 'report.md'}  results: {Path(args.dir) / 'results.json'}")
        return 0

    return run


@command("ablate", "run one stack over a grid of config values; one table of results")
def _setup_ablate(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("--config", "-c", metavar="YAML", required=True, help="grid config (see docs/benchmarks.md)")
    p.add_argument("--limit", type=int, metavar="N", help="first N prompts of each prompt set")
    p.add_argument("--out", metavar="DIR", help="results folder (default runs/<config name>); rerun to resume")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    def run(args: argparse.Namespace) -> int:
        bench, stacks, ablation = read_ablate_config(args.config, args.limit)
        out = Path(args.out) if args.out else _default_out(args.config, "ablate")
        return run_bench(bench, stacks, out, progress=not args.no_progress, ablation=ablation)

    return run
