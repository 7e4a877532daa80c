"""``pacer export`` for block drafts: a ``dflash`` draft folder written in speculators' ``dflash`` format,
which vLLM serves (``vllm serve TARGET --speculative-config '{"model": OUT, ...}'``, or the method read
from the config) and this drafter reads back (published.py).

What is written (docs/block-checkpoints.md):

- ``model.safetensors``: the network under the published names (``published.dflash_names``), and
  ``lm_head.weight`` when the draft predicts over a vocabulary other than the target's whole one in
  its order: its own head, or the target's rows of its subset (read from the target, which is loaded
  for that), with ``d2t`` / ``t2d`` when the vocabulary is smaller than the target's;
- ``mask_embedding.pt``: {mask_token_id, embedding}, the mask rows' embedding, which vLLM's
  ``qwen3_dflash.py`` puts in place of the embedding of ``mask_token_id`` (the draft's own id when it
  has one, else the highest target id outside its vocabulary, one a draft never proposes);
- ``config.json``: ``speculators_model_type: dflash``, the Qwen3 ``transformer_layer_config``,
  ``block_size`` (mask rows + 1: the anchor), ``aux_hidden_state_layer_ids`` (the inputs of target
  layers, as ``target_layers``), ``mask_token_id``, ``draft_vocab_size`` and ``speculators_config``.

Only drafts in the published architecture can be written: a draft that joins each block row with
the newest context feature (``inject``, the shipped draft's) or has no per-head q/k norms is refused
in one line naming the part, since vLLM's DFlash layers compute neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional

import torch

from pacer_core.draft_folders import MANIFEST
from pacer_core.errors import InputError
from pacer_core.jsonfile import read_json
from pacer_train.export import Exported, speculators_section

from .model import draft_identity, load_block_draft
from .published import MASK_FILE, dflash_names

MAX_POSITIONS = 32768  # the config's max_position_embeddings (vLLM sizes its rotary table from it)


def unproposed_token(vocab: int, subset: Iterable[int]) -> int:
    """The token a served draft's mask rows are fed the embedding of: the highest target id outside
    the draft's vocabulary ``subset``, one the draft never proposes (the last id when the draft covers
    every token)."""
    outside = set(range(vocab)).difference(subset)
    return max(outside) if outside else vocab - 1


def export_block_draft(
    draft: Path,
    dtype: torch.dtype = torch.float16,
    speculators: Optional[dict] = None,
    target: Any = None,
    target_path: Optional[str] = None,
) -> Exported:
    """The files of speculators' ``dflash`` format for the block draft folder ``draft``
    (``speculators``: {verifier, speculative_tokens (None: the draft's block)}); ``target`` (a
    ``FeatureModel``) gives the head rows of a draft sharing the target's, loaded from ``target_path``
    or else the draft's recipe when None. Bad input is one ``InputError``."""
    if speculators is None:
        raise InputError(
            f"'{draft}' is a dflash block draft, which is written in vLLM's speculators dflash format: "
            "add --speculators --verifier NAME_OR_PATH"
        )
    net = load_block_draft(draft)
    arch = net.arch
    _check_layout(draft, arch)
    tokens = speculators.get("speculative_tokens") or arch.block
    if tokens > arch.block:
        raise InputError(f"--speculative-tokens {tokens} exceeds the {arch.block} mask rows the draft fills a forward")
    manifest = read_json(draft / MANIFEST, "draft manifest", "distill the draft again (`pacer distill`)")
    state = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    tensors = {theirs: state[ours] for ours, theirs in dflash_names(arch).items()}
    subset, vocab = state["subset"].long(), arch.vocab_size
    whole = len(subset) == vocab  # a permutation of the target's vocabulary: written in the target's order
    rows = state.get("lm_head.weight")
    if rows is None and not torch.equal(subset, torch.arange(vocab)):
        rows = _target(target, target_path, manifest, draft).embedding_weights()[1].detach().float().cpu()[subset]
    if rows is not None:
        if whole:
            order = torch.argsort(subset)
            rows, subset = rows[order], subset[order]
        tensors["lm_head.weight"] = rows
        if not whole:
            tensors["d2t"] = subset - torch.arange(len(subset))  # target id = draft id + d2t[draft id]
            t2d = torch.zeros(vocab, dtype=torch.bool)
            t2d[subset] = True
            tensors["t2d"] = t2d
    mask_id = arch.mask_token_id
    if mask_id is None:
        mask_id = unproposed_token(vocab, subset.tolist())
    config = {
        "architectures": ["DFlashSpeculator"],
        "transformer_layer_config": _layer_config(arch),
        "draft_vocab_size": len(subset),
        "block_size": arch.block + 1,
        "aux_hidden_state_layer_ids": list(arch.target_layers),
        "mask_token_id": mask_id,
        "sample_from_anchor": False,
        **speculators_section("dflash", speculators["verifier"], tokens),
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    files = {MASK_FILE: {"mask_token_id": mask_id, "embedding": state["mask_embedding"].to(dtype)}}
    return Exported("dflash", tensors, config, files, identity=draft_identity(draft, manifest))


def _check_layout(draft: Path, arch) -> None:
    """Refuse a draft whose architecture ``arch`` the DFlash layout cannot express."""
    if arch.inject:
        raise InputError(
            f"'{draft}' joins each block row with the newest context feature (inject), which the "
            "DFlash layout (z-lab, speculators, vLLM) does not compute: only drafts in the published "
            "architecture (inject off, q/k norms) can be exported"
        )
    if not arch.qk_norm:
        raise InputError(
            f"'{draft}' has no per-head q/k norms, which every DFlash layer of the layout (vLLM's "
            "qwen3_dflash.py) applies: the attention part cannot be expressed"
        )


def _layer_config(arch) -> dict:
    """The ``transformer_layer_config`` of the draft's architecture ``arch``: a qwen3 layer stack."""
    return dict(
        model_type="qwen3",
        hidden_act="silu",
        hidden_size=arch.hidden_size,
        num_hidden_layers=arch.num_layers,
        vocab_size=arch.vocab_size,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        intermediate_size=arch.intermediate_size,
        rms_norm_eps=arch.rms_eps,
        rope_theta=arch.rope_theta,
        max_position_embeddings=MAX_POSITIONS,
        attention_bias=False,
        tie_word_embeddings=False,
        layer_types=["full_attention"] * arch.num_layers,
    )


def _target(target: Any, path: Optional[str], manifest: dict, draft: Path) -> Any:
    """The target whose output layer the draft shares: ``target``, else the one at ``path``, else the
    one its recipe names (``target.path``; None: the embedded target), checked against the manifest's
    digest."""
    if target is None:
        from pacer_core.hf import load_model

        recipe = (manifest.get("recipe") or {}).get("target") or {}
        path = path if path is not None else recipe.get("path")
        target, _, _ = load_model(path, "float32", "cpu", None, "target", pack_weights=False)
    recorded = manifest.get("target_digest")
    if recorded and target.digest and recorded != target.digest:
        raise InputError(
            f"'{draft}' was distilled from target {recorded}, but the target loaded for its head rows is "
            f"{target.digest}: give the draft's own target (--target PATH)"
        )
    return target
