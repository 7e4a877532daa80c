"""Published EAGLE checkpoints load into the ``eagle`` drafter from ``path`` alone.

Checkpoints are written here in exactly the layouts SafeAILab/EAGLE publishes (EAGLE-1/2:
``eagle/model/cnets1.py``; EAGLE-3: ``eagle/model/cnets.py`` with ``d2t``/``t2d``), from tiny
configs with random weights, for tiny Llama targets. The drafter must keep greedy output equal to
the target's (chains and trees, every stop policy, PACER), keep sampling exact (chi-square), compute
what a plain re-implementation of the published math computes, and refuse bad checkpoints in one line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from pacer_core import DecodeState, Draft, Engine, InputError, Resources, SamplingParams, hookimpl, load_config
from pacer_core.testing import chisquare_pvalue, exact_continuation_probs
from pacer_plugins.eagle.drafter import EagleConfig, EagleDrafter

from helpers import (
    LENGTH,
    PASS_P,
    Planted,
    adapter,
    bigram,
    engine_for,
    reference_greedy,
    sample_outputs,
    single_thread,
    tiny_llama,
    write_checkpoint,
)

HIDDEN, HEADS, KV_HEADS, FFN = 32, 4, 2, 48  # the tiny targets' attention layout (tiny_llama)
EAGLE3_LAYERS = 8  # EAGLE-3 reads the inputs of target layers 2, L // 2, L - 3: 2, 4, 5


# -- writing checkpoints in the published layouts -------------------------------------------------
def _save(folder: Path, config: dict, tensors: dict[str, torch.Tensor], fmt: str) -> Path:
    """``fmt``: bin, safetensors, or either with ``-sharded``: two shards named by transformers'
    ``*.index.json`` (``weight_map``: tensor name → shard file)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    kind, sharded = fmt.removesuffix("-sharded"), fmt.endswith("-sharded")

    def write(part: dict, name: str) -> None:
        if kind == "bin":
            torch.save(part, folder / name)
        else:
            save_file(part, str(folder / name))

    base = "pytorch_model" if kind == "bin" else "model"
    ext = ".bin" if kind == "bin" else ".safetensors"
    if not sharded:
        write(tensors, base + ext)
        return folder
    names = sorted(tensors)
    shards = {f"{base}-0000{i + 1}-of-00002{ext}": names[i::2] for i in range(2)}
    for shard, keys in shards.items():
        write({k: tensors[k] for k in keys}, shard)
    index = {
        "metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
        "weight_map": {k: shard for shard, keys in shards.items() for k in keys},
    }
    (folder / f"{base}{ext}.index.json").write_text(json.dumps(index, indent=2))
    return folder


def _llama_config(vocab: int, **extra) -> dict:
    """The one-layer Llama config.json an EAGLE checkpoint ships."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": 1,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "torch_dtype": "float32",
        **extra,
    }


def _randn(generator, *shape, std=0.2):
    return torch.randn(*shape, generator=generator) * std


def _norm_weight(generator):
    return 1.0 + _randn(generator, HIDDEN, std=0.1)


def _attention(g, prefix: str, width: int, head_dim: int, qkv_bias: bool, small: float = 0.2) -> dict:
    """q/k/v/o_proj of a published layer reading ``width`` inputs (cnets.py / cnets1.py names)."""
    tensors = {
        prefix + "q_proj.weight": _randn(g, HEADS * head_dim, width),
        prefix + "k_proj.weight": _randn(g, KV_HEADS * head_dim, width),
        prefix + "v_proj.weight": _randn(g, KV_HEADS * head_dim, width),
        prefix + "o_proj.weight": _randn(g, HIDDEN, HEADS * head_dim, std=small),
    }
    if qkv_bias:  # cnets1.py: nn.Linear(..., bias=config.qkv_bias) for q, k and v
        tensors.update(
            {
                prefix + f"{p}_proj.bias": _randn(g, n * head_dim, std=0.5)
                for p, n in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS))
            }
        )
    return tensors


def write_eagle1(
    folder: Path,
    target_model,
    fmt: str = "bin",
    bias: bool = True,
    seed: int = 0,
    passthrough: bool = False,
    drop: str = "",
    head_dim: int = 8,
    qkv_bias: bool = False,
    layers: int = 1,
    **config,
) -> Path:
    """An EAGLE-1/2 checkpoint for ``target_model``. ``passthrough`` (for a ``bigram`` target): fc
    scales embed(x_{t+1}) to the size the final norm gives it (HF initialises embeddings with std 0.02)
    and the layer adds little, so the draft predicts roughly the target's next distribution.
    ``layers`` > 1: cnets1.py's later layers, each with an ``input_layernorm``."""
    g = torch.Generator().manual_seed(seed)
    vocab = target_model.config.vocab_size
    fc = _randn(g, HIDDEN, 2 * HIDDEN)
    small = 0.2
    if passthrough:
        fc = torch.cat(
            [50.0 * torch.eye(HIDDEN) + _randn(g, HIDDEN, HIDDEN, std=5.0), _randn(g, HIDDEN, HIDDEN, std=0.05)], 1
        )
        small = 0.01
    tensors = {"fc.weight": fc}
    for i in range(layers):
        prefix = f"layers.{i}."
        tensors.update(_attention(g, prefix + "self_attn.", HIDDEN, head_dim, qkv_bias, small))
        tensors.update(
            {
                prefix + "post_attention_layernorm.weight": _norm_weight(g),
                prefix + "mlp.gate_proj.weight": _randn(g, FFN, HIDDEN),
                prefix + "mlp.up_proj.weight": _randn(g, FFN, HIDDEN),
                prefix + "mlp.down_proj.weight": _randn(g, HIDDEN, FFN, std=small),
            }
        )
        if i:
            tensors[prefix + "input_layernorm.weight"] = _norm_weight(g)
    # EAGLE-1 checkpoints carry a copy of the target's embeddings: ignored
    tensors["embed_tokens.weight"] = target_model.model.embed_tokens.weight.detach().clone()
    if bias:
        tensors["fc.bias"] = _randn(g, HIDDEN, std=0.02 if passthrough else 0.2)
    tensors.pop(drop, None)
    cfg = _llama_config(vocab, rope_theta=5000.0, bias=bias, num_hidden_layers=layers)  # a θ of its own
    cfg.update(_shape_keys(head_dim, qkv_bias))
    cfg.update(config)
    return _save(folder, cfg, tensors, fmt)


