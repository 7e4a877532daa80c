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


def load_pard_files(folder: Path, hidden_size: int) -> tuple[torch.Tensor, int]:
    """(mask embedding [hidden_size] float32, trained block) of a pard draft folder; a folder without
    them, or with a damaged or misfitting one, is one ``InputError`` naming the file."""
    from pacer_core.hf import load_safetensors

    if not (folder / PARD_CONFIG).is_file() or not (folder / PARD_WEIGHTS).is_file():
        raise InputError(
            f"draft '{folder}' is not a pard draft (no {PARD_CONFIG} and {PARD_WEIGHTS}): {FIX}, or "
            "run a plain token draft with the draft_model drafter"
        )
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
    tensors = load_safetensors(folder / PARD_WEIGHTS, FIX)
    mask = tensors.get("mask_embedding")
    if mask is None or tuple(mask.shape) != (hidden_size,) or not bool(torch.isfinite(mask.float()).all()):
        raise InputError(
            f"'{folder / PARD_WEIGHTS}' holds no finite mask_embedding of the draft's hidden size {hidden_size}: {FIX}"
        )
    return mask.float(), block
