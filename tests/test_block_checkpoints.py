"""Published DFlash drafts (plugins/block_draft/published.py): z-lab/dflash checkpoints and speculators'
``dflash`` format, read in random weights of the published shapes (scaled down to the tiny target)
and checked against a reference forward written here from the publishers' code (z-lab's
``dflash/model.py``, speculators' ``models/dflash``, vLLM's ``qwen3_dflash.py``), independent of
model.py; greedy decoding with them equals the target's own; what they cannot be is refused in one
line; and ``pacer export --speculators`` writes a draft that loads back identical."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from pacer_core import Resources, SamplingParams
from pacer_core.errors import InputError
from pacer_plugins.block_draft.drafter import DFlashConfig, DFlashDrafter

from helpers import adapter, block_engine, make_block_draft, one_line_error, reference_greedy, tiny_llama

TARGET_LAYERS = 3  # the tiny target's decoder layers
ZLAB_IDS = [0, 1]  # z-lab's target_layer_ids: the outputs of layers 0 and 1 (inputs of 1 and 2)
HEADS, KV_HEADS, HEAD_DIM, FFN, DRAFT_LAYERS = 4, 2, 8, 48, 2
BLOCK_SIZE = 4  # the anchor and three mask rows
MASK_ID = 13


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0, vocab=16, layers=TARGET_LAYERS, scale=3.0)


def published_tensors(hidden: int, vocab: int, fused: int, seed: int, draft_vocab: int = 0) -> dict:
    """Random tensors named and shaped as a DFlash checkpoint holds them (z-lab's Qwen3 layers, fc,
    hidden_norm, norm; an ``lm_head`` over ``draft_vocab`` rows when given); norms away from one."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, std=0.2):
        return torch.randn(*shape, generator=g) * std

    def norm(n):
        return 1 + 0.3 * torch.randn(n, generator=g)

    state = {"fc.weight": w(hidden, fused), "hidden_norm.weight": norm(hidden), "norm.weight": norm(hidden)}
    for i in range(DRAFT_LAYERS):
        p = f"layers.{i}."
        state.update(
            {
                p + "input_layernorm.weight": norm(hidden),
                p + "post_attention_layernorm.weight": norm(hidden),
                p + "self_attn.q_proj.weight": w(HEADS * HEAD_DIM, hidden),
                p + "self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, hidden),
                p + "self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, hidden),
                p + "self_attn.o_proj.weight": w(hidden, HEADS * HEAD_DIM),
                p + "self_attn.q_norm.weight": norm(HEAD_DIM),
                p + "self_attn.k_norm.weight": norm(HEAD_DIM),
                p + "mlp.gate_proj.weight": w(FFN, hidden),
                p + "mlp.up_proj.weight": w(FFN, hidden),
                p + "mlp.down_proj.weight": w(hidden, FFN),
            }
        )
    if draft_vocab:
        state["lm_head.weight"] = w(draft_vocab, hidden, std=1.0)
    return state


def qwen3_keys(hidden: int, vocab: int) -> dict:
    """The Qwen3 config keys of the draft's layers, as z-lab's config.json gives them."""
    return {
        "model_type": "qwen3",
        "hidden_size": hidden,
        "num_hidden_layers": DRAFT_LAYERS,
        "vocab_size": vocab,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "intermediate_size": FFN,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "max_position_embeddings": 4096,
        "layer_types": ["full_attention"] * DRAFT_LAYERS,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": False,
    }


def zlab_checkpoint(folder, target_model, seed=1, **changes):
    """A z-lab/dflash checkpoint folder for the tiny target (``changes``: config keys replaced)."""
    hidden, vocab = target_model.config.hidden_size, target_model.config.vocab_size
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        **qwen3_keys(hidden, vocab),
        "block_size": BLOCK_SIZE,
        "num_target_layers": TARGET_LAYERS,
        "dflash_config": {"mask_token_id": MASK_ID, "target_layer_ids": ZLAB_IDS},
        **changes,
    }
    (folder / "config.json").write_text(json.dumps(config))
    save_file(published_tensors(hidden, vocab, len(ZLAB_IDS) * hidden, seed), str(folder / "model.safetensors"))
    return folder


