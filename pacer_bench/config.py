"""The bench and ablation YAML: schema and validation, before any model loads.

A bench config names the models (shared by every stack), the prompt sets, the token budget and
sampling, the strategy stacks (each planned as a run: ``plan_stack``, autoregressive first) and
transformers' baselines; an ablation config is one stack over a grid of run-config values. Every
problem is a one-line ``ConfigError``. The schema is documented in docs/benchmarks.md.

The YAML, its overrides and its schema are read and validated by pacer_core.schema's
``load_schema``, as every config is. An override sets a bench key as given (no run-config defaults
are seeded).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import attrs
from omegaconf import OmegaConf

from pacer_core.config import ModelConfig, RunPlan, SamplingConfig, plan_run, read_config
from pacer_core.errors import ConfigError
from pacer_core.registry import components
from pacer_core.schema import load_schema, read_yaml

from .labels import check_name, grid_points
from .prompts import PROMPT_SETS, SPECBENCH

BASELINE = "autoregressive"
PROMPT_SET_NAMES = tuple(PROMPT_SETS)
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
    # token counts k of tree-masked forwards to time too (a tree of N nodes verifies N + 1 tokens); [] = none
    verify_tree_k: List[int] = attrs.field(factory=lambda: [2, 3, 4, 8, 12, 16, 24, 32, 48, 64])


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
    multi_turn: bool = False  # every turn of multi-turn questions (MT-Bench, a question.jsonl), after the own answers
    threads: Optional[int] = None  # torch CPU threads (None = torch's default)
    sampling: SamplingConfig = attrs.field(factory=SamplingConfig)
    stacks: Dict[str, StackConfig] = attrs.field(factory=dict)
    baselines: List[str] = attrs.field(factory=list)
    baseline_options: BaselineOptions = attrs.field(factory=BaselineOptions)
    oracle: OracleConfig = attrs.field(factory=OracleConfig)
    verify_cost: bool = False  # measure and report the verification cost without an oracle, too
    plots: bool = True
    # cost profiles (shipped names or files, docs/costs.md) the report predicts every stack's speedup under
    predict: List[str] = attrs.field(factory=list)


@attrs.define
class AblateConfig:
    bench: Optional[str] = None  # the base bench YAML (relative to this file); its stacks are replaced
    overrides: List[str] = attrs.field(factory=list)  # bench key=value applied to the base
    stack: StackConfig = attrs.field(factory=StackConfig)  # every grid point starts from this stack
    grid: Dict[str, List[Any]] = attrs.field(factory=dict)  # run-config key → values (all combinations)
    # grid key → one short label per value, naming the points (else generated: pacer_bench/labels.py)
    labels: Dict[str, List[Any]] = attrs.field(factory=dict)


# -- validation --------------------------------------------------------------------------------
BENCH_EXAMPLE = "max_new_tokens=32"  # an override of a bench config, shown in messages


def _read(path: Optional[str | Path], overrides: Sequence[str], schema_cls: type, what: str):
    """The validated config of ``path`` (or the defaults) with ``overrides``, and the folder its
    relative paths start from."""
    where = f"{what} '{path}'" if path is not None else what
    config = load_schema(schema_cls, path, overrides, where, example=BENCH_EXAMPLE)
    return config, (Path(path).resolve().parent if path is not None else Path.cwd())


def _anchor_paths(stacks: Dict[str, StackConfig], base_dir: Path, bench: Optional[BenchConfig] = None) -> None:
    """Stack config paths relative to the file that names them (else left relative to the cwd);
    likewise a .jsonl prompt set that does not exist relative to the cwd."""
    for stack in stacks.values():
        if stack.config and not Path(stack.config).is_absolute() and (base_dir / stack.config).exists():
            stack.config = str(base_dir / stack.config)
    if bench is not None:
        bench.prompt_sets = [_anchor_prompt_set(name, base_dir) for name in bench.prompt_sets]


def _anchor_prompt_set(name: str, base_dir: Path) -> str:
    """A .jsonl prompt set, or the question file of ``specbench:PATH``, relative to the bench file
    when it does not exist relative to the cwd."""
    prefix, path = (SPECBENCH + ":", name[len(SPECBENCH) + 1 :]) if name.startswith(SPECBENCH + ":") else ("", name)
    if (prefix or path.endswith(".jsonl")) and not Path(path).exists() and (base_dir / path).exists():
        return prefix + str(base_dir / path)
    return name


def read_bench_config(
    path: Optional[str | Path],
    overrides: Sequence[str] = (),
    limit: Optional[int] = None,
    extra_plugins: Sequence[Any] = (),
) -> tuple[BenchConfig, dict[str, RunPlan]]:
    """Read and validate a bench YAML (+ ``key=value`` overrides): the config and every stack's run
    plan (``plan_stack``; ``extra_plugins`` registered in each), autoregressive first. Raises
    ``ConfigError`` (one line) before any model loads."""
    bench, base_dir = _read(path, overrides, BenchConfig, "bench config")
    if limit is not None:
        bench.limit = limit
    _anchor_paths(bench.stacks, base_dir, bench)
    return bench, check_bench(bench, extra_plugins)


def check_bench(bench: BenchConfig, extra_plugins: Sequence[Any] = ()) -> dict[str, RunPlan]:
    """Value checks, and each stack planned as a run (``plan_stack``; autoregressive first)."""
    _check_values(bench)
    _check_names(bench)
    plans = _plan_stacks(bench, extra_plugins)
    log = bench.oracle.log_stack
    if log is not None and plans[log].config.strategy.drafter.get("tree") is not None:
        raise ConfigError(
            f"bench config: oracle.log_stack '{log}' drafts a token tree (strategy.drafter.tree); "
            "the oracle replays a chain: log a stack drafting a long fixed chain"
        )
    drafter = plans[BASELINE].stack.drafter.component.name
    if drafter != "autoregressive":
        raise ConfigError(f"stacks.{BASELINE}: the baseline must use the autoregressive drafter, not '{drafter}'")
    return plans


def _check_values(bench: BenchConfig) -> None:
    """The bench's numbers and dtypes in range."""
    for name, value, low in (
        ("max_new_tokens", bench.max_new_tokens, 1),
        ("repeats", bench.repeats, 1),
        ("warmup", bench.warmup, 0),
        ("oracle.verify_max_k", bench.oracle.verify_max_k, 1),
        ("oracle.verify_repeats", bench.oracle.verify_repeats, 1),
    ):
        if value < low:
            raise ConfigError(f"bench config: {name} must be >= {low}, got {value}")
    tree_k = bench.oracle.verify_tree_k
    if any(not isinstance(k, int) or isinstance(k, bool) or k < 2 for k in tree_k):
        raise ConfigError(
            f"bench config: oracle.verify_tree_k must list token counts >= 2 (the pending token "
            f"and at least one tree node), got {tree_k}"
        )
    if len(set(tree_k)) != len(tree_k):
        raise ConfigError(f"bench config: oracle.verify_tree_k names a token count twice: {tree_k}")
    if bench.threads is not None and bench.threads < 1:
        raise ConfigError(f"bench config: threads must be >= 1 (or null for torch's default), got {bench.threads}")
    if bench.skip < 0:
        raise ConfigError(f"bench config: skip must be >= 0 prompts per set, got {bench.skip}")
    if bench.limit is not None and bench.limit < 1:
        raise ConfigError(f"bench config: limit must be a positive number of prompts per set, got {bench.limit}")
    for model in (bench.target, bench.draft):
        dtype = model.dtype if model is not None and model.dtype else bench.dtype
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"bench config: unknown dtype '{dtype}': use float32, bfloat16 or float16")


