"""Prepacked weights for CPU inference: verification costs about one decoding step, not 1.6 of them.

On CPU, ``torch.nn.functional.linear`` re-lays-out (packs) its weight matrix on every call. For one
row that is skipped (a matrix-vector product), but for 2–8 rows — exactly a verification block — the
packing makes an fp32 forward of SmolLM2-135M cost 1.5–2× a one-token forward (96 vs 57 ms for two
tokens), which eats most of what speculative decoding saves. oneDNN can pack a weight once and
reuse it: the same forward then costs 45 ms for two tokens and 37 ms for one (bf16: 31 and 31 ms).
Measured by ``pacer bench --config configs/bench_core.yaml`` with and without ``pack_weights``.

``pack_linears(module)`` swaps every ``nn.Linear`` below ``module`` for a ``PackedLinear`` that keeps
the original ``weight`` / ``bias`` parameters (state dicts, tied embeddings and weight sharing are
unchanged) and multiplies with a packed copy when no gradient is wanted. ``PackedMatrix`` is the
same for a bare matrix (a draft's vocabulary-subset output layer). The packed copy is a snapshot:
pack a model after its weights are final. Results equal ``F.linear`` up to float rounding (the
order of the additions differs), which is how one-token and multi-token products already differ.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Optional, Sequence, cast

import torch
import torch.nn.functional as F
from torch import nn

from .errors import InputError

BATCH_HINT = 8  # rows the packed layout is tuned for (measured: hints 4–32 beat 1 for 2–8 rows)


@functools.lru_cache(maxsize=None)
def packing_supported(dtype: torch.dtype) -> bool:
    """Whether this torch build packs weights of ``dtype`` for CPU matrix products (oneDNN), checked
    by one small product against ``F.linear``."""
    ops = getattr(torch.ops, "mkldnn", None)
    if not torch.backends.mkldnn.is_available() or ops is None:
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        weight = torch.randn(24, 16, generator=generator).to(dtype)
        x = torch.randn(3, 16, generator=generator).to(dtype)
        packed = ops._reorder_linear_weight(weight, BATCH_HINT)
        out = ops._linear_pointwise(x, packed, None, "none", [], "")
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    return out.shape == (3, 24) and torch.allclose(
        out.float(), F.linear(x, weight).float(), atol=tolerance, rtol=tolerance
    )


@functools.lru_cache(maxsize=None)
def batched_slowdown(dtype: torch.dtype, rows: int = 64) -> float:
    """How many times longer than in float32 a CPU matrix product of ``rows`` rows (× 512 × 512)
    takes in ``dtype`` here, the best of three each. bfloat16 and float16 products run without fast
    kernels on CPUs lacking their instructions: on a 2-core AVX2 CPU bf16 took 44× as long at 256 rows
    (1.0 against 45 GFLOP/s), while one-row products, bound by reading the weights, stayed fast."""
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(rows, 512, generator=generator), torch.randn(512, 512, generator=generator)

    def best(x: torch.Tensor, y: torch.Tensor) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - start)
        return min(times)

    return best(a.to(dtype), b.to(dtype)) / max(best(a, b), 1e-9)


def batched_dtype_hint(dtype: torch.dtype, device: torch.device, option: str) -> Optional[str]:
    """One line for a batched job (feature extraction, batched generation) asked to run in bf16/fp16
    on a CPU where that is several times slower than float32, naming ``option`` to set; else None."""
    if device.type != "cpu" or dtype not in (torch.bfloat16, torch.float16):
        return None
    slowdown = batched_slowdown(dtype)
    if slowdown < 3:
        return None
    name = str(dtype).removeprefix("torch.")
    return (
        f"{name} matrix products of many rows take {slowdown:.0f}× as long as float32 ones on this CPU (no fast "
        f"{name} kernels): set {option}=float32 for this batched work"
    )


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), BATCH_HINT)


def _packed_product(x: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


class PackedLinear(nn.Module):
    """An ``nn.Linear`` whose inference products use a weight packed once (see the module doc)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self._packed: Optional[torch.Tensor] = _pack(linear.weight)
        self._packed_bias = None if linear.bias is None else linear.bias.detach()
        self._fused: Optional[tuple[FusedProducts, int]] = None  # see fuse_siblings

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return F.linear(x, self.weight, self.bias)  # training: the parameters, with their gradients
        if self._fused is not None:
            group, index = self._fused
            return group.product(x, index)
        return _packed_product(x, cast(torch.Tensor, self._packed), self._packed_bias)

    def extra_repr(self) -> str:
        fused = ", fused" if self._fused is not None else ""
        shape = f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        return f"{shape}, packed{fused}"


