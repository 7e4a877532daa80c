"""The bench folder's files: ``answers.jsonl`` (the answer log), ``bench.json`` and ``cost_model.json``.

The answer log holds one Spec-Bench-style JSON record per generation, appended, flushed and fsynced
one by one; a record's key is (prompt set, question id, stack, repeat). ``read_answers`` is its one
reader: the bench resumes from it (``AnswerLog``) and the report is computed from it (``load_run``).
Field meanings: docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import attrs

from pacer_core.errors import InputError

ANSWERS = "answers.jsonl"
META = "bench.json"
COST_MODEL = "cost_model.json"


def record_key(record: dict) -> tuple[str, str, str, int]:
    return (str(record["prompt_set"]), str(record["question_id"]), str(record["model_id"]), int(record.get("repeat", 0)))


@attrs.define
class Answers:
    """What ``read_answers`` found: the records in file order and their lines as stored."""

    records: list[dict] = attrs.field(factory=list)
    lines: list[bytes] = attrs.field(factory=list)
    dropped: int = 0  # unparseable or duplicate lines, and (unless kept) a last line without its newline


def read_answers(path: Path, keep_unterminated: bool = False) -> Answers:
    """Every complete line of an answer log that parses and has a key not seen before (the first of
    duplicates is kept). A last line without its newline is a write cut short: it is dropped, unless
    ``keep_unterminated`` (the report reads whatever parses; the bench rewrites the file without it)."""
    found = Answers()
    lines = path.read_bytes().split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # tail: after the last newline (empty if clean)
    if keep_unterminated:
        complete, tail = lines, b""
    seen: set = set()
    for line in complete:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            key = record_key(record)
        except (ValueError, KeyError, TypeError):
            found.dropped += 1
            continue
        if key in seen:  # never keep a duplicate
            found.dropped += 1
            continue
        seen.add(key)
        found.lines.append(line)
        found.records.append(record)
    if tail.strip():
        found.dropped += 1
    return found


class AnswerLog:
    """``answers.jsonl`` open for appending.

    Opening it keeps every complete, parseable line; a truncated last line (a kill mid-write) or any
    unparseable line is dropped and the file rewritten without it, so appends start clean.
    """

    def __init__(self, path: Path):
        self.path = path
        self.records: list[dict] = []
        self.dropped = 0
        if path.exists():
            self._load()
        self.keys = {record_key(r) for r in self.records}

    def _load(self) -> None:
        found = read_answers(self.path)
        self.records, self.dropped = found.records, found.dropped
        if self.dropped:
            tmp = self.path.with_name(self.path.name + ".tmp")
            with open(tmp, "wb") as handle:
                handle.write(b"".join(line + b"\n" for line in found.lines))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)

    def append(self, record: dict) -> None:
        key = record_key(record)
        if key in self.keys:
            raise RuntimeError(f"duplicate record {key}")
        line = json.dumps(record, ensure_ascii=False, default=json_default) + "\n"
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        self.keys.add(key)
        self.records.append(record)


def load_run(out: Path) -> tuple[dict, list[dict], Optional[dict]]:
    """(bench meta, records, cost model or None) of a bench folder; incomplete lines are skipped."""
    out = Path(out)
    if not (out / META).exists() or not (out / ANSWERS).exists():
        raise InputError(f"'{out}' is not a bench folder (no {META} / {ANSWERS}): run `pacer bench --out {out}` first")
    meta = json.loads((out / META).read_text())
    records = read_answers(out / ANSWERS, keep_unterminated=True).records
    cost = json.loads((out / COST_MODEL).read_text()) if (out / COST_MODEL).exists() else None
    return meta, records, cost


def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """Index of the first position where the two token lists differ (None if identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def make_record(set_name: str, prompt: Any, model_id: str, kind: str, repeat: int, ids: list[int],
                tokens: list[int], text: str, metrics: dict, finish: str, reference: Optional[list[int]]) -> dict:
    """One generation's record; ``reference`` is autoregressive decoding's tokens for the same key."""
    divergence = first_divergence(tokens, reference) if reference is not None else None
    return {
        "question_id": prompt.question_id,
        "category": prompt.category,
        "prompt_set": set_name,
        "model_id": model_id,
        "kind": kind,
        "repeat": repeat,
        "choices": [{"index": 0, "turns": [text], "decoding_steps": [int(metrics.get("steps", 0))],
                     "new_tokens": [len(tokens)], "wall_time": [float(metrics.get("wall_s", 0.0))],
                     "accept_lengths": list(metrics.get("accept_lengths", []))}],
        "tstamp": time.time(),
        "prompt_tokens": len(ids),
        "tokens": tokens,
        "finish_reason": finish,
        "identical_to_autoregressive": (reference is not None and divergence is None),
        "first_divergence": divergence,
        "metrics": metrics,
    }


def json_default(value: Any) -> Any:
    """JSON for tensors and numpy values (their lists or items); anything else as its text."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON atomically (a temporary file, then a rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=json_default) + "\n")
    os.replace(tmp, path)

