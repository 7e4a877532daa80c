"""What ``pacer export`` shares with the plugins whose drafts it writes (docs/eagle-checkpoints.md,
docs/block-checkpoints.md).

The command (plugins/feature_draft/export.py) writes the EAGLE layouts itself; a student kind that
``pacer distill`` learned from a plugin (``pacer_train.students.StudentKind``) may give an ``export``
function for its own drafts, which the command calls with the draft folder and its options and
whose ``Exported`` files it writes (one writer: an interrupted export leaves no half-written
checkpoint). ``speculators_section`` is the part of vLLM's speculators-format ``config.json`` every
algorithm shares (``vllm/transformers_utils/configs/speculators/base.py``): the model type, one greedy
proposal method of ``speculative_tokens`` tokens and the verifier.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch


@attrs.frozen
class Exported:
    """A draft in a published layout, ready to be written: ``model.safetensors`` of ``tensors``,
    ``config.json`` of ``config``, and ``files`` (name → a tensor or dict saved with ``torch.save``)."""

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