class FusedProducts:
    """One packed product for sibling layers that read the same input (a layer's q/k/v projections,
    an MLP's gate and up projections): their weights stacked into one matrix, each sibling's output a
    slice of the product. On CPU a decoding step is bound by reading the weights; one product over
    the stacked matrix runs fewer and larger kernels (vLLM stacks them too: ``qkv_proj``,
    ``gate_up_proj``). oneDNN adds each output element's terms in the same order either way, so the
    slices equal the separate products bit for bit (``tests/test_kernels.py``).

    The first sibling called with an input computes the whole product and keeps it for the others;
    each sibling takes its slice once, then the product is dropped. A sibling called with another
    input, or a second time with the same one, computes afresh, so every call returns its own
    product of the input it was given (per thread)."""

    def __init__(self, linears: Sequence[nn.Linear]):
        weights = [linear.weight.detach() for linear in linears]
        self.bounds: list[tuple[int, int]] = []
        for weight in weights:
            start = self.bounds[-1][1] if self.bounds else 0
            self.bounds.append((start, start + int(weight.shape[0])))
        self._packed = _pack(torch.cat(weights))
        biases = [linear.bias for linear in linears]
        self._bias = None if biases[0] is None else torch.cat([cast(torch.Tensor, b).detach() for b in biases])
        self._last = threading.local()  # (input, product, indices still to serve)

    def product(self, x: torch.Tensor, index: int) -> torch.Tensor:
        last = getattr(self._last, "value", None)
        if last is not None and last[0] is x and index in last[2]:
            product, waiting = last[1], last[2]
        else:
            product, waiting = _packed_product(x, self._packed, self._bias), set(range(len(self.bounds)))
        waiting.discard(index)
        self._last.value = (x, product, waiting) if waiting else None
        start, end = self.bounds[index]
        return product[..., start:end].contiguous()  # a copy only for several rows


SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # transformers' names


def fuse_siblings(module: nn.Module, groups: Sequence[Sequence[str]] = SIBLINGS) -> int:
    """Give the ``PackedLinear`` children named by one of ``groups`` under any submodule of ``module``
    one ``FusedProducts`` (when they share their input width, dtype and having a bias); returns how
    many groups were fused. Call after ``pack_linears``; their own packed copies are freed."""
    count = 0
    for parent in module.modules():
        for names in groups:
            linears = [getattr(parent, name, None) for name in names]
            if not all(isinstance(linear, PackedLinear) for linear in linears):
                continue
            members = cast(list[PackedLinear], linears)
            first = members[0]
            if any(
                m.in_features != first.in_features
                or m.weight.dtype != first.weight.dtype
                or (m.bias is None) != (first.bias is None)
                for m in members
            ):
                continue
            group = FusedProducts(cast(list[nn.Linear], members))
            for index, member in enumerate(members):
                member._fused, member._packed = (group, index), None
            count += 1
    return count


class PackedMatrix:
    """``x @ matrix.T`` with ``matrix`` packed once (for a bare weight such as an output-layer slice)."""

    def __init__(self, matrix: torch.Tensor, pack: bool):
        self.matrix = matrix
        self._packed = _pack(matrix) if pack else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is None:
            return x @ self.matrix.T
        return _packed_product(x.to(self.matrix.dtype), self._packed, None)


def pack_linears(module: nn.Module) -> int:
    """Replace every ``nn.Linear`` below ``module`` with a ``PackedLinear``; returns how many. The
    caller checks ``packing_supported`` for the weights' dtype and that they live on the CPU."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count


def should_pack(requested: Optional[bool], dtype: torch.dtype, device: torch.device, what: str) -> bool:
    """Resolve a ``pack_weights`` option: ``None`` packs when the weights are on the CPU and the build
    supports their dtype; ``True`` insists (one-line error otherwise); ``False`` never packs."""
    possible = device.type == "cpu" and packing_supported(dtype)
    if requested and not possible:
        reason = (
            "the weights are not on the CPU"
            if device.type != "cpu"
            else f"this torch build cannot pack {str(dtype).removeprefix('torch.')} weights (oneDNN)"
        )
        raise InputError(f"{what}: pack_weights=true but {reason}; set pack_weights to null or false")
    return possible if requested is None else bool(requested)
