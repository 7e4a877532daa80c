"""Test helpers for plugin authors: a scripted language model and an exact-distribution check.

``ScriptedLM`` implements ``pacer_core.protocols.LanguageModel`` in pure torch (no transformers, no
weights): the next-token logits are a deterministic function of the last ``order`` tokens of the
context, read from a seeded random table. It is fast enough to run tens of thousands of
generations through the engine in seconds, and its distributions are known exactly, so a strategy
can be checked against the target it claims to reproduce::

    from pacer_core import Engine, load_plan
    from pacer_core.testing import ScriptedLM, exact_continuation_probs, chisquare_pvalue

    target = ScriptedLM(vocab_size=6, seed=0)
    draft = ScriptedLM(vocab_size=6, seed=1)            # differs from the target: rejections happen
    plan = load_plan(overrides=["strategy.drafter={name: draft_model}", "sampling.temperature=1",
                                "generation.ignore_eos=true"], require_models=False)
    engine = Engine.build(target, draft=draft, plan=plan)
    prompt = [1, 2, 3]
    samples = [engine.generate(prompt, max_new_tokens=3, seed=i).tokens for i in range(20_000)]
    expected = exact_continuation_probs(target, prompt, 3, engine.sampling)  # [6, 6, 6]
    assert chisquare_pvalue(samples, expected) > 1e-3

The cache is a list of token ids (``cached_tokens``) supporting ``crop`` and ``reset``; ``forward``
appends its tokens to it like a KV cache would. A ``tree_mask`` is honoured exactly: each row's
logits are computed from the cached tokens plus the new tokens that row may attend to (in feed
order), so token trees can be scored too. ``positions`` are accepted and ignored (the
model has no notion of position). Fake hidden states ([k, hidden_size], also a deterministic
function of the same context) let PACER-style stop policies run without a real model.
"""

from __future__ import annotations

import itertools
from typing import Iterable, Optional, Sequence, Union, overload

import torch

from .protocols import ModelOutput
from .sampling import logits_to_probs
from .types import SamplingParams

__all__ = [
    "DeviceLM",
    "OnDevice",
    "ScriptedLM",
    "chisquare_pvalue",
    "count_host_reads",
    "count_host_syncs",
    "exact_continuation_probs",
    "on_device",
    "random_table",
]

MAX_BUCKETS = 1 << 16


def _num_buckets(vocab_size: int, order: int) -> int:
    return min((vocab_size + 1) ** order, MAX_BUCKETS)


def random_table(vocab_size: int, seed: int, order: int = 2, scale: float = 2.0) -> torch.Tensor:
    """A seeded table of logits, ``[buckets, vocab]`` float32, for ``ScriptedLM(table=...)``.

    ``scale`` is the standard deviation of the logits: larger means peakier distributions. Mix two
    tables (``a * t1 + (1 - a) * t2``) to get a draft correlated with its target.
    """
    generator = torch.Generator().manual_seed(seed)
    buckets = _num_buckets(vocab_size, order)
    return torch.randn(buckets, vocab_size, generator=generator) * scale


