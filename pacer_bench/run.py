"""``pacer bench`` / ``pacer ablate``: the run, whose results survive interruption.

One process loads the target (and draft) once and shares them across every strategy stack. For each
prompt, plain autoregressive decoding runs first, then each stack, then each external baseline
(transformers' own ``generate``), so machine drift hits all alike. Every generation appends one
Spec-Bench-style record to ``DIR/answers.jsonl`` (flushed and fsynced); a rerun skips the
(prompt, stack, repeat) keys already there. The report (``pacer_bench.report``) is computed from that
file alone. The bench YAML schema is documented in docs/benchmarks.md.

One bench writes a folder at a time: ``folder_lock`` holds an advisory lock (``flock``) on
``DIR/.bench.lock`` for the whole run, released when the process ends however it ends, and a second
``pacer bench`` (or ``pacer ablate``) on the same folder is refused in one line naming the holder's
pid; two writers would time their records under each other's load and could drop each other's
records when one rewrites the log. Ctrl-C exits 130 and SIGTERM 143, each saying what was kept.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import attrs

from pacer_core.commands import EXIT_INTERRUPTED, check_out_dir
from pacer_core.config import RunPlan
from pacer_core.errors import InputError

from . import units as _units
from .answers import ANSWERS, COST_MODEL, META, AnswerLog, json_default, make_record, read_meta, record_key, write_json
from .config import BASELINE, HF_BASELINES, BenchConfig, BenchModelConfig
from .hosttime import ForwardClock
from .prompts import load_prompts, turn_ids
from .report import write_report
from .timing import device_of, make_clock, measure_verify_costs
from .units import Models, Unit, engine_unit, hf_unit


def _settings(bench: BenchConfig, device: str) -> dict:
    """What must not change between a run and its resumption (records would not be comparable)."""

    def model(m: Optional[BenchModelConfig]):
        if m is None:
            return None
        return {
            "path": m.path,
            "dtype": m.dtype or bench.dtype,
            "device_map": m.device_map,
            "pack_weights": m.pack_weights,
        }

    return {
        "target": model(bench.target),
        "draft": model(bench.draft),
        "device": device,
        "max_new_tokens": bench.max_new_tokens,
        "sampling": attrs.asdict(bench.sampling),
        "ignore_eos": bench.ignore_eos,
        "chat_template": bench.chat_template,
    }


def _merge_meta(out: Path, meta: dict, old: Optional[dict]) -> dict:
    """Compare with the meta ``old`` of an earlier run in ``out`` (refuse incomparable settings) and merge."""
    if old is None:
        return meta
    if old.get("settings") != meta["settings"]:
        changed = [k for k in meta["settings"] if old.get("settings", {}).get(k) != meta["settings"][k]]
        raise InputError(
            f"'{out}' holds results of a bench with other settings ({', '.join(changed) or 'format'}): "
            "resume with the same settings, or choose another --out"
        )
    old_units = {u["name"]: u for u in old.get("units", [])}
    for unit in meta["units"]:
        before = old_units.get(unit["name"])
        if before is not None and before.get("config") != unit["config"]:
            raise InputError(
                f"'{out}' holds results of another definition of '{unit['name']}': rename the "
                "stack, or choose another --out"
            )
        drafts = [(u.get("draft") or {}).get("identity") for u in (before, unit) if u is not None]
        if len(drafts) == 2 and None not in drafts and drafts[0] != drafts[1]:
            raise InputError(
                f"'{out}' holds results of '{unit['name']}' made with draft {drafts[0]}, and this run reads draft "
                f"{drafts[1]}: rename the stack, restore the draft it read, or choose another --out"
            )
    names = [u["name"] for u in meta["units"]]
    meta["units"] = meta["units"] + [u for u in old.get("units", []) if u["name"] not in names]
    meta["prompt_sets"] = meta["prompt_sets"] + [p for p in old.get("prompt_sets", []) if p not in meta["prompt_sets"]]
    for key in ("skipped", "ablation"):
        if key in old and key not in meta:
            meta[key] = old[key]
    return meta


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


LOCK = ".bench.lock"
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143, as a shell reports a process SIGTERM ended


@contextmanager
def folder_lock(out: Path) -> Iterator[None]:
    """Hold the advisory lock of the bench folder ``out`` (``flock`` on ``out/.bench.lock``, holding
    this process's pid) while the block runs; the kernel releases it when the file is closed or the
    process ends, even by SIGKILL. Held by another process: ``InputError`` naming it."""
    path = out / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise InputError(
            f"--out '{out}': its lock file '{path}' cannot be opened "
            f"({exc.strerror or type(exc).__name__}): choose another --out"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            by = f" (pid {holder})" if holder.isdigit() else ""
            raise InputError(
                f"--out '{out}' is being written by another pacer bench{by}: wait for it to finish, "
                "or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the bench was, so it stops as Ctrl-C does (finished records kept)."""


@contextmanager
def _sigterm_stops() -> Iterator[None]:
    """While the block runs (in the main thread), SIGTERM raises ``Terminated``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_bench(
    bench: BenchConfig,
    stacks: dict[str, RunPlan],
    out: Path,
    *,
    models: Optional[Models] = None,
    progress: bool = True,
    report: bool = True,
    ablation: Optional[dict] = None,
) -> int:
    """Run (or resume) the bench into ``out``; write the report at the end. ``stacks``: each stack's
    run plan (``read_bench_config``), one engine built on each, so a run takes fresh plans. Returns
    the exit code (0, or 130 after Ctrl-C and 143 after SIGTERM with the finished records kept). The
    folder is locked for the run (``folder_lock``)."""
    # before models load
    prompt_sets = {name: load_prompts(name, bench.limit, bench.skip) for name in bench.prompt_sets}
    if not any(prompt_sets.values()):
        skipped = f" after skipping {bench.skip} per set" if bench.skip else ""
        raise InputError(f"no prompt to run: the prompt sets are empty{skipped}; check skip, --limit and the files")
    out = check_out_dir(out, "--out")  # a file, /dev/null or a read-only place is refused before models load
    try:
        with folder_lock(out), _sigterm_stops():
            return _run_locked(
                bench, stacks, out, prompt_sets, models=models, progress=progress, report=report, ablation=ablation
            )
    except Terminated:  # before the generations (loading models) or after them (the report)
        _log(f"terminated (SIGTERM): the generations in {out / ANSWERS} are kept; rerun the same command to resume")
        return EXIT_TERMINATED


def _run_locked(
    bench: BenchConfig,
    stacks: dict[str, RunPlan],
    out: Path,
    prompt_sets: dict,
    *,
    models: Optional[Models],
    progress: bool,
    report: bool,
    ablation: Optional[dict],
) -> int:
    """``run_bench`` once the folder is checked and locked."""
    earlier, log = _read_earlier(bench, out)  # before models load: a damaged file is refused at once
    models = _load_models(bench, models)
    device = device_of(models.target)
    clock = make_clock(device)
    units, skipped = _make_units(bench, stacks, models, clock, device)
    _write_meta(out, bench, device, units, skipped, ablation, earlier)
    work = _plan_work(bench, prompt_sets, models)

    planned = [
        (s, p.question_id, u.name, r, t)
        for s, p, _, turns in work
        for r in range(bench.repeats)
        for t in range(turns)
        for u in units
    ]
    done = sum(key in log.keys for key in planned)
    interrupted: Optional[BaseException] = None
    try:
        if done < len(planned):
            # a prompt of no set: stacks that remember earlier generations (datastore, phrase pool)
            # must not have seen a timed prompt's opening
            _warm_up(units, models.tokenizer.encode(WARMUP_PROMPT, chat_template=bench.chat_template), bench)
            if (bench.oracle.log_stack or bench.verify_cost) and not (out / COST_MODEL).exists():
                _measure_cost_model(out, bench, models, work[0][2], clock, device)
        _run_all(units, work, bench, log, models, done, len(planned), progress)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated)
        interrupted = exc
    kept = sum(key in log.keys for key in planned)
    if interrupted is not None:
        word = "terminated (SIGTERM)" if isinstance(interrupted, Terminated) else "interrupted"
        _log(f"{word}: {kept}/{len(planned)} generations kept in {out / ANSWERS}; rerun the same command to resume")
        return EXIT_TERMINATED if isinstance(interrupted, Terminated) else EXIT_INTERRUPTED
    if report:
        results = write_report(out, plots=bench.plots)
        print(results["markdown_table"])
        print(f"\nreport: {out / 'report.md'}  results: {out / 'results.json'}")
    return 0


def _read_earlier(bench: BenchConfig, out: Path) -> tuple[Optional[dict], AnswerLog]:
    """The files read before models load, so that a bad one is refused at once: each cost profile to
    predict with, the meta of an earlier run in ``out`` (or None) and its answer log."""
    from pacer_core.cost_profiles import load_profile

    for profile in bench.predict:
        load_profile(profile)
    earlier = read_meta(out) if os.path.lexists(out / META) else None
    log = AnswerLog(out / ANSWERS)
    if log.dropped:
        _log(f"dropped {log.dropped} incomplete line(s) from {out / ANSWERS} (an interrupted write)")
    if log.duplicates:
        _log(f"dropped {log.duplicates} duplicate record(s) from {out / ANSWERS} (the first of each key is kept)")
    return earlier, log


def _load_models(bench: BenchConfig, models: Optional[Models]) -> Models:
    """Set the bench's thread count, then load its models unless given (tests give them)."""
    if bench.threads is not None:
        import torch

        torch.set_num_threads(bench.threads)
    if models is None:
        _log("loading models ...")
        models = _units.load_models(bench)  # tests replace it
    if models.tokenizer is None:
        raise InputError("the bench needs a tokenizer to encode its prompts")
    return models


def _make_units(
    bench: BenchConfig, stacks: dict[str, RunPlan], models: Models, clock: Callable[[], float], device: str
) -> tuple[list[Unit], dict[str, str]]:
    """One unit per stack, then one per external baseline; a baseline that needs a draft model the
    bench lacks is skipped, with the reason."""
    skipped: dict[str, str] = {}
    forwards = ForwardClock() if device == "cpu" else None  # host time per step (docs/host-time.md)
    units = [engine_unit(name, plan, models, bench, clock, forwards) for name, plan in stacks.items()]
    for name in bench.baselines:
        if HF_BASELINES[name] and models.draft is None:
            skipped[name] = "needs a draft model: set the bench's draft.path"
            _log(f"skipping baseline {name}: it {skipped[name]}")
            continue
        units.append(hf_unit(name, models, bench, clock))
    return units, skipped


def _write_meta(
    out: Path,
    bench: BenchConfig,
    device: str,
    units: list[Unit],
    skipped: dict[str, str],
    ablation: Optional[dict],
    earlier: Optional[dict],
) -> None:
    """Write ``out``'s meta: this run's settings and units, merged with those of an earlier run."""
    meta = {
        "version": 1,
        "settings": _settings(bench, device),
        "baseline": BASELINE,
        "prompt_sets": list(bench.prompt_sets),
        "units": [
            {"name": u.name, "kind": u.kind, "config": u.description, "cost_kind": u.cost_kind, "draft": u.draft}
            for u in units
        ],
        "oracle": attrs.asdict(bench.oracle),
        "dtype": bench.dtype,
        "device": device,
        "skipped": skipped,
        "predict": list(bench.predict),
    }
    if ablation is not None:
        meta["ablation"] = ablation
    meta = _merge_meta(out, json.loads(json.dumps(meta, default=json_default)), earlier)
    write_json(out / META, meta)


def _plan_work(bench: BenchConfig, prompt_sets: dict, models: Models) -> list:
    """(set, prompt, first turn's ids, turns) of each prompt that fits the target's context. Every first
    turn is encoded once; all units decode the same ids (a later turn follows each unit's own answers)."""
    work = []
    too_long = 0
    for set_name, prompts in prompt_sets.items():
        for prompt in prompts:
            ids = turn_ids(models.tokenizer, prompt, [], bench.chat_template)
            if len(ids) + bench.max_new_tokens > models.target.max_length:
                too_long += 1
                continue
            work.append((set_name, prompt, ids, len(prompt.turns) if bench.multi_turn else 1))
    if too_long:
        _log(f"skipping {too_long} prompt(s) longer than the target's context minus max_new_tokens")
    if not work:
        raise InputError("no prompt to run: the prompt sets are empty (check --limit and the files)")
    return work


def _measure_cost_model(
    out: Path, bench: BenchConfig, models: Models, ids: list[int], clock: Callable[[], float], device: str
) -> None:
    """Measure the target's verification cost on the context ``ids`` (chains, and trees where asked,
    interleaved) and write it to ``out``'s cost model."""
    oracle = bench.oracle
    _log(
        f"measuring verification cost for k = 1..{oracle.verify_max_k} tokens"
        + (f", trees of k = {', '.join(map(str, sorted(oracle.verify_tree_k)))} tokens" if oracle.verify_tree_k else "")
        + " ..."
    )
    tree_k = sorted(oracle.verify_tree_k)
    chain_s, tree_s = measure_verify_costs(
        models.target, ids, range(1, oracle.verify_max_k + 1), oracle.verify_repeats, clock, tree_k
    )  # interleaved
    cost = {"verify_s": chain_s}
    if tree_k:
        cost["tree_k"], cost["tree_verify_s"] = tree_k, tree_s
    write_json(out / COST_MODEL, {**cost, "context_tokens": len(ids), "device": device, "dtype": bench.dtype})


WARMUP_PROMPT = "Name three colours of the rainbow."


def _warm_up(units: list[Unit], ids: list[int], bench: BenchConfig) -> None:
    budget = min(bench.max_new_tokens, 16)
    for unit in units:
        for _ in range(bench.warmup):
            unit.run(ids, 0, budget)


def _run_all(
    units: list[Unit],
    work: list,
    bench: BenchConfig,
    log: AnswerLog,
    models: Models,
    done: int,
    total: int,
    progress: bool,
) -> None:
    """Every planned generation not yet in the log: per prompt and repeat, turn by turn, every unit.
    Turn t > 0 is prompted with the unit's own answers to the earlier turns (read back from the log,
    so a resumed run continues a conversation where it stopped)."""
    from tqdm import tqdm

    by_key = {record_key(r): r for r in log.records}
    bar = tqdm(
        total=total, initial=done, unit="gen", file=sys.stderr, dynamic_ncols=True, disable=not progress, smoothing=0.1
    )
    too_long = 0
    try:
        for set_name, prompt, first_ids, turns in work:
            for repeat in range(bench.repeats):
                ended: set[str] = set()  # units whose conversation no longer fits the target's context
                for turn in range(turns):
                    reference_key = (set_name, prompt.question_id, BASELINE, repeat, turn)
                    for unit in units:
                        key = (set_name, prompt.question_id, unit.name, repeat, turn)
                        if key in log.keys or unit.name in ended:
                            continue
                        earlier = [by_key[(set_name, prompt.question_id, unit.name, repeat, t)] for t in range(turn)]
                        answers = [r["choices"][0]["turns"][0] for r in earlier]
                        ids = turn_ids(models.tokenizer, prompt, answers, bench.chat_template) if turn else first_ids
                        if len(ids) + bench.max_new_tokens > models.target.max_length:
                            ended.add(unit.name)
                            too_long += turns - turn
                            continue
                        bar.set_postfix_str(f"{set_name} {unit.name}", refresh=False)
                        tokens, metrics, finish = unit.run(ids, repeat, bench.max_new_tokens)
                        reference = by_key.get(reference_key)
                        ref_tokens = tokens if unit.name == BASELINE else (reference or {}).get("tokens")
                        record = make_record(
                            set_name,
                            prompt,
                            unit.name,
                            unit.kind,
                            repeat,
                            ids,
                            tokens,
                            models.tokenizer.decode(tokens),
                            metrics,
                            finish,
                            ref_tokens,
                            turn,
                        )
                        log.append(record)
                        by_key[key] = record
                        bar.update(1)
    finally:
        bar.close()
    if too_long:
        _log(
            f"skipped {too_long} later turn(s): the conversation so far plus max_new_tokens exceeds the "
            "target's context"
        )
