"""Tiny seeded Llama models built from a config (nothing downloaded), wrapped in the adapter: the
pairs ``pacer check`` and plugin authors' tests run strategy stacks on."""

from __future__ import annotations

import copy
from typing import Sequence

import torch

from .adapter import HFModel, _quiet_transformers

TINY_EOS = 2


def tiny_llama(
    seed: int,
    vocab: int = 64,
    *,
    layers: int = 2,
    hidden: int = 32,
    scale: float = 1.0,
    max_positions: int = 256,
    eos_bias: float = 0.0,
) -> torch.nn.Module:
    """A random Llama (fp32, eval); ``scale`` multiplies the output layer (larger = peakier
    distributions); ``eos_bias`` is added to token ``TINY_EOS``'s logit (EOS comes sooner)."""
    transformers = _quiet_transformers()
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        config = transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_positions,
            eos_token_id=TINY_EOS,
            bos_token_id=1,
            pad_token_id=0,
            tie_word_embeddings=False,
        )
        model = transformers.LlamaForCausalLM(config).eval()
    finally:
        torch.random.set_rng_state(generator_state)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
        if eos_bias:
            head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
            head.weight.copy_(model.lm_head.weight)
            head.bias.zero_()
            head.bias[TINY_EOS] = eos_bias
            model.lm_head = head
    return model


def noisy_copy(model: torch.nn.Module, std: float, seed: int) -> torch.nn.Module:
    """A copy of ``model`` with Gaussian noise of ``std`` times each weight tensor's spread added: as
    a draft it agrees with ``model`` often, not always."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in draft.parameters():
            if weight.numel() > 1:
                weight.add_(torch.randn(weight.shape, generator=generator) * std * weight.std())
    return draft


def tiny_model(model: torch.nn.Module, eos: bool = True) -> HFModel:
    """``model`` behind the adapter, with EOS ``TINY_EOS`` (or none)."""
    return HFModel(model, eos_token_ids=[TINY_EOS] if eos else [])


__all__: Sequence[str] = ["TINY_EOS", "noisy_copy", "tiny_llama", "tiny_model"]
