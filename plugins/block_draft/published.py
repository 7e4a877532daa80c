"""Published DFlash drafts, read as downloaded: z-lab/dflash checkpoints and speculators' ``dflash`` format.

Both hold ``config.json`` and ``model.safetensors`` (or shards with an index; safetensors only) with the
same network, read into ``BlockDraft`` with ``inject`` off and ``qk_norm`` on (model.py):

- ``fc`` (n·d → d, no bias) over the target layers' states, ``hidden_norm`` after it: the context
  features, projected by every layer's ``k_proj`` / ``v_proj`` (``k_norm`` on the keys) as its context
  keys and values;
- ``layers.{i}``: Qwen3 decoder layers (``input_layernorm``, ``self_attn.{q,k,v,o}_proj``,
  ``self_attn.{q,k}_norm`` over each head, ``post_attention_layernorm``, ``mlp.{gate,up,down}_proj``),
  every block row seeing every context row and every block row;
- ``norm``, then the target's output layer (z-lab) or the checkpoint's ``lm_head`` over its draft
  vocabulary, mapped to target ids by ``d2t`` (speculators: target id = draft id + d2t[draft id]).

A block is the last committed token (the anchor) followed by mask rows whose embedding is the
target's embedding of ``mask_token_id`` (or that of the checkpoint's ``embed_tokens``, or a
``mask_embedding.pt`` beside the weights, which vLLM reads too); the anchor's row predicts nothing,
so a checkpoint of ``block_size`` B drafts B − 1 tokens a forward.

The configs differ in where the DFlash keys are and how the target layers are numbered:

- **z-lab** (``architectures: [DFlashDraftModel]``): the Qwen3 keys at the top level, ``block_size`` at
  the top level or in ``dflash_config`` with ``mask_token_id`` and ``target_layer_ids``; layer id i
  reads transformers' ``hidden_states[i + 1]`` (the output of layer i: the input of layer i + 1);
- **speculators** (``speculators_model_type: dflash``): the Qwen3 keys in ``transformer_layer_config``;
  ``block_size``, ``mask_token_id``, ``draft_vocab_size`` and ``aux_hidden_state_layer_ids`` at the top
  level, the latter numbering the inputs of target layers (z-lab's id + 1, as vLLM's
  ``update_dflash`` converts them), as this project's ``target_layers`` do.

What the block drafter does not compute is refused by name rather than ignored (sliding-window or
causal layers, rotary scaling, biases, DFlash2's convolutions and selector, logit scales), so a
loaded draft never computes something other than its publisher's code. ``embed_tokens.weight``,
when present, must equal the target's embeddings (the drafter uses the target's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import torch

from pacer_core.draft_folders import MANIFEST
from pacer_core.errors import InputError
from pacer_core.hf.checkpoints import (
    CONFIG,
    FIX,
    ConfigReader,
    digest,
    draft_vocabulary,
    fill_tensors,
    read_tensors,
    weights_file,
)
from pacer_core.jsonfile import read_json

from .model import BlockArch, BlockDraft

MASK_FILE = "mask_embedding.pt"  # a mask embedding of its own (vLLM's qwen3_dflash.py reads it too)
LAYOUT = "the z-lab/dflash or speculators dflash layout"
ZLAB, SPECULATORS = "z-lab", "speculators"
# keys of DFlash variants the block drafter does not compute (DFlash2's convolutions and candidate selector)
VARIANT_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k", "markov_rank")


@attrs.frozen
class PublishedBlock:
    """A published DFlash checkpoint made ready for one target."""

    layout: str  # ZLAB or SPECULATORS
    net: BlockDraft  # float32, eval mode, on the CPU
    identity: str  # names the weights for PACER's M_B (Resources.draft_identity)


def is_published(folder: Path) -> bool:
    """Whether ``folder`` holds a published checkpoint (config.json and weights, no pacer manifest)."""
    return not (folder / MANIFEST).is_file() and weights_file(folder) is not None


def dflash_names(arch: BlockArch) -> dict[str, str]:
    """Our tensor name → the published DFlash tensor name (z-lab's and speculators' alike)."""
    names = {"fc.weight": "fc.weight", "context_norm": "hidden_norm.weight", "norm": "norm.weight"}
    if arch.own_head:
        names["lm_head.weight"] = "lm_head.weight"
    per_layer = {
        "input_norm": "input_layernorm.weight",
        "post_norm": "post_attention_layernorm.weight",
        **{f"{p}.weight": f"self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")},
        **{f"{p}.weight": f"mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")},
    }
    if arch.qk_norm:
        per_layer.update({"q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight"})
    for i in range(arch.num_layers):
        names.update({f"layers.{i}.{ours}": f"layers.{i}.{theirs}" for ours, theirs in per_layer.items()})
    return names


def _sections(config: dict, path: Path) -> tuple[str, dict, dict]:
    """(layout, the Qwen3 model keys, the DFlash keys) of a checkpoint config."""
    kind = config.get("speculators_model_type")
    if kind is not None:
        if kind != "dflash":
            raise InputError(
                f"'{path}' is a speculators checkpoint of {kind!r}, not 'dflash': the dflash drafter "
                "reads DFlash drafts only"
            )
        model = config.get("transformer_layer_config")
        if not isinstance(model, dict):
            raise InputError(
                f"'{path}' has no transformer_layer_config object (the draft's layers): it is not a "
                f"speculators dflash config; {FIX}"
            )
        return SPECULATORS, model, config
    dflash = config.get("dflash_config")
    if not isinstance(dflash, dict):
        raise InputError(
            f"'{path}' has neither speculators_model_type: dflash nor a dflash_config object: it is not "
            f"a DFlash checkpoint ({LAYOUT})"
        )
    if "block_size" not in dflash and "block_size" in config:
        dflash = {**dflash, "block_size": config["block_size"]}  # older z-lab checkpoints keep it at the top
    return ZLAB, config, dflash


def _refuse_variants(model: dict, draft: dict, r: ConfigReader, d: ConfigReader) -> None:
    """Keys of attention or output variants the block drafter does not compute, refused by name."""
    architectures = model.get("architectures") or []
    if any("DFlash2" in str(a) for a in architectures) or any(k in draft or k in model for k in VARIANT_KEYS):
        raise r.bad(
            "a DFlash2 (or DSpark) draft, with convolutions or a candidate selector, is not supported; "
            "only DFlash drafts are"
        )
    r.refuse_true("attention_bias", "q/k/v/o biases")
    r.refuse_true("mlp_bias", "MLP biases")
    r.refuse_true("is_causal", "causal attention inside the block")
    d.refuse_true("causal", "causal attention inside the block")
    d.refuse_true("use_swa", "sliding-window attention")
    d.refuse_true("sample_from_anchor", "the anchor row predicting a token")
    d.refuse_true("attention_sink_bias", "attention sinks")
    types = model.get("layer_types")
    if types is not None and (not isinstance(types, list) or any(t != "full_attention" for t in types)):
        raise r.bad(f"layer_types {types!r:.80} is not supported: only full_attention layers (no sliding window)")
    if types is None:
        r.refuse_true("use_sliding_window", "sliding-window attention")
    for key, default in (
        ("input_embedding_scale", 1),
        ("output_multiplier", 1),
        ("logit_scale", 1),
        ("partial_rotary_factor", 1),
    ):
        for source in (model, draft):
            if source.get(key) not in (None, default, float(default)):
                raise r.bad(f"{key} {source[key]!r} is not supported (only {default})")
    if draft.get("final_logit_softcapping") or model.get("final_logit_softcapping"):
        raise r.bad("final_logit_softcapping is not supported")
    if model.get("is_neox_style") is False:
        raise r.bad("is_neox_style: false (interleaved rotary layout) is not supported")
    if model.get("hidden_act", "silu") != "silu":
        raise r.bad(f"hidden_act {model.get('hidden_act')!r} is not supported (DFlash drafts use 'silu')")


def _target_layers(layout: str, draft: dict, d: ConfigReader, num_target_layers: int) -> list[int]:
    """The target layers whose inputs fc reads, in this project's numbering (the input of layer j)."""
    key = "aux_hidden_state_layer_ids" if layout == SPECULATORS else "target_layer_ids"
    ids = d.get(key)
    if not isinstance(ids, list) or not ids or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise d.bad(f"{key} must be a non-empty list of layer numbers, not {ids!r:.60}")
    layers = [i + 1 for i in ids] if layout == ZLAB else list(ids)
    beyond = [j for j in layers if j >= num_target_layers]
    if beyond:
        raise InputError(
            f"'{d.path}': {key} {ids} reads the input of target layer {beyond[0]}, but the target has "
            f"{num_target_layers} decoder layers (the last one's output is not a layer input): use "
            "the checkpoint published for this target"
        )
    return layers


