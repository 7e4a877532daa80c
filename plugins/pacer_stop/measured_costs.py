"""The cost model of the ``pacer`` stop's throughput rule: measured once per machine and model pair,
cached, refused for another pair or when stale (docs/pacer.md#the-cost-model).

A cost file is JSON: the bench's verification-cost probe (``pacer_bench.timing.measure_verify_costs``)
gives ``verify_s`` (seconds of one target forward over k = 1..K tokens); one short generation with a
fixed window gives ``draft_token_s`` (the drafter's seconds per draft token), ``draft_forward_s``
(per draft forward, what a cost profile's ``draft_s`` prices) and ``step_s`` (a step's remaining
fixed cost). ``key`` names what it was measured for:

- the pair: the target's weights digest, the draft identity (as the pacer stop sees them,
  ``Resources``), the dtype and the device;
- the machine: the processor, the CPU count (or the accelerator's name) and the torch version;
- ``version``: the cost-model format (``COST_MODEL_VERSION``).

The cache is ``$PACER_CACHE/costs/<pair hash>.json`` (``~/.cache/pacer-sd`` by default).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any, Optional

from pacer_core import InputError, hookimpl
from pacer_core.commands import bounded_int, check_out_file, command
from pacer_core.cost_profiles import CostModel, cost_model
from pacer_core.jsonfile import read_json

COST_MODEL_VERSION = 1
# the ranges of `pacer costs`' options: forwards and generations a machine can time in minutes
MAX_K = 512
MAX_REPEATS = 100
MAX_TOKENS_TIMED = 4096
MAX_GAMMA = 64
MAX_CONTEXT = 1 << 20
MEASURE_HINT = "pacer costs"
PAIR_FIELDS = ("target_digest", "draft_identity", "dtype", "device")
MACHINE_FIELDS = ("processor", "cpus", "accelerator", "torch")


def _processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str) -> dict[str, Any]:
    """What the measured seconds depend on besides the models."""
    import torch

    accelerator = None
    if device.startswith("cuda") and torch.cuda.is_available():
        accelerator = torch.cuda.get_device_name(torch.device(device))
    return {"processor": _processor(), "cpus": os.cpu_count(), "accelerator": accelerator, "torch": torch.__version__}


def pair(target_digest: Optional[str], draft_identity: Optional[str], dtype: Any, device: Any) -> dict[str, Any]:
    return {
        "target_digest": target_digest,
        "draft_identity": draft_identity,
        "dtype": str(dtype).replace("torch.", ""),
        "device": str(device),
    }


def run_pair(resources) -> dict[str, Any]:
    """The pair of a run, from the stop's ``Resources``."""
    target = resources.target
    return pair(target.digest, resources.draft_identity, target.dtype, target.device)


def cache_folder() -> Path:
    from pacer_core.hf.artifacts import cache_root

    return cache_root() / "costs"


def cache_file(key: dict[str, Any], folder: Optional[Path] = None) -> Path:
    """Where the cost model of this pair is cached (one file per pair; the machine is checked inside)."""
    text = json.dumps({k: key[k] for k in PAIR_FIELDS}, sort_keys=True)
    return (folder or cache_folder()) / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"


def _describe(key: dict[str, Any]) -> str:
    return (
        f"target {key.get('target_digest')} with draft {key.get('draft_identity')} "
        f"({key.get('dtype')}, {key.get('device')})"
    )


