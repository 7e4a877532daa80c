"""Spec-Bench compatibility: its answer files, rebuilt from the answer log, and its speed report.

Spec-Bench (Xia et al., 2024) writes one JSONL answer file per method, one line per question:
``question_id``, ``category``, ``answer_id``, ``model_id``, ``choices`` and ``tstamp``, where
``choices[i]`` (seed i) holds per-turn lists ``turns`` (texts), ``decoding_steps``, ``new_tokens``,
``wall_time`` and the concatenated per-step ``accept_lengths``. ``answer_files`` builds exactly that
from our records (a repeat r is choice r, a record's turn t is entry t of the lists);
``write_answer_files`` writes them beside the answer log, so they survive interruption and resume
the way the log does (they are rebuilt whenever the report is).

``speed`` computes what Spec-Bench's ``evaluation/speed.py`` prints for one task: over a file's
questions of that task, each question's speed is its summed new tokens over its summed wall time
(choice 0, all turns); tokens/s is the mean of those speeds; the speedup is that mean over the
baseline file's mean; the mean accepted tokens is the mean of all accept lengths. Tasks are
``mt_bench`` (MT-Bench's eight categories), each other category, and ``overall``. The one
difference: speed.py recounts the baseline's tokens by re-tokenizing its text (minus one, for the
BOS token of Vicuna's tokenizer), which needs the tokenizer; we read the baseline's ``new_tokens``,
counted the way the stacks' are.

The files count steps as Spec-Bench's runners do: a drafting stack's first step that verified no
draft (the prefill alone: an EAGLE draft has no feature to draft from yet) is folded into the next
step, as its EAGLE runners count (``decoding_steps`` one fewer, the first ``accept_lengths`` entry
holding the prefill's token too); a stack that never drafted is counted as its baseline runner does
(one step per token). Question ids are Spec-Bench's (``mtbench/81`` → ``81``), so the files join its
runners' files by id. ``leaderboard_markdown`` lays the speed figures out as Spec-Bench's leaderboard,
with 95% intervals (pacer_bench/stats.py). Meaning and use: docs/benchmarks.md#spec-bench-compatibility.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .stats import SEED, format_interval, interval, ratio

FOLDER = "specbench"  # DIR/specbench/<model_id>.jsonl
ANSWER_FIELDS = ("question_id", "category", "answer_id", "model_id", "choices", "tstamp")
CHOICE_FIELDS = ("index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths")
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
MT_BENCH, OVERALL = "mt_bench", "overall"
SPEED_BASELINES = ("autoregressive", "hf_generate")  # the files speedups are computed against, when present
SPEC_BENCH_ID_SETS = ("mtbench",)  # named sets holding Spec-Bench's own rows, their ids prefixed by the set's name
# Spec-Bench's six tasks in its leaderboard's order, with its column titles
LEADERBOARD = (
    (MT_BENCH, "Multi-turn Conversation"),
    ("translation", "Translation"),
    ("summarization", "Summarization"),
    ("qa", "Question Answering"),
    ("math_reasoning", "Mathematical Reasoning"),
    ("rag", "Retrieval-aug. Generation"),
)


def _question_id(set_name: str, value: Any) -> Any:
    """Spec-Bench's id of a question: the named ``mtbench`` set's ``mtbench/81`` is Spec-Bench's row
    81 (the same question); an id that is the text of a whole number is written as a number."""
    value = str(value)
    if set_name in SPEC_BENCH_ID_SETS and value.startswith(set_name + "/"):
        value = value[len(set_name) + 1 :]
    return int(value) if re.fullmatch(r"[0-9]+", value) else value


def spec_bench_steps(record: dict, plain: bool) -> tuple[int, list[int]]:
    """(decoding steps, accept lengths) of one turn as Spec-Bench's runners count them.

    ``plain`` (a stack that never drafted): one step per emitted token, the prefill's included, as
    its baseline runner counts. Otherwise a first step that verified no draft (``drafted_per_step[0]``
    is 0: the prefill alone) is folded into the second, as its EAGLE runners count (they prefill,
    then count each tree step's accepted tokens with the token before them); a first step that
    verified a draft is a decoding step for every runner. Sums are unchanged: Σ accept lengths is
    the turn's new tokens either way. Records without ``drafted_per_step`` are left as they are."""
    choice = record["choices"][0]
    steps, accepts = int(choice["decoding_steps"][0]), [int(a) for a in choice["accept_lengths"]]
    drafted = record.get("metrics", {}).get("drafted_per_step")
    if plain or not drafted or drafted[0] != 0 or len(accepts) < 2:
        return steps, accepts
    return steps - 1, [accepts[0] + accepts[1]] + accepts[2:]


def _drafted(record: dict) -> int:
    metrics = record.get("metrics", {})
    return int(metrics.get("drafted") or sum(metrics.get("drafted_per_step", [])) or 0)


def _answer_id(set_name: str, question_id: Any, model_id: str) -> str:
    """Stable across rebuilds (Spec-Bench draws a random short uuid; nothing reads it)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"pacer-bench:{set_name}\0{question_id}\0{model_id}").hex[:22]


def answer_files(records: Sequence[dict]) -> dict[str, list[dict]]:
    """model_id → its Spec-Bench answer lines, in the order questions first appear in ``records``.

    A question's line holds every repeat recorded (choice ``index`` = repeat, in order) and, in each
    choice, every turn recorded (in order); ``tstamp`` is its latest record's."""
    grouped: dict[str, dict[tuple, dict[int, dict[int, dict]]]] = {}
    drafting = {str(r["model_id"]) for r in records if _drafted(r)}
    for r in records:
        question = (str(r["prompt_set"]), str(r["question_id"]))
        repeats = grouped.setdefault(str(r["model_id"]), {}).setdefault(question, {})
        repeats.setdefault(int(r.get("repeat", 0)), {})[int(r.get("turn", 0))] = r
    files: dict[str, list[dict]] = {}
    for model_id, questions in grouped.items():
        lines = []
        for (set_name, question_id), repeats in questions.items():
            choices, first, stamp = [], None, 0.0
            for repeat in sorted(repeats):
                turns = [repeats[repeat][t] for t in sorted(repeats[repeat])]
                first = first or turns[0]
                stamp = max([stamp] + [float(r.get("tstamp", 0.0)) for r in turns])
                per_turn = [r["choices"][0] for r in turns]  # one turn per record
                counted = [spec_bench_steps(r, model_id not in drafting) for r in turns]
                choices.append(
                    {
                        "index": repeat,
                        "turns": [c["turns"][0] for c in per_turn],
                        "decoding_steps": [steps for steps, _ in counted],
                        "new_tokens": [int(c["new_tokens"][0]) for c in per_turn],
                        "wall_time": [float(c["wall_time"][0]) for c in per_turn],
                        "accept_lengths": [a for _, accepts in counted for a in accepts],
                    }
                )
            lines.append(
                {
                    "question_id": _question_id(set_name, question_id),
                    "category": first.get("category", set_name),
                    "answer_id": _answer_id(set_name, question_id, model_id),
                    "model_id": model_id,
                    "choices": choices,
                    "tstamp": stamp,
                }
            )
        files[model_id] = lines
    return files


def file_names(model_ids: Sequence[str]) -> dict[str, str]:
    """model_id → its answer file's name: the id with characters unsafe in a file name replaced by
    ``_`` (``~2``, ``~3``, ... added when two ids would share a name)."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for model_id in model_ids:
        stem = re.sub(r"[^A-Za-z0-9._+()=,-]", "_", model_id).lstrip(".") or "_"
        name, n = f"{stem}.jsonl", 1
        while name in taken:
            n += 1
            name = f"{stem}~{n}.jsonl"
        taken.add(name)
        names[model_id] = name
    return names


def write_answer_files(out: Path, files: dict[str, list[dict]]) -> dict[str, str]:
    """Write each model's answer file under ``out/specbench/`` (atomically: a temporary file, then a
    rename); model_id → the path relative to ``out``. Other files in the folder are left alone."""
    folder = Path(out) / FOLDER
    folder.mkdir(exist_ok=True)
    paths = {}
    for model_id, name in file_names(list(files)).items():
        path = folder / name
        tmp = path.with_name(name + ".tmp")
        tmp.write_text(
            "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in files[model_id]), encoding="utf-8"
        )
        os.replace(tmp, path)
        paths[model_id] = f"{FOLDER}/{name}"
    return paths


def in_task(line: dict, task: str) -> bool:
    if task == OVERALL:
        return True
    if task == MT_BENCH:
        return line["category"] in MT_BENCH_CATEGORIES
    return line["category"] == task


def tasks(lines: Sequence[dict]) -> list[str]:
    """speed.py's tasks present in ``lines``: ``mt_bench`` (any MT-Bench category), every other
    category in order of appearance, ``overall``."""
    categories = list(dict.fromkeys(line["category"] for line in lines))
    mt = [MT_BENCH] if any(c in MT_BENCH_CATEGORIES for c in categories) else []
    return mt + [c for c in categories if c not in MT_BENCH_CATEGORIES] + [OVERALL]


def _mean(values: Sequence[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _speeds(lines: Sequence[dict]) -> list[float]:
    """Per question: summed new tokens / summed wall seconds over the turns of choice 0 (a question
    timed at zero seconds, where speed.py would divide by zero, is left out)."""
    out = []
    for line in lines:
        choice = line["choices"][0]
        seconds = sum(choice["wall_time"])
        if seconds > 0:
            out.append(sum(choice["new_tokens"]) / seconds)
    return out


def speed(lines: Sequence[dict], base_lines: Sequence[dict], task: str) -> Optional[dict]:
    """speed.py's figures for ``task``: a method's answer lines against the baseline's (None when the
    method or the baseline has no question of the task)."""
    mine = [line for line in lines if in_task(line, task)]
    base = [line for line in base_lines if in_task(line, task)]
    rate, base_rate = _mean(_speeds(mine)), _mean(_speeds(base))
    if rate is None or base_rate is None:
        return None
    accepts = [a for line in mine for a in line["choices"][0]["accept_lengths"]]
    return {
        "questions": len(mine),
        "tokens_per_s": rate,
        "baseline_tokens_per_s": base_rate,
        "speedup": rate / base_rate if base_rate else None,
        "mean_accepted_tokens": _mean(accepts),
        **speed_intervals(mine, base),
    }


def _speed(line: dict) -> Optional[float]:
    choice = line["choices"][0]
    seconds = sum(choice["wall_time"])
    return sum(choice["new_tokens"]) / seconds if seconds > 0 else None


def speed_intervals(mine: Sequence[dict], base: Sequence[dict], seed: int = SEED) -> dict[str, Optional[list]]:
    """95% intervals of ``speed``'s speedup and mean accepted tokens, by a bootstrap over questions
    (speed.py reads choice 0 alone, so there are no repeats to draw): the speedup's over the
    questions timed in both files, paired by (question id, category), each drawn with its baseline
    line (a mean of speeds over the same questions is a ratio of their sums)."""
    base_speed = {(line["question_id"], line["category"]): _speed(line) for line in base}
    paired = [(line["question_id"], line["category"], _speed(line)) for line in mine]
    paired = [(q, c, v, base_speed.get((q, c))) for q, c, v in paired]
    paired = [p for p in paired if p[2] is not None and p[3] is not None]
    speedup = interval(
        ratio,
        np.array([p[2:] for p in paired], dtype=float).reshape(-1, 2),
        [p[:2] for p in paired],
        np.random.default_rng(seed),
    )
    counts = [(sum(line["choices"][0]["accept_lengths"]), len(line["choices"][0]["accept_lengths"])) for line in mine]
    accepted = interval(
        ratio,
        np.array(counts, dtype=float).reshape(-1, 2),
        [(line["question_id"], line["category"]) for line in mine],
        np.random.default_rng(seed),
    )
    return {
        "speedup_ci": list(speedup) if speedup else None,
        "mean_accepted_tokens_ci": list(accepted) if accepted else None,
    }


def speed_report(files: dict[str, list[dict]]) -> dict[str, dict[str, dict[str, dict]]]:
    """baseline → model_id → task → ``speed``'s figures, for every answer file against each of
    ``SPEED_BASELINES`` present (the baseline's own row included: speedup 1)."""
    report: dict[str, dict[str, dict[str, dict]]] = {}
    for baseline in SPEED_BASELINES:
        if baseline not in files:
            continue
        rows = {}
        for model_id, lines in files.items():
            figures = {task: speed(lines, files[baseline], task) for task in tasks(lines)}
            rows[model_id] = {task: f for task, f in figures.items() if f is not None}
        report[baseline] = rows
    return report


TAU_NOTE = (
    "Mean accepted tokens is Spec-Bench's count, not the report's τ: its runners count the prefill's token "
    "with the first decoding step (one step fewer per answer), so for the same stack it reads higher than τ "
    "in the tables above (τ × steps ÷ (steps − 1) for an answer of that many steps)."
)


def speed_markdown(specbench: dict) -> list[str]:
    """The report's Spec-Bench section: where the files are, then one table per baseline."""

    def fmt(value: Optional[float], spec: str, unit: str = "") -> str:
        return "—" if value is None else format(value, spec) + unit

    lines = [
        "## Spec-Bench speed",
        "",
        "Spec-Bench answer files (one per stack and baseline): "
        f"{', '.join(f'`{p}`' for p in specbench['files'].values())}. "
        "Computed as Spec-Bench's `evaluation/speed.py` does (choice 0; per question, new tokens ÷ wall "
        "time over its turns; the mean over questions; speedup = that mean ÷ the baseline's; mean accepted "
        "tokens over all steps, counted as its runners count them); [low, high]: 95% interval, bootstrap over "
        "questions: see docs/benchmarks.md.",
        "",
        TAU_NOTE,
        "",
    ]
    for baseline, rows in specbench["speed"].items():
        lines += [
            f"Against `{baseline}`:",
            "",
            "| stack | task | questions | tok/s | baseline tok/s | speedup | mean accepted tokens |",
            "|---|---|---|---|---|---|---|",
        ]
        for model_id, figures in rows.items():
            for task, f in figures.items():
                lines.append(
                    f"| {model_id} | {task} | {f['questions']} | {fmt(f['tokens_per_s'], '.1f')} | "
                    f"{fmt(f['baseline_tokens_per_s'], '.1f')} | "
                    f"{format_interval(f['speedup'], f.get('speedup_ci'), '.2f', '×')} | "
                    f"{format_interval(f['mean_accepted_tokens'], f.get('mean_accepted_tokens_ci'))} |"
                )
        lines.append("")
    return lines


def shows_leaderboard(specbench: dict, prompt_sets: Sequence[str]) -> bool:
    """A run over a Spec-Bench set, or whose files hold one of its tasks other than MT-Bench."""
    if any(name == FOLDER or name.startswith(FOLDER + ":") for name in prompt_sets):
        return True
    tasks_run = {task for rows in specbench["speed"].values() for figures in rows.values() for task in figures}
    return bool(tasks_run & {task for task, _ in LEADERBOARD[1:]})


def leaderboard_markdown(specbench: dict, prompt_sets: Sequence[str]) -> list[str]:
    """Spec-Bench's leaderboard layout (a row per stack: the speedup per task, #Mean Accepted
    Tokens, Overall), then τ per task, from the speed figures against ``autoregressive`` (else the
    first baseline), with their intervals; a task the run has no question of is —, and named."""
    if not specbench.get("speed") or not shows_leaderboard(specbench, prompt_sets):
        return []
    baseline = "autoregressive" if "autoregressive" in specbench["speed"] else next(iter(specbench["speed"]))
    rows = specbench["speed"][baseline]
    present = {task for figures in rows.values() for task in figures}
    missing = [title for task, title in LEADERBOARD if task not in present]

    def speedup(f: Optional[dict]) -> str:
        return "—" if f is None else format_interval(f["speedup"], f.get("speedup_ci"), ".2f", "×")

    def tau(f: Optional[dict]) -> str:
        return "—" if f is None else format_interval(f["mean_accepted_tokens"], f.get("mean_accepted_tokens_ci"))

    titles = [title for _, title in LEADERBOARD]
    lines = [
        "## Spec-Bench leaderboard",
        "",
        f"Speedup over `{baseline}` per Spec-Bench task, as its leaderboard lays it out (speed.py's figures: "
        "the mean of per-question speeds ÷ the baseline's; #Mean Accepted Tokens: per decoding step, counted as "
        "its runners count them); [low, high]: 95% interval, bootstrap over questions.",
        "",
        TAU_NOTE,
        "",
    ]
    if missing:
        offline = FOLDER in prompt_sets
        lines += [
            f"Not in this run: {', '.join(missing)}"
            + (
                " (the offline `specbench` set builds only Multi-turn Conversation, from the MT-Bench package, and "
                "Mathematical Reasoning, from GSM8K test items; the other tasks need Spec-Bench's question.jsonl: "
                "`specbench:PATH`)."
                if offline
                else "."
            ),
            "",
        ]
    lines += [
        "| stack | " + " | ".join(titles) + " | #Mean Accepted Tokens | Overall |",
        "|---|" + "---|" * (len(titles) + 2),
    ]
    for model_id, figures in rows.items():
        cells = [speedup(figures.get(task)) for task, _ in LEADERBOARD]
        lines.append(
            f"| {model_id} | " + " | ".join(cells) + f" | {tau(figures.get(OVERALL))} | "
            f"{speedup(figures.get(OVERALL))} |"
        )
    lines += [
        "",
        "Mean accepted tokens per task (Spec-Bench's count, not the report's τ):",
        "",
        "| stack | " + " | ".join(titles) + " | Overall |",
        "|---|" + "---|" * (len(titles) + 1),
    ]
    for model_id, figures in rows.items():
        cells = [tau(figures.get(task)) for task, _ in LEADERBOARD] + [tau(figures.get(OVERALL))]
        lines.append(f"| {model_id} | " + " | ".join(cells) + " |")
    return lines + [""]
