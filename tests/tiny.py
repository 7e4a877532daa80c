"""Tiny seeded Hugging Face models built from configs (nothing downloaded), shared by the tests."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from pacer_core.hf import HFModel

VOCAB = 64
EOS = 2


def tiny_llama(seed: int, vocab: int = VOCAB, layers: int = 2, hidden: int = 32, scale: float = 1.0,
               max_positions: int = 256) -> LlamaForCausalLM:
    """A random Llama; ``scale`` multiplies the output layer (larger = peakier distributions)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
        eos_token_id=EOS, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def adapter(model: LlamaForCausalLM, eos: bool = True) -> HFModel:
    return HFModel(model, eos_token_ids=[EOS] if eos else [])


def reference_greedy(model: LlamaForCausalLM, prompt: list[int], max_new_tokens: int, eos: bool = True) -> list[int]:
    """The target's own greedy decoding, by transformers' ``generate``."""
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=EOS if eos else None, pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
    )
    return out[0, len(prompt):].tolist()