def _shape_keys(head_dim: int, qkv_bias: bool) -> dict:
    return {
        **({"head_dim": head_dim} if head_dim != HIDDEN // HEADS else {}),
        **({"qkv_bias": True} if qkv_bias else {}),
    }


def write_eagle3(
    folder: Path,
    target_model,
    draft_vocab: int,
    fmt: str = "safetensors",
    seed: int = 0,
    drop: str = "",
    head_dim: int = 8,
    **config,
) -> Path:
    """An EAGLE-3 checkpoint for ``target_model``: its head covers ``draft_vocab`` target tokens (every
    other one first, then the lowest ids left), mapped by d2t/t2d. Its config has no rope_theta, like
    EAGLE's own training config (EAGLE then uses 10000)."""
    g = torch.Generator().manual_seed(seed)
    vocab = target_model.config.vocab_size
    chosen = sorted((list(range(0, vocab, 2)) + [i for i in range(vocab) if i % 2])[:draft_vocab])
    d2t = torch.tensor(chosen) - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[chosen] = True
    tensors = {
        "fc.weight": _randn(g, HIDDEN, 3 * HIDDEN),
        "midlayer.hidden_norm.weight": _norm_weight(g),
        "midlayer.input_layernorm.weight": _norm_weight(g),
        **_attention(g, "midlayer.self_attn.", 2 * HIDDEN, head_dim, False),
        "midlayer.post_attention_layernorm.weight": _norm_weight(g),
        "midlayer.mlp.gate_proj.weight": _randn(g, FFN, HIDDEN),
        "midlayer.mlp.up_proj.weight": _randn(g, FFN, HIDDEN),
        "midlayer.mlp.down_proj.weight": _randn(g, HIDDEN, FFN),
        "norm.weight": _norm_weight(g),
        "lm_head.weight": _randn(g, draft_vocab, HIDDEN, std=1.0),
        "d2t": d2t,
        "t2d": t2d,
    }
    tensors.pop(drop, None)
    cfg = _llama_config(vocab, draft_vocab_size=draft_vocab)
    cfg.update(_shape_keys(head_dim, False))
    cfg.update(config)
    return _save(folder, cfg, tensors, fmt)


def eagle3_target(vocab: int = 64, scale: float = 6.0):
    return tiny_llama(0, vocab=vocab, layers=EAGLE3_LAYERS, scale=scale)


def drafter_of(engine):
    return next(p for p in engine.pm.get_plugins() if type(p).__name__ == "EagleDrafter")


LAYOUTS = {
    "eagle1-bin": lambda t, d: write_eagle1(d, t, "bin"),
    "eagle1-safetensors-nobias": lambda t, d: write_eagle1(d, t, "safetensors", bias=False, passthrough=True),  # bigram
    "eagle3": lambda t, d: write_eagle3(d, t, draft_vocab=40),
}
TREE = "{topk: 3, depth: 4, nodes: 7}"  # grows up to 12 nodes: the best 7 are sent


def layout_target(layout: str):
    if layout == "eagle3":
        return eagle3_target()
    target_model = tiny_llama(0, scale=6.0)
    return bigram(target_model) if layout == "eagle1-safetensors-nobias" else target_model


# -- greedy output is the target's --------------------------------------------------------------
@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_greedy_output_is_the_targets(tmp_path, layout, tree):
    target_model = layout_target(layout)
    folder = LAYOUTS[layout](target_model, tmp_path / "ckpt")
    assert not (folder / "manifest.json").exists()
    engine = engine_for(target_model, folder, tree=tree)
    drafter = drafter_of(engine)
    assert drafter.layout == layout.split("-")[0]
    assert engine.target_hidden == ((2, 4, 5) if layout == "eagle3" else True)
    accepted = 0
    for prompt in ([1, 7, 9, 7, 9, 7], list(range(3, 30)), [5]):
        result = engine.generate(prompt, max_new_tokens=24)
        assert result.tokens == reference_greedy(target_model, prompt, 24), prompt
        accepted += result.metrics["accepted"]
        if len(prompt) > 1:
            assert result.metrics["drafted"] > 0 and result.metrics["draft_forwards"] > 0
    if layout == "eagle1-safetensors-nobias":  # the pass-through draft is often right
        assert accepted > 0


@pytest.mark.parametrize("stop", ["{name: heuristic}", "{name: entropy}", "{name: svip}", "{name: confidence}"])
@pytest.mark.parametrize("layout", ["eagle1-bin", "eagle3"])
def test_every_stop_policy_runs_on_a_published_checkpoint(tmp_path, layout, stop):
    target_model = layout_target(layout)
    folder = LAYOUTS[layout](target_model, tmp_path / "ckpt")
    prompt = [1, 7, 9, 7, 9, 7, 3, 4]
    for tree in (None, TREE):
        result = engine_for(target_model, folder, stop=stop, tree=tree).generate(prompt, max_new_tokens=16)
        assert result.tokens == reference_greedy(target_model, prompt, 16)


def test_tokens_outside_the_eagle3_draft_vocabulary_have_q_zero(tmp_path):
    target_model = eagle3_target(scale=2.0)
    folder = write_eagle3(tmp_path / "ckpt", target_model, draft_vocab=40)
    seen = []

    class Probe:
        @hookimpl
        def pacer_observe_step(self, state, step):
            if step.draft.num_nodes:
                seen.append(step.draft.tree)

    for tree in (None, TREE):
        engine = engine_for(target_model, folder, tree=tree, extra=["sampling.temperature=0.9"])
        engine.pm.register(Probe())
        engine.generate([1, 7, 9, 7], max_new_tokens=12, seed=1)
    outside = torch.ones(64, dtype=torch.bool)
    outside[drafter_of(engine).subset] = False  # the 24 target tokens the draft's head does not cover
    assert int(outside.sum()) == 24
    probs = torch.cat([t.draft_probs for t in seen])
    assert torch.allclose(probs.sum(-1), torch.ones(len(probs)), atol=1e-5)
    assert probs[:, outside].abs().max() == 0
    assert not outside[torch.cat([t.tokens for t in seen])].any()


def test_an_eagle3_member_of_a_hybrid_gets_its_layers(tmp_path):
    from helpers import make_draft

    target_model = eagle3_target()
    folder = write_eagle3(tmp_path / "ckpt", target_model, draft_vocab=40)
    members = f"[{{name: eagle, path: '{folder}', tree: {TREE}}}, {{name: prompt_lookup}}]"
    cfg = load_config(
        overrides=[f"strategy.drafter={{name: hybrid, members: {members}}}", "strategy.stop=[{name: fixed, gamma: 4}]"],
        require_models=False,
    )
    engine = Engine.build(adapter(target_model), cfg=cfg)
    assert engine.target_hidden == (2, 4, 5)
    prompt = [1, 7, 9, 7, 9, 7, 9, 7]
    assert engine.generate(prompt, max_new_tokens=16).tokens == reference_greedy(target_model, prompt, 16)
    own = make_draft(target_model, tmp_path / "own")  # reads the last layer: the two cannot share a pass
    members = f"[{{name: eagle, path: '{folder}'}}, {{name: eagle, path: '{own}'}}]"
    cfg = load_config(overrides=[f"strategy.drafter={{name: hybrid, members: {members}}}"], require_models=False)
    with pytest.raises(
        InputError,
        match=r"members read different target hidden states \(eagle: \[2, 4, 5\], "
        r"eagle: last",
    ):
        Engine.build(adapter(target_model), cfg=cfg)


# -- the math equals a plain implementation of the published networks ------------------------------
def _rms(x, weight, eps=1e-6):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _reference_rope(config: dict, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, head_dim] of rows fed in forwards of ``lengths`` rows each, from the config's θ and
    ``rope_scaling`` through transformers' own rope functions (``ROPE_INIT_FUNCTIONS``). A dynamic
    scaling is computed per forward from its furthest position (keys of earlier forwards were cached
    rotated as they were then, in EAGLE's code as in transformers)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    head_dim = config.get("head_dim") or HIDDEN // HEADS
    theta = config.get("rope_theta", 10000.0)  # EAGLE's default
    scaling = config.get("rope_scaling")
    hf = LlamaConfig(
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=head_dim,
        max_position_embeddings=config["max_position_embeddings"],
        rope_theta=theta,
        rope_scaling=dict(scaling) if scaling else None,
    )
    cos, sin, start = [], [], 0
    for length in lengths:
        end = start + length
        if scaling:
            kind = scaling.get("rope_type", scaling.get("type"))
            inv_freq, factor = ROPE_INIT_FUNCTIONS[kind](hf, "cpu", **({"seq_len": end} if kind == "dynamic" else {}))
        else:
            inv_freq, factor = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim)), 1.0
        emb = torch.outer(torch.arange(start, end).float(), inv_freq.float()).repeat(1, 2)
        cos.append(emb.cos() * factor)
        sin.append(emb.sin() * factor)
        start = end
    return torch.cat(cos), torch.cat(sin)