def speculators_checkpoint(folder, target_model, draft_ids, seed=2):
    """A speculators dflash checkpoint for the tiny target: its own lm_head over ``draft_ids`` (d2t, t2d),
    embed_tokens copied from the target, aux_hidden_state_layer_ids numbering layer inputs."""
    hidden, vocab = target_model.config.hidden_size, target_model.config.vocab_size
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "transformer_layer_config": qwen3_keys(hidden, vocab),
        "draft_vocab_size": len(draft_ids),
        "block_size": BLOCK_SIZE,
        "aux_hidden_state_layer_ids": [i + 1 for i in ZLAB_IDS],
        "mask_token_id": MASK_ID,
        "sample_from_anchor": False,
        "speculators_config": {
            "algorithm": "dflash",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": BLOCK_SIZE - 1}],
            "verifier": {"name_or_path": "tiny", "architectures": []},
        },
    }
    (folder / "config.json").write_text(json.dumps(config))
    state = published_tensors(hidden, vocab, len(ZLAB_IDS) * hidden, seed, draft_vocab=len(draft_ids))
    ids = torch.tensor(draft_ids)
    state["d2t"] = ids - torch.arange(len(ids))
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    state["t2d"] = t2d
    state["embed_tokens.weight"] = target_model.model.embed_tokens.weight.detach().clone()
    save_file(state, str(folder / "model.safetensors"))
    return folder


