"""The datastore file: earlier generations' token ids, kept across runs.

An ``.npz`` archive (numpy's zip of plain arrays; read with ``allow_pickle=False``) of three arrays:
``header``, a JSON text ``{"format": "pacer-datastore", "version": 1, "tokenizer": <identity>,
"tokens": <count>, "documents": <count>}``; ``tokens``, every document's ids concatenated (int32,
oldest first); ``lengths``, each document's length (int64). The tokenizer identity ties a store to
the target's vocabulary, so a store written for another tokenizer is refused instead of drafting
nonsense. Writes are atomic: each save writes a temporary file of its own and renames it over the
old one, so concurrent writers never mix their bytes and a reader always finds a whole store (the
last save wins). Arrays whose headers declare more bytes than the file holds are refused before
anything is allocated. Anything unreadable,
inconsistent, of another format version or of another tokenizer is refused with one line naming
the file and the fix.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from pacer_core import InputError
from pacer_core.atomic import atomic_write
from pacer_core.jsonfile import loads, open_regular

FORMAT = "pacer-datastore"
VERSION = 1
FIX = "delete it or set another datastore path"

__all__ = ["FORMAT", "VERSION", "check_path", "load_documents", "save_documents", "tokenizer_identity"]


def tokenizer_identity(tokenizer: Any, vocab_size: int) -> str:
    """Names the token ids' meaning: a hash of the tokenizer's vocabulary (token string → id), or,
    without a tokenizer (token-id prompts), the model's vocabulary size."""
    vocab = getattr(tokenizer, "vocab", None)
    if callable(vocab):
        items = sorted(vocab().items(), key=lambda kv: kv[1])
        digest = hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()[:16]
        return f"vocab-sha256:{digest}"
    return f"ids:{vocab_size}"


def save_documents(path: Union[str, Path], tokens: np.ndarray, lengths: np.ndarray, identity: str) -> None:
    """Write documents (``tokens`` [size] concatenated, oldest first; ``lengths`` [documents])
    atomically: a partial file never replaces a good one."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens, lengths = np.asarray(tokens, dtype=np.int32), np.asarray(lengths, dtype=np.int64)
    header = json.dumps(
        {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": identity,
            "tokens": int(tokens.shape[0]),
            "documents": int(lengths.shape[0]),
        }
    )
    # a temporary name of this write's own: two processes saving the same store never write into one
    # file, and the rename publishes a complete one (the last save wins, whole)
    atomic_write(path, lambda f: np.savez(f, header=np.array(header), tokens=tokens, lengths=lengths), shared=True)


def check_path(path: Union[str, Path]) -> Path:
    """Refuse, before any decoding, a datastore path no save could write (``InputError``, one line):
    a folder, a path under a file, or a place that cannot be written."""
    file = Path(path).expanduser()
    fix = "give path a .npz file in a folder that can be written"
    if file.is_dir():
        raise InputError(f"datastore path '{file}' is a folder: {fix}")
    existing = file.parent
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"datastore path '{file}' lies under '{existing}', which is not a folder: {fix}")
    try:  # what a save does: make the folder, write a file of its own in it
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".check", dir=file.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InputError(
            f"datastore path '{file}' cannot be written ({exc.strerror or type(exc).__name__} in '{existing}'): {fix}"
        ) from None
    return file


def _check_declared_sizes(handle: Any) -> None:
    """Refuse an archive (an open file) whose arrays declare more bytes than the file holds, from their
    .npy headers, before numpy allocates them (a 1 KB file could otherwise claim gigabytes)."""
    size = os.fstat(handle.fileno()).st_size
    with zipfile.ZipFile(handle) as archive:
        for info in archive.infolist():
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(member)
            if dtype.hasobject:
                raise ValueError(f"its array '{info.filename}' holds Python objects, not plain numbers")
            declared = math.prod(int(n) for n in shape) * dtype.itemsize
            if declared > size:
                raise ValueError(f"its array '{info.filename}' declares {declared} bytes, more than the file's {size}")


def load_documents(path: Union[str, Path], identity: str, vocab_size: Optional[int] = None) -> list[np.ndarray]:
    """The documents (int64 arrays, oldest first) of a datastore file written for ``identity``;
    ``InputError`` (one line) for a file that cannot be one."""
    shown = Path(path).expanduser()

    def refuse(problem: str) -> InputError:
        return InputError(f"datastore '{shown}' {problem}; {FIX}")

    try:  # one open file for the check and the read: a concurrent save may rename another over the path
        with open_regular(shown, "datastore", FIX) as handle:
            _check_declared_sizes(handle)
            handle.seek(0)
            with np.load(handle, allow_pickle=False) as archive:
                if not {"header", "tokens", "lengths"} <= set(archive.files):
                    raise refuse("is not a datastore file (it lacks header, tokens or lengths)")
                header = loads(str(archive["header"]))
                tokens, lengths = archive["tokens"], archive["lengths"]
    except InputError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise refuse(f"is not a readable datastore file ({reason})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise refuse(f"is not a datastore file (its header does not name the format {FORMAT!r})")
    if header.get("version") != VERSION:
        raise refuse(f"has format version {header.get('version')!r}; this version reads {VERSION}")
    if header.get("tokenizer") != identity:
        raise refuse(f"was written for another tokenizer ({header.get('tokenizer')}, this target's is {identity})")
    if (
        tokens.ndim != 1
        or lengths.ndim != 1
        or tokens.dtype.kind not in "iu"
        or lengths.dtype.kind not in "iu"
        or int(lengths.sum()) != len(tokens)
        or (lengths < 0).any()
        or header.get("tokens") != len(tokens)
        or header.get("documents") != len(lengths)
    ):
        raise refuse("is inconsistent (its token count disagrees with its header or document lengths)")
    if len(tokens) and (int(tokens.min()) < 0 or (vocab_size is not None and int(tokens.max()) >= vocab_size)):
        raise refuse(f"holds token ids outside this target's vocabulary [0, {vocab_size})")
    return np.split(tokens.astype(np.int64), np.cumsum(lengths)[:-1]) if len(lengths) else []
