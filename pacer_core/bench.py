"""``pacer bench``, ``pacer report`` and ``pacer ablate``: benchmarks whose results survive interruption.

One process loads the target (and draft) once and shares them across every strategy stack. For each
prompt, plain autoregressive decoding runs first, then each stack, then each external baseline
(transformers' own ``generate``), so machine drift hits all alike. Every generation appends one
Spec-Bench-style record to ``DIR/answers.jsonl`` (flushed and fsynced); a rerun skips the
(prompt, stack, repeat) keys already there. The report (``pacer_core.report``) is computed from that
file alone. The bench YAML schema is documented in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
import typing
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import attrs
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .cli import EXIT_INTERRUPTED, Runner, command
from .config import ModelConfig, PacerConfig, SamplingConfig, _one_line, _parse_value, _read_yaml, check, load_config, to_dict
from .errors import ConfigError, InputError
from .registry import components, new_plugin_manager

BASELINE = "autoregressive"
ANSWERS = "answers.jsonl"
META = "bench.json"
COST_MODEL = "cost_model.json"
PROMPT_SET_NAMES = ("humaneval", "gsm8k", "mtbench", "summarization", "code_editing")
HF_BASELINES = {  # name → needs the draft model
    "hf_generate": False,
    "hf_assisted_constant": True,
    "hf_assisted_heuristic": True,
    "hf_assisted_confidence": True,
    "hf_prompt_lookup": False,
}
_STACK_SECTIONS = ("strategy", "generation")  # what a stack may set; models and sampling are the bench's


# -- schema ------------------------------------------------------------------------------------
@attrs.define
class BenchModelConfig:
    path: Optional[str] = None  # HF folder or .gguf file; target: None = the embedded SmolLM2
    dtype: Optional[str] = None  # None = the bench's dtype
    device: Optional[str] = None  # None = the bench's device
    device_map: Optional[str] = None
    pack_weights: Optional[bool] = None  # CPU: multiply with weights packed once; null = where supported


@attrs.define
class StackConfig:
    """One strategy stack: a run config file and/or inline sections, then dotlist overrides."""

    config: Optional[str] = None  # a run config YAML (relative to the bench file, else to the cwd)
    strategy: Optional[Dict[str, Any]] = None  # inline strategy section (merged over the file's)
    generation: Optional[Dict[str, Any]] = None  # e.g. {max_draft_tokens: 32}
    overrides: List[str] = attrs.field(factory=list)  # e.g. ["strategy.stop.0.gamma=6"]


@attrs.define
class BaselineOptions:
    assisted_gamma: int = 4  # num_assistant_tokens of hf_assisted_constant / initial of _heuristic
    confidence_threshold: float = 0.4  # hf_assisted_confidence's assistant_confidence_threshold
    confidence_max_tokens: int = 20  # hf_assisted_confidence's num_assistant_tokens (a cap)
    prompt_lookup_num_tokens: int = 10  # hf_prompt_lookup (transformers' defaults)
    max_matching_ngram_size: int = 2


@attrs.define
class OracleConfig:
    log_stack: Optional[str] = None  # a stack drafting a long fixed window; None = no oracle analysis
    verify_max_k: int = 16  # measure one target forward over k = 1..verify_max_k tokens
    verify_repeats: int = 5  # timings per k (the median is kept)


@attrs.define
class BenchConfig:
    target: BenchModelConfig = attrs.field(factory=BenchModelConfig)
    draft: Optional[BenchModelConfig] = None
    dtype: str = "float32"  # float32 | bfloat16 | float16, for both models unless they set their own
    device: str = "auto"  # auto = cuda when available, else cpu
    prompt_sets: List[str] = attrs.field(factory=lambda: ["humaneval", "gsm8k", "mtbench", "summarization"])
    limit: Optional[int] = None  # first N prompts of each set (after `skip`)
    skip: int = 0  # leave out the first N prompts of each set: tune on a split the report never uses
    max_new_tokens: int = 128
    warmup: int = 1  # untimed generations per stack before the run
    repeats: int = 1  # each (prompt, stack) this many times
    ignore_eos: bool = False
    chat_template: bool = True
    threads: Optional[int] = None  # torch CPU threads (None = torch's default)
    sampling: SamplingConfig = attrs.field(factory=SamplingConfig)
    stacks: Dict[str, StackConfig] = attrs.field(factory=dict)
    baselines: List[str] = attrs.field(factory=list)
    baseline_options: BaselineOptions = attrs.field(factory=BaselineOptions)
    oracle: OracleConfig = attrs.field(factory=OracleConfig)
    verify_cost: bool = False  # measure and report the verification cost without an oracle, too
    plots: bool = True


@attrs.define
class AblateConfig:
    bench: Optional[str] = None  # the base bench YAML (relative to this file); its stacks are replaced
    overrides: List[str] = attrs.field(factory=list)  # bench key=value applied to the base
    stack: StackConfig = attrs.field(factory=StackConfig)  # every grid point starts from this stack
    grid: Dict[str, List[Any]] = attrs.field(factory=dict)  # run-config key → values (all combinations)


# -- validation --------------------------------------------------------------------------------
def _valid_keys(schema_cls: type, key: str) -> str:
    """The option names valid where ``key`` (a dotted path into ``schema_cls``) failed."""
    cls: Any = schema_cls
    parts = key.split(".")[:-1] if key else []
    i = 0
    while i < len(parts):
        hints = typing.get_type_hints(cls)
        hint = hints.get(parts[i])
        if hint is None:
            break
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        origin = typing.get_origin(hint)
        if origin in (dict, Dict) and len(args) == 2:
            cls, i = args[1], i + 2  # skip the mapping key
        elif origin is typing.Union and args:
            cls, i = args[0], i + 1
        else:
            cls, i = hint, i + 1
        if not attrs.has(cls):
            return ""
    return ", ".join(f.name for f in attrs.fields(cls)) if attrs.has(cls) else ""


def _validate(schema_cls: type, data: Any, where: str) -> Any:
    """``data`` merged over ``schema_cls``'s defaults in struct mode, as an attrs object."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping of keys, got {type(data).__name__}")
    allowed = [f.name for f in attrs.fields(schema_cls)]
    for key in data:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key '{key}'; valid keys: {', '.join(allowed)}")
    # typed nodes (the sections, each stack entry) refuse unknown keys; open mappings (stacks, grid,
    # inline strategy sections) take any key, their values checked by their own schema
    schema = OmegaConf.structured(schema_cls)
    OmegaConf.set_struct(schema, False)
    try:
        return OmegaConf.to_object(OmegaConf.merge(schema, data))
    except OmegaConfBaseException as exc:
        key = str(getattr(exc, "full_key", None) or getattr(exc, "key", None) or "")
        text = _one_line(exc)
        if "Key" in type(exc).__name__ or "not in struct" in text:
            valid = _valid_keys(schema_cls, key)
            hint = f"; valid keys there: {valid}" if valid else ""
            raise ConfigError(f"{where}: unknown key '{key}'{hint}") from None
        raise ConfigError(f"{where}: bad value for '{key}': {text}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {_one_line(exc)}") from None


