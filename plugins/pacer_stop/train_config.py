"""``pacer train-preverify``'s options (``TrainPreverifyConfig``, read by ``load_train_config``),
the simulation's run plan (``simulation_plan``: its stack resolved once and checked for what M_B
reads), M_B's shape and the checkpoint tag; everything is checked before any model loads. The
stages are in train.py (docs/pacer.md)."""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any, Dict, Optional, Sequence

import attrs

from pacer_core.config import (
    GenerationConfig,
    ModelConfig,
    PacerConfig,
    RunPlan,
    SamplingConfig,
    StrategyConfig,
    draft_model_config,
    plan_run,
)
from pacer_core.errors import ConfigError
from pacer_core.schema import load_schema

from .model import PreVerifierArch

LR_FLOOR = 0.05  # the cosine schedule decays to 0.05 × train.lr
DATA_KEYS = ("target", "draft", "drafter", "verifier", "sampling", "data", "seed")  # decide items and samples


@attrs.define
class DataConfig:
    window: int = 16  # draft tokens per simulated step (the longest draft M_B learns to judge)
    max_new_tokens: int = 128  # tokens SD generates per item
    chat_prompts: int = 192  # instructions (chat template applied)
    stdlib_passages: int = 96  # Python standard-library source passages the target continues
    docs_passages: int = 48  # pydoc_data prose passages the target continues
    passage_tokens: int = 96  # prompt length of a passage
    heldout_every: int = 10  # every 10th item is held out (by item: no step of it is trained on)
    skip_draft_corpus: bool = True  # skip the sources the draft's manifest says it was distilled on;
    # false: use them all (only for a draft not trained on this project's corpus, which has no such record)


@attrs.define
class ModelShape:
    width: int = 64
    layers: int = 1
    heads: int = 4
    ffn_size: int = 128
    positional: bool = True  # ablation: false
    max_positions: int = 64
    draft_confidence: bool = False  # also read log q(x) and H(q)
    confidence_prior: bool = False  # start from the draft's cumulative confidence, learn a correction
    dropout: float = 0.1


@attrs.define
class TrainConfig:
    epochs: float = 30.0
    batch_size: int = 16  # packed sequences per optimizer step
    pack_len: int = 256  # rows per packed sequence
    lr: float = 2e-3
    warmup: int = 50
    weight_decay: float = 0.01
    checkpoint_every: int = 100
    threads: int = 0  # torch threads; 0 = torch's default


@attrs.define
class TrainPreverifyConfig:
    target: ModelConfig = attrs.field(factory=ModelConfig)
    draft: Optional[ModelConfig] = None  # for drafters with a draft model (draft_model)
    drafter: Dict[str, Any] = attrs.field(factory=lambda: {"name": "eagle"})
    verifier: Dict[str, Any] = attrs.field(factory=lambda: {"name": "speculative_sampling"})
    sampling: SamplingConfig = attrs.field(factory=SamplingConfig)
    out: str = "runs/preverify"  # working folder: items, samples, checkpoints
    export: Optional[str] = None  # the M_B folder; default <out>/mb-<shape hash>
    seed: int = 0
    data: DataConfig = attrs.field(factory=DataConfig)
    model: ModelShape = attrs.field(factory=ModelShape)
    train: TrainConfig = attrs.field(factory=TrainConfig)


def load_train_config(path: Optional[str], overrides: list[str]) -> TrainPreverifyConfig:
    cfg = load_schema(TrainPreverifyConfig, path, overrides, "train-preverify config")
    defaults = TrainPreverifyConfig()
    cfg.drafter = {"name": defaults.drafter["name"], **cfg.drafter}  # `drafter.path=...` keeps the name
    cfg.verifier = {"name": defaults.verifier["name"], **cfg.verifier}
    d = cfg.data
    if d.window < 1 or d.max_new_tokens < 1 or d.heldout_every < 2 or d.passage_tokens < 4:
        raise ConfigError(
            "data.window, data.max_new_tokens must be >= 1, data.heldout_every >= 2, data.passage_tokens >= 4"
        )
    if cfg.model.max_positions < d.window:
        raise ConfigError(f"model.max_positions ({cfg.model.max_positions}) must be >= data.window ({d.window})")
    if cfg.train.pack_len < d.window:
        raise ConfigError(f"train.pack_len ({cfg.train.pack_len}) must be >= data.window ({d.window})")
    try:
        arch(cfg, 1)
    except ValueError as exc:
        raise ConfigError(f"model: {exc}") from None
    return cfg


def arch(cfg: TrainPreverifyConfig, input_size: int) -> PreVerifierArch:
    return PreVerifierArch(input_size=input_size, **attrs.asdict(cfg.model))


RESUMABLE_TRAIN_KEYS = ("epochs", "threads", "checkpoint_every")  # a run continued with other values is the same run


def shape_tag(cfg: TrainPreverifyConfig) -> str:
    """The checkpoint's tag: M_B's shape, the seed and the training recipe (every train option but
    the epochs, to train on for longer, and the threads and checkpoint interval, which change no
    result), so another learning rate or weight decay starts its own checkpoint instead of
    resuming one made with different settings."""
    recipe = {k: v for k, v in attrs.asdict(cfg.train).items() if k not in RESUMABLE_TRAIN_KEYS}
    text = json.dumps({"model": attrs.asdict(cfg.model), "seed": cfg.seed, "train": recipe}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def log(message: str) -> None:
    print(f"train-preverify: {message}", file=sys.stderr, flush=True)


def simulation_plan(cfg: TrainPreverifyConfig, extra_plugins: Sequence[Any] = ()) -> RunPlan:
    """The simulation's run plan (``simulation_config``, with ``extra_plugins``), made once per run
    before any model loads; its drafter must provide what M_B reads (``ConfigError``, one line)."""
    plan = plan_run(simulation_config(cfg), extra_plugins, require_models=False)
    drafter = plan.stack.drafter.component
    if "draft_hidden" not in drafter.provides:
        raise ConfigError(
            f"drafter '{drafter.name}' does not provide hidden states, which M_B reads: "
            "use draft_model, eagle or dflash"
        )
    if cfg.model.draft_confidence and "draft_probs" not in drafter.provides:
        raise ConfigError(f"model.draft_confidence needs the draft's probabilities; '{drafter.name}' has none")
    user = plan.stack.draft_model_entry()  # the drafter, or a composite's member
    if user is not None and draft_model_config(plan.config, user.component) is None:
        raise ConfigError(f"drafter '{user.component.name}' needs a draft model: set draft.path")
    return plan


def simulation_config(cfg: TrainPreverifyConfig) -> PacerConfig:
    """The run config of the simulation: the drafter and verifier under test, a fixed long window."""
    d = cfg.data
    return PacerConfig(
        target=cfg.target,
        draft=cfg.draft,
        sampling=cfg.sampling,
        generation=GenerationConfig(
            max_new_tokens=d.max_new_tokens, chat_template=False, ignore_eos=False, max_draft_tokens=max(64, d.window)
        ),
        strategy=StrategyConfig(
            drafter=dict(cfg.drafter),
            stop=[{"name": "fixed", "gamma": d.window}],
            verifier=dict(cfg.verifier),
            observers=[],
        ),
    )
