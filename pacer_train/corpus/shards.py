"""Corpus shards on disk: the format, the manifest, the resumable writer and the loader.

A corpus folder holds

- ``shard-NNNNN.safetensors``: ``tokens`` (uint16 token ids, int32 for vocabularies over 65,536) of
  every record's prompt (chat template applied) followed by the target's answer, packed;
  ``offsets`` (int64, records + 1: record i is ``tokens[offsets[i]:offsets[i + 1]]``) and
  ``prompt_lengths`` (int32: the first ``prompt_lengths[i]`` tokens of record i are the prompt).
- ``shard-NNNNN.json``: provenance — the stream positions the shard covers, one entry per record
  (instruction id, family, position, sha of the instruction text, prompt and answer lengths,
  whether the answer reached EOS) and per refused position (the reason), the generation settings,
  the target's weights digest, the command, timing, versions, and the sha256 of the tensor file.
- ``manifest.json``: the stream (seed, material digest), the target digest, the benchmark guard,
  every shard with its sha256 and counts, ``next_position`` and the totals per family.

A shard covers ``shard_size`` consecutive stream positions, so the positions of all shards are
contiguous from 0 (no gap) and each position is in exactly one shard (no duplicate). Files are
written to a temporary name and renamed (atomic): the tensor file, then its JSON, then the
manifest. A run killed at any point loses at most the shard it was making; on the next start,
temporary files are removed and a complete shard whose manifest update was lost is adopted.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

import attrs
import torch

from pacer_core.errors import InputError
from pacer_core.jsonfile import read_json, require_keys

FORMAT = 1
MANIFEST = "manifest.json"
RESTORE = "restore it with git checkout, or make the corpus again with `pacer corpus`"
RECORD_KEYS = frozenset({"id", "family", "position", "sha", "prompt_tokens", "answer_tokens", "finished"})


class CorpusError(InputError):
    """A corpus folder that cannot be used as it is (one line: what is wrong and the fix)."""


@attrs.frozen
class Sample:
    id: str  # the instruction's stable id (family/index)
    family: str
    position: int
    tokens: torch.Tensor  # int64 [prompt + answer]
    prompt_length: int
    finished: bool  # the answer ended with the target's EOS (else it hit max_new_tokens)

    @property
    def prompt(self) -> torch.Tensor:
        return self.tokens[: self.prompt_length]

    @property
    def answer(self) -> torch.Tensor:
        return self.tokens[self.prompt_length :]


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=1, sort_keys=False) + "\n").encode()


def pack(sequences: Sequence[Sequence[int]], prompt_lengths: Sequence[int], vocab_size: int) -> dict[str, torch.Tensor]:
    dtype = torch.uint16 if vocab_size <= 65536 else torch.int32
    flat = [t for seq in sequences for t in seq]
    offsets = [0]
    for seq in sequences:
        offsets.append(offsets[-1] + len(seq))
    return {
        "tokens": torch.tensor(flat, dtype=torch.int32).to(dtype),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
        "prompt_lengths": torch.tensor(list(prompt_lengths), dtype=torch.int32),
    }


def _empty_totals() -> dict[str, Any]:
    return {"records": 0, "refused": 0, "prompt_tokens": 0, "answer_tokens": 0, "tokens": 0, "families": {}}


def _add(totals: dict[str, Any], shard: dict[str, Any]) -> None:
    totals["refused"] += len(shard["refused"])
    for r in shard["records"]:
        totals["records"] += 1
        totals["prompt_tokens"] += r["prompt_tokens"]
        totals["answer_tokens"] += r["answer_tokens"]
        totals["tokens"] += r["prompt_tokens"] + r["answer_tokens"]
        fam = totals["families"].setdefault(r["family"], {"records": 0, "prompt_tokens": 0, "answer_tokens": 0})
        fam["records"] += 1
        fam["prompt_tokens"] += r["prompt_tokens"]
        fam["answer_tokens"] += r["answer_tokens"]


class CorpusStore:
    """A corpus folder: read the manifest, recover from an interrupted run, append shards."""

    def __init__(self, folder: Path, create: bool = True):
        self.folder = Path(folder)
        if self.folder.exists() and not self.folder.is_dir():
            raise CorpusError(f"corpus folder '{self.folder}' is a file: give a folder with out=")
        manifest = self.folder / MANIFEST
        if manifest.exists():
            self.manifest = read_json(manifest, "corpus manifest", RESTORE)
            if self.manifest.get("format") != FORMAT:
                raise CorpusError(f"'{manifest}' has format {self.manifest.get('format')!r}, this code reads {FORMAT}")
        elif not create:
            raise CorpusError(
                f"'{self.folder}' holds no corpus ({MANIFEST} is missing): "
                f"make one with `pacer corpus out={self.folder}`"
            )
        else:
            self.manifest = {
                "format": FORMAT,
                "stream": None,
                "target": None,
                "guard": None,
                "shards": [],
                "next_position": 0,
                "totals": _empty_totals(),
            }

    # -- reading -------------------------------------------------------------------------------
    @property
    def shards(self) -> list[dict[str, Any]]:
        return self.manifest["shards"]

    @property
    def next_position(self) -> int:
        return int(self.manifest["next_position"])

    @property
    def totals(self) -> dict[str, Any]:
        return self.manifest["totals"]

    def shard_info(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The JSON of a listed shard (its records), refused in one line naming it when damaged."""
        path = self.folder / f"{entry['name']}.json"
        info = read_json(path, "corpus shard", RESTORE)
        require_keys(
            info, path, "corpus shard", RESTORE, records=list, **({"timing": dict} if "timing" in info else {})
        )
        for i, record in enumerate(info["records"]):
            if not isinstance(record, dict) or not RECORD_KEYS <= record.keys():
                raise CorpusError(
                    f"corpus shard '{path}': record {i} is not an object with "
                    f"{', '.join(sorted(RECORD_KEYS))}: "
                    f"the file is damaged; {RESTORE}"
                )
        return info

    def verify(self, entry: dict[str, Any]) -> Path:
        path = self.folder / f"{entry['name']}.safetensors"
        if not path.exists():
            raise CorpusError(f"corpus shard '{path}' is missing: restore it with git checkout")
        digest = file_sha256(path)
        if digest != entry["sha256"]:
            raise CorpusError(
                f"corpus shard '{path}' does not match its sha256 in {MANIFEST} "
                f"({digest[:12]}… vs {entry['sha256'][:12]}…): restore it with git checkout"
            )
        return path

    def seen_texts(self) -> set[str]:
        return {r["sha"] for entry in self.shards for r in self.shard_info(entry)["records"]}

    # -- recovery ------------------------------------------------------------------------------
    def recover(self, log=lambda _: None) -> None:
        """Remove temporary files of an interrupted run; adopt a complete shard whose manifest
        update was lost; remove any other shard file the manifest does not list."""
        if not self.folder.exists():
            return
        for tmp in sorted(self.folder.glob("*.tmp")):
            tmp.unlink()
            log(f"removed {tmp.name} left by an interrupted run")
        while True:
            name = shard_name(len(self.shards))
            tensors, info = self.folder / f"{name}.safetensors", self.folder / f"{name}.json"
            if not (tensors.exists() and info.exists()):
                break
            try:  # a damaged one is not complete: removed below like any unlisted shard
                shard = json.loads(info.read_text())
                if shard.get("sha256") != file_sha256(tensors) or shard["positions"][0] != self.next_position:
                    break
            except (ValueError, AttributeError, KeyError, TypeError, IndexError):
                break
            self._register(name, shard)
            log(f"adopted {name}, complete but missing from {MANIFEST}")
        listed = {entry["name"] for entry in self.shards}
        for path in sorted(self.folder.glob("shard-*")):
            if path.name.split(".")[0] not in listed:
                path.unlink()
                log(f"removed {path.name}, an incomplete shard")

    # -- writing -------------------------------------------------------------------------------
    def set_header(self, stream: dict, target: dict, guard: dict) -> None:
        self.manifest["stream"], self.manifest["target"], self.manifest["guard"] = stream, target, guard

    def _register(self, name: str, shard: dict[str, Any]) -> None:
        counts = _empty_totals()
        _add(counts, shard)
        entry = {
            "name": name,
            "sha256": shard["sha256"],
            "positions": shard["positions"],
            "records": counts["records"],
            "refused": counts["refused"],
            "tokens": counts["tokens"],
            "answer_tokens": counts["answer_tokens"],
        }
        self.manifest["shards"].append(entry)
        self.manifest["next_position"] = shard["positions"][1]
        _add(self.manifest["totals"], shard)
        _write_atomic(self.folder / MANIFEST, _json_bytes(self.manifest))

    def append(
        self,
        records: list[dict[str, Any]],
        sequences: list[list[int]],
        refused: list[dict[str, Any]],
        end_position: int,
        vocab_size: int,
        provenance: dict[str, Any],
    ) -> str:
        """Write the next shard (covering positions next_position … end_position) and register it."""
        from safetensors.torch import save

        self.folder.mkdir(parents=True, exist_ok=True)
        name = shard_name(len(self.shards))
        data = save(
            pack(sequences, [r["prompt_tokens"] for r in records], vocab_size),
            metadata={"format": str(FORMAT), "shard": name},
        )
        _write_atomic(self.folder / f"{name}.safetensors", data)
        shard = {
            "format": FORMAT,
            "name": name,
            "positions": [self.next_position, end_position],
            "records": records,
            "refused": refused,
            **provenance,
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        _write_atomic(self.folder / f"{name}.json", _json_bytes(shard))
        self._register(name, shard)
        return name


def iter_corpus(
    folder: str | Path,
    families: Optional[Iterable[str]] = None,
    verify: bool = True,
    first_shard: int = 0,
    end_shard: Optional[int] = None,
) -> Iterator[Sample]:
    """Every record of a corpus folder in stream order (of its shards from ``first_shard`` on, before
    ``end_shard`` where given), as
    ``Sample`` (token ids, family, prompt / answer split). Each shard's sha256 is checked against the
    manifest first (``CorpusError``, one line, when it differs)."""
    from safetensors.torch import load_file

    store = CorpusStore(Path(folder), create=False)
    wanted = set(families) if families is not None else None
    for entry in store.shards[first_shard:end_shard]:
        path = store.verify(entry) if verify else store.folder / f"{entry['name']}.safetensors"
        info = store.shard_info(entry)
        tensors = load_file(str(path))
        tokens = tensors["tokens"].to(torch.int64)
        offsets = tensors["offsets"].tolist()
        lengths = tensors["prompt_lengths"].tolist()
        if len(offsets) != len(info["records"]) + 1:
            raise CorpusError(
                f"corpus shard '{path}' holds {len(offsets) - 1} records, its JSON lists {len(info['records'])}"
            )
        for i, record in enumerate(info["records"]):
            if wanted is not None and record["family"] not in wanted:
                continue
            yield Sample(
                record["id"],
                record["family"],
                record["position"],
                tokens[offsets[i] : offsets[i + 1]],
                lengths[i],
                record["finished"],
            )


def corpus_stats(folder: str | Path) -> dict[str, Any]:
    """The manifest's totals with the shard count, positions covered and generation seconds."""
    store = CorpusStore(Path(folder), create=False)
    seconds = sum(store.shard_info(e).get("timing", {}).get("seconds", 0.0) for e in store.shards)
    return {
        "folder": str(store.folder),
        "shards": len(store.shards),
        "positions": store.next_position,
        "generation_hours": round(seconds / 3600, 2),
        "stream": store.manifest["stream"],
        "target": store.manifest["target"],
        **store.totals,
    }
