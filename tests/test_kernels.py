"""Prepacked CPU weights (``pacer_core.kernels``): the same products as ``F.linear``, the same module
interface (state dict, tied weights, gradients), and speculative decoding with packed models is
still the target's greedy decoding. ``pack_weights`` resolves as documented."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from pacer_core import Engine, InputError, kernels, load_config
from pacer_core.kernels import (
    PackedLinear,
    PackedMatrix,
    fuse_siblings,
    pack_linears,
    packing_supported,
    should_pack,
)

from helpers import adapter, reference_greedy, tiny_llama

needs_packing = pytest.mark.skipif(not packing_supported(torch.float32), reason="this torch build cannot pack weights")


@needs_packing
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 33])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_functional_linear(rows, bias):
    torch.manual_seed(rows)
    linear = torch.nn.Linear(48, 80, bias=bias)
    packed = PackedLinear(linear)
    x = torch.randn(1, rows, 48)
    with torch.no_grad():
        assert torch.allclose(packed(x), F.linear(x, linear.weight, linear.bias), atol=1e-5, rtol=1e-5)
        assert packed(x[0]).shape == (rows, 80)  # 2-D input too


@pytest.mark.skipif(not packing_supported(torch.bfloat16), reason="this torch build cannot pack bf16 weights")
def test_packed_bfloat16_matches_within_its_rounding():
    torch.manual_seed(0)
    weight = torch.randn(64, 32).bfloat16()
    x = torch.randn(4, 32).bfloat16()
    assert torch.allclose(PackedMatrix(weight, pack=True)(x).float(), (x @ weight.T).float(), atol=0.1, rtol=0.02)


@needs_packing
def test_packed_linear_keeps_parameters_state_dict_and_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4, bias=False))
    keys, weights = list(model.state_dict()), [p for p in model.parameters()]
    assert pack_linears(model) == 2
    assert list(model.state_dict()) == keys
    assert all(a is b for a, b in zip(model.parameters(), weights))  # the same Parameter objects
    x = torch.randn(3, 8)
    model(x).sum().backward()  # with gradients: the plain product, so training still works
    assert model[0].weight.grad is not None and model[2].weight.grad is not None
    assert "packed" in repr(model[0])


@needs_packing
def test_packed_copy_is_a_snapshot():
    """Packing is for final weights: a later in-place change is not seen by inference products."""
    linear = torch.nn.Linear(8, 8, bias=False)
    packed = PackedLinear(linear)
    x = torch.randn(2, 8)
    with torch.no_grad():
        before = packed(x)
        linear.weight.add_(1.0)
        assert torch.equal(packed(x), before)


@needs_packing
def test_packed_model_keeps_tied_weights_and_logits():
    model = tiny_llama(0)
    model.lm_head.weight = model.model.embed_tokens.weight  # tie, as SmolLM2 does
    plain, packed = adapter(copy.deepcopy(model)), adapter(model)
    assert packed.pack_weights() == 2 * 7 + 1  # q k v o gate up down per layer, and the output layer
    assert packed.packed_weights and isinstance(model.lm_head, PackedLinear)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = [5, 9, 13, 7, 22, 8]
    assert torch.allclose(packed.forward(ids).logits, plain.forward(ids).logits, atol=1e-4, rtol=1e-4)


class Siblings(torch.nn.Module):
    def __init__(self, bias: bool):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(48, n, bias=bias) for n in (48, 16, 16))
        self.gate_proj, self.up_proj = torch.nn.Linear(48, 96), torch.nn.Linear(32, 96)  # widths differ


@needs_packing
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 33])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_siblings_equal_their_separate_products_bit_for_bit(rows, bias):
    torch.manual_seed(rows)
    module = Siblings(bias)
    separate = copy.deepcopy(module)
    assert pack_linears(module) == pack_linears(separate) == 5
    assert fuse_siblings(module) == 1  # q/k/v; gate and up read inputs of different widths
    assert module.q_proj._fused is not None and module.gate_proj._fused is None
    x, y = torch.randn(1, rows, 48), torch.randn(1, rows, 48)
    names = ("q_proj", "k_proj", "v_proj")
    with torch.inference_mode():
        expected = {(name, which): getattr(separate, name)(t) for name in names for which, t in (("x", x), ("y", y))}
        # in order, out of order, interleaved inputs, a sibling twice: each call its own input's product
        calls = [("q_proj", "x"), ("k_proj", "x"), ("v_proj", "x"), ("v_proj", "y"), ("q_proj", "x")]
        calls += [("k_proj", "y"), ("k_proj", "y"), ("q_proj", "y"), ("v_proj", "x"), ("v_proj", "y")]
        for name, which in calls:
            out = getattr(module, name)({"x": x, "y": y}[which])
            assert out.is_contiguous() and torch.equal(out, expected[name, which]), (name, which)


@needs_packing
def test_pack_weights_fuses_the_projections_of_each_layer():
    model = tiny_llama(0)
    plain, packed = adapter(copy.deepcopy(model)), adapter(model)
    packed.pack_weights()
    for layer in model.model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        qkv, gate_up = attention.q_proj._fused, mlp.gate_proj._fused
        assert qkv is not None and attention.k_proj._fused[0] is attention.v_proj._fused[0] is qkv[0]
        assert gate_up is not None and mlp.up_proj._fused[0] is gate_up[0] and mlp.down_proj._fused is None
    ids = [5, 9, 13, 7, 22, 8]
    assert torch.allclose(packed.forward(ids).logits, plain.forward(ids).logits, atol=1e-4, rtol=1e-4)
    assert torch.allclose(packed.forward([3]).logits, plain.forward([3]).logits, atol=1e-4, rtol=1e-4)


@needs_packing
def test_packed_vocabulary_subset_head():
    plain, packed = adapter(tiny_llama(0)), adapter(tiny_llama(0))
    subset = list(range(0, 64, 3))
    plain.use_vocab_subset(subset)
    packed.use_vocab_subset(subset)
    assert packed.pack_weights() == 2 * 7 + 1  # the full layer too: transformers' generate may run it
    assert isinstance(packed.model.lm_head, PackedLinear) and packed._head_subset._packed is not None
    a, b = plain.forward([4, 8, 15]).logits, packed.forward([4, 8, 15]).logits
    assert torch.isinf(b[:, 1]).all() and torch.allclose(a[:, subset], b[:, subset], atol=1e-4, rtol=1e-4)


@needs_packing
@pytest.mark.parametrize(
    "drafter, stop",
    [
        ("{name: draft_model}", "{name: fixed, gamma: 3}"),
        ("{name: draft_model}", "{name: heuristic}"),
        ("{name: prompt_lookup}", "{name: fixed, gamma: 4}"),
        ("{name: ouroboros, window_size: 3, guess_set_size: 3, level: 3, topk: 2}", "{name: fixed, gamma: 2}"),
    ],
)
def test_greedy_sd_with_packed_models_equals_the_unpacked_target(drafter, stop):
    target_model = tiny_llama(0, scale=6.0)
    draft_model = tiny_llama(0, scale=6.0)
    with torch.no_grad():
        for p in draft_model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.1 * p.std())
    prompt = [5, 9, 13, 5, 9, 13, 7]
    reference = reference_greedy(copy.deepcopy(target_model), prompt, 24)
    target, draft = adapter(target_model), adapter(draft_model)
    target.pack_weights()
    draft.pack_weights()
    cfg = load_config(
        overrides=[f"strategy.drafter={drafter}", f"strategy.stop=[{stop}]", "strategy.verifier={name: greedy}"],
        require_models=False,
    )
    result = Engine.build(target, draft=draft, cfg=cfg).generate(prompt, max_new_tokens=24)
    assert result.tokens == reference
    assert result.metrics["drafted"] > 0


def test_should_pack_resolves_the_option(monkeypatch):
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert should_pack(False, torch.float32, cpu, "target") is False
    assert should_pack(None, torch.float32, meta, "target") is False  # not on the CPU: never
    with pytest.raises(InputError, match="pack_weights=true but the weights are not on the CPU"):
        should_pack(True, torch.float32, meta, "draft")
    monkeypatch.setattr(kernels, "packing_supported", lambda dtype: False)
    assert should_pack(None, torch.float32, cpu, "target") is False
    with pytest.raises(InputError, match="cannot pack float32 weights"):
        should_pack(True, torch.float32, cpu, "target")
    monkeypatch.setattr(kernels, "packing_supported", lambda dtype: True)
    assert should_pack(None, torch.float32, cpu, "target") is True


def test_pack_weights_is_a_validated_model_option():
    assert load_config(overrides=["target.pack_weights=false"], require_models=False).target.pack_weights is False
    with pytest.raises(Exception, match="pack_weights"):
        load_config(overrides=["target.pack_weights=sometimes"], require_models=False)


def test_pack_weights_with_device_map_is_refused_before_loading(tmp_path):
    from pacer_core.hf import load_model

    (tmp_path / "config.json").write_text("{}")  # never read: the option is refused first
    with pytest.raises(InputError, match="pack_weights=true needs the whole model on the CPU, not device_map"):
        load_model(str(tmp_path), "float32", "cpu", "auto", "target", pack_weights=True)


def test_batched_dtype_hint_names_the_option_only_where_half_precision_is_slow(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    slowdown = kernels.batched_slowdown(torch.bfloat16)  # the real probe: a positive, finite ratio
    assert 0 < slowdown < float("inf")
    monkeypatch.setattr(kernels, "batched_slowdown", lambda dtype, rows=64: 30.0)
    hint = kernels.batched_dtype_hint(torch.bfloat16, cpu, "target.dtype")
    assert "30× as long as float32" in hint and hint.endswith("set target.dtype=float32 for this batched work")
    assert "\n" not in hint
    assert kernels.batched_dtype_hint(torch.float32, cpu, "dtype") is None
    assert kernels.batched_dtype_hint(torch.bfloat16, cuda, "dtype") is None  # GPUs have their own kernels
    monkeypatch.setattr(kernels, "batched_slowdown", lambda dtype, rows=64: 1.5)
    assert kernels.batched_dtype_hint(torch.float16, cpu, "dtype") is None