def _mask_embedding(folder: Path, mask_id: int, embed: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The mask rows' embedding: ``mask_embedding.pt`` when present (a tensor, or {mask_token_id,
    embedding}, loaded with ``weights_only=True``), else row ``mask_id`` of the target's embeddings
    ``embed``; and a digest naming the file ("" for a row)."""
    path = folder / MASK_FILE
    if not path.is_file():
        return embed[mask_id].float(), ""  # the checkpoint's embed_tokens, when present, equal the target's
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 — corrupt, truncated or holding more than tensors
        raise InputError(f"'{path}' cannot be loaded as a mask embedding ({type(exc).__name__}): {FIX}") from exc
    if isinstance(data, dict):
        if data.get("mask_token_id", mask_id) != mask_id:
            raise InputError(
                f"'{path}' is for mask_token_id {data.get('mask_token_id')!r}, but the config says "
                f"{mask_id}: the files do not belong together; {FIX}"
            )
        data = data.get("embedding")
    if not isinstance(data, torch.Tensor) or not data.is_floating_point() or data.numel() != embed.shape[1]:
        raise InputError(f"'{path}' does not hold one embedding of {embed.shape[1]} values: {FIX}")
    return data.reshape(-1).float(), digest(path)[:8]


def read_arch(folder: Path, target: Any) -> tuple[str, BlockArch, dict]:
    """(layout, the ``BlockArch`` of the checkpoint in ``folder`` for ``target``, its config) — every
    value checked against the target, refused in one ``InputError`` naming the key."""
    path = folder / CONFIG
    config = read_json(path, "DFlash checkpoint config", FIX)
    layout, model, draft = _sections(config, path)
    r = ConfigReader(model, path, "a DFlash", LAYOUT)
    d = ConfigReader(draft, path, "a DFlash", LAYOUT)
    _refuse_variants(model, draft, r, d)
    hidden, heads, kv_heads, head_dim = r.attention()
    vocab = r.whole("vocab_size")
    if model.get("rope_theta") is None and not isinstance(model.get("rope_parameters"), dict):
        raise r.bad(
            "there is no rope_theta, and engines assume different ones when it is absent (10000 in "
            "transformers' Qwen3Config, 1000000 in vLLM): add the value the draft was trained with"
        )
    theta, scaling = r.rope(10000.0)
    if scaling is not None:
        raise r.bad(f"rope scaling {scaling!r:.80} is not supported by the block drafter (plain rotary embeddings)")
    target_hidden = d.get("target_hidden_size", model.get("target_hidden_size")) or hidden
    if hidden != target.hidden_size or target_hidden != target.hidden_size:
        raise InputError(
            f"DFlash checkpoint '{folder}' has hidden size {hidden} (reading target states of size "
            f"{target_hidden}), but the target's is {target.hidden_size}: use the checkpoint published "
            "for this target"
        )
    if vocab != target.vocab_size:
        raise InputError(
            f"DFlash checkpoint '{folder}' has a vocabulary of {vocab} tokens, but the target's has "
            f"{target.vocab_size}: use the checkpoint published for this target"
        )
    block_size = d.whole("block_size", minimum=2)
    mask_id = d.whole("mask_token_id", minimum=0)
    if mask_id >= vocab:
        raise d.bad(f"mask_token_id {mask_id} is outside the vocabulary of {vocab} tokens")
    draft_vocab = d.whole("draft_vocab_size", vocab) if layout == SPECULATORS else vocab
    if draft_vocab > vocab:
        raise d.bad(f"draft_vocab_size ({draft_vocab}) exceeds vocab_size ({vocab})")
    try:
        arch = BlockArch(
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=r.whole("intermediate_size"),
            rope_theta=theta,
            rms_eps=r.positive("rms_norm_eps", 1e-6),
            vocab_size=vocab,
            subset_size=draft_vocab,
            target_layers=_target_layers(layout, draft, d, target.num_layers),
            num_layers=r.whole("num_hidden_layers"),
            block=block_size - 1,
            inject=False,
            qk_norm=True,
            mask_token_id=mask_id,
        )
    except ValueError as exc:
        raise r.bad(str(exc).splitlines()[0][:160]) from None
    return layout, arch, config


def load_published_block(folder: Path, target: Any) -> PublishedBlock:
    """Read the DFlash checkpoint in ``folder`` for ``target`` (a ``FeatureModel``); a checkpoint that
    does not fit the target or cannot be read is one ``InputError``; every size of its config is
    checked against the tensors before the network is built."""
    from pacer_core.hf import check_sizes

    path = weights_file(folder)
    if path is None:
        raise InputError(f"'{folder}' holds no config.json with model.safetensors: it is not a DFlash checkpoint")
    if not path.name.startswith("model.safetensors"):
        raise InputError(
            f"'{path}': DFlash checkpoints are read from safetensors only (model.safetensors or its "
            "shards); download the safetensors files of the checkpoint"
        )
    layout, arch, _ = read_arch(folder, target)
    state = read_tensors(path)
    own_head = "lm_head.weight" in state
    if arch.subset_size < arch.vocab_size and not own_head:
        raise InputError(
            f"'{path}' has no tensor 'lm_head.weight', which a draft vocabulary of {arch.subset_size} "
            f"tokens needs: the file is incomplete; {FIX}"
        )
    arch = attrs.evolve(arch, own_head=own_head)
    first = "layers.0.self_attn."
    sizes = [
        ("hidden_size", arch.hidden_size, "fc.weight", 0),
        ("len(target layers) × hidden_size", arch.fused_size, "fc.weight", 1),
        ("intermediate_size", arch.intermediate_size, "layers.0.mlp.gate_proj.weight", 0),
        ("num_attention_heads × head_dim", arch.num_heads * arch.head_dim, first + "q_proj.weight", 0),
        ("num_key_value_heads × head_dim", arch.num_kv_heads * arch.head_dim, first + "k_proj.weight", 0),
        ("head_dim", arch.head_dim, first + "q_norm.weight", 0),
    ]
    if own_head:
        sizes.append(("draft_vocab_size", arch.subset_size, "lm_head.weight", 0))
    check_sizes(
        folder / CONFIG,
        path,
        {name: tuple(t.shape) for name, t in state.items()},
        FIX,
        sizes,
        [("num_hidden_layers", arch.num_layers, "layers.")],
    )
    embed = target.embedding_weights()[0].detach().cpu()
    checkpoint_embed = state.get("embed_tokens.weight")
    if checkpoint_embed is not None and (
        tuple(checkpoint_embed.shape) != tuple(embed.shape)
        or not torch.equal(checkpoint_embed, embed.to(checkpoint_embed.dtype))
    ):
        raise InputError(
            f"DFlash checkpoint '{folder}' has embeddings (embed_tokens.weight) other than the target's: "
            "the block drafter embeds with the target's; use the checkpoint published for this target"
        )
    net = BlockDraft(arch)
    fill_tensors(net, state, dflash_names(arch), path, "DFlash")
    ids = draft_vocabulary(state, arch.subset_size, arch.vocab_size, path)
    mask, mask_digest = _mask_embedding(folder, arch.mask_token_id, embed)
    with torch.no_grad():
        net.subset.copy_(ids)
        net.mask_embedding.copy_(mask)
    identity = f"dflash-{layout}:{digest(path)}" + (f"+{mask_digest}" if mask_digest else "")
    return PublishedBlock(layout, net.eval(), identity)