def _reference_attention(x, t, prefix, rope, head_dim=HIDDEN // HEADS):
    """LlamaAttention of EAGLE's cnets: causal over x [T, in] at positions 0..T-1 (biases when the
    checkpoint has them); ``rope``: (cos, sin) [T, head_dim]."""
    n = x.shape[0]

    def project(name, heads):
        return (x @ t[prefix + name + ".weight"].T + t.get(prefix + name + ".bias", 0.0)).view(n, heads, head_dim)

    q, k, v = project("q_proj", HEADS), project("k_proj", KV_HEADS), project("v_proj", KV_HEADS)
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    cos, sin = rope
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 0), v.repeat_interleave(HEADS // KV_HEADS, 0)
    scores = q @ k.transpose(1, 2) / math.sqrt(head_dim)
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), torch.finfo(torch.float32).min)
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, HEADS * head_dim)
    return out @ t[prefix + "o_proj.weight"].T


def _reference_mlp(x, t, prefix):
    return (F.silu(x @ t[prefix + "gate_proj.weight"].T) * (x @ t[prefix + "up_proj.weight"].T)) @ t[
        prefix + "down_proj.weight"
    ].T


def reference_eagle1(t, config, embeds, features, lengths):
    """cnets1.Model.forward + its LlamaDecoderLayers: rows [T] → predicted features [T, H]."""
    rope = _reference_rope(config, lengths)
    head_dim = config.get("head_dim") or HIDDEN // HEADS
    x = torch.cat((embeds, torch.stack(features)), dim=-1) @ t["fc.weight"].T + t.get("fc.bias", 0.0)
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        h = x if i == 0 else _rms(x, t[p + "input_layernorm.weight"])  # layer 0 has no input_layernorm
        x = x + _reference_attention(h, t, p + "self_attn.", rope, head_dim)
        x = x + _reference_mlp(_rms(x, t[p + "post_attention_layernorm.weight"]), t, p + "mlp.")
    return x


