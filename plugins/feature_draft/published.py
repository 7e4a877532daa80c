"""Published EAGLE checkpoints (SafeAILab/EAGLE and the models trained with it), read as downloaded.

Such a folder holds ``config.json`` (a one-layer Llama config) and ``pytorch_model.bin`` or
``model.safetensors``, no manifest and no record of its target. The layout is recognised from the
tensor names:

- **EAGLE-1/2** (``eagle/model/cnets1.py``): ``fc`` (2d → d, bias unless the config says
  ``bias: false``) over cat(embed(x_{t+1}), f_t), then ``layers.0.*``: attention without an input
  norm (layer 0 skips it), ``post_attention_layernorm``, the MLP. No final norm, no output layer:
  the logits are the target's head over the full vocabulary. This is ``FeatureDraft`` with
  ``input_norm=False``.
- **EAGLE-3** (``eagle/model/cnets.py``): ``fc`` (3d → d) over the inputs of target decoder layers
  2, L // 2 and L − 3 (the engine returns them when the drafter declares ``target_layers``),
  ``midlayer.*`` with ``hidden_norm`` and ``input_layernorm``, attention over 2d inputs, ``norm``
  and an own ``lm_head`` over a reduced draft vocabulary mapped to target ids by ``d2t`` (target
  id = draft id + d2t[draft id]). This is ``Eagle3Draft``.

``embed_tokens.weight``, when present, is checked against the target and ignored: the drafter uses
the target's embeddings. Other tensors the math does not use are ignored, as EAGLE's own loader
does; every tensor it uses must be present with its shape. ``.bin`` files are unpickled with
``weights_only=True`` only.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any, Optional

import attrs
import torch

from pacer_core import InputError

from .model import ArchConfig, Eagle3Arch, Eagle3Draft, FeatureDraft

CONFIG = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
FIX = "download the checkpoint again"

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
    vocab: Optional[torch.Tensor]  # [draft vocab] target ids of the draft's own head (EAGLE-3); None: the target's head
    target_layers: Optional[tuple[int, ...]]  # target decoder layers whose inputs the draft reads; None: the last layer
    identity: str  # names the weights for PACER's M_B (Resources.draft_identity)


def weights_file(folder: Path) -> Optional[Path]:
    """The weights file of an EAGLE checkpoint folder (config.json + one weights file), else None."""
    if not (folder / CONFIG).is_file():
        return None
    return next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint file; anything unreadable is one ``InputError``."""
    if path.suffix == ".safetensors":
        from pacer_core.hf import load_safetensors

        state = load_safetensors(path, FIX)
    else:
        try:  # never unpickle arbitrary objects: plain tensors only
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
        except Exception as exc:  # noqa: BLE001 — corrupt, truncated or holding more than tensors
            raise InputError(f"'{path}' cannot be loaded as PyTorch weights ({type(exc).__name__}): it is truncated, "
                             f"corrupt or holds more than tensors; {FIX}") from exc
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise InputError(f"'{path}' does not hold a dict of named tensors: it is not an EAGLE checkpoint")
    return state


def _read_config(folder: Path) -> dict[str, Any]:
    try:
        config = json.loads((folder / CONFIG).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"'{folder / CONFIG}' cannot be read as JSON ({type(exc).__name__}): {FIX}") from exc
    if not isinstance(config, dict):
        raise InputError(f"'{folder / CONFIG}' is not a JSON object: {FIX}")
    return config


def _field(config: dict, key: str, folder: Path, default: Any = None) -> Any:
    value = config.get(key, default)
    if value is None:
        raise InputError(f"'{folder / CONFIG}' has no '{key}': it is not an EAGLE checkpoint config")
    return value


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def _fill(net: torch.nn.Module, state: dict[str, torch.Tensor], names: dict[str, str], path: Path) -> None:
    """Copy the checkpoint's tensors into ``net`` (our name → theirs), each checked for presence and shape."""
    own = net.state_dict()
    loaded = {}
    for ours, theirs in names.items():
        if theirs not in state:
            raise InputError(f"'{path}' has no tensor '{theirs}': the file is incomplete or not this EAGLE layout; {FIX}")
        tensor = state[theirs]
        if tuple(tensor.shape) != tuple(own[ours].shape):
            raise InputError(f"'{path}': tensor '{theirs}' has shape {tuple(tensor.shape)}, but its config.json "
                             f"implies {tuple(own[ours].shape)}: the config and weights do not belong together")
        loaded[ours] = tensor.float()
    net.load_state_dict(loaded, strict=False)


