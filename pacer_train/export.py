"""What ``pacer export`` shares with the plugins whose drafts it writes (docs/eagle-checkpoints.md,
docs/block-checkpoints.md).

The command (plugins/eagle/export.py) writes the EAGLE layouts itself; a student kind that
``pacer distill`` learned from a plugin (``pacer_train.students.StudentKind``) may give an ``export``
function for its own drafts, which the command calls with the draft folder and its options and
whose ``Exported`` files it writes (one writer: an interrupted export leaves no half-written
checkpoint). ``speculators_section`` is the part of vLLM's speculators-format ``config.json`` every
algorithm shares (``vllm/transformers_utils/configs/speculators/base.py``): the model type, one greedy
proposal method of ``speculative_tokens`` tokens and the verifier.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import attrs
import torch

from pacer_train.students import StudentKind, student_kinds


@attrs.frozen
class Exported:
    """A draft in a published layout, ready to be written: ``model.safetensors`` of ``tensors``,
    ``config.json`` of ``config``, and ``files`` (name → a tensor or dict saved with ``torch.save``; a
    dict under a name ending ``.json`` is written as JSON)."""

    layout: str  # e.g. "eagle3", "dflash"
    tensors: dict[str, torch.Tensor]
    config: dict[str, Any]
    files: dict[str, Any] = attrs.field(factory=dict)
    identity: str = ""  # names the draft's weights (its drafter's DraftInfo.identity)


def speculators_section(algorithm: str, verifier: str, speculative_tokens: int) -> dict[str, Any]:
    """The keys of vLLM's speculators format common to every algorithm (``eagle3``, ``dflash``):
    ``speculators_model_type`` and ``speculators_config`` (one greedy proposal method, the verifier as
    the serving machine names it)."""
    return {
        "speculators_model_type": algorithm,
        "speculators_config": {
            "algorithm": algorithm,
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": []},
        },
    }


def exporting_kind(draft: Path) -> Optional[StudentKind]:
    """The student kind a plugin adds whose drafts the folder ``draft`` is one of (the ``family`` of the
    kind's ``family_file`` there is the kind's name), when that kind exports its drafts; else None."""
    for kind in student_kinds().values():
        marker = draft / kind.family_file
        if kind.export is None or not marker.is_file():
            continue
        try:
            family = json.loads(marker.read_text()).get("family")
        except (OSError, ValueError, AttributeError):
            continue  # the kind's own loader refuses a damaged folder in its own words
        if family == kind.name:
            return kind
    return None