def _check_names(bench: BenchConfig) -> None:
    """The prompt sets, baselines and oracle's logged stack the bench names exist, each named once."""
    if not bench.prompt_sets:
        raise ConfigError(
            f"bench config: prompt_sets is empty; name at least one of {', '.join(PROMPT_SET_NAMES)} or a .jsonl file"
        )
    for name in bench.prompt_sets:
        if name not in PROMPT_SET_NAMES and not name.endswith(".jsonl") and not name.startswith(SPECBENCH + ":"):
            raise ConfigError(
                f"bench config: unknown prompt set '{name}'; available: {', '.join(PROMPT_SET_NAMES)} or a .jsonl file"
            )
    if len(set(bench.prompt_sets)) != len(bench.prompt_sets):
        raise ConfigError("bench config: prompt_sets names a set twice")
    for name in bench.baselines:
        if name not in HF_BASELINES:
            raise ConfigError(f"bench config: unknown baseline '{name}'; available: {', '.join(HF_BASELINES)}")
        if name in bench.stacks:
            raise ConfigError(f"bench config: '{name}' is both a stack and a baseline; rename the stack")
    if bench.oracle.log_stack is not None and bench.oracle.log_stack not in bench.stacks:
        raise ConfigError(
            f"bench config: oracle.log_stack '{bench.oracle.log_stack}' is not a stack; "
            f"stacks: {', '.join(bench.stacks) or 'none'}"
        )