def _apply_overrides(raw: Any, overrides: Sequence[str], where: str) -> None:
    for override in overrides:
        if "=" not in override:
            raise ConfigError(f"{where}: override '{override}' is not key=value (e.g. max_new_tokens=32)")
        key, value = override.split("=", 1)
        try:
            OmegaConf.update(raw, key.strip(), _parse_value(value), merge=True)
        except (OmegaConfBaseException, ValueError, IndexError, KeyError) as exc:
            raise ConfigError(f"{where}: override '{override}': {_one_line(exc)}") from None


def _read(path: Optional[str | Path], overrides: Sequence[str], schema_cls: type, what: str):
    raw = _read_yaml(Path(path)) if path is not None else OmegaConf.create({})
    where = f"{what} '{path}'" if path is not None else what
    _apply_overrides(raw, overrides, where)
    data = OmegaConf.to_container(raw)
    return _validate(schema_cls, data, where), (Path(path).resolve().parent if path is not None else Path.cwd())


def _anchor_paths(stacks: Dict[str, StackConfig], base_dir: Path, bench: Optional[BenchConfig] = None) -> None:
    """Stack config paths relative to the file that names them (else left relative to the cwd);
    likewise a .jsonl prompt set that does not exist relative to the cwd."""
    for stack in stacks.values():
        if stack.config and not Path(stack.config).is_absolute() and (base_dir / stack.config).exists():
            stack.config = str(base_dir / stack.config)
    if bench is not None:
        bench.prompt_sets = [str(base_dir / name) if name.endswith(".jsonl") and not Path(name).exists()
                             and (base_dir / name).exists() else name for name in bench.prompt_sets]


def read_bench_config(path: Optional[str | Path], overrides: Sequence[str] = (), limit: Optional[int] = None,
                      extra_plugins: Sequence[Any] = ()) -> tuple[BenchConfig, dict[str, PacerConfig]]:
    """Read and validate a bench YAML (+ ``key=value`` overrides): the config and every stack's
    resolved run config, autoregressive first. Raises ``ConfigError`` (one line) before any model loads."""
    bench, base_dir = _read(path, overrides, BenchConfig, "bench config")
    if limit is not None:
        bench.limit = limit
    _anchor_paths(bench.stacks, base_dir, bench)
    return bench, check_bench(bench, extra_plugins)


