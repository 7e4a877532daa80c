"""What the trainers build on the target: token-level students made of target layers and saved
without the tensors they share with it (``pacer_core.hf.materialize`` completes them on load), and
the target's hidden states for a batch (training data for feature-level drafts)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import attrs
import torch

from pacer_core.hf import DTYPES, SHARED_FILE, SUBSET_FILE, HFModel, model_from_config


def student_from_target(target: HFModel, layers: Sequence[int]) -> Any:
    """A small causal LM of the target's architecture: ``layers`` (indices into the target's decoder
    layers) copied in order, with the target's embeddings, final norm and output layer (float32,
    trainable; the caller freezes what it shares)."""
    config = copy.deepcopy(target.model.config)
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in layers]
    student = model_from_config(config, dtype=torch.float32)
    source = target.model.base_model
    with torch.no_grad():
        for mine, index in zip(student.base_model.layers, layers):
            mine.load_state_dict({k: v.float() for k, v in source.layers[index].state_dict().items()})
        student.base_model.norm.load_state_dict({k: v.float() for k, v in source.norm.state_dict().items()})
        student.get_input_embeddings().weight.copy_(target.model.get_input_embeddings().weight.float())
        if not getattr(config, "tie_word_embeddings", False):
            student.get_output_embeddings().weight.copy_(target.model.get_output_embeddings().weight.float())
    return student


def save_student(
    student: Any,
    folder: Path,
    *,
    target_path: Optional[str],
    target_digest: str,
    dtype: str = "bfloat16",
    vocab_subset: Optional[Sequence[int]] = None,
) -> int:
    """Write ``student`` as an HF folder without the tensors it shares with its target (the input
    embeddings, and the tied output layer): ``pacer-shared.json`` says where to get them, and
    ``materialize`` completes the folder on first load. Returns the bytes written for the weights."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    embed_name = "model.embed_tokens.weight"
    state = {
        k: v.detach().to(DTYPES[dtype]).contiguous()
        for k, v in student.state_dict().items()
        if k != embed_name and not (k == "lm_head.weight" and student.config.tie_word_embeddings)
    }
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    config = copy.deepcopy(student.config)
    config.dtype = dtype
    config.save_pretrained(folder)
    if student.generation_config is not None:
        student.generation_config.save_pretrained(folder)
    (folder / SHARED_FILE).write_text(
        json.dumps(
            {"target_path": target_path, "target_digest": target_digest, "tensors": {embed_name: embed_name}}, indent=2
        )
    )
    if vocab_subset is not None:
        (folder / SUBSET_FILE).write_text(json.dumps(sorted(int(t) for t in vocab_subset)))
    return (folder / "model.safetensors").stat().st_size


def last_hidden_states(target: HFModel, input_ids: torch.Tensor) -> torch.Tensor:
    """The target's last-layer hidden states (after the final norm) for a batch [B, L] → [B, L, d],
    without touching its KV cache (training data for feature-level drafts)."""
    return target_states(target, input_ids, [None])[0]


@torch.inference_mode()
def target_states(
    target: HFModel, input_ids: torch.Tensor, groups: Sequence[Optional[Sequence[int]]]
) -> list[torch.Tensor]:
    """Several kinds of target states from one forward over a batch [B, L]: per group, None = the
    last-layer states after the final norm ([B, L, d], ``last_hidden_states``), else the inputs of
    those decoder layers concatenated ([B, L, len × d], ``layer_inputs``)."""
    fused = any(group is not None for group in groups)
    out = target.model.base_model(input_ids=input_ids.to(target.device), use_cache=False, output_hidden_states=fused)
    return [
        out.last_hidden_state if group is None else torch.cat([out.hidden_states[i] for i in group], dim=-1)
        for group in groups
    ]


def layer_inputs(target: HFModel, input_ids: torch.Tensor, layers: Sequence[int]) -> torch.Tensor:
    """The inputs of the target's decoder ``layers`` for a batch [B, L], concatenated in that order →
    [B, L, len(layers) × d] (index i: transformers' ``hidden_states[i]``, as ``HFModel.forward(hidden=
    layers)`` returns them; what an EAGLE-3-style draft fuses), without touching its KV cache."""
    return target_states(target, input_ids, [layers])[0]


STUDENTS_GROUP = "pacer_sd.students"  # entry points naming a plugin's StudentKind


@attrs.frozen
class StudentKind:
    """A student kind a plugin adds to ``pacer distill`` (``student.kind=<name>``) through the
    ``pacer_sd.students`` entry-point group, so the command trains it without importing the plugin.

    ``train(cfg, out, tokens, features, target, subset, fused=, layers=, deadline=)`` (``layers``: the
    target layers whose inputs ``fused`` holds) returns (net, held-out
    metrics, training record) as the built-in students do; ``describe(cfg, layers, subset)`` the
    manifest's family line; ``save(net, folder, manifest)`` writes the draft folder; ``checkpoint``
    names its checkpoint in the run folder; ``default_layers(target)`` the target layers whose inputs
    it reads when ``student.fused_layers`` is unset (distill extracts them once); ``fuses``: whether it
    reads target layers' inputs at all (False: ``fused`` is None, ``student.fused_layers`` is refused);
    ``takes_init``: whether ``init=`` names the draft it starts from (``train`` reads ``cfg.init``);
    ``check(cfg)``: refuses the kind's options (a ``ValueError`` in one line) before any model loads;
    ``family_file``: the JSON file of its draft folders whose ``family`` names the kind (``pacer export``
    finds the kind of a folder by it)."""

    name: str
    train: Callable[..., Any]
    describe: Callable[..., str]
    save: Callable[..., None]
    checkpoint: str
    default_layers: Callable[[Any], Sequence[int]]
    # export(draft, dtype=, speculators=, target=) -> pacer_train.export.Exported: its drafts in a published
    # layout, for `pacer export` (None: the kind's drafts are not exported)
    export: Optional[Callable[..., Any]] = None
    fuses: bool = True
    takes_init: bool = False
    check: Optional[Callable[[Any], None]] = None
    family_file: str = "config.json"  # the JSON file of its draft folders whose "family" is the kind's name


def student_kinds() -> dict[str, StudentKind]:
    """The student kinds installed plugins add (``pacer_sd.students`` entry points), by name."""
    from importlib.metadata import entry_points

    kinds = {}
    for point in entry_points(group=STUDENTS_GROUP):
        kind = point.load()
        if isinstance(kind, StudentKind):
            kinds[kind.name] = kind
    return kinds
