"""Host time per step: what a decoding step costs outside the model forwards (docs/host-time.md).

On a GPU every step pays this time on top of its forwards: the drafter's logic (tree growth and
selection), masks and positions, the verifier's acceptance, cache bookkeeping and the hooks'
dispatch. It is measured on tiny models built in memory (one decoder layer, random weights, nothing
downloaded), whose forwards are timed and subtracted: ``ForwardClock`` times every model forward of
an engine (the target's and draft's ``LanguageModel`` forwards, and every ``torch.nn.Module`` and
packed output layer the strategy objects hold: an ``eagle`` draft network, PACER's M_B), and a
step's host time is ``(generation wall − forward seconds) / steps``.

``measure_host_time`` runs the stacks of ``STACKS`` and keeps, per stack, the fastest of several
repeats (the machine's noise only ever adds time); ``host_profile`` turns the result into a cost
profile's ``host_s`` entry. ``pacer bench-host`` runs it from the command line; the bench reports the
same quantity for its own runs (``host_ms_per_step``, from the same clock).
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import attrs
import torch

from pacer_core.commands import Runner, bounded_int, check_out_file, command
from pacer_core.errors import InputError

# stack name -> (config overrides, tree nodes sent or None); EAGLE, DFLASH and MB name the tiny models'
# folders; eagle trees grow topk nodes per level for depth levels (topk × depth >= nodes), then send the
# best `nodes`; a dflash tree takes the `nodes` likeliest of its one block's (block 4)
STACKS: dict[str, tuple[list[str], Optional[int]]] = {
    "plain": (["strategy.drafter={name: autoregressive}", "strategy.stop=[]"], None),
    "chain": (["strategy.drafter={name: eagle, path: EAGLE}", "strategy.stop=[{name: fixed, gamma: 4}]"], None),
    "tree10": (
        [
            "strategy.drafter={name: eagle, path: EAGLE, tree: {topk: 6, depth: 4, nodes: 10}}",
            "strategy.stop=[{name: fixed, gamma: 4}]",
        ],
        10,
    ),
    "tree32": (
        [
            "strategy.drafter={name: eagle, path: EAGLE, tree: {topk: 8, depth: 5, nodes: 32}}",
            "strategy.stop=[{name: fixed, gamma: 5}]",
        ],
        32,
    ),
    "tree64": (
        [
            "strategy.drafter={name: eagle, path: EAGLE, tree: {topk: 10, depth: 7, nodes: 64}}",
            "strategy.stop=[{name: fixed, gamma: 7}]",
        ],
        64,
    ),
    "hybrid": (
        [
            "strategy.drafter={name: hybrid, members: [{name: eagle, path: EAGLE, "
            "tree: {topk: 6, depth: 4, nodes: 10}}, {name: prompt_lookup}]}",
            "strategy.stop=[{name: fixed, gamma: 4}]",
        ],
        10,
    ),
    "pacer": (["strategy.drafter={name: eagle, path: EAGLE}", "strategy.stop=[{name: pacer, checkpoint: MB}]"], None),
    "draft_model_chain": (["strategy.drafter={name: draft_model}", "strategy.stop=[{name: fixed, gamma: 4}]"], None),
    "draft_model_tree64": (
        [
            "strategy.drafter={name: draft_model, tree: {topk: 10, depth: 7, nodes: 64}}",
            "strategy.stop=[{name: fixed, gamma: 7}]",
        ],
        64,
    ),
    "block_chain": (["strategy.drafter={name: dflash, path: DFLASH}", "strategy.stop=[{name: fixed, gamma: 4}]"], None),
    "block_tree64": (
        [
            "strategy.drafter={name: dflash, path: DFLASH, tree: {topk: 10, depth: 4, nodes: 64}}",
            "strategy.stop=[{name: fixed, gamma: 4}]",
        ],
        64,
    ),
}
DEFAULT_STACKS = ("plain", "chain", "tree10", "tree32", "tree64", "hybrid", "pacer")


DEFAULT_VOCAB = 512
# the ranges of `pacer bench-host`'s options: a vocabulary as large as the largest published ones,
# threads as many as a large machine has, generations long enough to be timed, not to fill memory
MAX_VOCAB = 262144
MAX_THREADS = 256
MAX_NEW_TOKENS = 4096
MAX_REPEATS = 1000


@attrs.frozen
class Shape:
    """The tiny models' shape: a one-layer Llama target (its identical copy is the token-level draft);
    ``subset``: the eagle and dflash drafts' output vocabulary."""

    vocab: int = DEFAULT_VOCAB
    hidden: int = 64
    layers: int = 1
    subset: Optional[int] = None  # the drafts' output vocabulary (None: the whole vocabulary)


