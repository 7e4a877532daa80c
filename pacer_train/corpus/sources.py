"""What a distillation corpus reads besides the target's answers: the ``corpus`` section of
``pacer distill`` (``CorpusConfig``), the Python standard-library source and the ``pydoc_data``
documentation prose it takes, and the record of exactly what was read (``corpus_sources``).

``pacer distill`` builds its corpus from these streams (plugins/eagle/distill.py);
``pacer train-preverify`` re-derives the record of a draft made before distill recorded it and
keeps what a draft was distilled on out of its own prompts (plugins/pacer_stop/items.py).
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
from pathlib import Path
from typing import Any, List, Optional

import attrs

from pacer_core.jsonfile import MAX_DATA_BYTES, read_bytes

__all__ = [
    "STDLIB_SKIP",
    "CorpusConfig",
    "corpus_sources",
    "stdlib_files",
    "stdlib_root",
    "text_digest",
    "text_sources",
]


@attrs.define
class CorpusConfig:
    # Python standard-library source (tests excluded)
    stdlib_tokens: int = attrs.field(default=100_000, validator=[attrs.validators.ge(0), attrs.validators.le(1 << 30)])
    # pydoc_data topics: the language reference's prose
    docs_tokens: int = attrs.field(default=30_000, validator=[attrs.validators.ge(0), attrs.validators.le(1 << 30)])
    # instructions the target answers (chat template applied)
    chat_answers: int = attrs.field(default=512, validator=[attrs.validators.ge(0), attrs.validators.le(1 << 20)])
    chat_max_new_tokens: int = attrs.field(default=256, validator=[attrs.validators.ge(1), attrs.validators.le(8192)])
    chat_batch_size: int = attrs.field(default=32, validator=[attrs.validators.ge(1), attrs.validators.le(4096)])
    seq_len: int = 256
    heldout_sequences: int = 24
    extra_files: List[str] = attrs.field(factory=list)  # your own text files (never benchmark prompts)
    selfdistill: Optional[str] = None  # a `pacer corpus` folder: its records (prompt + the target's answer) join
    selfdistill_from: int = 0  # read its shards from this index on (e.g. only those the init draft did not see)
    selfdistill_until: int = 0  # ... and before this one (0: to the last shard)
    selfdistill_extra: List[str] = attrs.field(factory=list)  # more `pacer corpus` folders, read whole (e.g. open chat)


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
    text read). The instructions are added by the caller (distill's ``build_corpus``)."""
    from pydoc_data.topics import topics

    streams: dict[str, list[int]] = {"stdlib": [], "docs": [], "extra": []}
    used: dict[str, Any] = {"seed": seed, "stdlib": [], "docs": [], "extra": []}
    for name in c.extra_files:
        text = read_bytes(
            Path(name), "corpus extra file", "give a text file in corpus.extra_files", limit=MAX_DATA_BYTES
        ).decode("utf-8", errors="ignore")
        text = text.replace("\r\n", "\n").replace("\r", "\n")  # as text mode reads it
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
    from .instructions import instructions

    streams, used = text_sources(c, seed, tokenizer, eos=0)
    used["instructions"] = [text_digest(q) for q in instructions(c.chat_answers, seed)]
    return {k: len(v) for k, v in streams.items()}, used