def load_published(folder: Path, target: Any) -> Published:
    """Read the EAGLE checkpoint in ``folder`` for ``target`` (a ``FeatureModel``); a checkpoint that
    does not fit the target or cannot be read is one ``InputError``."""
    path = weights_file(folder)
    assert path is not None
    config = _read_config(folder)
    state = read_tensors(path)
    if any(name.startswith("midlayer.") for name in state):
        layout = "eagle3"
    elif any(name.startswith("layers.0.") for name in state):
        layout = "eagle1"
    else:
        raise InputError(f"'{path}' holds neither EAGLE-1/2 tensors (layers.0.*) nor EAGLE-3 tensors (midlayer.*): "
                         "it is not an EAGLE checkpoint")
    hidden = int(_field(config, "hidden_size", folder))
    vocab = int(_field(config, "vocab_size", folder))
    heads = int(_field(config, "num_attention_heads", folder))
    kv_heads = int(config.get("num_key_value_heads") or heads)
    name = "EAGLE-3" if layout == "eagle3" else "EAGLE-1/2"
    if hidden != target.hidden_size:
        raise InputError(f"{name} checkpoint '{folder}' has hidden size {hidden}, but the target's is "
                         f"{target.hidden_size}: use the checkpoint published for this target")
    if vocab != target.vocab_size:
        raise InputError(f"{name} checkpoint '{folder}' has a vocabulary of {vocab} tokens, but the target's has "
                         f"{target.vocab_size}: use the checkpoint published for this target")
    embed = state.get("embed_tokens.weight")
    target_hidden = config.get("target_hidden_size")
    if target_hidden is not None and int(target_hidden) != hidden:
        raise InputError(f"{name} checkpoint '{folder}' reads target states of size {target_hidden} into a draft of "
                         f"hidden size {hidden}: drafts narrower than their target are not supported")
    if embed is not None and tuple(embed.shape) != (target.vocab_size, target.hidden_size):
        raise InputError(f"{name} checkpoint '{folder}' has embeddings of shape {tuple(embed.shape)}, but the "
                         f"target's are {(target.vocab_size, target.hidden_size)}: use the checkpoint published "
                         "for this target")
    if config.get("rope_scaling"):
        raise InputError(f"{name} checkpoint '{folder}': rope_scaling {config['rope_scaling']} is not supported "
                         "(only plain rotary embeddings)")
    if config.get("norm_before_residual"):
        raise InputError(f"{name} checkpoint '{folder}': norm_before_residual (a variant of other trainers) is not "
                         "supported; use a checkpoint in the SafeAILab/EAGLE layout")
    shape = dict(hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads,
                 intermediate_size=int(_field(config, "intermediate_size", folder)),
                 rope_theta=float(config.get("rope_theta") or 10000.0),  # EAGLE's default when absent
                 rms_eps=float(config.get("rms_norm_eps") or 1e-6))
    identity = f"{layout}:{_file_digest(path)}"
    if layout == "eagle1":
        if int(config.get("num_hidden_layers", 1)) != 1:
            raise InputError(f"{name} checkpoint '{folder}' has {config['num_hidden_layers']} layers; only "
                             "one-layer EAGLE drafts are supported")
        bias = bool(config.get("bias", True))  # EAGLE's default
        net = FeatureDraft(ArchConfig(vocab_size=vocab, subset_size=vocab, input_norm=False, fc_bias=bias, **shape))
        names = dict(EAGLE1_NAMES, **({"fc.bias": "fc.bias"} if bias else {}))
        _fill(net, state, names, path)
        net.subset.copy_(torch.arange(vocab))
        return Published(layout, net.eval(), None, None, identity)
    layers = eagle3_layers(target.num_layers)
    draft_vocab = int(config.get("draft_vocab_size") or vocab)
    net = Eagle3Draft(Eagle3Arch(draft_vocab_size=draft_vocab, fused_size=3 * hidden, **shape))
    _fill(net, state, EAGLE3_NAMES, path)
    ids = draft_vocabulary(state, draft_vocab, vocab, path)
    net.subset.copy_(ids)
    return Published(layout, net.eval(), ids, layers, identity)


def eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """The target decoder layers whose inputs EAGLE-3 reads, in order: 2, L // 2 and L − 3 (EAGLE's
    ``modeling_llama_kv.py`` keeps the hidden state entering those layers; as HF ``hidden_states``
    indices: the outputs of layers 1, L // 2 − 1 and L − 4)."""
    layers = (2, num_layers // 2, num_layers - 3)
    if not layers[0] < layers[1] < layers[2]:
        raise InputError(f"EAGLE-3 reads the inputs of target layers 2, L//2 and L-3, which need a target of at "
                         f"least 7 decoder layers; this one has {num_layers}")
    return layers


def draft_vocabulary(state: dict[str, torch.Tensor], draft_vocab: int, vocab: int, path: Path) -> torch.Tensor:
    """[draft vocab] target id of each row of EAGLE-3's head: i + d2t[i] (every id when the vocabularies
    are equal); checked to be distinct ids of the target and to agree with ``t2d`` when present."""
    if draft_vocab == vocab and "d2t" not in state:
        return torch.arange(vocab)
    d2t = state.get("d2t")
    if d2t is None:
        raise InputError(f"'{path}' has no tensor 'd2t' (the draft→target token map of its {draft_vocab}-token "
                         f"vocabulary): the file is incomplete; {FIX}")
    if tuple(d2t.shape) != (draft_vocab,):
        raise InputError(f"'{path}': d2t has shape {tuple(d2t.shape)}, but draft_vocab_size is {draft_vocab}")
    ids = torch.arange(draft_vocab) + d2t.long()
    if bool((ids < 0).any()) or bool((ids >= vocab).any()) or len(set(ids.tolist())) != draft_vocab:
        raise InputError(f"'{path}': d2t maps the draft vocabulary outside the target's {vocab} tokens or onto "
                         "one token twice: the checkpoint belongs to another target")
    t2d = state.get("t2d")
    if t2d is not None:
        if tuple(t2d.shape) != (vocab,):
            raise InputError(f"'{path}': t2d has {tuple(t2d.shape)} entries, but the target's vocabulary has {vocab}")
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[ids] = True
        if not torch.equal(t2d.bool(), mask):
            raise InputError(f"'{path}': t2d and d2t disagree on the draft vocabulary: {FIX}")
    return ids