@attrs.frozen
class HostTime:
    """One stack's steps: seconds per step in all, in model forwards, and the rest (the host's)."""

    stack: str
    steps: int  # steps of the fastest repeat
    nodes_per_step: float  # tokens the target verified per step (tree nodes)
    step_s: float  # wall seconds per step
    forward_s: float  # seconds per step inside model forwards
    host_s: float  # step_s - forward_s

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


class ForwardClock:
    """Seconds spent in model forwards, summed (``seconds``); ``watch_engine`` installs it.

    Each watched forward is timed with ``clock`` once, outermost call only (a network called inside
    another watched one is not counted twice)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock, self.seconds, self._depth, self._start = clock, 0.0, 0, 0.0
        self._watched: set[int] = set()

    def _enter(self) -> None:
        if self._depth == 0:
            self._start = self.clock()
        self._depth += 1

    def _leave(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += self.clock() - self._start

    def timed(self, function: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            self._enter()
            try:
                return function(*args, **kwargs)
            finally:
                self._leave()

        return wrapper

    def watch_model(self, model: Any) -> None:
        """Time a ``LanguageModel``'s forwards: its network's (``model.model``, an ``HFModel``'s
        transformers module and its base model, so the adapter's masks and cache bookkeeping count
        as host time), else its whole ``forward`` (replaced on the instance; a ``ScriptedLM``)."""
        if model is None or id(model) in self._watched:
            return
        self._watched.add(id(model))
        network = getattr(model, "model", None)
        if isinstance(network, torch.nn.Module):
            self.watch_module(network)
            base = getattr(network, "base_model", None)
            if isinstance(base, torch.nn.Module) and base is not network:
                self.watch_module(base)
        else:
            model.forward = self.timed(model.forward)

    def watch_module(self, module: torch.nn.Module) -> None:
        """Time the module's forward and the methods its class names in ``model_work``: a draft
        network's computations that run outside ``forward`` (a block draft's context keys and values,
        an EAGLE-3 draft's fused features) are model time, not host time."""
        if id(module) in self._watched:
            return
        self._watched.add(id(module))
        module.register_forward_pre_hook(lambda *_: self._enter())
        module.register_forward_hook(lambda *_: self._leave())
        for name in getattr(module, "model_work", ()):
            setattr(module, name, self.timed(getattr(module, name)))

    def watch_engine(self, engine: Any) -> "ForwardClock":
        """Time the engine's target and draft and the models its strategy objects hold (two levels
        deep, so a ``hybrid``'s members are found)."""
        self.watch_model(engine.target)
        self.watch_model(engine.draft)
        for _, plugin in engine.pm.list_name_plugin():
            self._watch_object(plugin, depth=2)
        return self

    def _watch_object(self, obj: Any, depth: int) -> None:
        from pacer_core.kernels import PackedMatrix

        if depth < 0 or not hasattr(obj, "__dict__") or isinstance(obj, type):
            return
        for name, value in list(vars(obj).items()):
            values = value if isinstance(value, (list, tuple)) else [value]
            for item in values:
                if isinstance(item, torch.nn.Module):
                    self.watch_module(item)
                elif isinstance(item, PackedMatrix) and item is value:  # an output layer: a draft forward's
                    if id(item) not in self._watched:
                        self._watched.add(id(item))
                        setattr(obj, name, self.timed(item))
                elif callable(getattr(item, "forward", None)) and hasattr(item, "cached_tokens"):
                    self.watch_model(item)
                elif type(item).__module__.split(".")[0] not in ("builtins", "torch", "attrs"):
                    self._watch_object(item, depth - 1)