# -- the reference: DFlash's forward as its publishers' code computes it ---------------------------
def rms(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


def reference_logits(state, target_model, tokens, theta=1000000.0, mask_embedding=None):
    """The mask rows' logits of one block after ``tokens`` (committed), computed as z-lab's
    ``DFlashDraftModel.forward`` + ``dflash_generate`` do: the context is every committed token but
    the last (its target states: hidden_states[id + 1] of each target_layer_id, fc, hidden_norm); the
    block is the last committed token then mask tokens; each layer's keys and values are k_proj/v_proj
    of [context; block] (k_norm on keys), q of the block (q_norm), rotary at the absolute positions,
    attention without a mask; the final norm, then lm_head (the checkpoint's, else the target's)."""
    with torch.no_grad():
        hs = target_model.model(input_ids=torch.tensor([tokens]), output_hidden_states=True).hidden_states
        ctx = torch.cat([hs[i + 1][0] for i in ZLAB_IDS], -1)[:-1]  # the committed tokens but the last
        ctx = rms(ctx @ state["fc.weight"].T, state["hidden_norm.weight"])
        embed = target_model.model.embed_tokens.weight
        mask = embed[MASK_ID] if mask_embedding is None else mask_embedding
        x = torch.cat([embed[tokens[-1]][None], mask[None].expand(BLOCK_SIZE - 1, -1)])
        c, q_len = ctx.shape[0], x.shape[0]
        positions = torch.arange(c + q_len).float()
        inv = 1.0 / theta ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
        angles = torch.cat([positions[:, None] * inv[None]] * 2, -1)
        cos, sin = angles.cos(), angles.sin()
        for i in range(DRAFT_LAYERS):
            p = f"layers.{i}."
            residual = x
            h = rms(x, state[p + "input_layernorm.weight"])
            q = (h @ state[p + "self_attn.q_proj.weight"].T).view(q_len, HEADS, HEAD_DIM)
            q = rms(q, state[p + "self_attn.q_norm.weight"]).transpose(0, 1)
            both = torch.cat([ctx, h])
            k = (both @ state[p + "self_attn.k_proj.weight"].T).view(c + q_len, KV_HEADS, HEAD_DIM)
            k = rms(k, state[p + "self_attn.k_norm.weight"]).transpose(0, 1)
            v = (both @ state[p + "self_attn.v_proj.weight"].T).view(c + q_len, KV_HEADS, HEAD_DIM).transpose(0, 1)
            q = q * cos[-q_len:] + rotate_half(q) * sin[-q_len:]
            k = k * cos + rotate_half(k) * sin
            k, v = k.repeat_interleave(HEADS // KV_HEADS, 0), v.repeat_interleave(HEADS // KV_HEADS, 0)
            weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM), -1)
            attn = (weights @ v).transpose(0, 1).reshape(q_len, HEADS * HEAD_DIM)
            x = residual + attn @ state[p + "self_attn.o_proj.weight"].T
            h = rms(x, state[p + "post_attention_layernorm.weight"])
            gate, up = h @ state[p + "mlp.gate_proj.weight"].T, h @ state[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ state[p + "mlp.down_proj.weight"].T
        out = rms(x, state["norm.weight"])[1:]  # the mask rows
        head = state["lm_head.weight"] if "lm_head.weight" in state else target_model.lm_head.weight
        return out @ head.T


def drafter_rows(folder, target_model, tokens):
    """The ``dflash`` drafter's draft distributions of one block after ``tokens`` (greedy sampling:
    plain softmax; no lookup prior: the network's own rows), its context fed the target's layer inputs
    it asked for."""
    drafter = DFlashDrafter(
        DFlashConfig(path=str(folder), lookup_bias=[]),
        Resources(target=adapter(target_model), draft=None, sampling=SamplingParams()),
    )
    with torch.no_grad():
        hs = target_model.model(input_ids=torch.tensor([tokens]), output_hidden_states=True).hidden_states
    fused = torch.cat([hs[j][0] for j in drafter.draft_info.target_layers], -1)[:-1]
    drafter.net.extend_context(drafter.context, fused)
    logits, _ = drafter._forward(tokens, [])
    rows, _ = drafter._rows(logits, tokens, [], None)
    return drafter, rows


TOKENS = [3, 7, 11, 5, 2, 9, 4]


def test_a_zlab_checkpoint_computes_what_zlabs_code_computes(tmp_path, target):
    from safetensors.torch import load_file

    folder = zlab_checkpoint(tmp_path / "zlab", target)
    drafter, rows = drafter_rows(folder, target, TOKENS)
    assert drafter.draft_info.target_layers == (1, 2)  # z-lab ids 0, 1: the outputs of layers 0 and 1
    assert drafter.block == BLOCK_SIZE - 1 and drafter.columns.id_list == list(range(16))
    expected = torch.softmax(reference_logits(load_file(folder / "model.safetensors"), target, TOKENS), -1)
    torch.testing.assert_close(rows, expected, rtol=1e-4, atol=1e-6)
    assert drafter.draft_info.identity.startswith("dflash-z-lab:")


def test_a_speculators_checkpoint_with_a_draft_vocabulary_computes_what_its_code_computes(tmp_path, target):
    from safetensors.torch import load_file

    draft_ids = [0, 2, 3, 5, 7, 9, 11, 14]
    folder = speculators_checkpoint(tmp_path / "spec", target, draft_ids)
    drafter, rows = drafter_rows(folder, target, TOKENS)
    assert drafter.draft_info.target_layers == (1, 2) and drafter.columns.id_list == draft_ids
    expected = torch.softmax(reference_logits(load_file(folder / "model.safetensors"), target, TOKENS), -1)
    torch.testing.assert_close(rows, expected, rtol=1e-4, atol=1e-6)


def test_a_mask_embedding_file_replaces_the_mask_tokens_row(tmp_path, target):
    from safetensors.torch import load_file

    folder = zlab_checkpoint(tmp_path / "zlab", target)
    mask = torch.randn(target.config.hidden_size)
    torch.save({"mask_token_id": MASK_ID, "embedding": mask}, folder / "mask_embedding.pt")
    _, rows = drafter_rows(folder, target, TOKENS)
    state = load_file(folder / "model.safetensors")
    torch.testing.assert_close(
        rows, torch.softmax(reference_logits(state, target, TOKENS, mask_embedding=mask), -1), rtol=1e-4, atol=1e-6
    )
    assert not torch.allclose(rows, torch.softmax(reference_logits(state, target, TOKENS), -1), atol=1e-3)


def test_a_wrong_reference_detail_is_caught(tmp_path, target):
    """The comparison can fail: a reference rotating with transformers' default θ (not the config's) differs."""
    from safetensors.torch import load_file

    folder = zlab_checkpoint(tmp_path / "zlab", target)
    _, rows = drafter_rows(folder, target, TOKENS)
    state = load_file(folder / "model.safetensors")
    wrong = reference_logits(state, target, TOKENS, theta=10000.0)  # transformers' default θ, not the config's
    assert not torch.allclose(rows, torch.softmax(wrong, -1), atol=1e-3)


@pytest.mark.parametrize("layout", ["zlab", "speculators"])
def test_greedy_decoding_with_a_published_draft_equals_the_targets(tmp_path, target, layout):
    folder = (
        zlab_checkpoint(tmp_path / "d", target)
        if layout == "zlab"
        else speculators_checkpoint(tmp_path / "d", target, [0, 2, 3, 5, 7, 9, 11, 14])
    )
    engine = block_engine(target, folder, stop="{name: fixed, gamma: 5}")
    for prompt in ([3, 7, 11, 5], [1, 2, 3], [9, 9, 9, 9]):
        assert engine.generate(prompt, max_new_tokens=20).tokens == reference_greedy(target, prompt, 20)


# -- refusals ---------------------------------------------------------------------------------------
def refusal(folder, target_model) -> str:
    with pytest.raises(InputError) as caught:
        drafter_rows(folder, target_model, TOKENS)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"layer_types": ["sliding_attention", "full_attention"]}, "only full_attention"),
        ({"architectures": ["DFlash2DraftModel"]}, "DFlash2"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling"),
        ({"rope_theta": None}, "no rope_theta"),
        ({"attention_bias": True}, "attention_bias"),
        ({"num_hidden_layers": 3}, "num_hidden_layers is 3"),
        ({"num_attention_heads": 8}, "num_attention_heads × head_dim"),
        ({"hidden_size": 64}, "hidden size 64"),
        ({"dflash_config": {"mask_token_id": MASK_ID, "target_layer_ids": [0, 2]}}, "input of target layer 3"),
        ({"dflash_config": {"mask_token_id": 99, "target_layer_ids": ZLAB_IDS}}, "mask_token_id 99"),
        ({"is_causal": True}, "causal attention"),
    ],
)
def test_a_checkpoint_the_drafter_cannot_compute_is_refused_by_name(tmp_path, target, changes, expected):
    assert expected in refusal(zlab_checkpoint(tmp_path / "zlab", target, **changes), target)