def reference_eagle3(t, config, embeds, hidden, lengths):
    """cnets.Model.forward + LlamaDecoderLayeremb: hidden rows are fc'd when 3H wide (true target
    states), else used as they are (the draft's own predictions)."""
    hidden = torch.stack([h @ t["fc.weight"].T if h.shape[-1] == 3 * HIDDEN else h for h in hidden])
    x = torch.cat(
        (_rms(embeds, t["midlayer.input_layernorm.weight"]), _rms(hidden, t["midlayer.hidden_norm.weight"])), dim=-1
    )
    x = hidden + _reference_attention(
        x, t, "midlayer.self_attn.", _reference_rope(config, lengths), config.get("head_dim") or HIDDEN // HEADS
    )
    return x + _reference_mlp(_rms(x, t["midlayer.post_attention_layernorm.weight"]), t, "midlayer.mlp.")


LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}  # head_dim 8: wavelengths 6.3 (kept), 63 (blended), 630+ (÷ 8)
VARIANTS = {  # published layouts: (eagle1|eagle3, writer options); each drafts what the reference computes
    "eagle1": ("eagle1", {}),
    "eagle3": ("eagle3", {}),
    "eagle1-qkv-bias": ("eagle1", {"qkv_bias": True}),  # EAGLE's Qwen2 drafts (cnets1.py qkv_bias)
    "eagle1-two-layers": ("eagle1", {"layers": 2}),
    "eagle1-head-dim": ("eagle1", {"head_dim": 16}),
    "eagle3-head-dim": ("eagle3", {"head_dim": 16}),  # Qwen3-style: heads × head_dim ≠ hidden size
    "eagle3-llama3-rope": (
        "eagle3",
        {
            "rope_scaling": LLAMA3,
            "rope_theta": 500000.0,
            "attention_bias": False,
            "mlp_bias": False,
            "pretraining_tp": 1,
            "bos_token_id": 128000,
            "tie_word_embeddings": False,
        },
    ),  # the keys of the Llama-3.1 EAGLE-3 configs
    "eagle1-llama3-rope": ("eagle1", {"rope_scaling": LLAMA3}),
    "eagle3-yarn-rope": (
        "eagle3",
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}},
    ),
    "eagle1-linear-rope": ("eagle1", {"rope_scaling": {"type": "linear", "factor": 2.0}}),
    "eagle1-dynamic-rope": (
        "eagle1",
        {"rope_scaling": {"type": "dynamic", "factor": 2.0}, "max_position_embeddings": 4},
    ),  # the prompt passes 4 positions
    "eagle1-sharded-safetensors": ("eagle1", {"fmt": "safetensors-sharded"}),
    "eagle3-sharded-bin": ("eagle3", {"fmt": "bin-sharded"}),
}


def write_variant(name: str, target_model, folder: Path) -> tuple[Path, dict, dict]:
    """The variant's folder, its tensors (read back independently of the loader) and its config."""
    layout, options = VARIANTS[name]
    if layout == "eagle3":
        folder = write_eagle3(folder, target_model, draft_vocab=40, **options)
    else:
        folder = write_eagle1(folder, target_model, **options)
    tensors = {}
    for path in folder.iterdir():
        if path.suffix == ".safetensors":
            tensors.update(load_file(str(path)))
        elif path.suffix == ".bin":
            tensors.update(torch.load(path, weights_only=True))
    return folder, tensors, json.loads((folder / "config.json").read_text())


def draft_two_tokens(target_model, folder, prompt):
    """The drafter's two-token block after ``prompt`` (its rows fed from the prefill, as the engine does)."""
    target = adapter(target_model)
    sampling = SamplingParams()
    drafter = EagleDrafter(EagleConfig(path=str(folder)), Resources(target=target, draft=None, sampling=sampling))
    target.reset()
    prefill = target.forward(prompt[:-1], logits_from=len(prompt) - 1, hidden=drafter.draft_info.target_layers or True)
    state = DecodeState(list(prompt), len(prompt), 8, sampling, torch.Generator().manual_seed(0), frozenset())
    drafter.pacer_start(state=state)  # the prompt's rows arrive with step 0's record, as from the engine
    step0 = SimpleNamespace(target_hidden=prefill.hidden_states, target_hidden_start=0)
    drafter.pacer_observe_step(state=state, step=step0)
    return drafter.pacer_propose(state=state, draft=Draft(), num_tokens=2)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_two_draft_steps_equal_the_published_math(tmp_path, variant):
    """Two draft tokens after a prompt: the first from rows fed with the target's states, the second
    from a row fed with the draft's own prediction; probabilities and hidden states must match a
    plain implementation of the publisher's network (biases, head size, rope scaling, layers)."""
    layout = VARIANTS[variant][0]
    target_model = eagle3_target() if layout == "eagle3" else tiny_llama(0, scale=6.0)
    folder, tensors, config = write_variant(variant, target_model, tmp_path / "ckpt")
    prompt = [1, 7, 9, 7, 9, 7, 3]
    with torch.no_grad():
        states = target_model(torch.tensor([prompt[:-1]]), output_hidden_states=True).hidden_states
    embed = target_model.model.embed_tokens.weight.detach()
    head = target_model.lm_head.weight.detach()
    vocab = head.shape[0]

    def reference_probs(feature):
        if layout == "eagle1":
            return torch.softmax(feature @ head.T, -1)
        ids = torch.arange(40) + tensors["d2t"]
        full = torch.zeros(vocab)
        full[ids] = torch.softmax(_rms(feature, tensors["norm.weight"]) @ tensors["lm_head.weight"].T, -1)
        return full

    # row r reads (x_{r+1}, target state of token r); the last row predicts the first draft token
    if layout == "eagle1":
        rows = [s for s in states[-1][0]]  # the last layer after the final norm
        predict = reference_eagle1
    else:
        rows = list(torch.cat([states[2][0], states[4][0], states[5][0]], -1))  # inputs of layers 2, 4, 5
        predict = reference_eagle3
    embeds = embed[prompt[1:]]
    out = predict(tensors, config, embeds, rows, [len(rows)])
    first_probs = reference_probs(out[-1])
    first = int(first_probs.argmax())
    out2 = predict(tensors, config, torch.cat([embeds, embed[[first]]]), rows + [out[-1]], [len(rows), 1])
    second_probs = reference_probs(out2[-1])

    block = draft_two_tokens(target_model, folder, prompt)
    assert block.tokens.tolist() == [first, int(second_probs.argmax())]
    assert torch.allclose(block.draft_probs, torch.stack([first_probs, second_probs]), atol=1e-5)
    assert torch.allclose(block.hidden_states, torch.stack([out[-1], out2[-1]]), atol=1e-5)