def check_costs(data: Any, path: Path, key: dict[str, Any]) -> CostModel:
    """The cost model in ``data`` (a cost file's JSON), or ``InputError`` in one line when it is not
    one, was measured for another pair, or is stale (another format version, machine or torch)."""
    fix = f"measure it again with `{MEASURE_HINT}` for this run's config"
    if not (isinstance(data, dict) and isinstance(data.get("key"), dict) and isinstance(data.get("verify_s"), list)):
        raise InputError(f"'{path}' is not a cost file `{MEASURE_HINT}` wrote: {fix}")
    saved = data["key"]
    if saved.get("version") != COST_MODEL_VERSION:
        raise InputError(
            f"cost file '{path}' has cost-model version {saved.get('version')}, this code reads "
            f"version {COST_MODEL_VERSION}: {fix}"
        )
    # parts a run does not know (in-memory models have no digest) are not compared
    differs = [f for f in PAIR_FIELDS if key.get(f) is not None and saved.get(f) is not None and key[f] != saved[f]]
    if differs:
        raise InputError(
            f"cost file '{path}' was measured for {_describe(saved)}, but this run pairs {_describe(key)}: {fix}"
        )
    changed = [f for f in MACHINE_FIELDS if f in key and saved.get(f) != key[f]]
    if changed:
        was = ", ".join(f"{f} {saved.get(f)!r} (now {key[f]!r})" for f in changed)
        raise InputError(f"cost file '{path}' is stale: measured with {was}: {fix}")
    try:
        return cost_model(data)
    except (ValueError, TypeError, KeyError) as exc:
        raise InputError(f"cost file '{path}' holds no valid cost model ({exc}): {fix}") from None


def read_costs(path: Path, key: dict[str, Any]) -> CostModel:
    """The cost file at ``path`` for ``key`` (pair + machine), checked by ``check_costs``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise InputError(
            f"no cost model at '{path}' for {_describe(key)}: measure one with `{MEASURE_HINT}` "
            "(seconds), or give the stop `costs: {verify_s: [...], draft_token_s: ..., step_s: ...}`"
        )
    data = read_json(path, "cost file", f"measure it again with `{MEASURE_HINT}`", expect=None)
    return check_costs(data, path, key)


def write_costs(path: Path, key: dict[str, Any], measured: dict[str, Any]) -> Path:
    """Write a cost file atomically: ``measured`` (verify_s, draft_token_s, step_s, …) under ``key``."""
    from pacer_train import atomic_write_text

    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"key": {**key, "version": COST_MODEL_VERSION}, **measured}, indent=2) + "\n")
    return path


def full_key(pair_key: dict[str, Any]) -> dict[str, Any]:
    return {**pair_key, **machine(pair_key["device"])}


# -- measuring: `pacer costs` -------------------------------------------------------------------------
PROBE_PROMPT = "Write a Python function that returns the n-th Fibonacci number, and explain it briefly."


class StepTimer:
    """An observer timing what the cost model needs from real steps: the drafter's seconds per
    draft token and per draft forward (they differ for a block drafter, whose one forward drafts a
    block: a profile prices a forward), and a step's seconds outside drafting and verification (the
    time between two steps' observations, less the later step's draft and verify time)."""

    def __init__(self, clock):
        self.clock = clock
        self.last: Optional[float] = None
        self.per_token: list[float] = []
        self.per_forward: list[float] = []
        self.other: list[float] = []

    @hookimpl
    def pacer_start(self, state) -> None:
        self.last = None

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        now = self.clock()
        if self.last is not None:
            self.other.append(max(0.0, now - self.last - step.draft_s - step.verify_s))
        self.last = now
        drafting = max(0.0, step.draft_s - step.stop_s)
        if step.drafted:
            self.per_token.append(drafting / step.drafted)
        if step.draft_forwards:
            self.per_forward.append(drafting / step.draft_forwards)


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else 0.0


def measure_costs(engine, prompt: list[int], max_k: int, repeats: int, tokens: int) -> dict[str, Any]:
    """Measure a cost model on a built engine (a stack with a fixed window): the bench's
    verification-cost probe for k = 1..``max_k``, then one generation of ``tokens`` tokens (after a
    short warm-up) for the draft and per-step costs. Returns the cost file's measured fields."""
    from pacer_bench.timing import device_of, make_clock, measure_verify_costs

    clock = make_clock(device_of(engine.target))
    timer = StepTimer(clock)
    engine.pm.register(timer, name="pacer-costs:timer")
    try:
        engine.generate(prompt, max_new_tokens=min(8, tokens))  # warm-up
        timer.per_token, timer.per_forward, timer.other = [], [], []
        engine.generate(prompt, max_new_tokens=tokens)
    finally:
        engine.pm.unregister(timer)
    verify_s, _ = measure_verify_costs(engine.target, prompt, range(1, max_k + 1), repeats, clock)
    return {
        "verify_s": verify_s,
        "draft_token_s": _median(timer.per_token),
        "draft_forward_s": _median(timer.per_forward),
        "step_s": _median(timer.other),
        "context_tokens": len(prompt),
        "steps_timed": len(timer.per_token),
    }