def tiny_models(shape: Shape, folder: Path, seed: int = 0) -> tuple[Any, Any, dict[str, str]]:
    """(target, draft, paths): a one-layer random Llama target (``HFModel``), an identical copy as the
    token-level draft (everything it drafts is accepted), and in ``folder`` a random ``eagle`` feature
    draft, a random ``dflash`` block draft (block 4, reading the inputs of the target's layers 0 and
    1) and a random PACER M_B for the eagle draft (paths["EAGLE"], paths["DFLASH"], paths["MB"])."""
    import copy

    from pacer_core.hf.tiny import tiny_llama, tiny_model
    from pacer_plugins.block_draft.model import BlockArch, BlockDraft, save_block_draft
    from pacer_plugins.eagle.model import ArchConfig, FeatureDraft
    from pacer_plugins.pacer_stop.model import PreVerifier, PreVerifierArch

    model = tiny_llama(seed, shape.vocab, layers=shape.layers, hidden=shape.hidden, max_positions=4096)
    target, draft = tiny_model(model, eos=False), tiny_model(copy.deepcopy(model), eos=False)
    subset = shape.vocab if shape.subset is None else shape.subset
    arch = ArchConfig(
        hidden_size=shape.hidden,
        vocab_size=shape.vocab,
        subset_size=subset,
        intermediate_size=2 * shape.hidden,
        extra_layers=0,
        **attrs.asdict(target.attention_shape()),
    )
    block_arch = BlockArch(
        hidden_size=shape.hidden,
        intermediate_size=2 * shape.hidden,
        vocab_size=shape.vocab,
        subset_size=subset,
        target_layers=[0, shape.layers],
        block=4,
        **attrs.asdict(target.attention_shape()),
    )
    # the heads cover the whole vocabulary in order, or ``subset`` ids spread evenly over it
    ids = (
        torch.arange(shape.vocab)
        if subset == shape.vocab
        else torch.linspace(0, shape.vocab - 1, subset).round().long()
    )
    with torch.random.fork_rng(devices=[]):  # seeded weights; the caller's random state is left alone
        torch.manual_seed(seed)
        net = FeatureDraft(arch)
        net.subset.copy_(ids)
        mb = PreVerifier(PreVerifierArch(input_size=shape.hidden, width=16, heads=2, ffn_size=32, max_positions=16))
        block_net = BlockDraft(block_arch)
        block_net.subset.copy_(ids)
    net.save(folder / "eagle", {"target_digest": None})
    mb.save(folder / "mb", {"target_digest": None, "draft_identity": None})
    save_block_draft(block_net, folder / "dflash", {"target_digest": None})
    return target, draft, {"EAGLE": str(folder / "eagle"), "DFLASH": str(folder / "dflash"), "MB": str(folder / "mb")}


def stack_engine(name: str, target: Any, draft: Any, paths: dict[str, str]) -> Any:
    """The engine of stack ``name`` (``STACKS``) around the tiny models: greedy, EOS ignored."""
    from pacer_core import Engine, load_plan

    overrides = [re.sub(r"\b(EAGLE|DFLASH|MB)\b", lambda m: f"'{paths[m.group(1)]}'", o) for o in STACKS[name][0]]
    overrides += [
        "strategy.verifier={name: greedy}",
        "strategy.observers=[{name: metrics}]",
        "generation.ignore_eos=true",
        "sampling.temperature=0",
    ]
    return Engine.build(target, draft=draft, plan=load_plan(overrides=overrides, require_models=False))


