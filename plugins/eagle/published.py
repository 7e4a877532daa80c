"""Published EAGLE checkpoints (SafeAILab/EAGLE and the models trained with it), read as downloaded.

Such a folder holds ``config.json`` (a Llama config of the draft) and its weights (one file or shards
with an index, pacer_core.hf.checkpoints), no manifest and no record of its target. The layout is
recognised from the tensor names:

- **EAGLE-1/2** (``eagle/model/cnets1.py``): ``fc`` (2d → d, bias unless the config says
  ``bias: false``) over cat(embed(x_{t+1}), f_t), then ``layers.{i}.*``: attention (q/k/v biases when
  the config says ``qkv_bias: true``) without an input norm in layer 0 (later layers have
  ``input_layernorm``), ``post_attention_layernorm``, the MLP. No final norm, no output layer: the
  logits are the target's head over the full vocabulary, or over the token map the config names
  (``speculative_token_map``, written by ``pacer export``). This is ``FeatureDraft`` with
  ``input_norm=False`` and ``extra_layers`` = layers − 1.
- **EAGLE-3** (``eagle/model/cnets.py``): ``fc`` (3d → d) over the inputs of target decoder layers
  2, L // 2 and L − 3 (the engine returns them when the drafter declares ``target_layers``),
  ``midlayer.*`` with ``hidden_norm`` and ``input_layernorm``, attention over 2d inputs, ``norm``
  and an own ``lm_head`` over a reduced draft vocabulary mapped to target ids by ``d2t`` (target
  id = draft id + d2t[draft id]). This is ``Eagle3Draft``.

The config's values are checked one by one (published_config.py); ``head_dim``, ``rope_scaling``
(linear, dynamic, yarn, llama3 as transformers defines them, rotary.py) and ``qkv_bias`` are honoured,
and keys of variants not implemented here are refused by name. ``embed_tokens.weight``, when present,
is checked against the target and ignored: the drafter uses the target's embeddings. Other tensors
the math does not use are ignored, as EAGLE's own loader does; every tensor it uses must be present
with its shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import attrs
import torch

from pacer_core import InputError
from pacer_core.hf.checkpoints import (  # noqa: F401 (FIX, weights_file: re-exported)
    FIX,
    digest,
    draft_vocabulary,
    fill_tensors,
    read_tensors,
    read_token_map,
    weights_file,
)

from .model import ArchConfig, Eagle3Arch, Eagle3Draft, FeatureDraft
from .published_config import CONFIG, PublishedConfig, check_config, read_config

# our module name → the EAGLE-1/2 tensor name (FeatureDraft)
EAGLE1_NAMES = {
    "fc.weight": "fc.weight",
    "q_proj.weight": "layers.0.self_attn.q_proj.weight",
    "k_proj.weight": "layers.0.self_attn.k_proj.weight",
    "v_proj.weight": "layers.0.self_attn.v_proj.weight",
    "o_proj.weight": "layers.0.self_attn.o_proj.weight",
    "post_norm.weight": "layers.0.post_attention_layernorm.weight",
    "gate_proj.weight": "layers.0.mlp.gate_proj.weight",
    "up_proj.weight": "layers.0.mlp.up_proj.weight",
    "down_proj.weight": "layers.0.mlp.down_proj.weight",
}
# our module name → the EAGLE-3 tensor name (Eagle3Draft)
EAGLE3_NAMES = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "midlayer.hidden_norm.weight",
    "input_norm.weight": "midlayer.input_layernorm.weight",
    "q_proj.weight": "midlayer.self_attn.q_proj.weight",
    "k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "v_proj.weight": "midlayer.self_attn.v_proj.weight",
    "o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "post_norm.weight": "midlayer.post_attention_layernorm.weight",
    "gate_proj.weight": "midlayer.mlp.gate_proj.weight",
    "up_proj.weight": "midlayer.mlp.up_proj.weight",
    "down_proj.weight": "midlayer.mlp.down_proj.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}


@attrs.frozen
class Published:
    """A published EAGLE checkpoint made ready for one target."""

    layout: str  # "eagle1" (EAGLE-1/2) or "eagle3"
    net: torch.nn.Module  # FeatureDraft or Eagle3Draft, float32 on the CPU
    vocab: Optional[torch.Tensor]  # [draft vocab] target ids of the draft's logits; None: the target's whole head
    target_layers: Optional[tuple[int, ...]]  # target decoder layers whose inputs the draft reads; None: the last layer
    identity: str  # names the weights for PACER's M_B (Resources.draft_identity)


def eagle1_names(layers: int, qkv_bias: bool, fc_bias: bool) -> dict[str, str]:
    """Our module name → the EAGLE-1/2 tensor name, for a draft of ``layers`` decoder layers."""
    names = {ours: theirs for ours, theirs in EAGLE1_NAMES.items()}
    if fc_bias:
        names["fc.bias"] = "fc.bias"
    if qkv_bias:
        names.update({f"{p}.bias": f"layers.0.self_attn.{p}.bias" for p in ("q_proj", "k_proj", "v_proj")})
    for i in range(1, layers):
        for ours, theirs in list(names.items()):
            if theirs.startswith("layers.0."):
                names[f"extra.{i - 1}.{ours}"] = theirs.replace("layers.0.", f"layers.{i}.")
        names[f"extra.{i - 1}.input_norm.weight"] = f"layers.{i}.input_layernorm.weight"
    return names


def eagle3_names(qkv_bias: bool = False) -> dict[str, str]:
    """Our module name → the EAGLE-3 tensor name."""
    names = dict(EAGLE3_NAMES)
    if qkv_bias:
        names.update({f"{p}.bias": f"midlayer.self_attn.{p}.bias" for p in ("q_proj", "k_proj", "v_proj")})
    return names


def load_published(folder: Path, target: Any) -> Published:
    """Read the EAGLE checkpoint in ``folder`` for ``target`` (a ``FeatureModel``); a checkpoint that
    does not fit the target or cannot be read is one ``InputError``; every size of its config is
    checked against the tensors before the network is built."""
    from pacer_core.hf import check_sizes

    path = weights_file(folder)
    assert path is not None
    config = read_config(folder)
    state = read_tensors(path)
    if any(name.startswith("midlayer.") for name in state):
        layout = "eagle3"
    elif any(name.startswith("layers.0.") for name in state):
        layout = "eagle1"
    else:
        raise InputError(
            f"'{path}' holds neither EAGLE-1/2 tensors (layers.0.*) nor EAGLE-3 tensors (midlayer.*): "
            "it is not an EAGLE checkpoint"
        )
    c = check_config(config, folder, layout)
    name = "EAGLE-3" if layout == "eagle3" else "EAGLE-1/2"
    if c.hidden_size != target.hidden_size:
        raise InputError(
            f"{name} checkpoint '{folder}' has hidden size {c.hidden_size}, but the target's is "
            f"{target.hidden_size}: use the checkpoint published for this target"
        )
    if c.vocab_size != target.vocab_size:
        raise InputError(
            f"{name} checkpoint '{folder}' has a vocabulary of {c.vocab_size} tokens, but the target's "
            f"has {target.vocab_size}: use the checkpoint published for this target"
        )
    embed = state.get("embed_tokens.weight")
    if c.target_hidden_size is not None and c.target_hidden_size != c.hidden_size:
        raise InputError(
            f"{name} checkpoint '{folder}' reads target states of size {c.target_hidden_size} into a "
            f"draft of hidden size {c.hidden_size}: drafts narrower than their target are not supported"
        )
    if embed is not None and tuple(embed.shape) != (target.vocab_size, target.hidden_size):
        raise InputError(
            f"{name} checkpoint '{folder}' has embeddings of shape {tuple(embed.shape)}, but the "
            f"target's are {(target.vocab_size, target.hidden_size)}: use the checkpoint published "
            "for this target"
        )
    check_sizes(
        folder / CONFIG, path, {name: tuple(t.shape) for name, t in state.items()}, FIX, *published_sizes(c, layout)
    )
    identity = f"{layout}:{digest(path)}"
    if layout == "eagle1":
        ids = None
        if c.token_map is not None:  # the draft vocabulary `pacer export` writes (SGLang's token map)
            ids = read_token_map(folder / c.token_map, c.vocab_size)
            identity += f"+{digest(folder / c.token_map)[:8]}"
        net = FeatureDraft(
            ArchConfig(
                vocab_size=c.vocab_size,
                subset_size=c.vocab_size if ids is None else len(ids),
                input_norm=False,
                fc_bias=c.fc_bias,
                extra_layers=c.num_layers - 1,
                **c.arch_fields(),
            )
        )
        fill_tensors(net, state, eagle1_names(c.num_layers, c.qkv_bias, c.fc_bias), path, "EAGLE")
        net.subset.copy_(torch.arange(c.vocab_size) if ids is None else ids)
        return Published(layout, net.eval(), ids, None, identity)
    layers = eagle3_layers(target.num_layers)
    net = Eagle3Draft(Eagle3Arch(draft_vocab_size=c.draft_vocab_size, fused_size=3 * c.hidden_size, **c.arch_fields()))
    fill_tensors(net, state, eagle3_names(c.qkv_bias), path, "EAGLE")
    ids = draft_vocabulary(state, c.draft_vocab_size, c.vocab_size, path)
    net.subset.copy_(ids)
    return Published(layout, net.eval(), ids, layers, identity)


def published_sizes(c: PublishedConfig, layout: str) -> tuple[list, list]:
    """(sizes, layers) of ``pacer_core.hf.check_sizes`` for a checkpoint of ``layout``: every size of
    its config.json that the network is built from, and the tensor dimension holding it."""
    layer = "layers.0." if layout == "eagle1" else "midlayer."
    sizes = [
        ("hidden_size", c.hidden_size, "fc.weight", 0),
        ("intermediate_size", c.intermediate_size, layer + "mlp.gate_proj.weight", 0),
        ("num_attention_heads × head_dim", c.num_heads * c.head_dim, layer + "self_attn.q_proj.weight", 0),
        ("num_key_value_heads × head_dim", c.num_kv_heads * c.head_dim, layer + "self_attn.k_proj.weight", 0),
    ]
    if layout == "eagle3":
        sizes += [
            ("3 × hidden_size", 3 * c.hidden_size, "fc.weight", 1),
            ("draft_vocab_size", c.draft_vocab_size, "lm_head.weight", 0),
        ]
        return sizes, []
    return sizes, [("num_hidden_layers", c.num_layers, "layers.")]


def eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """The target decoder layers whose inputs EAGLE-3 reads, in order: 2, L // 2 and L − 3 (EAGLE's
    ``modeling_llama_kv.py`` keeps the hidden state entering those layers; as HF ``hidden_states``
    indices: the outputs of layers 1, L // 2 − 1 and L − 4)."""
    layers = (2, num_layers // 2, num_layers - 3)
    if not layers[0] < layers[1] < layers[2]:
        raise InputError(
            f"EAGLE-3 reads the inputs of target layers 2, L//2 and L-3, which need a target of at "
            f"least 7 decoder layers; this one has {num_layers}"
        )
    return layers
