"""Stage 1 of ``pacer train-preverify``: the prompts M_B's data is simulated on (``items.json``).

Instructions this project ships (pacer_train/corpus/instructions.py, chat template applied) and
passages of Python standard-library source and ``pydoc_data`` prose (the target continues them);
the instructions, files and topics the draft was distilled on, as its manifest records them
(``corpus_sources``, written by ``pacer distill``), are skipped, and so is any prompt sharing a
13-word run with the self-distillation corpora it was distilled on. No benchmark prompts.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Optional

import attrs

from pacer_core.config import PacerConfig, draft_model_config
from pacer_core.errors import InputError
from pacer_core.registry import ResolvedComponent
from pacer_train import read_json
from pacer_train.corpus import iter_corpus
from pacer_train.corpus.guard import NGRAM, BenchmarkGuard, words
from pacer_train.corpus.instructions import instructions
from pacer_train.corpus.loaders import recorded_corpus
from pacer_train.corpus.sources import CorpusConfig, corpus_sources, stdlib_files, stdlib_root, text_digest

from .train_config import DataConfig, TrainPreverifyConfig, log


def draft_folder(sim: PacerConfig, drafter: ResolvedComponent) -> Optional[Path]:
    """The folder of the draft the simulation runs, found without loading a model: the draft model's
    for a drafter running one, else the folder the drafter's component says its config names
    (``Component.draft_folder``: its shipped draft when the config names none); None for a drafter
    declaring neither."""
    component = drafter.component
    if "draft_model" in component.needs:
        section = draft_model_config(sim, component)
        return Path(section.path).expanduser() if section is not None and section.path else None
    folder = drafter.draft_folder  # a hybrid's: its main member's
    return None if folder is None else Path(folder)


DRAFT_CORPUS_FIX = (
    "make the draft with the current `pacer distill`, or set data.skip_draft_corpus=false if it "
    "was not trained on this project's corpus"
)


def draft_manifest(folder: Optional[Path]) -> Optional[dict[str, Any]]:
    """The manifest of the draft in ``folder`` (None for a drafter without a draft folder), refused in
    one line unless it records the corpus the draft was distilled on (``corpus_sources``) or at least
    the distill recipe it can be re-derived from. Needs no model: checked before any loads."""
    if folder is None:
        return None
    path = folder / "manifest.json"
    if not path.is_file():
        raise InputError(
            f"draft '{folder}' has no manifest.json recording the corpus it was distilled on: {DRAFT_CORPUS_FIX}"
        )
    manifest = read_json(path, "draft manifest")
    if isinstance(manifest, dict) and isinstance(manifest.get("corpus_sources"), dict):
        return manifest
    recipe = manifest.get("recipe") if isinstance(manifest, dict) else None
    counts = manifest.get("corpus") if isinstance(manifest, dict) else None
    if not (
        isinstance(recipe, dict)
        and isinstance(recipe.get("corpus"), dict)
        and isinstance(counts, dict)
        and all(k in counts for k in ("stdlib", "docs"))
    ):
        raise InputError(
            f"draft '{folder}': its manifest records neither corpus_sources nor a distill recipe: {DRAFT_CORPUS_FIX}"
        )
    return manifest


def draft_corpus(folder: Optional[Path], manifest: Optional[dict[str, Any]], tokenizer) -> Optional[dict[str, Any]]:
    """What the draft was distilled on: its manifest's ``corpus_sources`` (pacer_train.corpus.sources.
    text_sources describes the record), or None without a draft folder.

    The documented fallback for a manifest written before distill recorded its sources: the record is
    re-derived with distill's own selection from the recipe the manifest records, and accepted only if
    the re-derived token counts equal the manifest's."""
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
        raise InputError(
            f"draft '{folder}': its manifest records no corpus_sources, and re-deriving them from its "
            f"recipe gives other token counts ({ {k: derived[k] for k in recorded} } vs {recorded}: "
            f"another tokenizer or Python standard library): {DRAFT_CORPUS_FIX}"
        )
    log(f"draft '{folder}' predates corpus_sources: re-derived them from its recipe (token counts match)")
    return used


