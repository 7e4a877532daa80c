"""The run configuration: YAML + ``key=value`` overrides, validated before any model loads.

Top-level sections (a public contract): ``target``, ``draft``, ``sampling``, ``generation`` and
``strategy`` (``drafter``, ``stop``, ``verifier``, ``observers``). Each strategy entry is
``{name: <registered name>, <option>: <value>, ...}``; its options are validated against the
plugin's own attrs config class in OmegaConf struct mode, so unknown keys and names fail loudly.
The YAML reader, the overrides and the typed validation are the schema module's (pacer_core/schema.py).

A run is planned once: ``load_plan`` (or ``plan_run`` for a config already read) reads the config,
resolves its strategy stack against a new plugin manager and returns the three together as a
``RunPlan``, which every entry point hands on to the engine it builds (``Engine.from_plan``,
``Engine.build(..., plan=plan)``). ``load_config`` is for a caller that wants the validated config
only (``pacer validate``, inspecting a config).
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, cast

import attrs
import pluggy
from omegaconf import OmegaConf

from .errors import ConfigError, InputError
from .registry import ResolvedComponent, ResolvedStack, check_capabilities, components, lookup, new_plugin_manager
from .schema import apply_override, check_finite, config_class, override_list, read_yaml, validate_typed
from .skipping import SkipConfig
from .types import Component


@attrs.define
class ModelConfig:
    path: Optional[str] = None  # HF folder or .gguf file; target: None = the embedded SmolLM2
    dtype: str = "float32"  # float32 | bfloat16 | float16
    device: str = "cpu"
    device_map: Optional[str] = None
    pack_weights: Optional[bool] = None  # CPU: multiply with weights packed once; null = where supported


@attrs.define
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 0


@attrs.define
class GenerationConfig:
    max_new_tokens: int = 128
    chat_template: bool = True  # apply the tokenizer's chat template to string prompts
    ignore_eos: bool = False  # decode the full budget (benchmarks)
    max_draft_tokens: int = 64  # hard bound on one step's draft, whatever the stop policies say
    # decode a step plainly when drafting is expected to be slower (cost-aware stacks): docs/costs.md
    skip_drafting: SkipConfig = attrs.field(factory=SkipConfig)


@attrs.define
class StrategyConfig:
    drafter: Dict[str, Any] = attrs.field(factory=lambda: {"name": "prompt_lookup"})
    stop: List[Dict[str, Any]] = attrs.field(factory=lambda: [{"name": "heuristic"}])
    verifier: Dict[str, Any] = attrs.field(factory=lambda: {"name": "speculative_sampling"})
    observers: List[Dict[str, Any]] = attrs.field(factory=lambda: [{"name": "metrics"}])


@attrs.define
class PacerConfig:
    target: ModelConfig = attrs.field(factory=ModelConfig)
    draft: Optional[ModelConfig] = None
    sampling: SamplingConfig = attrs.field(factory=SamplingConfig)
    generation: GenerationConfig = attrs.field(factory=GenerationConfig)
    strategy: StrategyConfig = attrs.field(factory=StrategyConfig)


SEED_RANGE = (-(2**63), 2**64 - 1)  # what a torch.Generator accepts


def check_seed(seed: int, name: str = "sampling.seed") -> None:
    """Refuse a seed a ``torch.Generator`` cannot take (``ConfigError``, one line)."""
    low, high = SEED_RANGE
    if not low <= seed <= high:
        raise ConfigError(f"{name} must lie in [-2**63, 2**64 - 1] (a 64-bit seed), got {seed}")


def load_config(
    path: Optional[str | Path] = None,
    overrides: Sequence[str] = (),
    extra_plugins: Sequence[Any] = (),
    require_models: bool = True,
) -> PacerConfig:
    """Read a YAML file (optional), apply ``key=value`` overrides and validate everything.

    Keys the file omits keep their defaults. Strategy names and options are checked against the
    installed plugins (and ``extra_plugins``). Raises ``ConfigError`` with a one-line message.
    ``require_models=False`` is for configs used with in-memory models (``Engine.build``).
    For a config alone (to validate or inspect it); a caller that runs it plans it instead
    (``load_plan``), so its stack is resolved once and handed to the engine.
    """
    return load_plan(path, overrides, extra_plugins, require_models).config


def read_config(path: Optional[str | Path] = None, overrides: Sequence[str] = ()) -> PacerConfig:
    """``load_config`` less the strategy stack: the sections read and validated, each strategy entry
    still an open mapping that ``resolve_stack`` resolves against the installed plugins."""
    raw = read_yaml(Path(path)) if path is not None else OmegaConf.create({})
    defaults = attrs.asdict(PacerConfig())  # an override reaching into a default list or entry edits it
    for override in override_list(overrides):
        apply_override(raw, override, defaults)
    data = cast("dict[str, Any]", OmegaConf.to_container(raw))  # a DictConfig's container: a dict
    allowed = [f.name for f in attrs.fields(PacerConfig)]
    for key in data:
        if key not in allowed:
            raise ConfigError(f"unknown config section '{key}'; valid sections: {', '.join(allowed)}")
    sections: dict[str, Any] = {}
    hints = typing.get_type_hints(PacerConfig)
    for field in attrs.fields(PacerConfig):
        if field.name not in data:
            continue
        value = data[field.name]
        if field.name == "draft" and value is None:
            sections["draft"] = None
            continue
        schema = cast(type, config_class(hints[field.name]))  # ModelConfig for Optional[ModelConfig]
        if not isinstance(value, dict):
            raise ConfigError(f"section '{field.name}' must be a mapping, got {type(value).__name__}")
        # strategy entries are open mappings: resolve_stack() validates each against its component's schema
        sections[field.name] = validate_typed(schema, value, field.name, finite=field.name != "strategy")
    return PacerConfig(**sections)


def resolve_stack(cfg: PacerConfig, pm: pluggy.PluginManager, require_models: bool = True) -> ResolvedStack:
    """Validate values and resolve every strategy entry against the plugins registered in ``pm``.

    Returns the typed stack (drafter, verifier, stops, observers). Called by ``plan_run``, which
    keeps ``pm`` and the stack together (a ``RunPlan``) for the engine built next.
    ``require_models=False`` skips the check that a stack needing a draft model can load one (for
    engines built around in-memory models).
    """
    g, s = cfg.generation, cfg.sampling
    for name in ("target", "draft", "sampling", "generation"):  # strategy entries: in resolve() below
        check_finite(getattr(cfg, name), name)
    if g.max_new_tokens <= 0:
        raise ConfigError(f"generation.max_new_tokens must be positive, got {g.max_new_tokens}")
    if g.max_draft_tokens < 0:
        raise ConfigError(f"generation.max_draft_tokens must be >= 0, got {g.max_draft_tokens}")
    if s.temperature < 0:
        raise ConfigError(f"sampling.temperature must be >= 0 (0 = greedy), got {s.temperature}")
    if s.top_k < 0:
        raise ConfigError(f"sampling.top_k must be >= 0 (0 = off), got {s.top_k}")
    if not 0.0 < s.top_p <= 1.0:
        raise ConfigError(f"sampling.top_p must be in (0, 1] (1 = off), got {s.top_p}")
    check_seed(s.seed)
    for section in (cfg.target, cfg.draft):
        if section is not None and section.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"unknown dtype '{section.dtype}': use float32, bfloat16 or float16")
    table = components(pm)
    st = cfg.strategy

    def resolve(kind: str, where: str, entry: Any) -> ResolvedComponent:
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a mapping like {{name: ..., <option>: ...}}")
        options = dict(entry)
        component = lookup(table, kind, options.pop("name", None), where)
        config = validate_typed(component.config, options, f"{where} ({component.name})")
        if not any(f.name == "members" for f in attrs.fields(component.config)):
            return ResolvedComponent(where, component, config)
        if ".members[" in where:  # a composite's factory builds plain members only
            raise ConfigError(
                f"{where}: a '{component.name}' cannot be a member of another: list its members in the outer one"
            )
        entries = config.members  # a composite: its members are entries of the same kind
        if not isinstance(entries, (list, tuple)) or not entries:
            raise ConfigError(f"{where}.members must be a non-empty list of {kind} entries like {{name: ...}}")
        members = tuple(resolve(kind, f"{where}.members[{i}]", e) for i, e in enumerate(entries))
        return ResolvedComponent(where, component, config, members)

    stack = ResolvedStack(
        drafter=resolve("drafter", "strategy.drafter", st.drafter),
        verifier=resolve("verifier", "strategy.verifier", st.verifier),
        stops=tuple(resolve("stop", f"strategy.stop[{i}]", e) for i, e in enumerate(st.stop)),
        observers=tuple(resolve("observer", f"strategy.observers[{i}]", e) for i, e in enumerate(st.observers)),
    )
    has_draft = not require_models or draft_model_config(cfg, stack.draft_model_user()) is not None
    check_capabilities(stack, table, greedy=s.temperature == 0, draft_model=has_draft)
    return stack


@attrs.frozen(eq=False)
class RunPlan:
    """One run, planned: its config, the plugin manager its stack was resolved against, and that
    stack. Made once per run (``load_plan``, ``plan_run``) and handed on to the engine, which builds
    the stack's strategy objects into ``pm``: one plan builds one engine."""

    config: PacerConfig
    pm: pluggy.PluginManager
    stack: ResolvedStack