def test_a_missing_or_misshapen_tensor_is_refused_naming_it(tmp_path, target):
    from safetensors.torch import load_file

    folder = zlab_checkpoint(tmp_path / "zlab", target)
    state = load_file(folder / "model.safetensors")
    del state["layers.1.self_attn.k_norm.weight"]
    save_file(state, str(folder / "model.safetensors"))
    assert "layers.1.self_attn.k_norm.weight" in refusal(folder, target)
    state["layers.1.self_attn.k_norm.weight"] = torch.ones(HEAD_DIM + 2)
    save_file(state, str(folder / "model.safetensors"))
    assert "layers.1.self_attn.k_norm.weight" in refusal(folder, target)


def test_pickled_weights_and_other_embeddings_are_refused(tmp_path, target):
    from safetensors.torch import load_file

    folder = zlab_checkpoint(tmp_path / "zlab", target)
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    assert "safetensors only" in refusal(folder, target)
    folder = speculators_checkpoint(tmp_path / "spec", target, list(range(16)))
    state = load_file(folder / "model.safetensors")
    state["embed_tokens.weight"] = state["embed_tokens.weight"] + 1
    save_file(state, str(folder / "model.safetensors"))
    assert "embeddings (embed_tokens.weight) other than the target's" in refusal(folder, target)


