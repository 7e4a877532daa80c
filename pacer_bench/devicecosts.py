"""A device's cost profile measured on random weights in real shapes (scripts/gpu_check.sh, docs/gpu.md).

What a decoding step costs on a device depends on the models' shapes, the dtype and the device, not
on the values of the weights. So this module builds, with random weights and directly on the device
(``pacer_core.hf.random_models``), a target of a known shape (``TARGETS``: the embedded target's,
SmolLM2-135M, and Llama-3-8B's), a one-layer feature head of its width (EAGLE-shaped:
``pacer_plugins.eagle.model.FeatureDraft`` and its output layer) and a token-level draft about a tenth of
its size, and measures after ``context`` cached tokens:

- ``verify_s``: one causal target forward over k new tokens (a chain's verification), k = 1..128;
- ``tree_verify_s``: one tree-masked target forward over k tokens (``pacer_bench.timing``'s probe);
- ``draft_s``: one draft forward over w tokens (one chain step, or one tree level), per drafter kind;
- ``preverify_s``: one consultation of PACER's M_B (``pacer_plugins.pacer_stop.model``, random, the shipped arch);
- ``host_s``: the host time per step outside the forwards (``pacer_bench.hosttime``).

The result is a cost profile (``pacer_core.cost_profiles``; curves made non-decreasing with ``monotone``)
plus a JSON file of the raw medians. Every phase gets a share of a time budget (``--seconds``): a
first pass is timed and the repeats are chosen to fit. With ``--small`` the shapes shrink to two
layers and a small width and vocabulary, so the same code runs on a CPU in seconds (the tests).

    python -m pacer_bench.devicecosts --target llama3-8b --out OUT/profile-llama3-8b.yaml
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import attrs
import torch

from pacer_core.cost_profiles import Profile, monotone, profile_from_dict, profile_to_dict, write_profile
from pacer_core.errors import InputError, PacerError
from pacer_core.hf.random_models import LlamaShape, random_llama

CHAIN_KS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 112, 128)
TREE_KS = (2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
DRAFT_WIDTHS = (1, 2, 4, 8, 16, 32, 64)
PREVERIFY_TOKENS = 8  # consultations per draft when timing M_B
MAX_REPEATS = 9


@attrs.frozen
class Target:
    """A target shape and the drafts measured with it."""

    label: str  # what the profile's target entry calls it
    shape: LlamaShape
    token_draft: LlamaShape  # a token-level draft about a tenth of the target
    feature_vocab: Optional[int]  # the feature head's output rows (None: the full vocabulary)


TARGETS = {
    # the embedded target (SmolLM2-135M-Instruct); its feature head reads the shipped drafts' 8192-token subset
    "smollm2-135m": Target(
        "SmolLM2-135M shape, random weights",
        LlamaShape(
            "smollm2-135m",
            layers=30,
            hidden=576,
            heads=9,
            kv_heads=3,
            intermediate=1536,
            vocab=49152,
            rope_theta=100000.0,
            tie_embeddings=True,
        ),
        LlamaShape(
            "smollm2-135m-3-layers",
            layers=3,
            hidden=576,
            heads=9,
            kv_heads=3,
            intermediate=1536,
            vocab=49152,
            rope_theta=100000.0,
            tie_embeddings=True,
        ),
        8192,
    ),
    # Llama-3-8B; its feature head has the full output layer (as EAGLE-2's published Llama-3 heads)
    "llama3-8b": Target(
        "Llama-3-8B shape, random weights",
        LlamaShape(
            "llama3-8b",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            intermediate=14336,
            vocab=128256,
            rope_theta=500000.0,
        ),
        LlamaShape(
            "llama3-0.8b",
            layers=12,
            hidden=2048,
            heads=32,
            kv_heads=8,
            intermediate=5632,
            vocab=128256,
            rope_theta=500000.0,
            tie_embeddings=True,
        ),
        None,
    ),
}
SMALL_VOCAB = 2048
SMALL_WIDTH = 256  # the small shapes' width at most (heads kept, so the attention grouping is the same)


def small(target: Target) -> Target:
    """``target`` shrunk for a CPU run: two layers (the token draft one), width <= SMALL_WIDTH, a
    SMALL_VOCAB vocabulary; a feature head over a quarter of it when the real one reads a subset."""
    head_dim = max(2, SMALL_WIDTH // target.shape.heads)
    shape = target.shape.scaled(f"{target.shape.name}-small", 2, head_dim, SMALL_VOCAB)
    draft = target.shape.scaled(f"{target.token_draft.name}-small", 1, head_dim, SMALL_VOCAB)
    return Target(
        f"{target.label}, shrunk to {shape.layers} layers, width {shape.hidden}, vocab {shape.vocab}",
        shape,
        draft,
        None if target.feature_vocab is None else SMALL_VOCAB // 4,
    )


# -- measuring -------------------------------------------------------------------------------------
class Budget:
    """A deadline shared by the phases; each asks how many repeats of a timed pass fit its share."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.clock, self.end = clock, clock() + seconds

    def left(self) -> float:
        return max(0.0, self.end - self.clock())

    def repeats(self, pass_s: float, share: float, most: int = MAX_REPEATS) -> int:
        """Repeats of a pass costing ``pass_s`` that fit ``share`` of the time left (at least one)."""
        return max(1, min(most, int(self.left() * share / max(pass_s, 1e-9))))