@pytest.mark.parametrize(
    "variant", ["eagle1-qkv-bias", "eagle3-llama3-rope", "eagle1-dynamic-rope", "eagle3-yarn-rope"]
)
def test_each_variant_changes_the_draft(tmp_path, variant):
    """The variants matter: the same weights drafted without the bias or the scaling differ (so the
    equality above could not hold by ignoring them)."""
    layout = VARIANTS[variant][0]
    target_model = eagle3_target() if layout == "eagle3" else tiny_llama(0, scale=6.0)
    folder, _, config = write_variant(variant, target_model, tmp_path / "ckpt")
    prompt = [1, 7, 9, 7, 9, 7, 3]
    honoured = draft_two_tokens(target_model, folder, prompt)
    config.pop("qkv_bias", None)
    config.pop("rope_scaling", None)
    (folder / "config.json").write_text(json.dumps(config))
    ignored = draft_two_tokens(target_model, folder, prompt)
    assert (honoured.hidden_states - ignored.hidden_states).abs().max() > 1e-3


def test_the_target_pass_returns_the_declared_layers_inputs():
    target_model = eagle3_target()
    target = adapter(target_model)
    tokens = [1, 7, 9, 7, 9]
    with torch.no_grad():
        states = target_model(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    out = target.forward(tokens, hidden=(2, 4, 5))
    assert out.hidden_states.shape == (5, 3 * HIDDEN)
    assert torch.allclose(out.hidden_states, torch.cat([states[2][0], states[4][0], states[5][0]], -1), atol=1e-6)
    target.use_vocab_subset(list(range(40)))  # the subset path returns the same states
    target.reset()
    assert torch.allclose(target.forward(tokens, hidden=(2, 4, 5)).hidden_states, out.hidden_states, atol=1e-6)
    target.reset()
    last = target.forward(tokens, hidden=(EAGLE3_LAYERS,)).hidden_states  # L: after the final norm
    assert torch.allclose(last, states[-1][0], atol=1e-6)
    with pytest.raises(ValueError, match="hidden layers"):
        target.forward([3], hidden=(EAGLE3_LAYERS + 1,))


# -- sampling stays exact -----------------------------------------------------------------------------
HF_VOCAB, HF_PROMPT = 16, [3, 7, 11, 5]


@pytest.mark.parametrize(
    "layout,tree,samples",
    [
        pytest.param("eagle1", None, 800, marks=pytest.mark.slow),  # sampled chains: q from the target's head
        ("eagle1", "{topk: 2, depth: 3, nodes: 3}", 600),  # top-k children: point masses; 3 of 4 sent
        ("eagle3", None, 300),  # the draft's own head: q = 0 outside its 12-token vocabulary
    ],
    ids=["eagle1-chain", "eagle1-tree", "eagle3-chain"],
)
def test_sampling_matches_the_target_distribution(tmp_path, layout, tree, samples):
    with single_thread():
        if layout == "eagle1":
            target_model = bigram(tiny_llama(0, vocab=HF_VOCAB, scale=25.0))
            folder = write_eagle1(tmp_path / "ckpt", target_model, passthrough=True)
        else:  # seven layers, the fewest EAGLE-3 reads three distinct layers of
            target_model = tiny_llama(0, vocab=HF_VOCAB, layers=7, scale=25.0)
            folder = write_eagle3(tmp_path / "ckpt", target_model, draft_vocab=12)
        engine = engine_for(
            target_model,
            folder,
            stop="{name: fixed, gamma: 2}",
            tree=tree,
            eos=False,
            extra=[
                "sampling.temperature=1.0",
                "strategy.verifier={name: speculative_sampling}",
                "generation.ignore_eos=true",
            ],
        )
        outputs, steps = sample_outputs(engine, HF_PROMPT, samples)
        expected = exact_continuation_probs(adapter(target_model, eos=False), HF_PROMPT, LENGTH, engine.sampling)
        p_value = chisquare_pvalue(outputs, expected)
    print(f"{layout} {tree}: p = {p_value:.4g}, steps/generation = {steps:.2f}")
    assert p_value > PASS_P
    assert steps < LENGTH - (0.3 if layout == "eagle1" else 0.02)  # draft tokens were accepted


# -- PACER on top -------------------------------------------------------------------------------------
def test_pacer_refuses_a_published_draft_without_a_pre_verifier_for_it(tmp_path):
    target_model = tiny_llama(0, scale=6.0)
    folder = write_eagle1(tmp_path / "ckpt", target_model)
    for digest in (None, "aaaa"):
        with pytest.raises(InputError) as info:
            engine_for(target_model, folder, stop="{name: pacer}", digest=digest)
        message = str(info.value)
        assert "\n" not in message and "train-preverify" in message and "eagle1:" in message


@pytest.mark.parametrize("layout", ["eagle1", "eagle3"])
def test_pacer_runs_with_a_pre_verifier_trained_for_the_pair(tmp_path, layout):
    target_model = layout_target("eagle3" if layout == "eagle3" else "eagle1-bin")
    folder = LAYOUTS["eagle3" if layout == "eagle3" else "eagle1-bin"](target_model, tmp_path / "ckpt")
    identity = drafter_of(engine_for(target_model, folder)).draft_info.identity
    assert identity.startswith(f"{layout}:")
    mb = write_checkpoint(tmp_path / "mb", HIDDEN, target_digest="aaaa", draft_identity=identity)
    prompt = [1, 7, 9, 7, 9, 7, 3, 4]
    for tree in (None, TREE):
        engine = engine_for(
            target_model,
            folder,
            stop=f"{{name: pacer, checkpoint: '{mb}', t0: 0.0, t_max: 0.0}}",
            tree=tree,
            digest="aaaa",
        )
        result = engine.generate(prompt, max_new_tokens=16)
        assert result.tokens == reference_greedy(target_model, prompt, 16)
        assert result.metrics["drafted"] > 0
    other = write_checkpoint(tmp_path / "mb-other", HIDDEN, target_digest="aaaa", draft_identity=f"{layout}:0123")
    with pytest.raises(InputError, match="train-preverify"):
        engine_for(target_model, folder, stop=f"{{name: pacer, checkpoint: '{other}'}}", digest="aaaa")


# -- one-line refusals --------------------------------------------------------------------------------
def refusal(target_model, folder) -> str:
    with pytest.raises(InputError) as info:
        engine_for(target_model, folder)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_checkpoint_for_another_hidden_size_or_vocabulary_is_refused(tmp_path):
    target_model = tiny_llama(0)
    other = tiny_llama(0, hidden=48)
    folder = write_eagle1(tmp_path / "wide", other)
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_size=48)
    (folder / "config.json").write_text(json.dumps(config))
    assert "hidden size 48, but the target's is 32" in refusal(target_model, folder)
    folder = write_eagle1(tmp_path / "vocab", target_model, vocab_size=80)
    assert "vocabulary of 80 tokens, but the target's has 64" in refusal(target_model, folder)
    folder = write_eagle1(tmp_path / "embed", tiny_llama(0, vocab=80))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 64}))
    assert "embeddings of shape (80, 32)" in refusal(target_model, folder)
    small = eagle3_target()
    folder = write_eagle3(tmp_path / "d2t", small, draft_vocab=40)
    assert "vocabulary of 64 tokens, but the target's has 16" in refusal(eagle3_target(vocab=16), folder)
    assert "at least 7 decoder layers" in refusal(tiny_llama(0, layers=4), write_eagle3(tmp_path / "short", small, 40))