def check_bench(bench: BenchConfig, extra_plugins: Sequence[Any] = ()) -> dict[str, PacerConfig]:
    """Value checks, and each stack resolved to a validated run config (autoregressive first)."""
    for name, value, low in (("max_new_tokens", bench.max_new_tokens, 1), ("repeats", bench.repeats, 1),
                             ("warmup", bench.warmup, 0), ("oracle.verify_max_k", bench.oracle.verify_max_k, 1),
                             ("oracle.verify_repeats", bench.oracle.verify_repeats, 1)):
        if value < low:
            raise ConfigError(f"bench config: {name} must be >= {low}, got {value}")
    if bench.threads is not None and bench.threads < 1:
        raise ConfigError(f"bench config: threads must be >= 1 (or null for torch's default), got {bench.threads}")
    if bench.skip < 0:
        raise ConfigError(f"bench config: skip must be >= 0 prompts per set, got {bench.skip}")
    if bench.limit is not None and bench.limit < 1:
        raise ConfigError(f"bench config: limit must be a positive number of prompts per set, got {bench.limit}")
    for model in (bench.target, bench.draft):
        dtype = (model.dtype if model is not None and model.dtype else bench.dtype)
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"bench config: unknown dtype '{dtype}': use float32, bfloat16 or float16")
    if not bench.prompt_sets:
        raise ConfigError("bench config: prompt_sets is empty; name at least one of "
                          f"{', '.join(PROMPT_SET_NAMES)} or a .jsonl file")
    for name in bench.prompt_sets:
        if name not in PROMPT_SET_NAMES and not name.endswith(".jsonl"):
            raise ConfigError(f"bench config: unknown prompt set '{name}'; available: "
                              f"{', '.join(PROMPT_SET_NAMES)} or a .jsonl file")
    if len(set(bench.prompt_sets)) != len(bench.prompt_sets):
        raise ConfigError("bench config: prompt_sets names a set twice")
    for name in bench.baselines:
        if name not in HF_BASELINES:
            raise ConfigError(f"bench config: unknown baseline '{name}'; available: {', '.join(HF_BASELINES)}")
        if name in bench.stacks:
            raise ConfigError(f"bench config: '{name}' is both a stack and a baseline; rename the stack")
    if bench.oracle.log_stack is not None and bench.oracle.log_stack not in bench.stacks:
        raise ConfigError(f"bench config: oracle.log_stack '{bench.oracle.log_stack}' is not a stack; "
                          f"stacks: {', '.join(bench.stacks) or 'none'}")
    stacks = dict(bench.stacks)
    if BASELINE not in stacks:
        stacks = {BASELINE: StackConfig(strategy={"drafter": {"name": "autoregressive"}, "stop": []}), **stacks}
    else:
        stacks = {BASELINE: stacks.pop(BASELINE), **stacks}
    resolved, needs_draft = {}, {}
    for name, stack in stacks.items():
        if not name.strip() or any(c in name for c in "\n\r\t"):
            raise ConfigError(f"bench config: stack name {name!r} must be non-empty text on one line")
        resolved[name] = resolve_stack(name, stack, bench, extra_plugins)
        drafter = check(resolved[name], extra_plugins, require_models=False).drafter
        if "draft_model" in drafter.component.needs:
            needs_draft[name] = drafter
    if bench.draft is None and bench.target.path is None:
        default = _default_draft(bench, needs_draft.values(), extra_plugins)
        if default is not None:
            bench.draft = BenchModelConfig(path=default)  # the shipped draft of the embedded target
    for name, drafter in needs_draft.items():
        if bench.draft is None:
            raise ConfigError(f"stacks.{name}: {drafter.where} '{drafter.component.name}' needs a draft model; "
                              "set the bench's draft.path (models are shared by all stacks)")
    drafter = resolved[BASELINE].strategy.drafter.get("name")
    if drafter != "autoregressive":
        raise ConfigError(f"stacks.{BASELINE}: the baseline must use the autoregressive drafter, not '{drafter}'")
    return resolved


def _default_draft(bench: BenchConfig, drafters: Iterable[Any], extra_plugins: Sequence[Any]) -> Optional[str]:
    """The shipped draft the bench loads when it runs the embedded target without a ``draft``: the
    default draft of the first stack drafter needing a model, else (for ``hf_assisted_*`` baselines)
    that of the ``draft_model`` drafter. Models are shared by all stacks, so there is one."""
    for drafter in drafters:
        if drafter.component.default_draft:
            return drafter.component.default_draft
    if any(HF_BASELINES[name] for name in bench.baselines):
        drafter = components(new_plugin_manager(extra_plugins))["drafter"].get("draft_model")
        return getattr(drafter, "default_draft", None)
    return None