class ScriptedLM:
    """A fake causal LM whose logits depend only on the last ``order`` tokens of the context.

    The context key is the last ``order`` tokens (padded on the left with the out-of-vocabulary id
    ``vocab_size`` for short contexts) read as a base-``vocab_size + 1`` number, modulo 2**16; with
    a tiny vocabulary every key has its own row of ``table``, so distinct contexts get independent
    distributions. ``table`` ([buckets, vocab], see ``random_table``) replaces the seeded random one
    (``seed`` then only picks the fake hidden states). ``eos_token_ids`` defaults to none, so
    generations always use the whole budget.
    """

    def __init__(
        self,
        vocab_size: int = 8,
        seed: int = 0,
        *,
        order: int = 2,
        scale: float = 2.0,
        table: Optional[torch.Tensor] = None,
        hidden_size: int = 16,
        max_length: int = 1024,
        eos_token_ids: Iterable[int] = (),
    ):
        if order < 1:
            raise ValueError("order must be at least 1")
        self.vocab_size = int(vocab_size)
        self.order = int(order)
        self.hidden_size = int(hidden_size)
        self.max_length = int(max_length)
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.buckets = _num_buckets(self.vocab_size, self.order)
        if table is None:
            table = random_table(self.vocab_size, seed, order, scale)
        if tuple(table.shape) != (self.buckets, self.vocab_size):
            raise ValueError(f"table must have shape {(self.buckets, self.vocab_size)}, got {tuple(table.shape)}")
        self.table = table.float().contiguous()  # [buckets, vocab]
        generator = torch.Generator().manual_seed(seed + 7919)
        self.hidden_table = torch.randn(self.buckets, self.hidden_size, generator=generator)  # [buckets, hidden]
        self.num_forwards = 0
        self.digest: Optional[str] = None  # no weights to hash
        self.dtype, self.device = torch.float32, torch.device("cpu")
        self._tokens: list[int] = []
        self._logit_rows: dict[int, torch.Tensor] = {}  # key -> [1, vocab] view of ``table``
        self._hidden_rows: dict[int, torch.Tensor] = {}  # key -> [1, hidden] view of ``hidden_table``

    # -- the function it computes --------------------------------------------------------------
    def key(self, context: Sequence[int]) -> int:
        """The table row holding the next-token logits after ``context``."""
        base, pad = self.vocab_size + 1, self.vocab_size
        key = 0
        for i in range(self.order, 0, -1):
            key = key * base + (int(context[-i]) if i <= len(context) else pad)
        return key % self.buckets

    def next_logits(self, context: Sequence[int]) -> torch.Tensor:
        """The next-token logits after ``context`` ([vocab] float32), without touching the cache."""
        return self.table[self.key(context)]

    # -- cache ---------------------------------------------------------------------------------
    @property
    def cached_tokens(self) -> Sequence[int]:
        return self._tokens

    def reset(self) -> None:
        self._tokens = []

    def crop(self, length: int, rows: Sequence[int] = ()) -> None:
        rows = [int(r) for r in rows]
        if any(r < length or r >= len(self._tokens) for r in rows) or rows != sorted(set(rows)):
            raise ValueError(f"rows must be ascending cache indices in [{length}, {len(self._tokens)})")
        self._tokens[length:] = [self._tokens[r] for r in rows]

    # -- forward -------------------------------------------------------------------------------
    def forward(
        self,
        tokens: Sequence[int],
        *,
        positions: Optional[torch.Tensor] = None,
        tree_mask: Optional[torch.Tensor] = None,
        logits_from: int = 0,
        hidden: Union[bool, Sequence[int]] = False,
    ) -> ModelOutput:
        """Append ``tokens`` to the cache; logits rows for ``tokens[logits_from:]``.

        Row i scores the token after the cached tokens plus ``tokens[:i + 1]`` (or, with a
        ``tree_mask`` [k, k] bool, plus the new tokens row i may attend to; a [k, cached + k] mask
        also hides cached tokens). Hidden states, when asked for, cover all k rows, as ``HFModel``
        returns them; for a sequence of layer indices each layer's fake state is the row rolled by
        its index ([k, len(layers) × hidden_size]).
        """
        tokens = list(map(int, tokens))
        k = len(tokens)
        if len(self._tokens) + k > self.max_length:
            raise ValueError(f"context of {len(self._tokens) + k} tokens exceeds max_length {self.max_length}")
        if tokens and (min(tokens) < 0 or max(tokens) >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        self.num_forwards += 1
        first = 0 if hidden else logits_from
        if tree_mask is None:
            keys = self._chain_keys(tokens)[first:]
        else:
            past = len(self._tokens)
            full = torch.ones(k, past + k, dtype=torch.bool)
            full[:, past + k - tree_mask.shape[1] :] = tree_mask
            allowed = full.tolist()
            context = self._tokens + tokens
            keys = [self.key([t for t, ok in zip(context, allowed[i]) if ok]) for i in range(first, k)]
        self._tokens.extend(tokens)
        if not hidden:
            return ModelOutput(logits=self._gather(self._logit_rows, self.table, keys))
        skip = max(0, min(logits_from, k))
        states = self._gather(self._hidden_rows, self.hidden_table, keys)
        if not isinstance(hidden, bool):
            states = torch.cat([states.roll(int(i), -1) for i in hidden], dim=-1)
        return ModelOutput(logits=self._gather(self._logit_rows, self.table, keys[skip:]), hidden_states=states)

    def _chain_keys(self, tokens: list[int]) -> list[int]:
        """``key(cached + tokens[:i + 1])`` for every i, rolling the key along the chain."""
        base = self.vocab_size + 1
        span = base ** (self.order - 1)
        number = 0
        for t in ([self.vocab_size] * self.order + self._tokens[-self.order :])[-self.order :]:
            number = number * base + t
        keys = []
        for t in tokens:
            number = number % span * base + t
            keys.append(number % self.buckets)
        return keys

    @staticmethod
    def _gather(views: dict[int, torch.Tensor], table: torch.Tensor, keys: list[int]) -> torch.Tensor:
        """Rows ``keys`` of ``table``, copied ([len(keys), width]); faster than fancy indexing."""
        if not keys:
            return table[:0].clone()
        parts = []
        for key in keys:
            row = views.get(key)
            if row is None:
                row = views[key] = table[key : key + 1]
            parts.append(row)
        return torch.cat(parts)


def exact_continuation_probs(model, prompt: Sequence[int], length: int, params: SamplingParams) -> torch.Tensor:
    """The probability of every ``length``-token continuation of ``prompt`` sampled from ``model``.

    Enumerates the prefixes (1 + V + … + V^(length-1) forwards on ``model``'s cache, which is reset
    after each) and applies ``logits_to_probs`` with ``params`` at each position. Any
    ``LanguageModel`` works, ``HFModel`` included. Returns ``[vocab] * length`` float64 summing to 1;
    entry ``[a, b, c]`` is P(first three tokens = a, b, c).
    """
    vocab = model.vocab_size
    probs = torch.ones([vocab] * length, dtype=torch.float64)
    for depth in range(length):
        for prefix in itertools.product(range(vocab), repeat=depth):
            model.reset()
            context = list(prompt) + list(prefix)
            out = model.forward(context, logits_from=len(context) - 1)
            row = logits_to_probs(out.logits[-1].cpu(), params).double()  # [vocab]
            row = row / row.sum()  # as torch.multinomial normalizes the float32 row it is given
            shape = [1] * (length - depth - 1)
            probs[prefix] *= row.reshape(vocab, *shape)
    model.reset()
    return probs


def chisquare_pvalue(samples: Sequence[Sequence[int]], expected: torch.Tensor, min_expected: float = 5.0):
    """Pearson chi-square p-value of ``samples`` (token tuples) against ``expected`` probabilities.

    ``expected`` is indexed by the tuple (e.g. from ``exact_continuation_probs``). Bins whose
    expected count is below ``min_expected`` are pooled into one bin (merged into the smallest
    other bin if the pool itself stays below it). A sample with probability 0 gives p = 0. Needs scipy.
    """
    from scipy.stats import chisquare

    n = len(samples)
    expected = expected.double().contiguous()
    flat = expected.reshape(-1)
    strides = expected.stride()
    if any(len(tokens) != expected.dim() for tokens in samples):
        raise ValueError(f"every sample must have {expected.dim()} tokens, one per dimension of expected")
    index = [sum(int(t) * s for t, s in zip(tokens, strides)) for tokens in samples]
    observed = torch.bincount(torch.tensor(index, dtype=torch.long), minlength=flat.numel()).double()
    if bool(((flat == 0) & (observed > 0)).any()):
        return 0.0
    expected_counts = flat * n
    big = expected_counts >= min_expected
    obs = observed[big].tolist()
    exp = expected_counts[big].tolist()
    pooled_exp, pooled_obs = float(expected_counts[~big].sum()), float(observed[~big].sum())
    if pooled_exp >= min_expected or not exp:
        obs.append(pooled_obs)
        exp.append(pooled_exp)
    else:  # too small to stand alone: merge the pool into the smallest remaining bin
        smallest = min(range(len(exp)), key=exp.__getitem__)
        obs[smallest] += pooled_obs
        exp[smallest] += pooled_exp
    if len(exp) < 2:
        raise ValueError(f"{n} samples are too few for a chi-square test: no two bins reach {min_expected}")
    scale = sum(obs) / sum(exp)  # exp sums to n up to rounding; scipy insists on equal totals
    return float(chisquare(obs, [e * scale for e in exp]).pvalue)


# -- host syncs --------------------------------------------------------------------------------
# Reading a GPU tensor's values on the host (or an op whose output size depends on them) makes the
# host wait for the GPU: a sync. ``OnDevice`` plays a GPU tensor on the CPU so the same code can be
# checked for them without a GPU; ``count_host_syncs`` counts the real ones on CUDA.
_HOST_READS = frozenset(
    {
        "tolist",
        "item",
        "__int__",
        "__float__",
        "__bool__",
        "__index__",
        "numpy",
        "__array__",
        "cpu",
        "nonzero",
        "masked_select",
        "unique",
        "unique_consecutive",
        "argwhere",
    }
)
_MIXING_ALLOWED = frozenset({"__getitem__", "__setitem__", "to", "copy_", "__repr__", "__format__"})
_reads: Optional[list[str]] = None  # the host reads recorded while ``count_host_reads`` is active


def _to_host(name: str, args: tuple, kwargs: dict) -> bool:
    if name in _HOST_READS:
        return True
    if name != "to":
        return False
    target = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device))), None))
    return target is not None and torch.device(target).type == "cpu"