def engine_pair(engine) -> dict[str, Any]:
    """The pair a ``pacer`` stop in this engine's stack would see (``Resources``)."""
    from .train import drafter_identity

    target = engine.target
    return pair(target.digest, drafter_identity(engine, engine.draft), target.dtype, target.device)


@command(
    "costs", "measure the throughput rule's cost model (seconds) for a run config's machine and models, and cache it"
)
def _setup_costs(p):
    p.add_argument("--config", "-c", metavar="YAML", help="the run config whose target, draft and drafter to measure")
    p.add_argument(
        "--out", metavar="FILE", help="write the cost file here (then give it as cost_file) instead of the cache"
    )
    p.add_argument(
        "--max-k",
        type=bounded_int(1, MAX_K),
        default=17,
        metavar="K",
        help=f"verification forwards of 1..K tokens, K from 1 to {MAX_K} (17)",
    )
    p.add_argument(
        "--repeats",
        type=bounded_int(1, MAX_REPEATS),
        default=3,
        help=f"timings per k, 1 to {MAX_REPEATS}; the median is kept (3)",
    )
    p.add_argument(
        "--tokens",
        type=bounded_int(1, MAX_TOKENS_TIMED),
        default=32,
        help=f"new tokens of the generation timing the drafter, 1 to {MAX_TOKENS_TIMED} (32)",
    )
    p.add_argument(
        "--gamma",
        type=bounded_int(1, MAX_GAMMA),
        default=4,
        help=f"the fixed window of that generation, 1 to {MAX_GAMMA} (4)",
    )
    p.add_argument(
        "--profile",
        metavar="FILE",
        help="also write a measured cost profile (docs/costs.md): chain and "
        "tree verification curves up to --profile-max-k tokens after "
        "--context cached tokens, the drafter's forward, the host time; "
        "and copy it to the machine-wide cache that sizes every later "
        "`nodes: auto` tree on this device and target (unless --no-cache)",
    )
    p.add_argument(
        "--profile-max-k",
        type=bounded_int(1, PROFILE_CHAIN_K[-1]),
        default=512,
        metavar="K",
        help=f"the profile's longest forward, 1 to {PROFILE_CHAIN_K[-1]} (512)",
    )
    p.add_argument(
        "--context",
        type=bounded_int(1, MAX_CONTEXT),
        default=300,
        help=f"cached tokens before the profile's forwards, 1 to {MAX_CONTEXT} and, with --profile-max-k, "
        "within the target's context (300)",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="with --profile: write the profile file only, leaving the machine-wide cache (and so every "
        "later `nodes: auto` tree) as it is",
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. target.dtype=bfloat16")

    return _run_costs


def _run_costs(args) -> int:
    """``pacer costs``: measure, write the cost file (and with --profile a cost profile), say where."""
    from pacer_core import cli
    from pacer_core.config import load_plan

    overrides = list(args.overrides) + [
        f"strategy.stop=[{{name: fixed, gamma: {args.gamma}}}]",
        "sampling.temperature=0",
    ]
    plan = load_plan(args.config, overrides)  # validated before any model loads
    if args.profile:
        check_out_file(args.profile, "--profile")  # before measuring
    if args.out:
        check_out_file(args.out, "--out")  # before measuring, which takes minutes
    engine = cli.build_engine(plan)
    prompt = engine.encode(PROBE_PROMPT) if engine.tokenizer is not None else list(range(1, 17))
    check_fits(engine, len(prompt) + args.max_k, "the probe prompt plus --max-k")
    if args.profile:
        check_fits(engine, args.context + args.profile_max_k, "--context plus --profile-max-k")
    measured = measure_costs(engine, prompt, args.max_k, args.repeats, args.tokens)
    key = full_key(engine_pair(engine))
    path = write_costs(Path(args.out) if args.out else cache_file(key), key, measured)
    if args.profile:
        written = write_measured_profile(Path(args.profile), engine, plan.config, prompt, measured, args)
        print(f"measured cost profile -> {written}")
        if args.no_cache:
            print("the machine-wide profile cache is left as it was (--no-cache)")
        else:
            cached, replaced = cache_profile(written, engine)
            print(
                f"{'replaced' if replaced else 'wrote'} the machine-wide profile {cached}: every later "
                f"`nodes: auto` tree on {engine.target.device} with this target now sizes itself by this "
                f"measurement (delete that file to go back to the shipped profile)"
            )
    v = measured["verify_s"]
    print(
        f"cost model for {_describe(key)}: verify {v[0] * 1e3:.2f} ms (k=1) .. {v[-1] * 1e3:.2f} ms "
        f"(k={len(v)}), draft {measured['draft_token_s'] * 1e3:.2f} ms/token "
        f"({measured['draft_forward_s'] * 1e3:.2f} ms/forward), other "
        f"{measured['step_s'] * 1e3:.2f} ms/step -> {path}"
    )
    return 0


PROFILE_CHAIN_K = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
PROFILE_TREE_K = (2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def write_measured_profile(path: Path, engine, cfg, prompt: list[int], measured: dict[str, Any], args) -> Path:
    """Measure the verification curves after ``args.context`` cached tokens and write a measured
    cost profile with this run's drafter and per-step costs (``measured``)."""
    from pacer_bench.timing import device_of, make_clock, measure_verify_costs
    from pacer_core.cost_profiles import Curve, Profile, monotone, write_profile

    clock = make_clock(device_of(engine.target))
    top = args.profile_max_k
    chain_k = [k for k in PROFILE_CHAIN_K if k <= top]
    tree_k = [k for k in PROFILE_TREE_K if k <= top]
    context = (prompt * (args.context // max(len(prompt), 1) + 1))[: args.context]
    chain, tree = measure_verify_costs(engine.target, context, chain_k, args.repeats, clock, tree_k)
    key = full_key(engine_pair(engine))
    kind = engine.draft_cost_kind  # the drafter's Component.cost_kind
    target = engine.target
    step = float(measured["step_s"]) or 1e-6
    profile = Profile(
        name=f"measured-{key['device']}-{key['dtype']}",
        kind="measured",
        device=f"{key.get('accelerator') or key['processor']} ({key['cpus']} CPUs, torch {key['torch']})",
        verify=Curve(chain_k, monotone(chain)),
        tree_verify=Curve(tree_k, monotone(tree)) if tree_k else None,
        draft={kind: Curve([1], [max(float(measured["draft_forward_s"]), 1e-6)])} if kind else {},
        host_plain=step,
        host_chain=step,
        dtype=key["dtype"],
        target={k: v for k, v in {"digest": target.digest, "vocab": target.vocab_size}.items() if v is not None},
        context=len(context),
        sources={
            "verify_s": f"pacer costs --profile, median of {args.repeats} forwards per k after {len(context)} "
            "cached tokens",
            "draft_s": "pacer costs: the drafter's seconds per draft forward (its host work included) in a "
            "generation with a fixed window",
            "host_s": "pacer costs: a step's seconds outside drafting and verifying in that generation",
        },
    )
    return write_profile(path, profile, header="measured by `pacer costs --profile` (docs/costs.md)")


def cache_profile(path: Path, engine) -> tuple[Path, bool]:
    """A copy of the measured profile where cost-sized trees on this device and target find it, and
    whether it replaced an earlier one."""
    import shutil

    from pacer_core.cost_profiles import measured_profile_path

    cached = measured_profile_path(str(engine.target.device), engine.target.digest)
    replaced = cached.exists()
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
    shutil.copyfile(path, tmp)
    os.replace(tmp, cached)
    return cached, replaced


def check_fits(engine, tokens: int, what: str) -> None:
    """Refuse, before measuring, forwards the target cannot hold: ``tokens`` (``what``) beyond its context."""
    limit = getattr(engine.target, "max_length", None)
    if isinstance(limit, int) and tokens > limit:
        raise InputError(f"{what} come to {tokens} tokens, more than the target's context of {limit}: lower them")
