"""The shipped drafts as the serving check (``pacer_bench.servecheck``) exports them: found in the
plugin folders, written with ``pacer export`` as a user runs it, and the ``speculative_config.method``
each export asks of vLLM."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Optional

import attrs


def shipped_drafts(plugins: Path) -> list[Path]:
    """The drafts this checkout ships that `pacer export` reads: plugin folders holding a manifest
    and ``draft.safetensors`` (feature-level, EAGLE-3 and dflash drafts) or of a student kind that
    exports its drafts (a pard draft); a plain token-level draft is a causal LM of its own, served as it is."""
    from pacer_train.export import exporting_kind

    return sorted(
        p.parent
        for p in plugins.glob("*/*/manifest.json")
        if (p.parent / "draft.safetensors").is_file() or exporting_kind(p.parent) is not None
    )


VLLM_METHODS = {"EagleLlamaForCausalLM": "eagle", "LlamaForCausalLMEagle3": "eagle3"}


def vllm_method(config: Mapping[str, Any]) -> str:
    """The ``speculative_config.method`` an export's config.json asks of vLLM (a PARD checkpoint, naming
    its ``pard_token``: ``draft_model``, with parallel drafting)."""
    if config.get("pard_token") is not None:
        return "draft_model"
    if config.get("speculators_model_type"):
        return str(config["speculators_model_type"])
    for name in config.get("architectures") or ():
        if name in VLLM_METHODS:
            return VLLM_METHODS[name]
    raise ValueError(f"no vLLM method for architectures {config.get('architectures')}")


def as_vllm_reads(export: Path, out: Path) -> Path:
    """A copy of an EAGLE export as vLLM's EAGLE reader sees it: without ``speculative_token_map``,
    which vLLM does not read (it drafts over the whole vocabulary)."""
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((export / "config.json").read_text())
    config.pop("speculative_token_map", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copyfile(export / "model.safetensors", out / "model.safetensors")
    return out


def export_with_pacer(draft: Path, out: Path, target_folder: Path) -> str:
    """``pacer export DRAFT OUT`` as a user runs it (``--engine vllm``; a dflash draft in speculators'
    format, verified by the target's folder); its refusal line, or "" once written."""
    command = [sys.executable, "-m", "pacer_core", "export", str(draft), str(out)]
    config = draft / "config.json"
    family = json.loads(config.read_text()).get("family") if config.is_file() else None
    if family == "dflash":
        command += ["--speculators", "--verifier", str(target_folder)]
    else:
        command += ["--engine", "vllm"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode == 0:
        return ""
    said = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
    return (said[-1] if said else f"exit {done.returncode}").removeprefix("pacer: error: ")


COMPARED = ("eagle", "eagle3", "dflash", "draft_model")  # the vLLM methods the check runs beside ours


@attrs.frozen
class Served:
    """An export as the check serves it: the folder vLLM reads, our stack running the same network from
    the same folder, the draft length both use and whether vLLM drafts in parallel (a PARD draft)."""

    folder: Path
    stack: list[str]
    k: int
    parallel_drafting: bool = False


def served_stack(method: str, config: Mapping[str, Any], export: Path, work: Path, k: int) -> Optional[Served]:
    """How the check serves an export (``config``: its config.json) asking vLLM for ``method``, beside
    ours; None for a method it does not compare.

    Ours runs without the drafter's context priors (they adjust logits outside the network) and, for
    EAGLE-1, over the whole vocabulary as vLLM's reader does (``as_vllm_reads``). A block draft (dflash,
    or a PARD draft: vLLM's ``draft_model`` with parallel drafting) drafts one block a forward in vLLM:
    its length is the block when ``k`` is longer, so that ours drafts no further block either."""
    stop = "strategy.stop=[{{name: fixed, gamma: {}}}]"
    if method in ("eagle", "eagle3"):
        served = as_vllm_reads(export, work / f"{export.name}-as-vllm-reads") if method == "eagle" else export
        drafter = f"{{name: eagle, path: '{served}', context_vocab: false, lookup_bias: [], corpus_bias: 0.0}}"
        return Served(served, [f"strategy.drafter={drafter}", stop.format(k)], k)
    if method == "dflash":
        k = min(k, int(config["block_size"]) - 1)
        drafter = f"{{name: dflash, path: '{export}', lookup_bias: [], corpus_bias: 0.0, context_vocab: false}}"
        return Served(export, [f"strategy.drafter={drafter}", stop.format(k)], k)
    if method == "draft_model" and "pard_token" in config:
        k = min(k, int(json.loads((export / "pard.json").read_text())["block"]))
        stack = [
            f"draft.path='{export}'",
            "draft.dtype=float32",
            "strategy.drafter={name: pard, lookup_bias: [], corpus_bias: 0.0}",
        ]
        return Served(export, [*stack, stop.format(k)], k, parallel_drafting=True)
    return None