def prompt_ids(vocab: int, length: int = 48, seed: int = 0) -> list[int]:
    """A prompt that repeats itself (so ``prompt_lookup`` finds n-grams to draft)."""
    generator = torch.Generator().manual_seed(seed)
    phrase = torch.randint(3, vocab, (length // 3,), generator=generator).tolist()
    return (phrase * 3)[:length]


def time_engine(
    engine: Any, prompt: Sequence[int], new_tokens: int, repeats: int, clock: Callable[[], float] = time.perf_counter
) -> tuple[int, float, float, float]:
    """(steps, nodes per step, wall seconds, forward seconds) of the fastest of ``repeats`` generations
    by host time, after one untimed warm-up generation."""
    forwards = ForwardClock(clock).watch_engine(engine)
    best: Optional[tuple[int, float, float, float]] = None
    for repeat in range(repeats + 1):
        before = forwards.seconds
        start = clock()
        result = engine.generate(list(prompt), max_new_tokens=new_tokens)
        wall = clock() - start
        spent = forwards.seconds - before
        steps = int(result.metrics["steps"])
        nodes = sum(result.metrics.get("nodes_per_step", [])) / max(steps, 1)
        run = (steps, nodes, wall, spent)
        if repeat and (best is None or (wall - spent) / steps < (best[2] - best[3]) / best[0]):
            best = run
    assert best is not None
    return best


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def measure_host_time(
    stacks: Iterable[str] = DEFAULT_STACKS,
    *,
    shape: Shape = Shape(),
    new_tokens: int = 64,
    repeats: int = 5,
    threads: Optional[int] = 1,
    seed: int = 0,
    clock: str = "wall",
    progress: Callable[[str], None] = lambda line: None,
) -> list[HostTime]:
    """Host time per step of each stack of ``STACKS`` on tiny models of ``shape`` (built in memory),
    greedy, ``new_tokens`` per generation, the fastest of ``repeats``. ``threads`` pins torch's
    intra-op threads while measuring (tiny models only lose time to thread hand-offs; 1 to
    ``MAX_THREADS``, or None to keep torch's own count). ``clock``:
    "wall" (``time.perf_counter``), or "cpu" (this thread's CPU time, ``time.thread_time``: on one
    torch thread it leaves out the time other processes take the core, for a busy machine)."""
    stacks = list(stacks)
    unknown = [s for s in stacks if s not in STACKS]
    if unknown:
        raise InputError(f"unknown host-time stack {unknown[0]!r}: choose from {', '.join(STACKS)}")
    if clock not in CLOCKS:
        raise InputError(f"unknown clock {clock!r}: choose wall or cpu")
    if clock == "cpu" and threads != 1:
        raise InputError("the cpu clock counts one thread's time: measure with threads=1")
    if new_tokens < 1 or repeats < 1:
        raise InputError(f"new_tokens ({new_tokens}) and repeats ({repeats}) must be at least 1")
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise InputError(f"threads must be from 1 to {MAX_THREADS} (None: torch's own count), got {threads}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory() as folder:
            target, draft, paths = tiny_models(shape, Path(folder), seed)
            prompt = prompt_ids(shape.vocab, seed=seed)
            out = []
            for name in stacks:
                engine = stack_engine(name, target, draft, paths)
                steps, nodes, wall, spent = time_engine(engine, prompt, new_tokens, repeats, CLOCKS[clock])
                out.append(HostTime(name, steps, nodes, wall / steps, spent / steps, (wall - spent) / steps))
                progress(row_text(out[-1]))
            return out
    finally:
        torch.set_num_threads(before)


def host_profile(results: Sequence[HostTime]) -> dict[str, Any]:
    """A cost profile's ``host_s`` entry from measured results: ``plain``, ``chain`` and ``tree`` by
    nodes sent (the eagle stacks; a token-level draft's stacks are left out)."""
    by_name = {r.stack: r for r in results}
    out: dict[str, Any] = {}
    for key in ("plain", "chain"):
        if key in by_name:
            out[key] = by_name[key].host_s
    trees = {STACKS[r.stack][1]: r.host_s for r in results if r.stack.startswith("tree")}
    if trees:
        out["tree"] = dict(sorted(trees.items()))
    return out


def row_text(r: HostTime) -> str:
    return (
        f"| {r.stack} | {r.steps} | {r.nodes_per_step:.1f} | {1000 * r.step_s:.2f} | "
        f"{1000 * r.forward_s:.2f} | {1000 * r.host_s:.2f} |"
    )


TABLE_HEAD = "| stack | steps | nodes/step | step ms | forward ms | host ms |\n|---|---|---|---|---|---|"


@command("bench-host", "host time per step outside the model forwards, on tiny models (docs/host-time.md)")
def _setup(p: argparse.ArgumentParser) -> Runner:
    p.add_argument(
        "--stacks",
        default=",".join(DEFAULT_STACKS),
        help=f"comma-separated, from {', '.join(STACKS)} (default: {','.join(DEFAULT_STACKS)})",
    )
    p.add_argument(
        "--new-tokens",
        type=bounded_int(1, MAX_NEW_TOKENS),
        default=64,
        help=f"new tokens per generation, 1 to {MAX_NEW_TOKENS} (default 64)",
    )
    p.add_argument(
        "--repeats",
        type=bounded_int(1, MAX_REPEATS),
        default=5,
        help=f"timed generations per stack, 1 to {MAX_REPEATS}; the fastest counts (default 5)",
    )
    p.add_argument(
        "--vocab",
        type=bounded_int(8, MAX_VOCAB),
        default=DEFAULT_VOCAB,
        help=f"the tiny models' vocabulary, 8 to {MAX_VOCAB} (default {DEFAULT_VOCAB})",
    )
    p.add_argument(
        "--subset",
        type=bounded_int(8, MAX_VOCAB),
        default=None,
        help="the eagle and dflash drafts' output vocabulary, 8 to --vocab, e.g. 8192 as the shipped "
        "drafts' (default: the whole vocabulary)",
    )
    p.add_argument(
        "--threads",
        type=bounded_int(1, MAX_THREADS),
        default=1,
        help=f"torch threads while measuring, 1 to {MAX_THREADS} (default 1; there is no 0 for "
        "'torch's own count': give the count)",
    )
    p.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall (default), or cpu: this thread's CPU time, for a machine other jobs share",
    )
    p.add_argument("--json", metavar="FILE", help="also write the results and the profile's host_s entry here")

    def run(args: argparse.Namespace) -> int:
        if args.subset is not None and not 8 <= args.subset <= args.vocab:
            raise InputError(f"--subset must be between 8 and --vocab ({args.vocab}), got {args.subset}")
        if args.json:
            check_out_file(args.json, "--json")  # a folder or an unwritable place, refused before measuring
        stacks = [s.strip() for s in args.stacks.split(",") if s.strip()]
        unknown = [s for s in stacks if s not in STACKS]
        if unknown or not stacks:
            raise InputError(f"unknown host-time stack {(unknown or [''])[0]!r}: choose from {', '.join(STACKS)}")
        print(TABLE_HEAD, flush=True)
        results = measure_host_time(
            stacks,
            shape=Shape(vocab=args.vocab, subset=args.subset),
            new_tokens=args.new_tokens,
            repeats=args.repeats,
            threads=args.threads,
            clock=args.clock,
            progress=lambda line: print(line, flush=True),
        )
        profile = host_profile(results)
        print(f"host_s: {json.dumps({k: v for k, v in profile.items()})}")
        if args.json:
            Path(args.json).expanduser().write_text(
                json.dumps({"results": [r.as_dict() for r in results], "host_s": profile}, indent=1) + "\n"
            )
        return 0

    return run
