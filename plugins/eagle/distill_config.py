"""The options of ``pacer distill`` (``DistillConfig``: the target, the corpus, the student and its
training) and their checks (``load_distill_config``), read by the command (distill.py) and by the
stages it runs (students.py)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import attrs

from pacer_core.config import ModelConfig
from pacer_core.errors import ConfigError
from pacer_core.schema import load_schema
from pacer_train.corpus.sources import CorpusConfig
from pacer_train.distillation import CHECKPOINT

DATA_KEYS = ("target", "seed", "corpus")  # decide the corpus and features in out/: fixed for a folder


BUILT_IN_KINDS = ("feature", "eagle3", "token")


def check_kind(kind: str) -> None:
    """A student kind ``pacer distill`` trains: a built-in one or one a plugin adds."""
    from pacer_train.students import student_kinds

    if kind not in BUILT_IN_KINDS and kind not in student_kinds():
        known = ", ".join([*BUILT_IN_KINDS, *sorted(student_kinds())])
        raise ValueError(f"student.kind must be one of {known} (got {kind!r})")


@attrs.define
class StudentConfig:
    kind: str = attrs.field(default="feature", validator=lambda _, __, value: check_kind(value))
    # feature: the EAGLE-1-style `eagle` draft (reads the target's last hidden states);
    # eagle3: the EAGLE-3-style `eagle` draft (fuses several target layers, own norm and head over the subset);
    # token: a small HF causal LM for `draft_model` / `ouroboros` / transformers' assisted generation;
    # or a kind a plugin adds (pacer_sd.students entry points): dflash, the `dflash` block draft
    # draft head vocabulary: the most frequent corpus tokens
    subset_size: int = attrs.field(default=8192, validator=[attrs.validators.ge(1), attrs.validators.le(1 << 20)])
    # feature, eagle3 and dflash kinds: the decoder layers' MLP width
    intermediate_size: int = attrs.field(default=1536, validator=[attrs.validators.ge(1), attrs.validators.le(1 << 20)])
    extra_layers: int = 0  # feature kind: decoder layers after the first (a deeper draft); with init= a
    # shallower draft, the layers it lacks start as the identity
    fused_layers: Optional[List[int]] = attrs.field(default=None, validator=lambda _, __, v: _layers(v))
    # eagle3, dflash: target decoder layers whose inputs it fuses
    # (None = EAGLE-3's low, middle and high: 2, L // 2, L - 3)
    layers: List[int] = attrs.field(factory=lambda: [0, -1])  # token kind: target layers it starts from
    block: int = attrs.field(default=8, validator=[attrs.validators.ge(1), attrs.validators.le(32)])
    # dflash: mask rows (drafted tokens) one forward fills
    draft_layers: int = attrs.field(default=2, validator=[attrs.validators.ge(1), attrs.validators.le(8)])
    # dflash: its decoder layers
    published: bool = False  # dflash: the published DFlash architecture (a block row's input is its embedding
    # alone, per-head q/k norms), the one vLLM serves, instead of ours (each row joined with the newest context feature)
    dtype: str = "bfloat16"  # token kind: storage dtype of its own tensors


def _layers(value) -> None:
    if value is not None and any(isinstance(i, bool) or not 0 <= i <= 4096 for i in value):
        raise ValueError(f"'fused_layers' must name target decoder layers (whole numbers >= 0), got {value!r}")


def _within(low: float, high: float, low_open: bool = False):
    """A validator: a number in [low, high] ((low, high] with ``low_open``), refused in one line."""

    def check(instance, attribute, value) -> None:
        if isinstance(value, bool) or not (low < value if low_open else low <= value) or not value <= high:
            bracket = "(" if low_open else "["
            raise ValueError(f"'{attribute.name}' must lie in {bracket}{low}, {high}], got {value!r}")

    return check


@attrs.define
class TrainConfig:
    epochs: float = attrs.field(default=6.0, validator=_within(0, 1e4, low_open=True))
    batch_size: int = attrs.field(default=8, validator=_within(1, 4096))
    lr: float = attrs.field(default=1e-3, validator=_within(0, 10, low_open=True))
    warmup: int = attrs.field(default=100, validator=_within(0, 1 << 30))
    weight_decay: float = attrs.field(default=0.0, validator=_within(0, 10))
    feature_weight: float = attrs.field(default=1.0, validator=_within(0, 1e6))
    ce_weight: float = attrs.field(default=0.1, validator=_within(0, 1e6))
    teacher_temperature: float = 1.0  # the cross-entropy's target is softmax(target logits / this); < 1 sharpens it
    noise: float = attrs.field(default=0.1, validator=_within(0, 1e3))  # uniform noise on input features, ±noise
    unroll: int = 2  # training-time test: draft steps trained per row, steps >= 2 fed the network's own
    # predicted feature (1 = EAGLE-1's loss)
    unroll_decay: float = 1.0  # weight of draft step j: unroll_decay ** (j - 1)
    # steps between checkpoints, also when the held-out agreement is measured (scaling.json)
    checkpoint_every: int = attrs.field(default=100, validator=_within(1, 1 << 30))
    max_seconds: float = 0.0  # stop training (checkpoint, then export) once the command has run this long; 0 = no limit
    threads: int = attrs.field(default=0, validator=_within(0, 256))  # torch threads; 0 = torch's default
    anchors: int = attrs.field(default=48, validator=[attrs.validators.ge(1), attrs.validators.le(4096)])
    # dflash: blocks trained per sequence (random anchors, packed with one mask)


@attrs.define
class DistillConfig:
    target: ModelConfig = attrs.field(factory=ModelConfig)
    out: str = "runs/distill"  # working folder: corpus, features, checkpoints
    export: Optional[str] = None  # the draft folder; default <out>/draft (<out>/token-draft for student.kind=token)
    init: Optional[str] = None  # start from this draft folder or checkpoint.pt (feature, eagle3); None = random
    seed: int = 0
    corpus: CorpusConfig = attrs.field(factory=CorpusConfig)
    student: StudentConfig = attrs.field(factory=StudentConfig)
    train: TrainConfig = attrs.field(factory=TrainConfig)


def load_distill_config(path: Optional[str], overrides: list[str]) -> DistillConfig:
    cfg = load_schema(DistillConfig, path, overrides, "distill config")
    if cfg.corpus.seq_len < 4 or cfg.corpus.heldout_sequences < 1:
        raise ConfigError("corpus.seq_len must be >= 4 and corpus.heldout_sequences >= 1")
    missing = [name for name in cfg.corpus.extra_files if not Path(name).is_file()]
    if missing:
        raise ConfigError(f"corpus file '{missing[0]}' does not exist: give paths of text files in corpus.extra_files")
    if cfg.corpus.selfdistill is not None and not (Path(cfg.corpus.selfdistill) / "manifest.json").is_file():
        raise ConfigError(
            f"corpus.selfdistill '{cfg.corpus.selfdistill}' holds no `pacer corpus` corpus "
            "(no manifest.json): make one with `pacer corpus out=FOLDER` or drop the option"
        )
    for folder in cfg.corpus.selfdistill_extra:
        if not (Path(folder) / "manifest.json").is_file():
            raise ConfigError(
                f"corpus.selfdistill_extra '{folder}' holds no `pacer corpus` corpus (no manifest.json): "
                "make one with `pacer corpus out=FOLDER` or drop it from the list"
            )
    folders = [cfg.corpus.selfdistill] * (cfg.corpus.selfdistill is not None) + list(cfg.corpus.selfdistill_extra)
    if len({Path(f).resolve() for f in folders}) != len(folders):
        raise ConfigError(
            "corpus.selfdistill_extra names a corpus folder twice (or corpus.selfdistill again): give each once"
        )
    t = cfg.train
    if t.unroll < 1 or not 0 < t.unroll_decay <= 1 or t.max_seconds < 0:
        raise ConfigError(
            f"train.unroll must be >= 1 (got {t.unroll}), train.unroll_decay in (0, 1] "
            f"(got {t.unroll_decay}) and train.max_seconds >= 0 (got {t.max_seconds})"
        )
    if not t.teacher_temperature > 0:
        raise ConfigError(
            f"train.teacher_temperature must be > 0 (got {t.teacher_temperature}): 1 trains towards "
            "the target's distribution, below 1 towards a sharper one"
        )
    from pacer_train.students import student_kinds

    plugin_kind = student_kinds().get(cfg.student.kind)
    if plugin_kind is not None and plugin_kind.check is not None:
        try:
            plugin_kind.check(cfg)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    fuses = cfg.student.kind == "eagle3" or (plugin_kind is not None and plugin_kind.fuses)
    if cfg.student.fused_layers is not None and (not fuses or not cfg.student.fused_layers):
        raise ConfigError(
            "student.fused_layers names the target layers an eagle3 or dflash student fuses: give a "
            "non-empty list with such a student.kind, or leave it null"
        )
    if cfg.student.published and cfg.student.kind != "dflash":
        raise ConfigError(
            f"student.published chooses the published DFlash architecture of a dflash student: give it "
            f"with student.kind=dflash, not {cfg.student.kind}"
        )
    if cfg.student.extra_layers and (cfg.student.kind != "feature" or cfg.student.extra_layers < 0):
        raise ConfigError(
            f"student.extra_layers={cfg.student.extra_layers} deepens a feature student: give a count "
            ">= 0 with student.kind=feature, or leave it 0"
        )
    if cfg.init is not None and plugin_kind is not None and plugin_kind.takes_init:
        if not Path(cfg.init).expanduser().is_dir():
            raise ConfigError(
                f"init '{cfg.init}' is not a folder: give the draft folder a "
                f"student.kind={cfg.student.kind} run starts from"
            )
    elif cfg.init is not None:
        if cfg.student.kind not in ("feature", "eagle3"):
            start = (
                "the token student starts from target layers (student.layers)"
                if cfg.student.kind == "token"
                else "a run of that kind resumes from its own checkpoint in out="
            )
            raise ConfigError(
                f"init= continues a feature or eagle3 student, not student.kind={cfg.student.kind}: {start}"
            )
        if not Path(cfg.init).expanduser().exists() and not (Path(cfg.out) / CHECKPOINT).exists():
            raise ConfigError(
                f"init '{cfg.init}' does not exist: give a draft folder `pacer distill` wrote or a "
                "run folder's checkpoint.pt"
            )
    return cfg