def context_ids(vocab: int, length: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (length,), generator=generator).tolist()


def forward_curves(
    model: Any,
    context: Sequence[int],
    ks: Sequence[int],
    tree_ks: Sequence[int],
    clock: Callable[[], float],
    budget: Budget,
    share: float,
) -> tuple[dict, dict, int]:
    """({k: median s} of causal forwards, {k: median s} of tree-masked ones, repeats) after ``context``."""
    from .timing import measure_verify_costs

    start = time.perf_counter()
    measure_verify_costs(model, context, ks, 1, clock, tree_ks)  # a first pass: warms up and prices one
    repeats = budget.repeats(time.perf_counter() - start, share)
    chain, tree = measure_verify_costs(model, context, ks, repeats, clock, tree_ks)
    return dict(zip(ks, chain)), dict(zip(tree_ks, tree)), repeats


def feature_head(
    target: Target, shape: LlamaShape, device: str, dtype: torch.dtype
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """(network, embedding table [vocab, d], output rows [subset, d]): a random one-layer feature
    draft of the target's width, built on the device."""
    from pacer_plugins.eagle.model import ArchConfig, FeatureDraft

    subset = target.feature_vocab or shape.vocab
    arch = ArchConfig(
        hidden_size=shape.hidden,
        num_heads=shape.heads,
        num_kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        intermediate_size=shape.intermediate,
        rope_theta=shape.rope_theta,
        vocab_size=shape.vocab,
        subset_size=subset,
    )
    with torch.device(device):
        net = FeatureDraft(arch).to(dtype).eval()
        embed = torch.randn(shape.vocab, shape.hidden, dtype=dtype) * 0.02
        head = torch.randn(subset, shape.hidden, dtype=dtype) * 0.02
    return net, embed, head


@torch.inference_mode()
def feature_level_curve(
    target: Target,
    shape: LlamaShape,
    device: str,
    dtype: torch.dtype,
    context: int,
    widths: Sequence[int],
    clock: Callable[[], float],
    budget: Budget,
    share: float,
) -> tuple[dict, int]:
    """{w: median s} of one feature-head forward over w rows after ``context`` cached rows, as the
    ``eagle`` drafter runs it: embeddings and features in, a tree level's mask (w > 1), the output
    layer over its rows and their distribution; the cache cropped back after each."""
    from pacer_plugins.eagle.model import KVCache

    net, embed, head = feature_head(target, shape, device, dtype)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, shape.vocab, (context + max(widths),), generator=generator).to(device)
    features = (torch.randn(context + max(widths), shape.hidden, generator=generator) * 0.5).to(device, dtype)
    cache = KVCache()
    net(embed[tokens[:context]], features[:context], torch.arange(context), cache)

    def level(w: int) -> None:
        rows = slice(context, context + w)
        mask = None
        if w > 1:  # every context row, and the level's own row (what a tree level's rows see at least)
            mask = torch.zeros(w, context + w, dtype=torch.bool)
            mask[:, :context] = True
            mask[:, context:] = torch.eye(w, dtype=torch.bool)
        out = net(embed[tokens[rows]], features[rows], torch.full((w,), context), cache, mask)
        probs = (out @ head.T).float().softmax(-1)  # [w, subset]
        probs.topk(min(8, probs.shape[-1]), dim=-1)
        cache.crop(context)

    def one_pass() -> list[float]:
        times = []
        for w in widths:
            begin = clock()
            level(w)
            times.append(clock() - begin)
        return times

    start = time.perf_counter()
    one_pass()
    repeats = budget.repeats(time.perf_counter() - start, share)
    runs = [one_pass() for _ in range(repeats)]
    return {w: sorted(r[i] for r in runs)[len(runs) // 2] for i, w in enumerate(widths)}, repeats


def preverify_cost(
    hidden: int, device: str, dtype: torch.dtype, clock: Callable[[], float], budget: Budget, share: float
) -> tuple[float, int]:
    """Median seconds of one consultation of M_B (the shipped arch, random weights, read from a
    draft's hidden state on ``device``) at positions 0..PREVERIFY_TOKENS-1 of a draft."""
    from pacer_plugins.pacer_stop.model import CONFIG, IncrementalPredictor, PreVerifier, PreVerifierArch
    from pacer_plugins.pacer_stop.policy import DEFAULT_CHECKPOINT

    shipped = json.loads((DEFAULT_CHECKPOINT / CONFIG).read_text())
    fields = {f.name for f in attrs.fields(PreVerifierArch)}
    arch = PreVerifierArch(
        **{**{k: v for k, v in shipped.items() if k in fields}, "input_size": hidden, "dropout": 0.0}
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        predictor = IncrementalPredictor(PreVerifier(arch))
    generator = torch.Generator().manual_seed(3)
    hiddens = torch.randn(PREVERIFY_TOKENS, 1, hidden, generator=generator).to(device, dtype)
    confidence = torch.stack([torch.full((PREVERIFY_TOKENS, 1), -0.3), torch.full((PREVERIFY_TOKENS, 1), 1.5)], -1)
    confidence = confidence.to(device)  # [tokens, 1, 2]: log q(x), H(q)

    def one_draft() -> list[float]:
        predictor.reset()
        times = []
        for i in range(PREVERIFY_TOKENS):
            begin = clock()
            predictor(hiddens[i], i, confidence[i] if arch.draft_confidence else None)
            times.append(clock() - begin)
        return times

    start = time.perf_counter()
    one_draft()
    repeats = budget.repeats(time.perf_counter() - start, share, most=50)
    times = sorted(t for _ in range(repeats) for t in one_draft())
    return times[len(times) // 2], repeats


def host_costs(small_run: bool) -> tuple[dict[str, Any], str]:
    """(the profile's ``host_s``, where it comes from): ``pacer_bench.hosttime`` on its tiny models
    (host time does not depend on the target's size: the forwards are subtracted)."""
    from .hosttime import host_profile, measure_host_time

    new_tokens, repeats = (16, 1) if small_run else (64, 3)
    host = host_profile(measure_host_time(new_tokens=new_tokens, repeats=repeats))
    return host, (
        f"pacer_bench.hosttime.measure_host_time (tiny models, forwards subtracted; {new_tokens} tokens, "
        f"fastest of {repeats})"
    )


# -- the profile -----------------------------------------------------------------------------------
def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"


def slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def measure(
    name: str,
    *,
    device: str,
    dtype: str,
    context: int = 512,
    seconds: float = 120.0,
    small_run: bool = False,
    host: Optional[dict[str, Any]] = None,
    host_source: str = "",
    progress: Callable[[str], None] = lambda line: None,
) -> tuple[Profile, dict[str, Any]]:
    """(profile, raw measurements) for target ``name`` of ``TARGETS`` on ``device``. ``host`` (a
    ``host_s`` entry, e.g. another profile's) is reused when given, else measured."""
    if name not in TARGETS:
        raise InputError(f"unknown target shape '{name}': choose from {', '.join(TARGETS)}")
    from pacer_core.hf import DTYPES

    if dtype not in DTYPES:
        raise InputError(f"unknown dtype '{dtype}': use one of {', '.join(DTYPES)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("device cuda: no GPU is visible; use --device cpu (with --small)")
    target = small(TARGETS[name]) if small_run else TARGETS[name]
    budget = Budget(seconds)
    phases: dict[str, float] = {}
    date = datetime.date.today().isoformat()

    def phase(label: str, begun: float) -> None:
        phases[label] = round(time.perf_counter() - begun, 2)
        progress(f"{name}: {label} {phases[label]:.1f} s ({budget.left():.0f} s left)")

    raw = _measure_forwards(target, device, dtype, context, budget, phase)
    if host is None:
        begun = time.perf_counter()
        host, host_source = host_costs(small_run)
        phase("host time", begun)
    raw["host_s"] = host
    data = _profile_data(target, device, dtype, context, raw, host, host_source, date)
    profile = profile_from_dict(data, f"measured {name}")
    raw.update(
        phases_s=phases,
        device=data["device"],
        torch=torch.__version__,
        date=date,
        token_draft={"name": target.token_draft.name, **target.token_draft.describe()},
    )
    return profile, raw


def _measure_forwards(
    target: Target, device: str, dtype: str, context: int, budget: Budget, phase: Callable[[str, float], None]
) -> dict[str, Any]:
    """The raw timings of every forward a profile prices, each phase reported to ``phase``: the
    target's verification curves (causal and tree-masked), the feature head's and the token draft's
    forwards per width, and M_B's consultation."""
    from pacer_core.hf import DTYPES

    from .timing import make_clock

    shape, torch_dtype, clock = target.shape, DTYPES[dtype], make_clock(device)
    raw: dict[str, Any] = {}
    begun = time.perf_counter()
    model = random_llama(shape, device, dtype, seed=0)
    ctx = context_ids(shape.vocab, context)
    phase("build target", begun)
    begun = time.perf_counter()
    chain, tree, raw["verify_repeats"] = forward_curves(model, ctx, CHAIN_KS, TREE_KS, clock, budget, 0.3)
    raw["verify_s"], raw["tree_verify_s"] = chain, tree
    phase("verification curves", begun)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()

    begun = time.perf_counter()
    feature, raw["feature_repeats"] = feature_level_curve(
        target, shape, device, torch_dtype, context, DRAFT_WIDTHS, clock, budget, 0.25
    )
    raw["draft_s_feature"] = feature
    phase("feature head", begun)
    begun = time.perf_counter()
    draft = random_llama(target.token_draft, device, dtype, seed=1)
    token_1, token_tree, raw["token_repeats"] = forward_curves(
        draft, ctx, [1], [w for w in DRAFT_WIDTHS if w > 1], clock, budget, 0.3
    )
    del draft
    raw["draft_s_token"] = {**token_1, **token_tree}
    phase("token draft", begun)
    begun = time.perf_counter()
    raw["preverify_s"], raw["preverify_repeats"] = preverify_cost(shape.hidden, device, torch_dtype, clock, budget, 0.5)
    phase("M_B", begun)
    return raw


def _profile_data(
    target: Target,
    device: str,
    dtype: str,
    context: int,
    raw: dict[str, Any],
    host: dict[str, Any],
    host_source: str,
    date: str,
) -> dict[str, Any]:
    """The measured profile file's content, each number's source cited."""
    shape = target.shape
    how = (
        f"scripts/gpu_check.sh (python -m pacer_bench.devicecosts) on {date}: random weights in the shape, "
        f"{dtype}, {context} cached tokens, median of"
    )
    return {
        "format": 1,
        "name": f"{slug(device_name(device))}-{shape.name}-{dtype}",
        "kind": "measured",
        "device": f"{device_name(device)}, batch 1",
        "dtype": dtype,
        "target": {"name": target.label, **shape.describe()},
        "context": context,
        "verify_s": smooth(raw["verify_s"]),
        "tree_verify_s": smooth(raw["tree_verify_s"]),
        "draft_s": {"feature": smooth(raw["draft_s_feature"]), "token": smooth(raw["draft_s_token"])},
        "preverify_s": seconds4(raw["preverify_s"]),
        "host_s": {key: smooth(value) if isinstance(value, dict) else seconds4(value) for key, value in host.items()},
        "sources": {
            "verify_s": f"{how} {raw['verify_repeats']} causal forwards per k",
            "tree_verify_s": f"{how} {raw['verify_repeats']} tree-masked forwards per k",
            "draft_s": (
                f"{how} {raw['feature_repeats']} (feature: one decoder layer of the target's width and its "
                f"{target.feature_vocab or shape.vocab}-row output layer) and {raw['token_repeats']} "
                f"(token: {target.token_draft.name}, {target.token_draft.params() / 1e9:.3f}B parameters) "
                "forwards per width"
            ),
            "preverify_s": f"{how} {raw['preverify_repeats'] * PREVERIFY_TOKENS} consultations of the shipped M_B arch",
            "host_s": host_source or "given",
        },
    }


def seconds4(value: float) -> float:
    """``value`` to four significant digits (the timings' noise is larger)."""
    return float(f"{value:.4g}")


def smooth(points: dict[int, float]) -> dict[int, float]:
    """The measured medians made non-decreasing in k (noise aside, more tokens never cost less), to
    four significant digits (rounding keeps the order)."""
    ks = sorted(points)
    return {k: seconds4(v) for k, v in zip(ks, monotone([points[k] for k in ks]))}


# -- command line ------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pacer_bench.devicecosts",
        description="Measure a device cost profile on random weights in a target's real shape.",
    )
    p.add_argument("--target", required=True, help=f"the target shape: {', '.join(TARGETS)}")
    p.add_argument("--out", required=True, metavar="YAML", help="the profile file to write")
    p.add_argument("--raw", metavar="JSON", help="also write the raw medians and the phases' seconds here")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when visible; default auto)")
    p.add_argument("--dtype", default=None, help="bfloat16 (the default on CUDA) or float32 (the default on the CPU)")
    p.add_argument("--context", type=int, default=512, help="cached tokens before each timed forward (512)")
    p.add_argument("--seconds", type=float, default=120.0, help="time budget of the measurements (120)")
    p.add_argument(
        "--small", action="store_true", help="shrunk shapes (2 layers, small width and vocabulary): a CPU check"
    )
    p.add_argument("--host-from", metavar="YAML", help="reuse this profile's host_s instead of measuring it")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        from pacer_core.commands import check_out_dir
        from pacer_core.cost_profiles import load_profile
        from pacer_core.hf import resolve_device

        device = resolve_device(args.device)
        dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
        if args.context < 1 or args.seconds <= 0:
            raise InputError(f"--context ({args.context}) and --seconds ({args.seconds}) must be positive")
        for path in (args.out, args.raw):
            if path:
                check_out_dir(Path(path).expanduser().parent, "--out" if path == args.out else "--raw")
        host, host_source = None, ""
        if args.host_from:
            given = load_profile(args.host_from)
            host = profile_to_dict(given)["host_s"]
            host_source = f"{given.sources.get('host_s', 'measured')} (from {Path(args.host_from).name})"
        profile, raw = measure(
            args.target,
            device=device,
            dtype=dtype,
            context=args.context,
            seconds=args.seconds,
            small_run=args.small,
            host=host,
            host_source=host_source,
            progress=lambda line: print(line, flush=True),
        )
        header = (
            f"measured by python -m pacer_bench.devicecosts --target {args.target}"
            f"{' --small' if args.small else ''} (docs/gpu.md)"
        )
        write_profile(args.out, profile, header)
        if args.raw:
            Path(args.raw).expanduser().write_text(json.dumps(raw, indent=1, default=str) + "\n")
        v = profile.verify
        print(
            f"{profile.name}: verify {v(1) * 1e3:.2f} ms (k=1), {v(16) * 1e3:.2f} ms (16), {v(128) * 1e3:.2f} ms "
            f"(128); feature draft {profile.draft['feature'](1) * 1e3:.2f} ms, token draft "
            f"{profile.draft['token'](1) * 1e3:.2f} ms; M_B {profile.preverify_s * 1e3:.3f} ms -> {args.out}"
        )
        return 0
    except PacerError as exc:
        print(f"pacer: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
