"""What makes a token draft folder a ``pard`` draft: its learned mask embedding and the block it was
trained to fill, beside the HF draft's own files (``pard.safetensors``, ``pard.json``).

A PARD draft (arXiv 2504.18583) is an ordinary small causal LM sharing the target's tokenizer (the
``draft_model`` drafter can run it too) fine-tuned so that one forward over ``[context, m, …, m]``
predicts the next ``block`` tokens: the last real row as a language model does, each mask row ``m``
the token one further. The mask token is not in the tokenizer's vocabulary (the draft shares the
target's embeddings, and the tokenizer must stay the target's): its embedding is stored here and fed
as the input of the mask rows (``pacer_core.hf.HFModel.forward(mask_embedding=)``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from pacer_core.errors import InputError
from pacer_core.jsonfile import read_json

PARD_CONFIG = "pard.json"
PARD_WEIGHTS = "pard.safetensors"
FAMILY = "pard"
MAX_BLOCK = 32
FIX = "make one with `pacer distill student.kind=pard`"


def save_pard_files(folder: Path, mask_embedding: torch.Tensor, block: int) -> None:
    """Write the mask embedding ([hidden], fp16) and the trained block into a token draft folder."""
    from safetensors.torch import save_file

    save_file(
        {"mask_embedding": mask_embedding.detach().to("cpu", torch.float16).contiguous()}, str(folder / PARD_WEIGHTS)
    )
    (folder / PARD_CONFIG).write_text(json.dumps({"family": FAMILY, "block": int(block)}, indent=2))


def load_pard_files(folder: Path, embeddings: torch.Tensor) -> tuple[torch.Tensor, Optional[int], bool]:
    """(mask embedding [hidden] float32, trained block or None, whether ``pacer distill`` made the draft)
    of a pard draft folder, ``embeddings`` [vocab, hidden] being its model's input embeddings.

    A draft ``pacer distill`` wrote stores its mask embedding in ``pard.safetensors`` and its block in
    ``pard.json``. A published PARD checkpoint (AMD's, or ``pacer export`` of a pard draft, which vLLM
    serves) names a ``pard_token`` in its ``config.json`` instead, whose embedding row feeds the mask
    rows; its block is the drafter's ``block`` option (or ``pard.json``'s, beside an export). Anything
    else, or a damaged or misfitting file, is one ``InputError`` naming the file."""
    from pacer_core.hf import load_safetensors

    hidden_size = embeddings.shape[1]
    block = _block(folder) if (folder / PARD_CONFIG).is_file() else None
    if (folder / PARD_WEIGHTS).is_file():
        if block is None:
            raise InputError(f"draft '{folder}' has {PARD_WEIGHTS} but no {PARD_CONFIG}: {FIX}")
        mask = load_safetensors(folder / PARD_WEIGHTS, FIX).get("mask_embedding")
        if mask is None or tuple(mask.shape) != (hidden_size,) or not bool(torch.isfinite(mask.float()).all()):
            raise InputError(
                f"'{folder / PARD_WEIGHTS}' holds no finite mask_embedding of the draft's hidden size "
                f"{hidden_size}: {FIX}"
            )
        return mask.float(), block, True
    token = _pard_token(folder)
    if token is None:
        raise InputError(
            f"draft '{folder}' is not a pard draft (no {PARD_CONFIG} and {PARD_WEIGHTS}, no pard_token in its "
            f"config.json): {FIX}, or run a plain token draft with the draft_model drafter"
        )
    if not 0 <= token < embeddings.shape[0]:
        raise InputError(
            f"'{folder / 'config.json'}' names pard_token {token}, outside the draft's vocabulary of "
            f"{embeddings.shape[0]}: give a PARD checkpoint whose mask token is in its vocabulary"
        )
    return embeddings[token].detach().float().clone(), block, (folder / PARD_CONFIG).is_file()


def _block(folder: Path) -> int:
    config = read_json(folder / PARD_CONFIG, "pard config", FIX)
    block = config.get("block") if isinstance(config, dict) else None
    if (
        not isinstance(config, dict)
        or config.get("family") != FAMILY
        or isinstance(block, bool)
        or not isinstance(block, int)
        or not 2 <= block <= MAX_BLOCK
    ):
        raise InputError(
            f"'{folder / PARD_CONFIG}' is not a pard config (family: {FAMILY}, block: a whole number "
            f"in 2..{MAX_BLOCK}): {FIX}"
        )
    return block


def _pard_token(folder: Path) -> Optional[int]:
    """The ``pard_token`` a published PARD checkpoint's ``config.json`` names, or None."""
    if not (folder / "config.json").is_file():
        return None
    config = read_json(folder / "config.json", "draft config", "give a PARD checkpoint's folder")
    token = config.get("pard_token") if isinstance(config, dict) else None
    if token is None:
        return None
    if isinstance(token, bool) or not isinstance(token, int):
        raise InputError(f"'{folder / 'config.json'}' names pard_token {token!r:.30}, not a token id")
    return token