def _plan_stacks(bench: BenchConfig, extra_plugins: Sequence[Any]) -> dict[str, RunPlan]:
    """Each stack planned as a run, the autoregressive baseline first (added when the bench has none);
    the bench's draft model set to the shipped default where stacks need one and the embedded target runs."""
    stacks = dict(bench.stacks)
    if BASELINE not in stacks:
        stacks = {BASELINE: StackConfig(strategy={"drafter": {"name": "autoregressive"}, "stop": []}), **stacks}
    else:
        stacks = {BASELINE: stacks.pop(BASELINE), **stacks}
    plans, needs_draft = {}, {}
    for name, stack in stacks.items():
        check_name(name, "bench config")
        plans[name] = plan_stack(name, stack, bench, extra_plugins)
        user = plans[name].stack.draft_model_entry()  # a composite's member included
        if user is not None:
            needs_draft[name] = user
    if bench.draft is None and bench.target.path is None:
        default = _default_draft(bench, needs_draft.values(), plans[BASELINE])
        if default is not None:
            bench.draft = BenchModelConfig(path=default)  # the shipped draft of the embedded target
    for name, drafter in needs_draft.items():
        if bench.draft is None:
            raise ConfigError(
                f"stacks.{name}: {drafter.where} '{drafter.component.name}' needs a draft model; "
                "set the bench's draft.path (models are shared by all stacks)"
            )
    return plans


def _default_draft(bench: BenchConfig, drafters: Iterable[Any], baseline: RunPlan) -> Optional[str]:
    """The shipped draft the bench loads when it runs the embedded target without a ``draft``: the
    default draft of the first stack drafter needing a model, else (for ``hf_assisted_*`` baselines)
    that of the ``draft_model`` drafter (installed with the plugins of the ``baseline`` stack's
    plan). Models are shared by all stacks, so there is one."""
    for drafter in drafters:
        if drafter.component.default_draft:
            return drafter.component.default_draft
    if any(HF_BASELINES[name] for name in bench.baselines):
        drafter = components(baseline.pm)["drafter"].get("draft_model")
        return None if drafter is None else drafter.default_draft
    return None


def _deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and "name" not in value:
            out[key] = _deep_merge(out[key], value)
        else:  # lists, scalars and whole strategy entries ({name: ...}) replace
            out[key] = value
    return out


def plan_stack(name: str, stack: StackConfig, bench: BenchConfig, extra_plugins: Sequence[Any] = ()) -> RunPlan:
    """A stack's run plan (``pacer_core.config.plan_run``, with an observer of the step metrics the
    records need): its run config is its file, then its inline sections, then its overrides; the
    models, sampling, token budget and EOS handling are the bench's, shared by every stack.
    ``check_bench`` checks its draft model."""
    where = f"stacks.{name}"
    data: dict = {}
    if stack.config:
        try:
            loaded = OmegaConf.to_container(read_yaml(Path(stack.config)))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        data = {k: v for k, v in loaded.items() if k in _STACK_SECTIONS}
    for section in _STACK_SECTIONS:
        inline = getattr(stack, section)
        if inline:
            data = _deep_merge(data, {section: inline})
    forced = [
        f"sampling={json.dumps(attrs.asdict(bench.sampling))}",
        f"generation.max_new_tokens={bench.max_new_tokens}",
        f"generation.ignore_eos={json.dumps(bench.ignore_eos)}",
        f"generation.chat_template={json.dumps(bench.chat_template)}",
    ]
    overrides = [f"{key}={json.dumps(value)}" for key, value in data.items()] + list(stack.overrides) + forced
    try:
        return plan_run(read_config(None, overrides), extra_plugins, require_models=False, step_metrics=True)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def read_ablate_config(
    path: str | Path, limit: Optional[int] = None, extra_plugins: Sequence[Any] = ()
) -> tuple[BenchConfig, dict[str, RunPlan], dict]:
    """A grid YAML → the bench it runs (one stack per grid point), the stacks' run plans, ablation meta."""
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
    points = grid_points(ablate.grid, ablate.labels, f"ablate config '{path}'")
    stacks = {
        name: attrs.evolve(
            ablate.stack, overrides=list(ablate.stack.overrides) + [f"{k}={json.dumps(v)}" for k, v in point.items()]
        )
        for name, point in points.items()
    }
    bench = attrs.evolve(bench, stacks=stacks, baselines=[], oracle=OracleConfig())
    if limit is not None:
        bench.limit = limit
    return bench, check_bench(bench, extra_plugins), {"keys": keys, "points": points}


def is_bench_config(path: str | Path) -> bool:
    """Shipped bench and grid configs are named bench*.yaml / ablate*.yaml (not run configs)."""
    return Path(path).name.startswith(("bench", "ablate"))


def model_config(m: BenchModelConfig, bench: BenchConfig) -> ModelConfig:
    """A bench model section as a run's model section: a null dtype or device takes the bench's."""
    return ModelConfig(
        path=m.path,
        dtype=m.dtype or bench.dtype,
        device=m.device or bench.device,
        device_map=m.device_map,
        pack_weights=m.pack_weights,
    )