def _plain_tensors(args: Iterable) -> Iterable[torch.Tensor]:
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _plain_tensors(a)
        elif isinstance(a, torch.Tensor) and not isinstance(a, OnDevice):
            yield a


class OnDevice(torch.Tensor):
    """A CPU tensor standing for one on a GPU (tests). Results of ops on it are ``OnDevice`` too;
    reading its values on the host (``tolist``, ``int()``, ``.cpu()``, ``nonzero``, ...) returns plain
    tensors and is recorded while ``count_host_reads`` is active; mixing it with a plain tensor of
    one or more dimensions in an op raises, as CUDA does (indexing with host indices and copies
    excepted), so code that would fail on a GPU fails here too. Code asking where a tensor lives
    (``Tensor.is_cpu``) is told what a GPU's tensor tells: not on the CPU; its ``device`` stays the CPU,
    where its data is."""

    @property  # Tensor declares is_cpu a plain attribute; a read-only property here is meant
    def is_cpu(self) -> bool:  # type: ignore[override]
        return False

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        to_host = _to_host(name, args, kwargs)
        if not to_host and name not in _MIXING_ALLOWED:
            mixed = [t for t in _plain_tensors(list(args) + list(kwargs.values())) if t.dim() > 0]
            if mixed:
                raise RuntimeError(
                    f"{name}: a device tensor mixed with a host tensor of shape "
                    f"{tuple(mixed[0].shape)} (move one of them first)"
                )
        if to_host and _reads is not None:
            _reads.append(name)
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **kwargs)
        if to_host:
            return result.as_subclass(torch.Tensor) if isinstance(result, torch.Tensor) else result
        return torch._tensor._convert(result, cls)