def _deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and "name" not in value:
            out[key] = _deep_merge(out[key], value)
        else:  # lists, scalars and whole strategy entries ({name: ...}) replace
            out[key] = value
    return out


def resolve_stack(name: str, stack: StackConfig, bench: BenchConfig, extra_plugins: Sequence[Any] = ()) -> PacerConfig:
    """A stack's run config: its file, then its inline sections, then its overrides; the models,
    sampling, token budget and EOS handling are the bench's, shared by every stack."""
    where = f"stacks.{name}"
    data: dict = {}
    if stack.config:
        try:
            loaded = OmegaConf.to_container(_read_yaml(Path(stack.config)))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        data = {k: v for k, v in loaded.items() if k in _STACK_SECTIONS}
    for section in _STACK_SECTIONS:
        inline = getattr(stack, section)
        if inline:
            data = _deep_merge(data, {section: inline})
    forced = [f"sampling={json.dumps(attrs.asdict(bench.sampling))}",
              f"generation.max_new_tokens={bench.max_new_tokens}",
              f"generation.ignore_eos={json.dumps(bench.ignore_eos)}",
              f"generation.chat_template={json.dumps(bench.chat_template)}"]
    overrides = [f"{key}={json.dumps(value)}" for key, value in data.items()] + list(stack.overrides) + forced
    try:
        cfg = load_config(None, overrides, extra_plugins=extra_plugins, require_models=False)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not any(entry.get("name") == "metrics" for entry in cfg.strategy.observers):
        cfg.strategy.observers.append({"name": "metrics"})  # the records need its numbers
    return cfg  # load_config checked it; check_bench checks its draft model


def read_ablate_config(path: str | Path, limit: Optional[int] = None,
                       extra_plugins: Sequence[Any] = ()) -> tuple[BenchConfig, dict[str, PacerConfig], dict]:
    """A grid YAML → the bench it runs (one stack per grid point), resolved stacks, ablation meta."""
    ablate, grid_dir = _read(path, (), AblateConfig, "ablate config")
    if not ablate.grid:
        raise ConfigError(f"ablate config '{path}': grid is empty; give run-config keys with lists of values")
    for key, values in ablate.grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"ablate config '{path}': grid.{key} must be a non-empty list of values")
    if ablate.bench:
        base_path = Path(ablate.bench)
        if not base_path.is_absolute() and (grid_dir / base_path).exists():
            base_path = grid_dir / base_path
        bench, base_dir = _read(base_path, ablate.overrides, BenchConfig, "bench config")
    else:
        bench, base_dir = _read(None, ablate.overrides, BenchConfig, "bench config")
    _anchor_paths({}, base_dir, bench)
    _anchor_paths({"stack": ablate.stack}, grid_dir)
    keys = list(ablate.grid)
    short = [k.split(".")[-1] for k in keys]
    labels = short if len(set(short)) == len(short) else keys
    stacks, points = {}, {}
    for values in itertools.product(*ablate.grid.values()):
        label = " ".join(f"{lab}={json.dumps(v, separators=(',', ':'))}" for lab, v in zip(labels, values))
        stacks[label] = attrs.evolve(ablate.stack, overrides=list(ablate.stack.overrides)
                                     + [f"{k}={json.dumps(v)}" for k, v in zip(keys, values)])
        points[label] = dict(zip(keys, values))
    bench = attrs.evolve(bench, stacks=stacks, baselines=[], oracle=OracleConfig())
    if limit is not None:
        bench.limit = limit
    return bench, check_bench(bench, extra_plugins), {"keys": keys, "points": points}


def is_bench_config(path: str | Path) -> bool:
    """Shipped bench and grid configs are named bench*.yaml / ablate*.yaml (not run configs)."""
    return Path(path).name.startswith(("bench", "ablate"))


# -- the answer log ----------------------------------------------------------------------------
def record_key(record: dict) -> tuple[str, str, str, int]:
    return (str(record["prompt_set"]), str(record["question_id"]), str(record["model_id"]), int(record.get("repeat", 0)))