def plan_run(
    cfg: PacerConfig, extra_plugins: Sequence[Any] = (), require_models: bool = True, step_metrics: bool = False
) -> RunPlan:
    """``cfg``'s run plan: a new plugin manager (the entry-point plugins and ``extra_plugins``) and
    the stack resolved against it (``resolve_stack``). ``step_metrics``: the run reads the step
    metrics (a command's summary, the bench's records), so an observer providing them is added
    unless the stack has one (``with_step_metrics``)."""
    pm = new_plugin_manager(extra_plugins)
    if step_metrics:
        cfg = with_step_metrics(cfg, components(pm)["observer"])
    return RunPlan(cfg, pm, resolve_stack(cfg, pm, require_models))


def load_plan(
    path: Optional[str | Path] = None,
    overrides: Sequence[str] = (),
    extra_plugins: Sequence[Any] = (),
    require_models: bool = True,
    step_metrics: bool = False,
) -> RunPlan:
    """The run plan of a YAML file (optional) with ``key=value`` overrides: ``read_config``, then
    ``plan_run``. Everything is validated before any model loads (``ConfigError``, one line)."""
    return plan_run(read_config(path, overrides), extra_plugins, require_models, step_metrics)


def with_step_metrics(cfg: PacerConfig, observers: dict[str, Component]) -> PacerConfig:
    """``cfg`` with an installed observer (of ``observers``, by name) that provides ``metrics`` added,
    unless its stack has one already; the first such observer by name."""
    named = [entry.get("name") for entry in cfg.strategy.observers if isinstance(entry, dict)]
    if any("metrics" in observers[n].provides for n in named if isinstance(n, str) and n in observers):
        return cfg
    providers = sorted(n for n, c in observers.items() if "metrics" in c.provides)
    if not providers:
        raise InputError("no installed observer provides the step metrics: reinstall the project (pip install -e .)")
    strategy = attrs.evolve(cfg.strategy, observers=[*cfg.strategy.observers, {"name": providers[0]}])
    return attrs.evolve(cfg, strategy=strategy)


def draft_model_config(cfg: PacerConfig, drafter: Component) -> Optional[ModelConfig]:
    """The draft model a run loads: ``cfg.draft`` when it names a path; else, for the embedded target,
    the drafter's shipped ``default_draft`` (in the target's dtype and device); else ``None``."""
    if cfg.draft is not None and cfg.draft.path:
        return cfg.draft
    if cfg.target.path is None and drafter.default_draft:
        base = cfg.draft or ModelConfig(
            dtype=cfg.target.dtype,
            device=cfg.target.device,
            device_map=cfg.target.device_map,
            pack_weights=cfg.target.pack_weights,
        )
        return attrs.evolve(base, path=drafter.default_draft)
    return None


def to_dict(cfg: PacerConfig) -> dict[str, Any]:
    return attrs.asdict(cfg)