@pytest.mark.parametrize(
    "layout,drop",
    [
        ("eagle1", "layers.0.mlp.up_proj.weight"),
        ("eagle1", "fc.bias"),
        ("eagle3", "midlayer.hidden_norm.weight"),
        ("eagle3", "d2t"),
    ],
)
def test_a_missing_tensor_is_refused(tmp_path, layout, drop):
    if layout == "eagle1":
        target_model = tiny_llama(0)
        folder = write_eagle1(tmp_path / "ckpt", target_model, drop=drop)
    else:
        target_model = eagle3_target()
        folder = write_eagle3(tmp_path / "ckpt", target_model, draft_vocab=40, drop=drop)
    assert f"has no tensor '{drop}'" in refusal(target_model, folder)


def test_a_wrongly_shaped_tensor_or_a_bad_token_map_is_refused(tmp_path):
    target_model = eagle3_target()
    folder = write_eagle3(tmp_path / "ckpt", target_model, draft_vocab=40, intermediate_size=40)
    assert "'midlayer.mlp.gate_proj.weight' has shape (48, 32)" in refusal(target_model, folder)
    folder = write_eagle3(tmp_path / "t2d", target_model, draft_vocab=40)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["t2d"] = ~tensors["t2d"]
    save_file(tensors, str(folder / "model.safetensors"))
    assert "t2d and d2t disagree" in refusal(target_model, folder)
    tensors["d2t"] = tensors["d2t"] + 30
    save_file(tensors, str(folder / "model.safetensors"))
    assert "outside the target's 64 tokens" in refusal(target_model, folder)


def test_an_unreadable_file_is_refused(tmp_path):
    target_model = tiny_llama(0)
    folder = write_eagle1(tmp_path / "bin", target_model)
    weights = folder / "pytorch_model.bin"
    weights.write_bytes(weights.read_bytes()[:200])
    assert "cannot be loaded as PyTorch weights" in refusal(target_model, folder)
    folder = write_eagle1(tmp_path / "st", target_model, fmt="safetensors")
    (folder / "model.safetensors").write_bytes(b"not safetensors at all")
    assert "cannot be read as safetensors" in refusal(target_model, folder)
    folder = write_eagle1(tmp_path / "json", target_model)
    (folder / "config.json").write_text("{not json")
    assert "config.json' is not valid JSON" in refusal(target_model, folder)
    # a pickle that would run code is refused without running it (weights_only=True)
    marker = tmp_path / "planted"
    folder = write_eagle1(tmp_path / "planted-ckpt", target_model)
    torch.save({"fc.weight": Planted(str(marker))}, folder / "pytorch_model.bin")
    assert "cannot be loaded as PyTorch weights" in refusal(target_model, folder)
    assert not marker.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "nor an EAGLE checkpoint" in refusal(target_model, empty)
    folder = write_eagle1(tmp_path / "foreign", target_model)
    torch.save({"model.layers.0.mlp.up_proj.weight": torch.zeros(2)}, folder / "pytorch_model.bin")
    assert "neither EAGLE-1/2 tensors" in refusal(target_model, folder)


