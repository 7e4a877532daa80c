"""Tests of my_stop_plugin on tiny random models built from a config (nothing downloaded)."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import my_stop_plugin
from pacer_core import Engine, load_plan
from pacer_core.hf import HFModel


def tiny_llama(seed: int) -> HFModel:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(32.0)  # peaky distributions, so draft probabilities vary
    return HFModel(model)  # no EOS: every run decodes the full budget


def generate(drafter: str, stop: str) -> dict:
    overrides = [f"strategy.drafter={{name: {drafter}}}", f"strategy.stop=[{stop}]"]
    plan = load_plan(overrides=overrides, extra_plugins=[my_stop_plugin], require_models=False)
    engine = Engine.build(tiny_llama(0), draft=tiny_llama(1), plan=plan)
    result = engine.generate([5, 9, 13, 5, 9], max_new_tokens=24)
    return {"tokens": result.tokens, "lengths": result.metrics["draft_length_histogram"]}


def test_prob_floor_bounds_drafts_and_keeps_the_output():
    plain = generate("autoregressive", "")
    never = generate("draft_model", "{name: prob_floor, floor: 0.0, max_tokens: 5}")
    always = generate("draft_model", "{name: prob_floor, floor: 1.01, max_tokens: 5}")
    assert max(never["lengths"]) == 5  # nothing is below a floor of 0: drafts reach max_tokens
    assert set(always["lengths"]) == {1}  # every token is below 1.01: stop after the first
    assert never["tokens"] == always["tokens"] == plain["tokens"]  # lossless
