"""``pacer export`` of a ``pard`` draft: a PARD checkpoint vLLM serves (``"method": "draft_model"``
with ``"parallel_drafting": true``; ``vllm/v1/spec_decode/llm_base_proposer.py`` reads ``pard_token``).

The draft is written whole (the tensors it shares with its target copied in) as a Llama causal LM:
vLLM feeds the mask rows the input embedding of the token its ``config.json`` names as
``pard_token``, so the draft's learned mask embedding is written into that row of the input
embeddings, and the output layer is written untied (the target's rows, as before). The token is the
highest id outside the draft's vocabulary subset (one the draft never proposes); a draft over the
whole vocabulary gives up its last token's input embedding. vLLM has no draft vocabulary for draft
models, so the export's output layer covers every token, as ours does when it runs the export
(``pard.json`` beside it gives our ``pard`` drafter the trained block; vLLM reads no other JSON).
The draft's tokenizer files (the target's) are written beside it, as a checkpoint carries them.
``rope_theta`` is written at the top level too (transformers 5 keeps it in ``rope_parameters`` only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from pacer_core.errors import InputError
from pacer_train.export import Exported

from .export import unproposed_token
from .pard_files import FAMILY, PARD_CONFIG, load_pard_files

FIX = "make the draft again with `pacer distill student.kind=pard`"
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")  # the target's, as the draft's


def export_pard(
    draft: Path,
    dtype: torch.dtype = torch.float16,
    speculators: Optional[dict] = None,
    target: Any = None,
    target_path: Optional[str] = None,
) -> Exported:
    """The files of a PARD checkpoint for the pard draft folder ``draft`` (``dtype``, ``target`` and
    ``target_path`` are the export command's; a pard draft needs no target). Bad input is one
    ``InputError``."""
    from pacer_core.hf import SUBSET_FILE, load_safetensors, materialize, weights_digest
    from pacer_core.jsonfile import read_json

    if speculators is not None:
        raise InputError(
            f"'{draft}' is a pard draft, which vLLM serves as a draft model with parallel drafting, not in "
            "the speculators format: leave --speculators out"
        )
    complete = materialize(str(draft))  # the draft with the tensors it shares with its target copied in
    tensors = dict(load_safetensors(complete / "model.safetensors", FIX))
    config = read_json(complete / "config.json", "draft config", FIX)
    embed = tensors.get("model.embed_tokens.weight")
    if not isinstance(config, dict) or embed is None or embed.dim() != 2:
        raise InputError(f"'{draft}' holds no causal LM with input embeddings (model.embed_tokens.weight): {FIX}")
    mask, block, _ = load_pard_files(draft, embed.float())
    vocab = embed.shape[0]
    subset_file = draft / SUBSET_FILE
    subset = read_json(subset_file, "vocabulary subset", FIX, expect=list) if subset_file.is_file() else []
    pard_token = unproposed_token(vocab, subset)
    head = tensors.get("lm_head.weight", embed)
    embed = embed.clone()
    embed[pard_token] = mask.to(embed.dtype)
    tensors.update({"model.embed_tokens.weight": embed, "lm_head.weight": head.clone()})
    config = {**config, "tie_word_embeddings": False, "pard_token": pard_token, **_top_level_theta(config)}
    config.pop("_model_name_or_path", None)
    return Exported(
        layout="pard",
        tensors=tensors,
        config=config,
        files={
            PARD_CONFIG: {"family": FAMILY, "block": block},
            **{
                name: read_json(complete / name, "tokenizer file", FIX)
                for name in TOKENIZER
                if (complete / name).is_file()
            },
        },
        identity=f"pard:{weights_digest(Path(complete))}",
    )


def _top_level_theta(config: dict) -> dict:
    """``rope_theta`` at the top level when the draft's config (written by transformers 5) holds θ only in
    ``rope_parameters``: transformers 4's LlamaConfig, and engines' Llama models that read
    ``config.rope_theta`` (SGLang's ``llama.py`` with a default of 10000), would otherwise rotate with
    another base than the draft was trained with; transformers 5 reads the same θ from either. A rope
    scaling stays in ``rope_parameters`` only."""
    params = config.get("rope_parameters")
    if "rope_theta" in config or not isinstance(params, dict) or "rope_theta" not in params:
        return {}
    return {"rope_theta": params["rope_theta"]}
