"""The bench and ablation YAML: schema and validation, before any model loads.

A bench config names the models (shared by every stack), the prompt sets, the token budget and
sampling, the strategy stacks (each resolved to a validated run config, autoregressive first) and
transformers' baselines; an ablation config is one stack over a grid of run-config values. Every
problem is a one-line ``ConfigError``. The schema is documented in docs/benchmarks.md.

YAML files and override values are read with pacer_core.schema's helpers. The bench's own rules
differ from a run config's on purpose: an override sets a bench key as given (no run-config
defaults are seeded), and typed entries inside open mappings (each ``stacks`` entry) are checked
key by key, naming the keys valid where one failed.
"""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import attrs
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pacer_core.config import ModelConfig, PacerConfig, SamplingConfig, check, load_config
from pacer_core.errors import ConfigError
from pacer_core.registry import components, new_plugin_manager
from pacer_core.schema import check_finite, one_line, parse_value, read_yaml

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


def _shape(hint: Any) -> tuple[Optional[type], Any, bool]:
    """(dict or list or None, the value type of a mapping or None, whether null is allowed) of a field."""
    args = typing.get_args(hint)
    optional = typing.get_origin(hint) is typing.Union and type(None) in args
    if optional:
        hint = next(a for a in args if a is not type(None))
    if attrs.has(hint):
        return dict, None, optional
    origin = typing.get_origin(hint)
    if origin is dict:
        value = typing.get_args(hint)[1] if typing.get_args(hint) else None
        return dict, value if attrs.has(value) else None, optional
    if origin is list:
        return list, None, optional
    return None, None, optional


def _keys_of(cls: Any) -> str:
    return f" with the keys {', '.join(f.name for f in attrs.fields(cls))}" if attrs.has(cls) else ""


def _check_shapes(schema_cls: type, data: dict, where: str) -> None:
    """A section, list or stack entry given as another kind of value, named with what it must be
    (OmegaConf's own message would not say which key)."""
    hints = typing.get_type_hints(schema_cls)
    for key, value in data.items():
        hint = hints[key]
        kind, entries, optional = _shape(hint)
        if kind is None or (value is None and optional):
            continue
        if not isinstance(value, kind):
            what = "a list" if kind is list else f"a mapping{_keys_of(typing.get_args(hint)[0] if optional else hint)}"
            raise ConfigError(f"{where}: '{key}' must be {what}, got {type(value).__name__}")
        if entries is not None:
            for name, entry in value.items():
                if not isinstance(entry, dict):
                    raise ConfigError(
                        f"{where}: '{key}.{name}' must be a mapping{_keys_of(entries)}, got {type(entry).__name__}"
                    )


def _validate(schema_cls: type, data: Any, where: str) -> Any:
    """``data`` merged over ``schema_cls``'s defaults in struct mode, as an attrs object."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping of keys, got {type(data).__name__}")
    allowed = [f.name for f in attrs.fields(schema_cls)]
    for key in data:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key '{key}'; valid keys: {', '.join(allowed)}")
    _check_shapes(schema_cls, data, where)
    # typed nodes (the sections, each stack entry) refuse unknown keys; open mappings (stacks, grid,
    # inline strategy sections) take any key, their values checked by their own schema
    schema = OmegaConf.structured(schema_cls)
    OmegaConf.set_struct(schema, False)
    try:
        result = OmegaConf.to_object(OmegaConf.merge(schema, data))
    except OmegaConfBaseException as exc:
        key = str(getattr(exc, "full_key", None) or getattr(exc, "key", None) or "")
        text = one_line(exc)
        if "Key" in type(exc).__name__ or "not in struct" in text:
            valid = _valid_keys(schema_cls, key)
            hint = f"; valid keys there: {valid}" if valid else ""
            raise ConfigError(f"{where}: unknown key '{key}'{hint}") from None
        raise ConfigError(f"{where}: bad value for '{key}': {text}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {one_line(exc)}") from None
    check_finite(result, where)
    return result


def _apply_overrides(raw: Any, overrides: Sequence[str], where: str) -> None:
    for override in overrides:
        if "=" not in override:
            raise ConfigError(f"{where}: override '{override}' is not key=value (e.g. max_new_tokens=32)")
        key, value = override.split("=", 1)
        negative = next((part for part in re.split(r"[.\[\]]", key.strip()) if re.fullmatch(r"-\d+", part)), None)
        if negative is not None:  # OmegaConf would count it from the end and silently edit another item
            raise ConfigError(
                f"{where}: override '{override}': list index {negative} is negative; indices count from 0"
            )
        try:
            OmegaConf.update(raw, key.strip(), parse_value(value), merge=True)
        except (OmegaConfBaseException, ValueError, IndexError, KeyError) as exc:
            raise ConfigError(f"{where}: override '{override}': {one_line(exc)}") from None


def _read(path: Optional[str | Path], overrides: Sequence[str], schema_cls: type, what: str):
    raw = read_yaml(Path(path)) if path is not None else OmegaConf.create({})
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
) -> tuple[BenchConfig, dict[str, PacerConfig]]:
    """Read and validate a bench YAML (+ ``key=value`` overrides): the config and every stack's
    resolved run config, autoregressive first. Raises ``ConfigError`` (one line) before any model loads."""
    bench, base_dir = _read(path, overrides, BenchConfig, "bench config")
    if limit is not None:
        bench.limit = limit
    _anchor_paths(bench.stacks, base_dir, bench)
    return bench, check_bench(bench, extra_plugins)


def check_bench(bench: BenchConfig, extra_plugins: Sequence[Any] = ()) -> dict[str, PacerConfig]:
    """Value checks, and each stack resolved to a validated run config (autoregressive first)."""
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
    stacks = dict(bench.stacks)
    if BASELINE not in stacks:
        stacks = {BASELINE: StackConfig(strategy={"drafter": {"name": "autoregressive"}, "stop": []}), **stacks}
    else:
        stacks = {BASELINE: stacks.pop(BASELINE), **stacks}
    resolved, needs_draft = {}, {}
    for name, stack in stacks.items():
        check_name(name, "bench config")
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
            raise ConfigError(
                f"stacks.{name}: {drafter.where} '{drafter.component.name}' needs a draft model; "
                "set the bench's draft.path (models are shared by all stacks)"
            )
    log = bench.oracle.log_stack
    if log is not None and resolved[log].strategy.drafter.get("tree") is not None:
        raise ConfigError(
            f"bench config: oracle.log_stack '{log}' drafts a token tree (strategy.drafter.tree); "
            "the oracle replays a chain: log a stack drafting a long fixed chain"
        )
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
        cfg = load_config(None, overrides, extra_plugins=extra_plugins, require_models=False)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not any(entry.get("name") == "metrics" for entry in cfg.strategy.observers):
        cfg.strategy.observers.append({"name": "metrics"})  # the records need its numbers
    return cfg  # load_config checked it; check_bench checks its draft model


def read_ablate_config(
    path: str | Path, limit: Optional[int] = None, extra_plugins: Sequence[Any] = ()
) -> tuple[BenchConfig, dict[str, PacerConfig], dict]:
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