def test_context_vocab_is_refused_for_a_head_of_the_whole_vocabulary(tmp_path):
    target_model = tiny_llama(0)
    folder = write_eagle1(tmp_path / "ckpt", target_model)
    with pytest.raises(
        InputError, match="context_vocab=true needs a draft whose head is a subset.*leave context_vocab unset"
    ):
        engine_for(target_model, folder, extra=["strategy.drafter.context_vocab=true"])
    engine_for(target_model, folder, extra=["strategy.drafter.context_vocab=false"])
    # the priors apply to any head when set, and are off by default for published checkpoints
    plain = next(p for p in engine_for(target_model, folder).pm.get_plugins() if type(p).__name__ == "EagleDrafter")
    assert plain.context_bias == 0.0 and plain.lookup_bias == () and not plain.reads_context
    engine = engine_for(target_model, folder, extra=["strategy.drafter.context_bias=1.0"])
    prompt = [1, 7, 9, 7, 9, 7]
    assert engine.generate(prompt, max_new_tokens=20).tokens == reference_greedy(target_model, prompt, 20)
    drafter = next(p for p in engine.pm.get_plugins() if type(p).__name__ == "EagleDrafter")
    assert set(drafter.columns.ids[drafter.bias == 1.0].tolist()) >= {1, 7, 9}


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("num_attention_heads", 0, "num_attention_heads must be a whole number ≥ 1, not 0"),
        ("hidden_size", "abc", "hidden_size must be a whole number ≥ 1, not 'abc'"),
        ("hidden_size", [576], "hidden_size must be a whole number ≥ 1, not [576]"),
        ("intermediate_size", -5, "intermediate_size must be a whole number ≥ 1, not -5"),
        ("rope_theta", "fast", "rope_theta must be a number > 0, not 'fast'"),
        ("num_key_value_heads", 3, "num_attention_heads (4) must be a multiple of num_key_value_heads (3)"),
        ("head_dim", 7, "head_dim must be even"),
        ("rms_norm_eps", float("nan"), "rms_norm_eps must be a number > 0"),
        ("bias", "yes", "bias must be true or false, not 'yes'"),
        ("qkv_bias", 1, "qkv_bias must be true or false, not 1"),
        ("num_hidden_layers", 1.5, "num_hidden_layers must be a whole number ≥ 1, not 1.5"),
        ("vocab_size", True, "vocab_size must be a whole number ≥ 1, not True"),
    ],
)
def test_a_config_value_of_the_wrong_type_is_refused_naming_the_key(tmp_path, key, value, needle):
    target_model = tiny_llama(0)
    folder = write_eagle1(tmp_path / "ckpt", target_model)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    message = refusal(target_model, folder)
    assert needle in message and "config.json" in message


def never_built(*args, **kwargs):
    raise AssertionError("a draft network was built from a config its weights were not checked against")


@pytest.mark.parametrize(
    "layout,config,needle",
    [
        ("eagle1", {"num_hidden_layers": 1_000_000}, "num_hidden_layers is 1000000, but"),
        ("eagle1", {"num_hidden_layers": 2}, "holds 1 such layer(s) (layers.N.*)"),
        (
            "eagle1",
            {"intermediate_size": 10**12},
            "intermediate_size is 1000000000000, but tensor 'layers.0.mlp.gate_proj.weight' has shape (48, 32)",
        ),
        ("eagle1", {"num_attention_heads": 10**9, "head_dim": 8}, "num_attention_heads × head_dim is 8000000000"),
        ("eagle1", {"head_dim": 2**30}, "num_attention_heads × head_dim is 4294967296"),
        (
            "eagle1",
            {"num_key_value_heads": 1, "head_dim": 8},
            "num_key_value_heads × head_dim is 8, but tensor 'layers.0.self_attn.k_proj.weight' has shape (16, 32)",
        ),
        ("eagle3", {"intermediate_size": 10**12}, "intermediate_size is 1000000000000"),
        ("eagle3", {"num_attention_heads": 2**20, "head_dim": 2**20}, "num_attention_heads × head_dim"),
        ("eagle3", {"draft_vocab_size": 60}, "draft_vocab_size is 60, but tensor 'lm_head.weight' has shape (40, 32)"),
    ],
)
def test_a_config_size_its_weights_do_not_hold_is_refused_before_anything_is_built(
    tmp_path, monkeypatch, layout, config, needle
):
    """Every size in a downloaded config.json is compared with the tensors before a network is built
    from it: a config asking for a million layers or a terabyte matrix is one line naming the key,
    never an allocation (building anything here fails the test)."""
    from pacer_plugins.eagle import published

    target_model = eagle3_target() if layout == "eagle3" else tiny_llama(0)
    write = write_eagle3 if layout == "eagle3" else write_eagle1
    folder = write(tmp_path / "ckpt", target_model, **({"draft_vocab": 40} if layout == "eagle3" else {}))
    (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()), **config}))
    for network in ("FeatureDraft", "Eagle3Draft"):
        monkeypatch.setattr(published, network, never_built)
    message = refusal(target_model, folder)
    assert needle in message and "config.json" in message and "do not belong together" in message


