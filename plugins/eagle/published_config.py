"""The ``config.json`` of a published EAGLE checkpoint, read and checked value by value.

Every value the draft network is built from is checked for its type and range before anything is
built, so a damaged or hand-edited config is one ``InputError`` naming the key (``num_attention_heads:
0``, ``hidden_size: "abc"``, ``rope_theta: "fast"``), never a bare exception from deep inside. Keys of
variants this loader does not implement are refused by name rather than ignored, so a draft never
silently computes something other than what its publisher's code computes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import attrs

from pacer_core import InputError
from pacer_core.hf.checkpoints import ConfigReader
from pacer_core.jsonfile import parse_json, read_bytes

from .rotary import Rotary

CONFIG = "config.json"
FIX = "download the checkpoint again"


@attrs.frozen
class PublishedConfig:
    """The values of an EAGLE checkpoint's config.json that shape its network."""

    hidden_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # config head_dim, else hidden_size / num_attention_heads
    intermediate_size: int
    rms_eps: float
    rope_theta: float  # 10000 when absent, as in EAGLE's code
    rope_scaling: Optional[dict]  # None: plain rotary embeddings (checked by Rotary.parse)
    max_position_embeddings: int
    num_layers: int
    fc_bias: bool  # EAGLE-1/2: config `bias` (default true in EAGLE's code)
    qkv_bias: bool  # EAGLE-1/2: config `qkv_bias` (cnets1.py), q/k/v projections with biases
    draft_vocab_size: int  # EAGLE-3: rows of its own head (the vocabulary size when absent)
    target_hidden_size: Optional[int]
    token_map: Optional[str]  # EAGLE-1/2 exported by `pacer export`: file of the draft's vocabulary (target ids)

    def arch_fields(self) -> dict[str, Any]:
        """The keyword arguments ``ArchConfig`` and ``Eagle3Arch`` share."""
        return dict(
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            rope_theta=self.rope_theta,
            rms_eps=self.rms_eps,
            qkv_bias=self.qkv_bias,
            rope_scaling=self.rope_scaling,
            max_position_embeddings=self.max_position_embeddings,
        )


def read_config(folder: Path) -> dict[str, Any]:
    """The JSON object of ``folder/config.json``, read as every user-named file is (a regular file,
    bounded, nested at most ``MAX_DEPTH`` deep); anything else is one ``InputError``."""
    path = folder / CONFIG
    config = parse_json(read_bytes(path, "checkpoint config", FIX), f"checkpoint config '{path}'", FIX)
    if not isinstance(config, dict):
        raise InputError(f"'{folder / CONFIG}' is not a JSON object: {FIX}")
    return config


def check_config(config: dict, folder: Path, layout: str) -> PublishedConfig:
    """``config`` (read from ``folder``) checked for a checkpoint of ``layout`` ("eagle1" or "eagle3")."""
    r = ConfigReader(config, folder / CONFIG, "an EAGLE", "the SafeAILab/EAGLE layout", FIX)
    hidden, heads, kv_heads, head_dim = r.attention()
    vocab = r.whole("vocab_size")
    intermediate = r.whole("intermediate_size")
    rms_eps = r.positive("rms_norm_eps", 1e-6)
    max_positions = r.whole("max_position_embeddings", 2048)
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise r.bad(f"hidden_act {act!r} is not supported (EAGLE drafts use 'silu')")
    rope_theta, scaling = r.rope(10000.0)  # EAGLE's default θ when absent
    Rotary.parse(rope_theta, scaling, max_positions, r.bad)  # checked here, built with the network
    r.refuse_true("norm_before_residual", "a variant of other trainers")
    r.refuse_true("attention_bias", "an o_proj bias, which EAGLE's code does not have")
    r.refuse_true("mlp_bias", "MLP biases, which EAGLE's code does not have")
    factor = config.get("partial_rotary_factor")
    if factor not in (None, 1, 1.0):
        raise r.bad(f"partial_rotary_factor {factor!r} is not supported (only 1: every dimension rotated)")
    layers = r.whole("num_hidden_layers", 1)
    if layout == "eagle3":
        if layers != 1:
            raise r.bad(f"num_hidden_layers is {layers}; only one-layer EAGLE-3 drafts are supported")
        r.refuse_true("qkv_bias", "EAGLE-3's code (eagle/model/cnets.py) has no q/k/v biases")
        _refuse_layer_ids(config, r)
    draft_vocab = r.whole("draft_vocab_size", vocab)
    if draft_vocab > vocab:
        raise r.bad(f"draft_vocab_size ({draft_vocab}) exceeds vocab_size ({vocab})")
    target_hidden = config.get("target_hidden_size")
    token_map = config.get("speculative_token_map")
    if token_map is not None and (
        not isinstance(token_map, str) or Path(token_map).name != token_map or token_map in ("", ".", "..")
    ):
        raise r.bad(f"speculative_token_map must name a file beside config.json, not {token_map!r}")
    return PublishedConfig(
        hidden_size=hidden,
        vocab_size=vocab,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        rms_eps=rms_eps,
        rope_theta=rope_theta,
        rope_scaling=scaling,
        max_position_embeddings=max_positions,
        num_layers=layers,
        fc_bias=r.flag("bias", True),
        qkv_bias=r.flag("qkv_bias", False),
        draft_vocab_size=draft_vocab,
        target_hidden_size=None if target_hidden is None else r.whole("target_hidden_size"),
        token_map=token_map,
    )


def _refuse_layer_ids(config: dict, r: ConfigReader) -> None:
    """Target layers named by the config (vLLM's and SGLang's ``eagle_aux_hidden_state_layer_ids``,
    top level or in ``eagle_config``) are refused: the engines number them differently (vLLM: the
    input of layer j; SGLang: the output of layer j), and this loader reads EAGLE's layers."""
    eagle_config = config.get("eagle_config")
    if eagle_config is not None and not isinstance(eagle_config, dict):
        raise r.bad(f"eagle_config must be an object, not {eagle_config!r}")
    eagle_config = eagle_config or {}
    if eagle_config.get("use_aux_hidden_state") is False:
        raise r.bad(
            "eagle_config.use_aux_hidden_state: false (a draft without fc over three target layers) is not supported"
        )
    for where, ids in (
        ("eagle_aux_hidden_state_layer_ids", config.get("eagle_aux_hidden_state_layer_ids")),
        ("eagle_config.eagle_aux_hidden_state_layer_ids", eagle_config.get("eagle_aux_hidden_state_layer_ids")),
    ):
        if ids is not None:
            raise InputError(
                f"'{r.path}': {where} {ids!r} is not supported: engines number these layers "
                "differently, and this loader reads the inputs of target layers 2, L // 2 and L − 3 as "
                "EAGLE's code does; remove the key if the draft was trained on those"
            )
