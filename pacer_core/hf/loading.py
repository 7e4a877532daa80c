"""Loading a config's model sections: (adapter, tokenizer, weights digest)."""

from __future__ import annotations

import json
from typing import Any, Optional

import torch

from ..errors import InputError
from ..kernels import should_pack
from .adapter import DTYPES, HFModel, HFTokenizer
from .artifacts import SUBSET_FILE, materialize, weights_digest


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when a GPU is visible, else ``cpu``; any other name is returned as is."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_model(path: Optional[str], dtype: str, device: str, device_map: Optional[str], name: str,
               pack_weights: Optional[bool] = None):
    """(model adapter, tokenizer, weights digest) for a config's ``target`` or ``draft`` section.

    ``device`` may be ``auto`` (CUDA when available); ``pack_weights`` (None: wherever possible) see
    ``pacer_core.kernels.should_pack``."""
    if dtype not in DTYPES:  # the options first: the files may take long to read or convert
        raise InputError(f"unknown dtype '{dtype}' for {name}: use one of {', '.join(DTYPES)}")
    if device_map and pack_weights:
        raise InputError(f"{name}: pack_weights=true needs the whole model on the CPU, not device_map; "
                         "set pack_weights to null or false")
    folder = materialize(path)
    device = resolve_device(device)
    model = HFModel.load(folder, dtype=dtype, device=device, device_map=device_map, name=name)
    if (folder / SUBSET_FILE).exists():
        model.use_vocab_subset(json.loads((folder / SUBSET_FILE).read_text()))
    if not device_map and should_pack(pack_weights, model.dtype, model.device, name):
        model.pack_weights()
    model.digest = weights_digest(folder)
    return model, HFTokenizer.load(folder), model.digest


def load_section(section: Any, name: str):
    """``load_model`` for a config's model section (``pacer_core.config.ModelConfig``)."""
    return load_model(section.path, section.dtype, section.device, section.device_map, name, section.pack_weights)


def load_draft(section: Any, target_tokenizer) -> HFModel:
    """The draft model of a ``draft`` section, refused unless it shares the target's tokenizer."""
    draft, draft_tokenizer, _ = load_section(section, "draft")
    if draft_tokenizer.vocab() != target_tokenizer.vocab():
        raise InputError(f"draft '{section.path}' and target use different tokenizers: speculative decoding "
                         "needs a draft trained with the target's tokenizer")
    return draft
