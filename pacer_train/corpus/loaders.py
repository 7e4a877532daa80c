"""Corpora as documents of token ids: what the ``datastore`` drafter searches (its ``corpus``) and
the ``eagle`` drafter's corpus prior counts (its ``corpus``, docs/draft.md).

A corpus is ``shipped`` (the self-distillation corpus the embedded target wrote), a folder
``pacer corpus`` wrote (the target's answers), a ``.json`` of token ids or a UTF-8 text file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pacer_core.errors import InputError
from pacer_core.jsonfile import MAX_DATA_BYTES, loads, read_bytes
from pacer_core.registry import shipped_folder

from .shards import CorpusStore, iter_corpus

SHIPPED_CORPUS = "shipped"  # corpus: shipped = the self-distillation corpus the embedded target wrote
# the names its folders are shipped under (pacer_shipped: the eagle drafter's plugin keeps them beside the
# draft distilled on them): the corpus, and the open-chat answers grown apart from it
SELFDISTILL_CORPUS = "selfdistill_corpus"
OPEN_CHAT_CORPUS = "open_chat_corpus"


def load_corpus(
    path: str, tokenizer: Any, vocab_size: int, target_digest: Optional[str] = None, prompt_tail: int = 0
) -> list[list[int]]:
    """A corpus's documents. ``shipped`` or a folder that ``pacer corpus`` wrote: the target's own
    answers, each with the last ``prompt_tail`` tokens of its prompt (so an answer's opening is found
    after the chat template's assistant header); refused when another target wrote it. A ``.json``
    file holds token ids (a list, or a list of lists); any other file is UTF-8 text, tokenized once
    with the target's tokenizer (no chat template)."""
    if path == SHIPPED_CORPUS or Path(path).expanduser().is_dir():
        return _target_answers(path, vocab_size, target_digest, prompt_tail)
    file = Path(path).expanduser()
    if not file.is_file():
        raise InputError(
            f"datastore corpus '{file}' does not exist: give a text file, a .json of token ids, "
            f"a folder `pacer corpus` wrote or '{SHIPPED_CORPUS}'"
        )
    data = read_bytes(file, "datastore corpus", "give a text file or a .json of token ids", limit=MAX_DATA_BYTES)
    if file.suffix == ".json":
        try:
            data = loads(data)
        except ValueError as exc:  # not JSON, not UTF-8, or nested deeper than MAX_DEPTH
            raise InputError(
                f"datastore corpus '{file}' is not readable JSON ({str(exc).splitlines()[0]}); give a list of token ids"
            ) from None
        docs = data if isinstance(data, list) and data and all(isinstance(d, list) for d in data) else [data]
        for doc in docs:
            if not isinstance(doc, list) or not all(type(t) is int and 0 <= t < vocab_size for t in doc):
                raise InputError(
                    f"datastore corpus '{file}' must hold token ids in [0, {vocab_size}): "
                    "a list of ints or a list of such lists"
                )
        return docs
    if tokenizer is None:
        raise InputError(
            f"datastore corpus '{file}' is text but this engine has no tokenizer: give token ids in a .json file"
        )
    try:
        text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as text mode reads it
    except UnicodeDecodeError as exc:
        raise InputError(f"datastore corpus '{file}' is not readable UTF-8 text ({exc}); give a text file") from None
    return [list(tokenizer.encode(text, chat_template=False))]


def corpus_writer(path: str) -> Optional[dict[str, Any]]:
    """The target that wrote a self-distillation corpus (``shipped`` or a folder ``pacer corpus`` wrote):
    its manifest's ``{"path", "digest"}``; None for a text or .json corpus."""
    if path != SHIPPED_CORPUS and not Path(path).expanduser().is_dir():
        return None
    return _self_distillation(path)[1].manifest.get("target") or {}


def shipped_corpus() -> Optional[Path]:
    """The folder of the shipped corpus; ``None`` when no installed plugin ships it. Reached by its
    name (``pacer_core.registry.shipped_folder``): the training package imports no plugin."""
    return shipped_folder(SELFDISTILL_CORPUS)


def recorded_corpus(record: dict[str, Any]) -> Optional[Path]:
    """The self-distillation corpus a draft's record names (``selfdistill`` in its ``corpus_sources``:
    ``path`` as distill was given it, ``shards``: each shard's name and sha256 prefix): the recorded
    folder (relative to the working directory) when it holds a corpus, else the shipped corpus holding
    every recorded shard with its checksum (found by content, wherever the plugin shipping it is
    installed); None when neither does."""
    recorded = Path(record["path"]).expanduser()
    if (recorded / "manifest.json").is_file():
        return recorded
    wanted = {(s["name"], s["sha256"]) for s in record.get("shards") or []}
    for name in (SELFDISTILL_CORPUS, OPEN_CHAT_CORPUS):
        folder = shipped_folder(name)
        if not wanted or folder is None or not (folder / "manifest.json").is_file():
            continue
        held = {e["name"]: e["sha256"] for e in CorpusStore(folder, create=False).shards}
        if all(held.get(shard, "").startswith(checksum) for shard, checksum in wanted):
            return folder
    return None


def _self_distillation(path: str) -> tuple[Path, CorpusStore]:
    """(folder, ``CorpusStore``) of ``shipped`` or a corpus folder."""
    folder = shipped_corpus() if path == SHIPPED_CORPUS else Path(path).expanduser()
    if folder is None:  # pragma: no cover - the plugins ship in the same distribution
        raise InputError(
            f"datastore corpus '{path}' is a self-distillation corpus, which needs the "
            "eagle plugin: install pacer-sd whole, or give a text or .json corpus"
        )
    return folder, CorpusStore(folder, create=False)


def _target_answers(path: str, vocab_size: int, target_digest: Optional[str], prompt_tail: int) -> list[list[int]]:
    """The answers of a self-distillation corpus folder (its shards' checksums are verified on
    reading), each after its prompt's last ``prompt_tail`` tokens."""
    folder, store = _self_distillation(path)
    written_by = store.manifest.get("target") or {}
    if target_digest is not None and written_by.get("digest") not in (None, target_digest):
        raise InputError(
            f"datastore corpus '{path}' was written by another target ({written_by.get('path')}, "
            f"weights {written_by.get('digest')}; this target's are {target_digest}): "
            "grow one with this target (`pacer corpus out=DIR`) or give a text corpus"
        )
    docs = []
    for sample in iter_corpus(folder):
        tokens = sample.tokens[max(0, sample.prompt_length - prompt_tail) :]
        if len(tokens) and int(tokens.max()) >= vocab_size:
            raise InputError(
                f"datastore corpus '{path}' holds token ids beyond this target's vocabulary "
                f"({vocab_size}): give a corpus this target wrote"
            )
        docs.append(tokens.tolist())
    return docs