def fresh_instructions(d: DataConfig, used: Optional[dict[str, Any]], keep=lambda text: True) -> list[str]:
    """``d.chat_prompts`` instructions the draft's corpus did not answer (and ``keep`` accepts), drawn
    after the ones it did (with its seed)."""
    asked = set((used or {}).get("instructions", []))
    more = instructions(len(asked) + 4 * d.chat_prompts + 8, int((used or {}).get("seed", 0)))
    return [q for q in dict.fromkeys(more) if text_digest(q) not in asked and keep(q)][: d.chat_prompts]


def seen_sources(record: Optional[dict[str, Any]]) -> dict[str, Any]:
    """Everything a draft's weights saw, from its ``corpus_sources``: its own corpus's record and,
    under ``init``, the records of the drafts it continued (a chain of runs), merged into one:
    instructions, stdlib files and documentation topics concatenated, the self-distillation corpora
    (``selfdistill`` and ``selfdistill_extra``) listed; the seed is the draft's own."""
    merged: dict[str, Any] = {
        "seed": int((record or {}).get("seed", 0)),
        "instructions": [],
        "stdlib": [],
        "docs": [],
        "selfdistill": [],
    }
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
    where its record says (relative to the working directory), else the shipped corpus holding its
    recorded shards (``pacer_train.corpus.loaders.recorded_corpus``); a missing one is refused in one
    line, before any model loads: M_B's prompts could not be kept apart from it."""
    folders = []
    for entry in used.get("selfdistill", []):
        found = recorded_corpus(entry)
        if found is None:
            raise InputError(
                f"the draft was distilled on the self-distillation corpus '{entry['path']}', which is "
                "not here: M_B's training prompts must be kept apart from it; run from the folder it "
                "was recorded from (or copy the corpus there), or set data.skip_draft_corpus=false"
            )
        folders.append(found)
    return folders


class CorpusGuard:
    """``overlaps(text)``: whether a candidate prompt shares a 13-word run with the prompts or answers
    of the self-distillation corpora the draft was trained on (the benchmark guard's n-gram check,
    pointed at the draft's training text)."""

    def __init__(self, folders: list[Path], tokenizer):
        texts = [
            (f"{folder.name}/{sample.id}", tokenizer.decode(part.tolist()))
            for folder in folders
            for sample in iter_corpus(folder)
            for part in (sample.prompt, sample.answer)
        ]
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


def build_items(
    cfg: TrainPreverifyConfig, tokenizer, used: Optional[dict[str, Any]] = None, guard: Optional[CorpusGuard] = None
) -> list[dict[str, Any]]:
    """The prompts to simulate SD on: [{"source", "prompt": token ids}], shuffled with the seed. Skips
    what ``used`` (the draft's ``corpus_sources``, its ``init`` chain included) names: instructions by
    digest, stdlib files by relative path or digest, documentation topics by name or digest; and any
    prompt the ``guard`` finds in the draft's self-distillation corpora."""
    from pydoc_data.topics import topics

    d, rng, used = cfg.data, random.Random(cfg.seed), seen_sources(used)

    def fresh(prompt) -> bool:  # an instruction's text or a passage's ids (decoded only when a guard reads it)
        return guard is None or not guard.overlaps(prompt if isinstance(prompt, str) else tokenizer.decode(prompt))

    items = [
        {"source": "chat", "prompt": tokenizer.encode(q, chat_template=True)}
        for q in fresh_instructions(d, used, fresh)
    ]
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
            passage = ids[start : start + d.passage_tokens]
            if fresh(passage):
                passages.append({"source": "stdlib", "prompt": passage})
    items += passages
    used_topics, used_texts = _unused(used.get("docs", []), "topic")
    docs = [
        tokenizer.encode(topics[name], chat_template=False)
        for name in sorted(topics)
        if name not in used_topics and text_digest(topics[name]) not in used_texts
    ]
    docs = [ids for ids in docs if len(ids) >= need]
    offset, taken = 0, 0
    while docs and taken < d.docs_passages:  # round robin over topics, one passage each per round
        progressed = False
        for ids in docs:
            start = offset * 2 * d.passage_tokens
            if taken < d.docs_passages and start + need <= len(ids):
                progressed = True
                passage = ids[start : start + d.passage_tokens]
                if fresh(passage):
                    items.append({"source": "docs", "prompt": passage})
                    taken += 1
        offset += 1
        if not progressed:
            break
    rng.shuffle(items)
    return items
