"""Causal LMs with random weights in real shapes, built directly on their device: what a device's
costs are measured on when no weights are at hand (``pacer_bench.devicecosts``, scripts/gpu_check.sh).

A forward's cost depends on the shapes, the dtype and the device, not on the values of the weights,
so a Llama of the embedded target's shape (SmolLM2-135M) or of Llama-3-8B's shape, initialised at
random, costs what the trained model costs. The weights are created on the device (a CUDA model is
never materialised on the CPU first: an 8B model in bf16 is 16 GB) and the global random state is
left as it was.
"""

from __future__ import annotations

from typing import Any, Optional

import attrs
import torch

from .adapter import DTYPES, HFModel, _quiet_transformers


@attrs.frozen
class LlamaShape:
    """A Llama-architecture decoder's shape (what its forward costs depend on)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    max_positions: int = 8192

    def __attrs_post_init__(self) -> None:
        if min(self.layers, self.hidden, self.heads, self.kv_heads, self.intermediate, self.vocab) < 1:
            raise ValueError(f"shape '{self.name}': every size must be >= 1")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"shape '{self.name}': hidden ({self.hidden}) must be a multiple of heads "
                f"({self.heads}), and heads of kv_heads ({self.kv_heads})"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def params(self) -> int:
        """Parameters: embeddings, attention, MLP and norms of every layer, the final norm and the
        output layer (shared with the embeddings when tied)."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        per_layer = attention + mlp + 2 * self.hidden
        embeddings = self.vocab * self.hidden
        return self.layers * per_layer + embeddings * (1 if self.tie_embeddings else 2) + self.hidden

    def describe(self) -> dict[str, Any]:
        """The fields a cost profile's ``target`` entry takes."""
        return {
            "params_b": round(self.params() / 1e9, 3),
            "layers": self.layers,
            "hidden": self.hidden,
            "vocab": self.vocab,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "intermediate": self.intermediate,
        }

    def scaled(self, name: str, layers: int, head_dim: int, vocab: int) -> "LlamaShape":
        """The same head counts (so the same attention grouping) at a smaller size: ``layers``
        layers, heads of ``head_dim``, the MLP's ratio to the width kept, ``vocab`` tokens."""
        hidden = self.heads * head_dim
        intermediate = max(1, round(self.intermediate * hidden / self.hidden))
        return attrs.evolve(self, name=name, layers=layers, hidden=hidden, intermediate=intermediate, vocab=vocab)


def llama_config(shape: LlamaShape) -> Any:
    """transformers' ``LlamaConfig`` of ``shape``."""
    transformers = _quiet_transformers()
    return transformers.LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        rope_theta=shape.rope_theta,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=shape.tie_embeddings,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def random_llama(
    shape: LlamaShape, device: str = "cpu", dtype: str = "float32", seed: int = 0, name: Optional[str] = None
) -> HFModel:
    """The adapter of a Llama of ``shape`` with random weights, created on ``device`` in ``dtype``
    (``float32``, ``bfloat16`` or ``float16``); seeded, without touching the global random state."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype '{dtype}': use one of {', '.join(DTYPES)}")
    transformers = _quiet_transformers()
    config = llama_config(shape)
    target = torch.device(device)
    devices = [target] if target.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        with target:  # parameters are allocated and initialised there, never on the CPU first
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    first = next(model.parameters())
    if first.device.type != target.type:
        raise RuntimeError(f"the random model was built on {first.device}, not on {device}")
    if first.dtype != DTYPES[dtype]:  # a transformers version that read the dtype under another name
        model = model.to(DTYPES[dtype])
    return HFModel(model, eos_token_ids=(), name=name or shape.name)