# -- pacer export: speculators' dflash format, read back identical -----------------------------------
def published_arch_draft(target_model, folder, subset):
    """A random block draft in the published architecture (inject off, q/k norms) over ``subset``,
    with a learned mask embedding, saved as `pacer distill` saves one."""
    import attrs

    from pacer_plugins.block_draft.model import BlockArch, BlockDraft, save_block_draft

    shape = attrs.asdict(adapter(target_model).attention_shape())
    arch = BlockArch(
        hidden_size=target_model.config.hidden_size,
        intermediate_size=FFN,
        vocab_size=target_model.config.vocab_size,
        subset_size=len(subset),
        target_layers=[1, 2],
        num_layers=DRAFT_LAYERS,
        block=BLOCK_SIZE - 1,
        inject=False,
        qk_norm=True,
        **shape,
    )
    torch.manual_seed(3)
    net = BlockDraft(arch)
    with torch.no_grad():
        net.mask_embedding.normal_(std=0.5)
        for layer in net.layers:
            layer.q_norm.normal_(1, 0.3)
            layer.k_norm.normal_(1, 0.3)
        net.subset.copy_(torch.tensor(subset))
    save_block_draft(net, folder, {"target_digest": None})
    return folder


@pytest.mark.parametrize("subset", [[0, 2, 3, 5, 7, 9, 11, 14], [15 - i for i in range(16)]])
def test_an_exported_draft_loads_back_drafting_identically(tmp_path, target, subset):
    """`pacer export --speculators` then the speculators loader: the same draft distributions over the
    same token ids (float32 export: bit for bit; the target's head rows for a subset, reordered for a
    permutation of the whole vocabulary, which needs no d2t)."""
    from pacer_plugins.eagle.export import export_draft

    draft = published_arch_draft(target, tmp_path / "draft", subset)
    result = export_draft(
        draft,
        tmp_path / "out",
        torch.float32,
        speculators={"verifier": "tiny", "speculative_tokens": None},
        target=adapter(target),
    )
    assert result["layout"] == "dflash" and result["files"] == ["mask_embedding.pt"]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash" and config["block_size"] == BLOCK_SIZE
    assert config["aux_hidden_state_layer_ids"] == [1, 2] and config["draft_vocab_size"] == len(subset)
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == BLOCK_SIZE - 1
    assert config["mask_token_id"] not in subset or len(subset) == 16
    original, rows = drafter_rows(draft, target, TOKENS)
    loaded, back = drafter_rows(tmp_path / "out", target, TOKENS)
    assert loaded.draft_info.identity.startswith("dflash-speculators:")
    order = torch.argsort(original.columns.ids)  # the exported head lists a whole vocabulary in id order
    ids = original.columns.ids if len(subset) < 16 else original.columns.ids[order]
    assert loaded.columns.id_list == ids.tolist()
    torch.testing.assert_close(back, rows if len(subset) < 16 else rows[:, order], rtol=0, atol=0)


def test_drafts_outside_the_published_architecture_are_refused_in_one_line(tmp_path, target, capsys):
    draft = make_block_draft(target, tmp_path / "ours")  # inject on, no q/k norms: the shipped kind
    err = one_line_error(capsys, ["export", str(draft), str(tmp_path / "out"), "--speculators", "--verifier", "t"])
    assert "inject" in err and "published architecture" in err
    err = one_line_error(capsys, ["export", str(draft), str(tmp_path / "out")])
    assert "add --speculators --verifier" in err
    assert not (tmp_path / "out").exists()
