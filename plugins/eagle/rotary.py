"""Rotary position embeddings with the scalings of Llama configs (``rope_scaling``), for draft networks.

A draft's attention rotates q and k by angles position × inverse frequency. Plain rotary embeddings
use the frequencies θ^(−2i/d); a ``rope_scaling`` entry of the draft's ``config.json`` changes them
the way transformers' ``modeling_rope_utils`` defines each type (the formulas are written out here,
from its documentation and the papers):

- ``linear`` (position interpolation): every frequency divided by ``factor``;
- ``dynamic`` (dynamic NTK): while the furthest position of a forward stays within
  ``max_position_embeddings`` nothing changes; beyond it, θ grows to
  θ · (factor · n / max_pos − (factor − 1))^(d / (d − 2)) for n = that position + 1 (transformers
  recomputes the frequencies per forward from the positions it rotates; keys already cached keep the
  rotation they were given, in EAGLE's code and in transformers alike);
- ``yarn``: frequencies blended between interpolated (÷ factor) and original by a linear ramp over the
  dimensions whose wavelength lies between ``beta_fast`` and ``beta_slow`` rotations of the original
  context, and cos/sin multiplied by the attention factor (0.1 · ln(factor) + 1 unless given);
- ``llama3`` (Llama 3.1): long wavelengths (beyond original_max / low_freq_factor) divided by
  ``factor``, short ones (below original_max / high_freq_factor) kept, the band between interpolated
  smoothly.

``Rotary.parse`` reads such an entry (``type`` or ``rope_type``, EAGLE's code reads ``type``) and
refuses anything else in one line naming the key.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import attrs
import torch

KINDS = ("default", "linear", "dynamic", "yarn", "llama3")
# the keys each kind reads besides `type`/`rope_type` (others are refused rather than silently ignored)
KEYS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor", "original_max_position_embeddings"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    },
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
}


@attrs.frozen
class Rotary:
    """The rotary embedding of a draft layer: θ plus an optional scaling (``kind`` in KINDS)."""

    theta: float
    kind: str = "default"
    factor: float = 1.0
    max_positions: int = 2048  # the config's max_position_embeddings (dynamic; yarn's default factor)
    original_max: int = 2048  # original_max_position_embeddings (llama3, yarn, dynamic)
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = 1.0  # cos and sin are multiplied by it (yarn)
    truncate: bool = True

    @classmethod
    def parse(
        cls, theta: float, scaling: Optional[dict], max_positions: int, refuse: Callable[[str], Exception]
    ) -> "Rotary":
        """A ``Rotary`` from θ and a config's ``rope_scaling`` (None or a dict); ``refuse(message)``
        builds the exception raised for an entry that is not understood."""
        if scaling is None:
            return cls(float(theta))
        if not isinstance(scaling, dict):
            raise refuse(f'rope_scaling must be an object such as {{"rope_type": "llama3", ...}}, not {scaling!r}')
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in KINDS:
            raise refuse(f"rope_scaling type {kind!r} is not supported ({', '.join(KINDS)} are)")
        unknown = set(scaling) - KEYS[kind] - {"type", "rope_type"}
        if unknown:
            raise refuse(
                f"rope_scaling key {sorted(unknown)[0]!r} is not supported with type {kind!r} "
                f"(it reads {', '.join(sorted(KEYS[kind])) or 'nothing more'})"
            )
        original = _number(scaling, "original_max_position_embeddings", max_positions, refuse, whole=True)
        default_factor = max_positions / original if kind == "yarn" else None
        factor = _number(scaling, "factor", default_factor, refuse) if kind != "default" else 1.0
        if kind == "default":
            return cls(float(theta))
        if factor < 1.0 and kind != "linear":
            raise refuse(f"rope_scaling factor {factor} must be at least 1 for type {kind!r}")
        rotary = cls(float(theta), kind, factor, max_positions, original)
        if kind == "llama3":
            low = _number(scaling, "low_freq_factor", None, refuse)
            high = _number(scaling, "high_freq_factor", None, refuse)
            if not high > low:
                raise refuse(f"rope_scaling high_freq_factor ({high}) must exceed low_freq_factor ({low})")
            rotary = attrs.evolve(rotary, low_freq_factor=low, high_freq_factor=high)
        if kind == "yarn":
            fast = _number(scaling, "beta_fast", 32.0, refuse)
            slow = _number(scaling, "beta_slow", 1.0, refuse)
            attention = scaling.get("attention_factor")
            if attention is None:
                mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
                if mscale and mscale_all:
                    attention = _mscale(factor, _number(scaling, "mscale", None, refuse)) / _mscale(
                        factor, _number(scaling, "mscale_all_dim", None, refuse)
                    )
                else:
                    attention = _mscale(factor)
            else:
                attention = _number(scaling, "attention_factor", None, refuse)
            truncate = scaling.get("truncate", True)
            if not isinstance(truncate, bool):
                raise refuse(f"rope_scaling truncate must be true or false, not {truncate!r}")
            rotary = attrs.evolve(
                rotary, beta_fast=fast, beta_slow=slow, attention_factor=float(attention), truncate=truncate
            )
        return rotary

    def inverse_frequencies(self, head_dim: int, furthest: int) -> torch.Tensor:
        """[head_dim / 2] float32 inverse frequencies; ``furthest``: the furthest position rotated + 1
        (read by ``dynamic`` only)."""
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
        theta = self.theta
        if self.kind == "dynamic" and furthest > self.max_positions:
            theta = theta * (self.factor * furthest / self.max_positions - (self.factor - 1)) ** (
                head_dim / (head_dim - 2)
            )
        inv = 1.0 / (theta**exponents)
        if self.kind == "linear":
            return inv / self.factor
        if self.kind == "llama3":
            wavelength = 2 * math.pi / inv
            low_wave, high_wave = self.original_max / self.low_freq_factor, self.original_max / self.high_freq_factor
            scaled = torch.where(wavelength > low_wave, inv / self.factor, inv)
            smooth = (self.original_max / wavelength - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            blended = (1 - smooth) * scaled / self.factor + smooth * scaled
            middle = (wavelength >= high_wave) & (wavelength <= low_wave)
            return torch.where(middle, blended, scaled)
        if self.kind == "yarn":

            def dim_of(rotations: float) -> float:  # the dimension completing `rotations` turns in the context
                return head_dim * math.log(self.original_max / (rotations * 2 * math.pi)) / (2 * math.log(theta))

            low, high = dim_of(self.beta_fast), dim_of(self.beta_slow)
            if self.truncate:
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, head_dim - 1)
            if low == high:
                high += 0.001
            ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
            keep = 1 - ramp  # the share of the original (extrapolated) frequency
            return inv / self.factor * (1 - keep) + inv * keep
        return inv

    def cos_sin(
        self, head_dim: int, positions: torch.Tensor, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, head_dim / 2] float32 cos and sin of the angles at ``positions`` [T], on ``device``
        (only ``dynamic`` reads the positions' values on the host, for its furthest position)."""
        furthest = int(positions.max()) + 1 if self.kind == "dynamic" and positions.numel() else 0
        inv = self.inverse_frequencies(head_dim, furthest).to(device)
        angles = positions.to(device).float()[:, None] * inv[None]
        return angles.cos() * self.attention_factor, angles.sin() * self.attention_factor


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _number(scaling: dict, key: str, default: Any, refuse: Callable[[str], Exception], whole: bool = False) -> float:
    value = scaling.get(key, default)
    if value is None:
        raise refuse(f"rope_scaling has no {key!r}, which its type needs")
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
        or (whole and value != int(value))
    ):
        kind = "a whole number" if whole else "a number"
        raise refuse(f"rope_scaling {key} must be {kind} > 0, not {value!r}")
    return float(value)