class AnswerLog:
    """``answers.jsonl``: one JSON record per line, appended, flushed and fsynced one by one.

    Opening it keeps every complete, parseable line; a truncated last line (a kill mid-write) or any
    unparseable line is dropped and the file rewritten without it, so appends start clean.
    """

    def __init__(self, path: Path):
        self.path = path
        self.records: list[dict] = []
        self.dropped = 0
        if path.exists():
            self._load()
        self.keys = {record_key(r) for r in self.records}

    def _load(self) -> None:
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        complete, tail = lines[:-1], lines[-1]  # tail: after the last newline (empty if clean)
        good: list[bytes] = []
        seen: set = set()
        for line in complete:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                key = record_key(record)
            except (ValueError, KeyError, TypeError):
                self.dropped += 1
                continue
            if key in seen:  # never keep a duplicate
                self.dropped += 1
                continue
            seen.add(key)
            good.append(line)
            self.records.append(record)
        if tail.strip():
            self.dropped += 1
        if self.dropped:
            tmp = self.path.with_name(self.path.name + ".tmp")
            with open(tmp, "wb") as handle:
                handle.write(b"".join(line + b"\n" for line in good))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)

    def append(self, record: dict) -> None:
        key = record_key(record)
        if key in self.keys:
            raise RuntimeError(f"duplicate record {key}")
        line = json.dumps(record, ensure_ascii=False, default=_json_default) + "\n"
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        self.keys.add(key)
        self.records.append(record)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


# -- models and timing -------------------------------------------------------------------------
@attrs.define
class Models:
    target: Any
    draft: Any = None
    tokenizer: Any = None


def load_models(bench: BenchConfig) -> Models:
    """Load the bench's target (and draft) once. Tests replace this function to inject tiny models."""
    from .hf import load_draft, load_section

    target, tokenizer, _ = load_section(_model_config(bench.target, bench), "target")
    draft = None
    if bench.draft is not None:
        if not bench.draft.path:
            raise InputError("bench draft section needs a path: an HF folder or .gguf sharing the target's tokenizer")
        draft = load_draft(_model_config(bench.draft, bench), tokenizer)
    return Models(target, draft, tokenizer)


def _model_config(m: BenchModelConfig, bench: BenchConfig) -> ModelConfig:
    """A bench model section as a run's model section: a null dtype or device takes the bench's."""
    return ModelConfig(path=m.path, dtype=m.dtype or bench.dtype, device=m.device or bench.device,
                       device_map=m.device_map, pack_weights=m.pack_weights)


def _device_of(model: Any) -> str:
    device = getattr(model, "device", None)
    return str(device) if device is not None else "cpu"


def make_clock(device: str) -> Callable[[], float]:
    """``time.perf_counter``, synchronising CUDA first when the models run on a GPU."""
    if device.startswith("cuda"):
        import torch

        def clock() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()

        return clock
    return time.perf_counter


