"""The folder a trained draft lives in, as ``pacer distill`` writes it for every student kind
(``eagle``, ``dflash``): ``draft.safetensors`` (the network's tensors, floating ones in float16),
``config.json`` (the draft's ``family`` and architecture) and ``manifest.json`` (how it was made:
its target's digest, the command, held-out agreement). One writer and one identity for them all;
each plugin reads its own architecture from ``config.json``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import nn

WEIGHTS = "draft.safetensors"
CONFIG = "config.json"
MANIFEST = "manifest.json"


def save_draft_folder(net: nn.Module, folder: Path, config: dict, manifest: dict) -> None:
    """Write ``net`` into ``folder``: its state (floating tensors as float16, the others, such as a
    head's ``subset`` of token ids, as they are), ``config`` and ``manifest``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().to("cpu", torch.float16 if v.is_floating_point() else v.dtype).contiguous()
        for k, v in net.state_dict().items()
    }
    save_file(state, str(folder / WEIGHTS))
    (folder / CONFIG).write_text(json.dumps(config, indent=2))
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))


def draft_identity(family: str, folder: Path, manifest: dict) -> str:
    """Names a draft folder for components trained on its drafts (PACER's M_B) and for the runs that
    read it: its family, the digest of the target it was distilled from (``manifest``'s) and a hash
    of its weights file."""
    weights = hashlib.sha256((folder / WEIGHTS).read_bytes()).hexdigest()[:16]
    return f"{family}:{manifest.get('target_digest')}:{weights}"
