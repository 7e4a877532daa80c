"""The datastore file: earlier generations' token ids, kept across runs.

An ``.npz`` archive (numpy's zip of plain arrays; read with ``allow_pickle=False``) of three arrays:
``header``, a JSON text ``{"format": "pacer-datastore", "version": 1, "tokenizer": <identity>,
"tokens": <count>, "documents": <count>}``; ``tokens``, every document's ids concatenated (int32,
oldest first); ``lengths``, each document's length (int64). The tokenizer identity ties a store to
the target's vocabulary, so a store written for another tokenizer is refused instead of drafting
nonsense. Writes are atomic (a temporary file renamed over the old one). Anything unreadable,
inconsistent, of another format version or of another tokenizer is refused with one line naming
the file and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from pacer_core import InputError

FORMAT = "pacer-datastore"
VERSION = 1
FIX = "delete it or set another datastore path"

__all__ = ["FORMAT", "VERSION", "load_documents", "save_documents", "tokenizer_identity"]


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
    header = json.dumps({"format": FORMAT, "version": VERSION, "tokenizer": identity,
                         "tokens": int(tokens.shape[0]), "documents": int(lengths.shape[0])})
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        np.savez(f, header=np.array(header), tokens=tokens, lengths=lengths)
    os.replace(tmp, path)


def load_documents(path: Union[str, Path], identity: str, vocab_size: Optional[int] = None) -> list[np.ndarray]:
    """The documents (int64 arrays, oldest first) of a datastore file written for ``identity``;
    ``InputError`` (one line) for a file that cannot be one."""
    shown = Path(path).expanduser()

    def refuse(problem: str) -> InputError:
        return InputError(f"datastore '{shown}' {problem}; {FIX}")

    try:
        with np.load(shown, allow_pickle=False) as archive:
            if not {"header", "tokens", "lengths"} <= set(archive.files):
                raise refuse("is not a datastore file (it lacks header, tokens or lengths)")
            header = json.loads(str(archive["header"]))
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
    if (tokens.ndim != 1 or lengths.ndim != 1 or tokens.dtype.kind not in "iu" or lengths.dtype.kind not in "iu"
            or int(lengths.sum()) != len(tokens) or (lengths < 0).any() or header.get("tokens") != len(tokens)
            or header.get("documents") != len(lengths)):
        raise refuse("is inconsistent (its token count disagrees with its header or document lengths)")
    if len(tokens) and (int(tokens.min()) < 0 or (vocab_size is not None and int(tokens.max()) >= vocab_size)):
        raise refuse(f"holds token ids outside this target's vocabulary [0, {vocab_size})")
    return np.split(tokens.astype(np.int64), np.cumsum(lengths)[:-1]) if len(lengths) else []