@overload
def on_device(tensor: torch.Tensor) -> torch.Tensor: ...
@overload
def on_device(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]: ...
def on_device(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if tensor is None else tensor.as_subclass(OnDevice)


class DeviceLM:
    """A ``LanguageModel`` whose outputs are ``OnDevice``: the wrapped model as if it ran on a GPU."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    @property
    def cached_tokens(self) -> Sequence[int]:
        return self.model.cached_tokens

    def forward(self, tokens, **kwargs) -> ModelOutput:
        out = self.model.forward(tokens, **kwargs)
        return ModelOutput(logits=on_device(out.logits), hidden_states=on_device(out.hidden_states))


class count_host_reads:
    """Record the host reads of ``OnDevice`` tensors inside the ``with`` block: ``.reads`` (names)."""

    def __enter__(self) -> "count_host_reads":
        global _reads
        self._saved, _reads = _reads, []
        self.reads = _reads
        return self

    def __exit__(self, *exc) -> None:
        global _reads
        _reads = self._saved


class count_host_syncs:
    """Count the host syncs CUDA reports inside the ``with`` block (``.count``), through PyTorch's
    sync debug mode; on a machine without CUDA the count stays 0 (use ``count_host_reads``)."""

    def __enter__(self) -> "count_host_syncs":
        import warnings

        self.count = 0
        self._cuda = torch.cuda.is_available()
        if self._cuda:
            torch.cuda.synchronize()
            self._warnings = warnings.catch_warnings(record=True)
            self._caught = self._warnings.__enter__()
            warnings.simplefilter("always")
            self._mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        if self._cuda:
            torch.cuda.set_sync_debug_mode(self._mode)
            self._warnings.__exit__(*exc)
            self.count = sum("synchroniz" in str(w.message) for w in self._caught)
