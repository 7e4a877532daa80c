"""The bench folder's files: ``answers.jsonl`` (the answer log), ``bench.json`` and ``cost_model.json``.

The answer log holds one Spec-Bench-style JSON record per generation (one turn of a question),
appended, flushed and fsynced one by one; a record's key is (prompt set, question id, stack, repeat,
turn). Spec-Bench's own answer files are rebuilt from it (pacer_bench/specbench.py). ``read_answers`` is its one
reader: the bench resumes from it (``AnswerLog``) and the report is computed from it (``load_run``).
Field meanings: docs/benchmarks.md.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import attrs

from pacer_core.cost_profiles import MAX_TOKENS, is_seconds
from pacer_core.errors import InputError
from pacer_core.jsonfile import MAX_DATA_BYTES, TooDeep, loads, read_bytes

ANSWERS = "answers.jsonl"
META = "bench.json"
COST_MODEL = "cost_model.json"


def shown_path(path: Any) -> str:
    """A model path as bench.json and the report show it: relative to the working folder when inside it
    (a shipped draft's absolute path would name the machine that ran the bench), else as given."""
    try:
        return str(Path(str(path)).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def pair_key(record: dict) -> tuple:
    """What pairs a stack's record with the baseline's: (prompt set, question id, repeat, turn)."""
    return (record["prompt_set"], str(record["question_id"]), int(record.get("repeat", 0)), int(record.get("turn", 0)))


def record_key(record: dict) -> tuple[str, str, str, int, int]:
    """(prompt set, question id, stack, repeat, turn); records written before multi-turn runs are turn 0."""
    return (
        str(record["prompt_set"]),
        str(record["question_id"]),
        str(record["model_id"]),
        int(record.get("repeat", 0)),
        int(record.get("turn", 0)),
    )


@attrs.define
class Answers:
    """What ``read_answers`` found: the records in file order and their lines as stored."""

    records: list[dict] = attrs.field(factory=list)
    lines: list[bytes] = attrs.field(factory=list)
    dropped: int = 0  # a last line without its newline (a write cut short), unless kept
    duplicates: int = 0  # lines repeating an earlier record's key (the first is kept)


_RECORD_FIELDS = {
    "prompt_set": str,
    "question_id": (str, int),
    "model_id": str,
    "tokens": list,
    "metrics": dict,
    "choices": list,
}
# the metrics the report and the replay add up, when a record has them: counts (whole numbers from 0
# to MAX_COUNT) and seconds (finite, from 0 to MAX_RECORD_SECONDS); and the per-step lists, whose
# entries are counts of at most MAX_TOKENS (a step's draft, accepted path, nodes sent, draft forwards)
MAX_COUNT = 10**9
MAX_RECORD_SECONDS = 1e7  # about four months for one generation
_METRIC_COUNTS = (
    "steps",
    "accepted",
    "drafted",
    "emitted",
    "target_forwards",
    "draft_forwards",
    "pacer_checks",
    "new_tokens",
)
_METRIC_SECONDS = ("wall_s", "forward_s", "draft_s", "verify_s", "stop_s", "pacer_mb_s")
_STEP_LISTS = ("drafted_per_step", "accepted_per_step", "nodes_per_step", "draft_forwards_per_step")
_METRIC_LISTS = ("accept_lengths", *_STEP_LISTS)
_CHOICE_LISTS = {
    "turns": str,
    "decoding_steps": (int, float),
    "new_tokens": (int, float),
    "wall_time": (int, float),
    "accept_lengths": (int, float),
}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any, top: int = MAX_COUNT) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top


def _seconds(value: Any) -> bool:
    return _number(value) and math.isfinite(value) and 0 <= value <= MAX_RECORD_SECONDS


def _shown(value: Any) -> str:
    return json.dumps(value)[:40]


def _metric_problem(field: str, value: Any) -> Optional[str]:
    """Why ``metrics.field`` cannot be read (a count, seconds, a per-step list), or None."""
    if value is None:
        return None
    if field in _METRIC_COUNTS or field.startswith("hybrid_accepted_"):
        if not _count(value):
            return f"'metrics.{field}' is {_shown(value)}, not a count from 0 to {MAX_COUNT}"
    elif field in _METRIC_SECONDS:
        if not _seconds(value):
            return f"'metrics.{field}' is {_shown(value)}, not a number of seconds from 0 to {MAX_RECORD_SECONDS:g}"
    elif field in _METRIC_LISTS:
        if not isinstance(value, list):
            return f"'metrics.{field}' is {_shown(value)}, not a list of counts"
        bad = next((i for i, x in enumerate(value) if not _count(x, MAX_TOKENS)), None)
        if bad is not None:
            return f"'metrics.{field}[{bad}]' is {_shown(value[bad])}, not a count from 0 to {MAX_TOKENS}"
    return None


def _steps_problem(metrics: dict) -> Optional[str]:
    """Why the per-step lists of ``metrics`` do not describe one list of steps (lengths that differ,
    more accepted than drafted), or None."""
    lists = {f: metrics[f] for f in _STEP_LISTS if metrics.get(f) is not None}
    lengths = {len(v) for v in lists.values()}
    if len(lengths) > 1:
        return "the per-step lists differ in length (" + ", ".join(f"{f} {len(v)}" for f, v in lists.items()) + ")"
    for i, (d, a) in enumerate(zip(metrics.get("drafted_per_step") or (), metrics.get("accepted_per_step") or ())):
        if a > d:
            return f"'metrics.accepted_per_step[{i}]' is {a}, more than the {d} drafted at that step"
    return None


def _tree_step_problem(step: Any) -> Optional[str]:
    """Why one ``tree_log`` step is not a tree (parents before their children, a draft probability
    per node, main and accepted paths of existing nodes), or None."""
    if not isinstance(step, dict):
        return "is not an object"
    parents, q = step.get("parents"), step.get("q")
    if not isinstance(parents, list) or not 0 < len(parents) <= MAX_TOKENS:
        return f"has parents {_shown(parents)}, not a list of 1 to {MAX_TOKENS} node indices"
    if not all(isinstance(p, int) and not isinstance(p, bool) and -1 <= p < i for i, p in enumerate(parents)):
        return "has a parent that is not -1 (the root) or an earlier node"
    if not isinstance(q, list) or len(q) != len(parents) or not all(_number(x) and 0 <= x <= 1 for x in q):
        return f"has q {_shown(q)}, not one probability from 0 to 1 per node"
    for key in ("main", "path"):
        nodes = step.get(key)
        if not isinstance(nodes, list) or not all(_count(n, len(parents) - 1) for n in nodes):
            return f"has {key} {_shown(nodes)}, not a list of its nodes"
    if step.get("forwards") is not None and not _count(step["forwards"]):
        return f"has forwards {_shown(step['forwards'])}, not a count"
    return None


def _nested_problem(record: dict) -> Optional[str]:
    """Why the metrics or the first choice of ``record`` cannot be read by the report or the replay, or None."""
    metrics = record["metrics"]
    for field, value in metrics.items():
        problem = _metric_problem(field, value)
        if problem:
            return problem
    problem = _steps_problem(metrics)
    if problem:
        return problem
    steps = metrics.get("tree_steps")
    if steps is not None:
        if not isinstance(steps, list):
            return f"'metrics.tree_steps' is {_shown(steps)}, not the tree_log observer's list of steps"
        for i, step in enumerate(steps):
            problem = _tree_step_problem(step)
            if problem:
                return f"'metrics.tree_steps[{i}]' {problem}"
    topk = metrics.get("draft_topk")
    if topk and not (
        isinstance(topk, dict)
        and isinstance(topk.get("k"), list)
        and isinstance(topk.get("counts"), list)
        and all(isinstance(row, list) and all(_number(x) for x in row) for row in topk["counts"])
    ):
        return "'metrics.draft_topk' is not the draft_quality observer's tallies ({k: [...], counts: [[...]]})"
    choice = record["choices"][0] if record["choices"] else None
    if not isinstance(choice, dict):
        return "'choices' holds no answer object"
    for field, kinds in _CHOICE_LISTS.items():
        value = choice.get(field)
        if (
            not isinstance(value, list)
            or not all(isinstance(x, kinds) and not isinstance(x, bool) for x in value)
            or (field in ("turns", "decoding_steps") and not value)
        ):
            return (
                f"'choices[0].{field}' is {json.dumps(value)[:40]}, not a list of "
                f"{'texts' if kinds is str else 'numbers'}"
            )
    return None


def record_problem(record: Any) -> Optional[str]:
    """Why ``record`` is not an answer record (the fields the bench and the report read, nested ones
    too), or None."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    for field, kinds in _RECORD_FIELDS.items():
        if field not in record:
            return f"no '{field}'"
        if not isinstance(record[field], kinds) or isinstance(record[field], bool):
            return f"'{field}' is a {type(record[field]).__name__}"
    nested = _nested_problem(record)
    if nested:
        return nested
    for field in ("repeat", "turn"):
        count = record.get(field, 0)
        if not _count(count):
            return f"'{field}' is {_shown(count)}, not a count"
    if record.get("prompt_tokens") is not None and not _count(record["prompt_tokens"], MAX_TOKENS):
        return f"'prompt_tokens' is {_shown(record['prompt_tokens'])}, not a count from 0 to {MAX_TOKENS}"
    return None


def _parse(line: bytes) -> tuple[Optional[dict], Optional[str]]:
    try:
        record = loads(line)
    except TooDeep as exc:
        return None, str(exc)
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except ValueError as exc:
        return None, f"not JSON: {str(exc).splitlines()[0]}"
    problem = record_problem(record)
    return (None, problem) if problem else (record, None)


def read_answers(path: Path, keep_unterminated: bool = False) -> Answers:
    """Every record of an answer log, in file order; the first of lines sharing a key is kept.

    Only the last line can be an interrupted write (a kill mid-append): without its newline it is
    dropped, unless ``keep_unterminated`` and it parses (the report reads a run in progress; the
    bench rewrites the file without it). Any other line that is not a record means the file was
    damaged or edited: ``InputError`` naming the file, the line and the fix, rather than results
    silently lost or misreported.
    """
    lines = read_bytes(
        path,
        "answer log",
        "it must be the file `pacer bench` writes; move it away or choose another --out",
        limit=MAX_DATA_BYTES,
    ).split(b"\n")
    found = Answers()
    complete, tail = lines[:-1], lines[-1]  # tail: after the last newline (empty if clean)
    seen: set = set()

    def keep(line: bytes, record: dict) -> None:
        key = record_key(record)
        if key in seen:  # never keep a duplicate
            found.duplicates += 1
            return
        seen.add(key)
        found.lines.append(line)
        found.records.append(record)

    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        record, problem = _parse(line)
        if problem is not None:
            raise InputError(
                f"answer log '{path}' line {number} is not a bench record ({problem}): the file is "
                f"damaged (only a cut-short last line is an interrupted write); restore it, or delete "
                f"line {number} to run that generation again"
            )
        keep(line, record)
    if tail.strip():
        record, problem = _parse(tail) if keep_unterminated else (None, "cut short")
        if record is not None:
            keep(tail, record)
        else:
            found.dropped += 1
    return found


class AnswerLog:
    """``answers.jsonl`` open for appending.

    Opening it reads every record (``read_answers``: a damaged line is an ``InputError``); a
    truncated last line (a kill mid-write) or a duplicate record is dropped and the file rewritten
    without it, so appends start clean.
    """

    def __init__(self, path: Path):
        self.path = path
        self.records: list[dict] = []
        self.dropped = 0
        self.duplicates = 0
        if path.exists():
            self._load()
        self.keys = {record_key(r) for r in self.records}

    def _load(self) -> None:
        found = read_answers(self.path)
        self.records, self.dropped, self.duplicates = found.records, found.dropped, found.duplicates
        if self.dropped or self.duplicates:
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


def _read_json(path: Path, what: str, fix: str) -> Any:
    data = read_bytes(path, what, fix)
    try:
        return loads(data)
    except TooDeep as exc:
        problem = str(exc)
    except UnicodeDecodeError:
        problem = "not UTF-8 text"
    except ValueError as exc:
        problem = f"not JSON: {str(exc).splitlines()[0]}"
    raise InputError(f"{what} '{path}' cannot be read ({problem}): {fix}")


def meta_problem(meta: Any) -> Optional[str]:
    """Why ``meta`` is not a bench folder's ``bench.json`` (what the resume and the report read), or None."""
    if not isinstance(meta, dict):
        return f"a JSON {type(meta).__name__}, not an object"
    for key, kind in (("settings", dict), ("baseline", str), ("prompt_sets", list), ("units", list)):
        if key not in meta:
            return f"no '{key}'"
        if not isinstance(meta[key], kind):
            return f"'{key}' is a {type(meta[key]).__name__}, not a{'n' if kind is str else ''} {kind.__name__}"
    if not all(isinstance(name, str) for name in meta["prompt_sets"]):
        return "'prompt_sets' holds something other than names"
    for unit in meta["units"]:
        if not isinstance(unit, dict) or not isinstance(unit.get("name"), str) or not isinstance(unit.get("kind"), str):
            return "a unit is not an object with a 'name' and a 'kind'"
    for key in ("oracle", "skipped"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            return f"'{key}' is a {type(meta[key]).__name__}, not an object"
    ablation = meta.get("ablation")
    if ablation is not None and not (
        isinstance(ablation, dict)
        and isinstance(ablation.get("keys"), list)
        and isinstance(ablation.get("points"), dict)
        and all(isinstance(v, dict) for v in ablation["points"].values())
    ):
        return "'ablation' is not an object with 'keys' and 'points'"
    return None


def read_meta(out: Path) -> dict:
    """``bench.json`` of a bench folder, checked; ``InputError`` in one line naming the file and the fix."""
    path = Path(out) / META
    fix = "restore it, or delete it and rerun the same pacer bench command to write it again"
    meta = _read_json(path, "bench file", fix)
    problem = meta_problem(meta)
    if problem is not None:
        raise InputError(f"bench file '{path}' is not a bench's settings ({problem}): {fix}")
    return meta


def read_cost_model(out: Path) -> Optional[dict]:
    """``cost_model.json`` of a bench folder (None when absent), checked like ``read_meta``."""
    path = Path(out) / COST_MODEL
    if not os.path.lexists(path):
        return None
    fix = "delete it (the report then leaves out the verification cost) or restore it"
    cost = _read_json(path, "cost model", fix)
    verify = cost.get("verify_s") if isinstance(cost, dict) else None
    if not (isinstance(verify, list) and 0 < len(verify) <= MAX_TOKENS and all(is_seconds(v) for v in verify)):
        raise InputError(f"cost model '{path}' has no list of seconds under 'verify_s': {fix}")
    if "tree_k" in cost or "tree_verify_s" in cost:  # written since token trees (older files lack them)
        tree_k, tree_s = cost.get("tree_k"), cost.get("tree_verify_s")
        if not (
            isinstance(tree_k, list)
            and isinstance(tree_s, list)
            and len(tree_k) == len(tree_s)
            and all(isinstance(k, int) and not isinstance(k, bool) and 2 <= k <= MAX_TOKENS for k in tree_k)
            and tree_k == sorted(set(tree_k))
            and all(is_seconds(v) for v in tree_s)
        ):
            raise InputError(
                f"cost model '{path}' has no matching lists of ascending token counts >= 2 under "
                f"'tree_k' and seconds under 'tree_verify_s': {fix}"
            )
    return cost


def load_run(out: Path) -> tuple[dict, list[dict], Optional[dict]]:
    """(bench meta, records, cost model or None) of a bench folder; a last line cut short is skipped,
    any other damage is an ``InputError`` in one line."""
    out = Path(out)
    if not (out / META).exists() or not (out / ANSWERS).exists():
        raise InputError(f"'{out}' is not a bench folder (no {META} / {ANSWERS}): run `pacer bench --out {out}` first")
    meta = read_meta(out)
    records = read_answers(out / ANSWERS, keep_unterminated=True).records
    return meta, records, read_cost_model(out)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """Index of the first position where the two token lists differ (None if identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def make_record(
    set_name: str,
    prompt: Any,
    model_id: str,
    kind: str,
    repeat: int,
    ids: list[int],
    tokens: list[int],
    text: str,
    metrics: dict,
    finish: str,
    reference: Optional[list[int]],
    turn: int = 0,
) -> dict:
    """One generation's record (turn ``turn`` of the question); ``reference`` is autoregressive
    decoding's tokens for the same key (the same turn)."""
    divergence = first_divergence(tokens, reference) if reference is not None else None
    return {
        "question_id": prompt.question_id,
        "category": prompt.category,
        "prompt_set": set_name,
        "model_id": model_id,
        "kind": kind,
        "repeat": repeat,
        "turn": turn,
        "choices": [
            {
                "index": 0,
                "turns": [text],
                "decoding_steps": [int(metrics.get("steps", 0))],
                "new_tokens": [len(tokens)],
                "wall_time": [float(metrics.get("wall_s", 0.0))],
                "accept_lengths": list(metrics.get("accept_lengths", [])),
            }
        ],
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