def measure_verify_costs(target: Any, context: Sequence[int], max_k: int, repeats: int,
                         clock: Callable[[], float]) -> list[float]:
    """Median seconds of one target forward over k = 1..max_k new tokens after ``context`` (cached),
    as a verification step feeds them; the cache is cropped back after each forward."""
    context = list(context)
    feed = (context * (max_k // max(len(context), 1) + 1))[:max_k]
    target.reset()
    target.forward(context, logits_from=len(context))
    base = len(target.cached_tokens)
    target.forward(feed[:1])  # one untimed forward
    target.crop(base)
    times: dict[int, list[float]] = {k: [] for k in range(1, max_k + 1)}
    for _ in range(repeats):
        for k in range(1, max_k + 1):
            start = clock()
            target.forward(feed[:k])
            times[k].append(clock() - start)
            target.crop(base)
    target.reset()
    return [sorted(v)[len(v) // 2] for _, v in sorted(times.items())]


# -- metrics -----------------------------------------------------------------------------------
def step_metrics(accept_lengths: Sequence[int], drafted_per_step: Sequence[int],
                 accepted_per_step: Sequence[int]) -> dict[str, Any]:
    """The metrics observer's per-generation numbers, from per-step lists (for external baselines)."""
    steps, drafted, accepted, emitted = len(accept_lengths), sum(drafted_per_step), sum(accepted_per_step), sum(accept_lengths)
    longest = max(drafted_per_step, default=0)
    hist: dict[int, int] = {}
    for d in drafted_per_step:
        hist[int(d)] = hist.get(int(d), 0) + 1
    return {
        "steps": steps, "drafted": drafted, "accepted": accepted, "emitted": emitted,
        "mean_accepted_length": emitted / steps if steps else 0.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "per_position_acceptance": [sum(a > i for a in accepted_per_step) / max(1, sum(d > i for d in drafted_per_step))
                                    for i in range(longest)],
        "mean_draft_length": drafted / steps if steps else 0.0,
        "draft_length_histogram": dict(sorted(hist.items())),
        "accept_lengths": list(accept_lengths),
        "drafted_per_step": list(drafted_per_step),
        "accepted_per_step": list(accepted_per_step),
    }


def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """Index of the first position where the two token lists differ (None if identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# -- units: what runs per prompt ---------------------------------------------------------------
@attrs.define
class Unit:
    name: str
    kind: str  # "stack" | "baseline"
    run: Callable[[list[int], int, int], tuple[list[int], dict, str]]  # (ids, repeat, budget) → tokens, metrics, finish
    description: dict


def _engine_unit(name: str, cfg: PacerConfig, models: Models, bench: BenchConfig, clock, extra_plugins) -> Unit:
    from .engine import Engine

    engine = Engine.build(models.target, draft=models.draft, tokenizer=models.tokenizer, cfg=cfg,
                          extra_plugins=extra_plugins, clock=clock)

    def run(ids: list[int], repeat: int, budget: int):
        result = engine.generate(ids, max_new_tokens=budget, seed=bench.sampling.seed + repeat)
        return list(result.tokens), dict(result.metrics), result.finish_reason

    description = {k: v for k, v in to_dict(cfg).items() if k in ("sampling", "generation", "strategy")}
    return Unit(name, "stack", run, description)


def _hf_unit(name: str, models: Models, bench: BenchConfig, clock) -> Unit:
    from .hf import hf_generate_traced

    o, s = bench.baseline_options, bench.sampling
    assistant = models.draft if HF_BASELINES[name] else None
    kwargs: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    if name == "hf_prompt_lookup":
        kwargs = {"prompt_lookup_num_tokens": o.prompt_lookup_num_tokens,
                  "max_matching_ngram_size": o.max_matching_ngram_size}
    elif name == "hf_assisted_constant":
        settings = {"num_assistant_tokens": o.assisted_gamma, "num_assistant_tokens_schedule": "constant",
                    "assistant_confidence_threshold": 0.0}
    elif name == "hf_assisted_heuristic":
        settings = {"num_assistant_tokens": o.assisted_gamma, "num_assistant_tokens_schedule": "heuristic",
                    "assistant_confidence_threshold": 0.0}
    elif name == "hf_assisted_confidence":
        settings = {"num_assistant_tokens": o.confidence_max_tokens, "num_assistant_tokens_schedule": "constant",
                    "assistant_confidence_threshold": o.confidence_threshold}
    if s.temperature > 0:
        kwargs.update(do_sample=True, temperature=s.temperature, top_k=s.top_k or None, top_p=s.top_p)
    eos = set() if bench.ignore_eos else set(models.target.eos_token_ids)
    description = {"baseline": name, "generate_kwargs": dict(kwargs), "assistant_settings": dict(settings)}

    def run(ids: list[int], repeat: int, budget: int):
        if s.temperature > 0:
            import torch

            torch.manual_seed(s.seed + repeat)
        tokens, trace, after = hf_generate_traced(models.target, ids, budget,
                                                  ignore_eos=bench.ignore_eos, assistant=assistant,
                                                  assistant_settings=settings or None, clock=clock, **kwargs)
        settings.update(after)  # transformers' heuristic schedule carries over to the next prompt
        accepted = [max(0, min(e - 1, d)) for e, d in zip(trace["accept_lengths"], trace["drafted_per_step"])]
        metrics = {"new_tokens": len(tokens), "wall_s": trace["wall_s"],
                   "tokens_per_s": len(tokens) / trace["wall_s"] if trace["wall_s"] > 0 else 0.0,
                   "target_forwards": trace["target_forwards"], "draft_forwards": trace["draft_forwards"]}
        metrics.update(step_metrics(trace["accept_lengths"], trace["drafted_per_step"], accepted))
        metrics.update(verify_s=trace["verify_s"], draft_s=max(0.0, trace["wall_s"] - trace["verify_s"]), stop_s=0.0)
        finish = "eos" if tokens and tokens[-1] in eos else "length"
        return tokens, metrics, finish

    return Unit(name, "baseline", run, description)


# -- the run -----------------------------------------------------------------------------------
def _settings(bench: BenchConfig, device: str) -> dict:
    """What must not change between a run and its resumption (records would not be comparable)."""
    def model(m: Optional[BenchModelConfig]):
        if m is None:
            return None
        return {"path": m.path, "dtype": m.dtype or bench.dtype, "device_map": m.device_map,
                "pack_weights": m.pack_weights}

    return {"target": model(bench.target), "draft": model(bench.draft), "device": device,
            "max_new_tokens": bench.max_new_tokens, "sampling": attrs.asdict(bench.sampling),
            "ignore_eos": bench.ignore_eos, "chat_template": bench.chat_template}


def _merge_meta(out: Path, meta: dict) -> dict:
    """Compare with the meta of an earlier run in ``out`` (refuse incomparable settings) and merge."""
    path = out / META
    if not path.exists():
        return meta
    try:
        old = json.loads(path.read_text())
    except ValueError:
        return meta
    if old.get("settings") != meta["settings"]:
        changed = [k for k in meta["settings"] if old.get("settings", {}).get(k) != meta["settings"][k]]
        raise InputError(f"'{out}' holds results of a bench with other settings ({', '.join(changed) or 'format'}): "
                         "resume with the same settings, or choose another --out")
    old_units = {u["name"]: u for u in old.get("units", [])}
    for unit in meta["units"]:
        before = old_units.get(unit["name"])
        if before is not None and before.get("config") != unit["config"]:
            raise InputError(f"'{out}' holds results of another definition of '{unit['name']}': rename the "
                             "stack, or choose another --out")
    names = [u["name"] for u in meta["units"]]
    meta["units"] = meta["units"] + [u for u in old.get("units", []) if u["name"] not in names]
    meta["prompt_sets"] = meta["prompt_sets"] + [p for p in old.get("prompt_sets", []) if p not in meta["prompt_sets"]]
    for key in ("skipped", "ablation"):
        if key in old and key not in meta:
            meta[key] = old[key]
    return meta


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    os.replace(tmp, path)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_bench(bench: BenchConfig, stacks: dict[str, PacerConfig], out: Path, *, models: Optional[Models] = None,
              extra_plugins: Sequence[Any] = (), progress: bool = True, report: bool = True,
              ablation: Optional[dict] = None) -> int:
    """Run (or resume) the bench into ``out``; write the report at the end. Returns the exit code
    (0, or 130 after Ctrl-C with the finished records kept)."""
    from .prompts import load_prompts

    out.mkdir(parents=True, exist_ok=True)
    prompt_sets = {name: load_prompts(name, bench.limit, bench.skip) for name in bench.prompt_sets}  # before models load
    if bench.threads is not None:
        import torch

        torch.set_num_threads(bench.threads)
    if models is None:
        _log("loading models ...")
        models = load_models(bench)
    if models.tokenizer is None:
        raise InputError("the bench needs a tokenizer to encode its prompts")
    device = _device_of(models.target)
    clock = make_clock(device)

    skipped: dict[str, str] = {}
    units = [_engine_unit(name, cfg, models, bench, clock, extra_plugins) for name, cfg in stacks.items()]
    for name in bench.baselines:
        if HF_BASELINES[name] and models.draft is None:
            skipped[name] = "needs a draft model: set the bench's draft.path"
            _log(f"skipping baseline {name}: it {skipped[name]}")
            continue
        units.append(_hf_unit(name, models, bench, clock))

    meta = {"version": 1, "settings": _settings(bench, device), "baseline": BASELINE,
            "prompt_sets": list(bench.prompt_sets),
            "units": [{"name": u.name, "kind": u.kind, "config": u.description} for u in units],
            "oracle": attrs.asdict(bench.oracle), "dtype": bench.dtype, "device": device, "skipped": skipped}
    if ablation is not None:
        meta["ablation"] = ablation
    meta = _merge_meta(out, json.loads(json.dumps(meta, default=_json_default)))
    _write_json(out / META, meta)
    log = AnswerLog(out / ANSWERS)
    if log.dropped:
        _log(f"dropped {log.dropped} incomplete line(s) from {out / ANSWERS} (an interrupted write)")

    # encode every prompt once; all units decode the same ids
    work = []
    too_long = 0
    for set_name, prompts in prompt_sets.items():
        for prompt in prompts:
            ids = models.tokenizer.encode(prompt.text, chat_template=bench.chat_template)
            if len(ids) + bench.max_new_tokens > models.target.max_length:
                too_long += 1
                continue
            work.append((set_name, prompt, list(ids)))
    if too_long:
        _log(f"skipping {too_long} prompt(s) longer than the target's context minus max_new_tokens")
    if not work:
        raise InputError("no prompt to run: the prompt sets are empty (check --limit and the files)")

    planned = [(s, p.question_id, u.name, r) for s, p, _ in work for r in range(bench.repeats) for u in units]
    done = sum(key in log.keys for key in planned)
    interrupted = False
    try:
        if done < len(planned):
            _warm_up(units, work[0][2], bench)
            if (bench.oracle.log_stack or bench.verify_cost) and not (out / COST_MODEL).exists():
                _log(f"measuring verification cost for k = 1..{bench.oracle.verify_max_k} tokens ...")
                verify = measure_verify_costs(models.target, work[0][2], bench.oracle.verify_max_k,
                                              bench.oracle.verify_repeats, clock)
                _write_json(out / COST_MODEL, {"verify_s": verify, "context_tokens": len(work[0][2]),
                                                "device": device, "dtype": bench.dtype})
        _run_all(units, work, bench, log, models, done, len(planned), progress)
    except KeyboardInterrupt:
        interrupted = True
    kept = sum(key in log.keys for key in planned)
    if interrupted:
        _log(f"interrupted: {kept}/{len(planned)} generations kept in {out / ANSWERS}; "
             "rerun the same command to resume")
        return EXIT_INTERRUPTED
    if report:
        from .report import write_report

        results = write_report(out, plots=bench.plots)
        print(results["markdown_table"])
        print(f"\nreport: {out / 'report.md'}  results: {out / 'results.json'}")
    return 0


def _warm_up(units: list[Unit], ids: list[int], bench: BenchConfig) -> None:
    budget = min(bench.max_new_tokens, 16)
    for unit in units:
        for _ in range(bench.warmup):
            unit.run(ids, 0, budget)


def _run_all(units: list[Unit], work: list, bench: BenchConfig, log: AnswerLog, models: Models,
             done: int, total: int, progress: bool) -> None:
    from tqdm import tqdm

    by_key = {record_key(r): r for r in log.records}
    bar = tqdm(total=total, initial=done, unit="gen", file=sys.stderr, dynamic_ncols=True,
               disable=not progress, smoothing=0.1)
    try:
        for set_name, prompt, ids in work:
            for repeat in range(bench.repeats):
                reference_key = (set_name, prompt.question_id, BASELINE, repeat)
                for unit in units:
                    key = (set_name, prompt.question_id, unit.name, repeat)
                    if key in log.keys:
                        continue
                    bar.set_postfix_str(f"{set_name} {unit.name}", refresh=False)
                    tokens, metrics, finish = unit.run(ids, repeat, bench.max_new_tokens)
                    reference = by_key.get(reference_key)
                    ref_tokens = tokens if unit.name == BASELINE else (reference or {}).get("tokens")
                    record = _record(set_name, prompt, unit, repeat, ids, tokens, metrics, finish, ref_tokens, models)
                    log.append(record)
                    by_key[key] = record
                    bar.update(1)
    finally:
        bar.close()


def _record(set_name: str, prompt: Any, unit: Unit, repeat: int, ids: list[int], tokens: list[int], metrics: dict,
            finish: str, reference: Optional[list[int]], models: Models) -> dict:
    text = models.tokenizer.decode(tokens)
    divergence = first_divergence(tokens, reference) if reference is not None else None
    return {
        "question_id": prompt.question_id,
        "category": prompt.category,
        "prompt_set": set_name,
        "model_id": unit.name,
        "kind": unit.kind,
        "repeat": repeat,
        "choices": [{"index": 0, "turns": [text], "decoding_steps": [int(metrics.get("steps", 0))],
                     "new_tokens": [len(tokens)], "wall_time": [float(metrics.get("wall_s", 0.0))],
                     "accept_lengths": list(metrics.get("accept_lengths", []))}],
        "tstamp": time.time(),
        "prompt_tokens": len(ids),
        "tokens": tokens,
        "finish_reason": finish,
        "identical_to_autoregressive": (reference is not None and divergence is None),
        "first_divergence": divergence,
        "metrics": metrics,
    }


# -- commands ----------------------------------------------------------------------------------
def _default_out(config: Optional[str], prefix: str) -> Path:
    stem = Path(config).stem if config else prefix
    return Path("runs") / stem


@command("bench", "benchmark strategy stacks against autoregressive decoding (resumable; writes a report)")
def _setup_bench(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("--config", "-c", metavar="YAML", help="bench config (see docs/benchmarks.md); defaults apply to keys it omits")
    p.add_argument("--limit", type=int, metavar="N", help="first N prompts of each prompt set (overrides limit)")
    p.add_argument("--out", metavar="DIR", help="results folder (default runs/<config name>); rerun to resume")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="bench config overrides, e.g. max_new_tokens=32 dtype=bfloat16")

    def run(args: argparse.Namespace) -> int:
        bench, stacks = read_bench_config(args.config, args.overrides, args.limit)
        out = Path(args.out) if args.out else _default_out(args.config, "bench")
        return run_bench(bench, stacks, out, progress=not args.no_progress)

    return run


@command("report", "write report.md, results.json and plots from a bench's answers.jsonl")
def _setup_report(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("dir", metavar="DIR", help="a folder written by `pacer bench` or `pacer ablate`")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")

    def run(args: argparse.Namespace) -> int:
        from .report import write_report

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
