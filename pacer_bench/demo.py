"""``pacer demo``: the main job — plain decoding vs speculative decoding on the embedded target.

One process, one loaded target, real prompts. Its speedups must survive a burst of load on the
machine (another process waking up during one run), so each is a paired, repeated measurement:

1. **Interleaved rounds.** Each prompt is decoded ``repeats`` times by plain decoding and by every
   stack; within a round the runs follow one another (the order rotating from round to round), so
   a stack's run and the plain run it is paired with are minutes apart at most, never a whole
   sweep apart.
2. **Paired ratios.** In each round, a stack's tokens/s over plain decoding's in the same round.
3. **Medians.** A prompt's speedup is the median of its rounds' ratios (one disturbed round of three
   cannot move it); a stack's speedup is the median of its per-prompt speedups, with a 95%
   bootstrap interval over prompts (``median_interval``).
4. **A warning** when a prompt's rounds disagree by more than ``SPREAD`` (the fastest ratio over
   the slowest), naming the worst: the machine's load changed during the run.

The clock is injected (``measure(..., clock=...)``), so tests drive it with a simulated burst.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable, Optional, Sequence

import attrs
import numpy as np

from pacer_core.config import load_plan
from pacer_core.engine import Engine, load_stack_draft
from pacer_core.errors import InputError, PacerError

from .prompts import load_prompts

DEMO_STACKS = {
    "prompt_lookup+fixed(4)": ["strategy.drafter={name: prompt_lookup}", "strategy.stop=[{name: fixed, gamma: 4}]"],
    # the shipped drafts: feature-level (plugins/eagle) and token-level (plugins/pacer_builtins)
    "draft(eagle)+fixed(2)": ["strategy.drafter={name: eagle}", "strategy.stop=[{name: fixed, gamma: 2}]"],
    # PACER as configs/pacer.yaml runs it (b 1, t0 0.3; docs/pacer.md#which-settings-are-pacers)
    "draft(eagle)+pacer": ["strategy.drafter={name: eagle}", "strategy.stop=[{name: pacer, b: 1, t0: 0.3}]"],
    "draft(token)+fixed(2)": ["strategy.drafter={name: draft_model}", "strategy.stop=[{name: fixed, gamma: 2}]"],
}
# real prompts, taken in turn from these sets: an edit that copies its input, then held-out tasks
DEMO_SETS = ("code_editing", "gsm8k", "mtbench", "humaneval")
PLAIN = "plain"
REPEATS = 3  # rounds per prompt: the median of three ignores one disturbed round
SPREAD = 1.25  # a prompt's rounds disagreeing by more than this (max ratio / min ratio): warn
SEED = 0
RESAMPLES = 2000


def demo_prompts(count: int) -> list:
    """``count`` prompts, the first of each of ``DEMO_SETS`` in turn, then the second of each, ..."""
    per_set = -(-count // len(DEMO_SETS))
    sets = [load_prompts(name, per_set) for name in DEMO_SETS]
    return [prompt for row in zip(*sets) for prompt in row][:count]


@attrs.frozen
class Run:
    """One timed generation: its tokens, seconds on the demo's clock, and τ."""

    tokens: tuple
    seconds: float
    tau: float

    @property
    def rate(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else float("nan")


def round_order(names: Sequence[str], round_index: int) -> list[str]:
    """The runs of one round: plain decoding and every stack, rotated by the round's index, so no
    stack always runs right after (or long after) plain decoding."""
    shift = round_index % len(names)
    return list(names[shift:]) + list(names[:shift])


def measure(
    engines: dict[str, Any],
    prompts: Sequence[str],
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
    progress: Optional[Callable[[int, int], None]] = None,
) -> list[list[dict[str, Run]]]:
    """runs[p][r][name]: prompt p, round r, each of ``engines`` (``PLAIN`` among them), timed on
    ``clock`` around ``engine.generate(prompt)``, in ``round_order``."""
    runs = []
    for p, prompt in enumerate(prompts):
        rounds = []
        for r in range(repeats):
            done: dict[str, Run] = {}
            for name in round_order(list(engines), r):
                start = clock()
                result = engines[name].generate(prompt)
                seconds = clock() - start
                done[name] = Run(tuple(result.tokens), seconds, float(result.metrics.get("mean_accepted_length", 1.0)))
            rounds.append(done)
            if progress is not None:
                progress(p, r)
        runs.append(rounds)
    return runs


def median_interval(
    values: Sequence[float], seed: int = SEED, resamples: int = RESAMPLES, level: float = 0.95
) -> Optional[tuple[float, float]]:
    """The percentile bootstrap interval of the median of ``values`` (None with fewer than two)."""
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return None
    draws = np.random.default_rng(seed).integers(0, values.size, size=(resamples, values.size))
    medians = np.median(values[draws], axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(medians, [tail, 1.0 - tail])
    return float(low), float(high)


def summarize(runs: list[list[dict[str, Run]]], stacks: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per stack: each prompt's round ratios and median, the median over prompts with its interval,
    the widest spread of a prompt's rounds (and which prompt), and the outputs identical to plain."""
    out = {}
    for name in stacks:
        per_prompt, spreads, identical = [], [], 0
        for rounds in runs:
            ratios = [r[name].rate / r[PLAIN].rate for r in rounds]
            per_prompt.append(
                {
                    "ratios": ratios,
                    "median": statistics.median(ratios),
                    "tau": statistics.median(r[name].tau for r in rounds),
                }
            )
            spreads.append(max(ratios) / min(ratios))
            identical += all(r[name].tokens == r[PLAIN].tokens for r in rounds)
        medians = [p["median"] for p in per_prompt]
        worst = int(np.argmax(spreads))
        out[name] = {
            "prompts": per_prompt,
            "speedup": statistics.median(medians),
            "interval": median_interval(medians),
            "spread": spreads[worst],
            "worst_prompt": worst,
            "identical": identical,
        }
    return out


def report_lines(summary: dict[str, dict[str, Any]], prompt_ids: Sequence[str], repeats: int) -> list[str]:
    """The totals: per stack its median speedup, interval and identical outputs; then a warning
    when a prompt's rounds disagree by more than ``SPREAD``."""
    lines = []
    for name, s in summary.items():
        ci = s["interval"]
        interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        lines.append(
            f"{name}: speedup {s['speedup']:.2f}x{interval} over plain decoding (median over prompts of "
            f"each prompt's median of {repeats} paired rounds; 95% interval over prompts); "
            f"{s['identical']}/{len(prompt_ids)} outputs identical to plain decoding"
        )
    shaky = {name: s for name, s in summary.items() if s["spread"] > SPREAD}
    if shaky:
        name, s = max(shaky.items(), key=lambda item: item[1]["spread"])
        ratios = s["prompts"][s["worst_prompt"]]["ratios"]
        lines.append(
            f"warning: timings unsteady: {len(shaky)} stack(s) saw a prompt's rounds disagree by more than "
            f"{SPREAD:.2f}x (worst: {name} on {prompt_ids[s['worst_prompt']]}, rounds "
            f"{', '.join(f'{r:.2f}x' for r in ratios)}); the machine's load changed during the run. The "
            "medians above ignore a disturbed round, but rerun on an idle machine (or with --repeats 5) "
            "before quoting them"
        )
    elif repeats < 3:
        lines.append(
            f"note: {repeats} round(s) per prompt: a burst of load during one run moves these figures; "
            "use --repeats 3 or more for figures to quote"
        )
    return lines


def prompt_line(prompt_id: str, rounds: list[dict[str, Run]], summary: dict[str, dict[str, Any]], index: int) -> str:
    """One prompt: plain decoding's median rate, then per stack its median speedup, τ and whether
    every round's output equals plain decoding's."""
    plain_rate = statistics.median(r[PLAIN].rate for r in rounds)
    line = [f"{prompt_id}: {len(rounds[0][PLAIN].tokens)} tokens, plain {plain_rate:.1f} tok/s (median)"]
    for name, s in summary.items():
        p = s["prompts"][index]
        same = all(r[name].tokens == r[PLAIN].tokens for r in rounds)
        line.append(f"{name} {p['median']:.2f}x τ={p['tau']:.2f} {'identical' if same else 'DIFFERENT'}")
    return " | ".join(line)


def demo_engines(target: Any, tokenizer: Any, max_new_tokens: int, dtype: str) -> dict[str, Engine]:
    """Plain decoding and every demo stack that can be built, each an engine on its own run plan
    around the one loaded ``target`` (each draft loaded once); a stack whose plugin or draft is not
    installed is skipped, saying why."""
    base = [f"generation.max_new_tokens={max_new_tokens}"]
    plain = load_plan(overrides=base + ["strategy.drafter={name: autoregressive}", "strategy.stop=[]"])
    engines = {PLAIN: Engine.build(target, tokenizer=tokenizer, plan=plain)}
    drafts: dict = {}
    for name, overrides in DEMO_STACKS.items():
        try:
            plan = load_plan(overrides=base + [f"target.dtype={dtype}"] + overrides)
            draft = load_stack_draft(plan, tokenizer, drafts)
            engines[name] = Engine.build(target, draft=draft, tokenizer=tokenizer, plan=plan)
        except PacerError as exc:  # a plugin or its artifact is not installed: say so, go on
            print(f"skipping {name}: {exc}", file=sys.stderr)
    return engines


def run_demo(
    count: int = 4,
    max_new_tokens: int = 128,
    dtype: str = "float32",
    repeats: int = REPEATS,
    clock: Callable[[], float] = time.perf_counter,
) -> int:
    """Decode ``count`` real prompts with plain decoding and every demo stack, ``repeats`` interleaved
    rounds each; print per prompt and the totals. Exit code 1 when a float32 stack's output differs
    from plain decoding."""
    from pacer_core.hf import load_model

    if count <= 0 or max_new_tokens <= 0 or repeats <= 0:
        raise InputError("--prompts, --max-new-tokens and --repeats must be positive")
    print(f"loading the embedded target (SmolLM2-135M-Instruct, {dtype}) ...", file=sys.stderr)
    target, tokenizer, _ = load_model(None, dtype, "cpu", None, "target")
    if target.packed_weights:
        print("weights packed once for CPU products (pacer_core/kernels.py)", file=sys.stderr)
    engines = demo_engines(target, tokenizer, max_new_tokens, dtype)
    prompts = demo_prompts(count)
    for engine in engines.values():  # warm-up: no engine's first (slower) call is timed
        engine.generate("Say hi.", max_new_tokens=4)
    stacks = [name for name in engines if name != PLAIN]
    print(
        f"{len(prompts)} prompts ({', '.join(DEMO_SETS[: len(prompts)])}), greedy, {dtype}, up to {max_new_tokens} "
        f"new tokens; {repeats} interleaved rounds per prompt, speedups paired within a round"
    )

    def progress(p: int, r: int) -> None:
        print(f"  {prompts[p].question_id}: round {r + 1}/{repeats}", file=sys.stderr, flush=True)

    runs = measure(engines, [p.text for p in prompts], repeats, clock, progress)
    summary = summarize(runs, stacks)
    ids = [p.question_id for p in prompts]
    for i, rounds in enumerate(runs):
        print(prompt_line(ids[i], rounds, summary, i), flush=True)
    print()
    print("\n".join(report_lines(summary, ids, repeats)))
    # greedy SD must equal plain decoding in fp32; bf16 may flip near-ties (docs/concepts.md)
    exact = all(s["identical"] == len(prompts) for s in summary.values())
    return 0 if exact or dtype != "float32" else 1