@pytest.mark.parametrize(
    "layout,config,needle",
    [
        (
            "eagle3",
            {"rope_scaling": {"rope_type": "longrope", "factor": 2.0}},
            "rope_scaling type 'longrope' is not supported",
        ),
        ("eagle1", {"rope_scaling": {"type": "linear"}}, "rope_scaling has no 'factor'"),
        ("eagle1", {"rope_scaling": {"type": "linear", "factor": "x"}}, "rope_scaling factor must be a number > 0"),
        ("eagle3", {"rope_scaling": {**LLAMA3, "beta_fast": 2}}, "rope_scaling key 'beta_fast' is not supported"),
        ("eagle3", {"rope_scaling": "llama3"}, "rope_scaling must be an object"),
        ("eagle1", {"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ("eagle1", {"attention_bias": True}, "attention_bias: True is not supported"),
        ("eagle1", {"mlp_bias": True}, "mlp_bias: True is not supported"),
        ("eagle1", {"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5 is not supported"),
        ("eagle3", {"qkv_bias": True}, "qkv_bias: True is not supported"),
        ("eagle3", {"num_hidden_layers": 2}, "only one-layer EAGLE-3 drafts"),
        ("eagle3", {"draft_vocab_size": 80}, "draft_vocab_size (80) exceeds vocab_size (64)"),
        (
            "eagle3",
            {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}},
            "eagle_config.eagle_aux_hidden_state_layer_ids [1, 3, 4] is not supported",
        ),
        ("eagle3", {"eagle_aux_hidden_state_layer_ids": [2, 4, 5]}, "remove the key if the draft was trained on those"),
        ("eagle3", {"eagle_config": {"use_aux_hidden_state": False}}, "use_aux_hidden_state: false"),
        ("eagle1", {"speculative_token_map": "../map.pt"}, "speculative_token_map must name a file beside"),
        ("eagle1", {"speculative_token_map": "map.pt"}, "map.pt' (the config's speculative_token_map) is missing"),
    ],
)
def test_an_unsupported_key_is_refused_by_name(tmp_path, layout, config, needle):
    if layout == "eagle3":
        target_model = eagle3_target()
        folder = write_eagle3(tmp_path / "ckpt", target_model, draft_vocab=40, **config)
    else:
        target_model = tiny_llama(0)
        folder = write_eagle1(tmp_path / "ckpt", target_model, **config)
    assert needle in refusal(target_model, folder)


def test_a_damaged_shard_index_is_refused(tmp_path):
    target_model = tiny_llama(0)
    folder = write_eagle1(tmp_path / "ckpt", target_model, fmt="safetensors-sharded")
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    (folder / "model-00002-of-00002.safetensors").unlink()
    assert "names shard 'model-00002-of-00002.safetensors', which is missing" in refusal(target_model, folder)
    folder = write_eagle1(tmp_path / "moved", target_model, fmt="safetensors-sharded")
    data["weight_map"]["fc.weight"] = (
        "model-00002-of-00002.safetensors"
        if data["weight_map"]["fc.weight"].startswith("model-00001")
        else "model-00001-of-00002.safetensors"
    )
    (folder / "model.safetensors.index.json").write_text(json.dumps(data))
    assert "places tensor 'fc.weight' in" in refusal(target_model, folder)
    data["weight_map"]["fc.weight"] = "../elsewhere.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(data))
    assert "not a .safetensors file beside the index" in refusal(target_model, folder)
    (folder / "model.safetensors.index.json").write_text("{}")
    assert "has no 'weight_map'" in refusal(target_model, folder)
    folder = write_eagle1(tmp_path / "planted", target_model, fmt="bin-sharded")
    marker = tmp_path / "planted-marker"
    torch.save({"fc.weight": Planted(str(marker))}, folder / "pytorch_model-00001-of-00002.bin")
    assert "cannot be loaded as PyTorch weights" in refusal(target_model, folder)
    assert not marker.exists()


def test_the_command_line_refuses_a_bad_config_value_in_one_line_exit_2(tmp_path, capsys):
    """``pacer generate`` with a published checkpoint whose config has a value of the wrong type: one
    line naming the key, exit 2, never a traceback (the tiny target saved with a word tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from helpers import VOCAB, assert_one_line_error, run_cli

    target_model = tiny_llama(0)
    target_model.save_pretrained(tmp_path / "target")
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="w0", pad_token="w0", bos_token="w1", eos_token="w2"
    ).save_pretrained(tmp_path / "target")
    folder = write_eagle1(tmp_path / "ckpt", target_model)
    argv = [
        "generate",
        "-p",
        "w5 w7 w9 w7",
        "-n",
        "4",
        f"target.path={tmp_path / 'target'}",
        f"strategy.drafter={{name: eagle, path: '{folder}'}}",
    ]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    config = json.loads((folder / "config.json").read_text())
    for key, value, needle in (
        ("num_attention_heads", 0, "num_attention_heads must be a whole number ≥ 1, not 0"),
        ("rope_theta", "fast", "rope_theta must be a number > 0, not 'fast'"),
        ("rope_scaling", {"rope_type": "longrope"}, "rope_scaling type 'longrope'"),
    ):
        (folder / "config.json").write_text(json.dumps({**config, key: value}))
        code, _, err = run_cli(argv, capsys)
        assert_one_line_error(code, err, needle, "config.json")


def test_an_eagle1_token_map_restricts_the_draft_and_a_bad_one_is_refused(tmp_path):
    target_model = tiny_llama(0)
    folder = write_eagle1(tmp_path / "ckpt", target_model, speculative_token_map="map.pt")
    torch.save([5, 3, 9, 7, 1], folder / "map.pt")  # SGLang's format: a list (or tensor) of target ids
    drafter = drafter_of(engine_for(target_model, folder))
    assert drafter.subset.tolist() == [5, 3, 9, 7, 1] and drafter.draft_info.identity.startswith("eagle1:")
    prompt = [1, 7, 9, 7, 9, 7]
    assert engine_for(target_model, folder).generate(prompt, max_new_tokens=12).tokens == reference_greedy(
        target_model, prompt, 12
    )
    for content, needle in (
        ([5, 5], "one id twice"),
        ([70], "outside the target's 64 tokens"),
        (torch.rand(4), "does not hold a list of token ids"),
        ({"ids": [1]}, "does not hold a list of token ids"),
    ):
        torch.save(content, folder / "map.pt")
        assert needle in refusal(target_model, folder)
    marker = tmp_path / "planted"
    torch.save(Planted(str(marker)), folder / "map.pt")
    assert "cannot be loaded as a token map" in refusal(target_model, folder)
    assert not marker.exists()
