"""``pacer export``: a draft trained here, written in the published EAGLE layout other engines serve.

The layouts are those SafeAILab/EAGLE's code builds (``eagle/model/cnets1.py`` for EAGLE-1/2,
``eagle/model/cnets.py`` for EAGLE-3) and vLLM's and SGLang's EAGLE loaders read
(``vllm/model_executor/models/llama_eagle.py`` and ``llama_eagle3.py``;
``python/sglang/srt/models/llama_eagle.py`` and ``llama_eagle3.py``):

- a feature-level student (``FeatureDraft``) becomes an EAGLE-1/2 checkpoint: ``fc`` and
  ``layers.{i}.*``. EAGLE's layer 0 has no input norm; a student with one (the shipped draft) is
  written with an identity layer 0 first (all its weights zero but its norm: attention and MLP add
  exactly zero) and its own layer as layer 1, whose ``input_layernorm`` the layout has. Its head is
  the target's restricted to the student's vocabulary: the ids go to ``token_map.pt`` (SGLang's
  ``--speculative-token-map`` format, named by the config's ``speculative_token_map``).
- an EAGLE-3 student (``Eagle3Draft``) becomes an EAGLE-3 checkpoint: ``fc``, ``midlayer.*``,
  ``norm``, ``lm_head`` and the vocabulary maps ``d2t`` (target id − draft id, int64) and ``t2d``
  (bool over the target's vocabulary), as EAGLE-3's code registers them.

Weights keep the dtype the draft folder stores (float16) unless ``--dtype`` says otherwise.
``embed_tokens.weight`` is not written: EAGLE's code, vLLM and SGLang take the target's. What the
layout cannot express is refused in one line naming the part (an EAGLE-3 student fusing other target
layers than 2, L // 2 and L − 3, or not three of them).

What each engine reads (docs/eagle-checkpoints.md#serving-an-export):

- an EAGLE-1 ``fc`` always has a bias in the written file: a student without one gets a zero
  ``fc.bias`` and the config no ``bias`` key, because SGLang's ``llama_eagle.py`` builds ``fc`` with a
  bias whatever the config says and would keep a random one (vLLM and EAGLE's code read the zeros);
- the EAGLE-1 architecture name is the one engine's registry maps (``--engine``: vLLM's
  ``EagleLlamaForCausalLM``, SGLang's ``LlamaForCausalLMEagle``, or ``LlamaForCausalLM`` for
  EAGLE's own code, which builds its network from the config whatever the name);
- an EAGLE-3 config always says ``norm_before_residual: false`` (EAGLE's layer: the residual is the
  un-normed fused state; vLLM's speculators reader takes true when the key is absent), and
  ``--speculators`` adds vLLM's speculators-format keys (``speculators_model_type``,
  ``transformer_layer_config``, ``speculators_config`` with the verifier) so ``vllm serve OUT`` runs it.

The written files get the permissions a plain ``open()`` gives (0644 under the usual umask), and the
config names the draft folder by its name and identity only, never by a path of the exporting machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
from pathlib import Path, PurePath
from typing import Any, Iterator, Optional

import torch

from pacer_core.atomic import share
from pacer_core.commands import Runner, bounded_int, check_out_dir, command
from pacer_core.draft_folders import CONFIG, MANIFEST, WEIGHTS
from pacer_core.errors import InputError
from pacer_core.jsonfile import read_json
from pacer_train.export import exporting_kind, speculators_section

from .drafter import draft_identity
from .model import Eagle3Draft, FeatureDraft, load_draft
from .published import eagle1_names, eagle3_names

TOKEN_MAP = "token_map.pt"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# the architecture names vLLM's and SGLang's registries map to their EAGLE / EAGLE-3 Llama drafts:
# vLLM keeps names starting "Eagle" (EagleLlamaForCausalLM) and SGLang registers LlamaForCausalLMEagle;
# EAGLE's own code (cnets1.py) builds its network from the config whatever the name. EAGLE-3:
# LlamaForCausalLMEagle3 in both engines.
EAGLE1_ARCHITECTURES = {"vllm": "EagleLlamaForCausalLM", "sglang": "LlamaForCausalLMEagle", "eagle": "LlamaForCausalLM"}
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
ENGINES = tuple(EAGLE1_ARCHITECTURES)
MAX_POSITIONS = 1 << 20  # the largest --max-position-embeddings: engines size rotary tables from it
MAX_SPECULATIVE_TOKENS = 64


def export_draft(
    draft: Path,
    out: Path,
    dtype: torch.dtype = torch.float16,
    max_positions: Optional[int] = None,
    engine: str = "vllm",
    speculators: Optional[dict[str, Any]] = None,
    target: Any = None,
    target_path: Optional[str] = None,
) -> dict[str, Any]:
    """Write the draft folder ``draft`` (one ``pacer distill`` made) into ``out`` (absent or empty) in
    the published layout; returns {layout, out, tensors, token_map}. ``engine``: whose EAGLE-1
    architecture name the config gives (``ENGINES``); ``speculators``: an EAGLE-3 draft's config in
    vLLM's speculators format too, ``{"verifier": NAME_OR_PATH, "speculative_tokens": K or None}``; a
    draft of a plugin's student kind (``dflash``) is written by the kind's ``export``, which may read
    ``target`` (a ``FeatureModel``) or the target at ``target_path``. Bad input is one ``InputError``."""
    check_draft(draft)
    if engine not in EAGLE1_ARCHITECTURES:
        raise InputError(f"unknown engine {engine!r}: choose from {', '.join(ENGINES)}")
    if max_positions is not None:
        check_range(max_positions, 1, MAX_POSITIONS, "--max-position-embeddings")
    manifest = read_json(draft / MANIFEST, "draft manifest", "distill the draft again (`pacer distill`)")
    kind = exporting_kind(draft)
    if kind is not None:  # a student kind a plugin adds writes its own drafts' files (pacer_train.export)
        exported = kind.export(draft, dtype=dtype, speculators=speculators, target=target, target_path=target_path)
        config = {
            **exported.config,
            "pacer_export": {
                "draft": draft.resolve().name,
                "draft_identity": exported.identity,
                "target": portable(manifest.get("target")),
                "target_digest": manifest.get("target_digest"),
            },
        }
        tensors = {
            name: (t.to(dtype) if t.is_floating_point() else t).contiguous() for name, t in exported.tensors.items()
        }
        _write(out, tensors, config, exported.files)
        return {"layout": exported.layout, "out": str(out), "tensors": len(tensors), "files": sorted(exported.files)}
    net = load_draft(draft)
    if isinstance(net, Eagle3Draft):
        layout, tensors, config, token_map = "eagle3", *_eagle3(net, draft)
        architectures = [EAGLE3_ARCHITECTURE]
    elif isinstance(net, FeatureDraft):
        layout, tensors, config, token_map = "eagle1", *_eagle1(net)
        architectures = [EAGLE1_ARCHITECTURES[engine]]
    else:  # pragma: no cover — load_draft knows no other family
        raise InputError(f"'{draft}' holds a {type(net).__name__}, which has no published EAGLE layout")
    if speculators is not None and layout != "eagle3":
        raise InputError(
            f"'{draft}' is a feature-level (EAGLE-1) draft: --speculators writes vLLM's speculators "
            "format for EAGLE-3 drafts only; export without it (vLLM serves the EAGLE-1 layout with "
            "method eagle)"
        )
    arch = net.arch
    if max_positions is None:
        max_positions = arch.max_position_embeddings if arch.rope_scaling else 32768
    llama = dict(
        model_type="llama",
        hidden_act="silu",
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=max_positions,
        rms_norm_eps=arch.rms_eps,
        rope_theta=arch.rope_theta,
        tie_word_embeddings=False,
    )
    if arch.rope_scaling:
        llama["rope_scaling"] = arch.rope_scaling
    if arch.qkv_bias:
        llama["qkv_bias"] = True
    config = {"architectures": architectures, **llama, **config, "torch_dtype": str(dtype).removeprefix("torch.")}
    if speculators is not None:
        config.update(speculators_config(llama, config, **speculators))
    config["pacer_export"] = {
        "draft": draft.resolve().name,
        "draft_identity": draft_identity(draft),
        "target": portable(manifest.get("target")),
        "target_digest": manifest.get("target_digest"),
    }
    tensors = {name: (t.to(dtype) if t.is_floating_point() else t).contiguous() for name, t in tensors.items()}
    files = {} if token_map is None else {TOKEN_MAP: token_map.clone()}
    _write(out, tensors, config, files)
    return {"layout": layout, "out": str(out), "tensors": len(tensors), "files": sorted(files)}


def _eagle1(net: FeatureDraft) -> tuple[dict, dict, Optional[torch.Tensor]]:
    """EAGLE-1/2 tensors (cnets1.py names), config keys and the token map of a feature student."""
    arch = net.arch
    own = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    shift = 1 if arch.input_norm else 0  # an input norm before the first layer: an identity layer 0 first
    layers = 1 + arch.extra_layers + shift
    names = eagle1_names(layers, arch.qkv_bias, arch.fc_bias)  # ours (as if without the shift) → theirs
    tensors = {}
    for ours, theirs in names.items():
        if ours == "fc.weight" or ours == "fc.bias":
            tensors[theirs] = own[ours]
            continue
        # our layer k: 0 = the module's own weights, k ≥ 1 = extra.{k - 1}; theirs: layers.{k}
        k = int(ours.split(".")[1]) + 1 if ours.startswith("extra.") else 0
        param = ours.split(".", 2)[2] if ours.startswith("extra.") else ours
        source = k - shift  # our layer feeding EAGLE layer k (−1: the identity layer)
        if source < 0:
            tensors[theirs] = (
                torch.ones_like(own[param]) if param.endswith("norm.weight") else torch.zeros_like(own[param])
            )
        elif source == 0:
            tensors[theirs] = own[param]
        else:
            tensors[theirs] = own[f"extra.{source - 1}.{param}"]
    if shift:
        tensors["layers.1.input_layernorm.weight"] = own["input_norm.weight"]
    if not arch.fc_bias:  # a zero bias, and no `bias` key: SGLang builds fc with a bias whatever the config says
        tensors["fc.bias"] = torch.zeros(arch.hidden_size, dtype=own["fc.weight"].dtype)
    config = {"num_hidden_layers": layers, "vocab_size": arch.vocab_size}
    subset = own["subset"].long()
    token_map = None if torch.equal(subset, torch.arange(arch.vocab_size)) else subset
    if token_map is not None:
        config["speculative_token_map"] = TOKEN_MAP
    return tensors, config, token_map


def _eagle3(net: Eagle3Draft, draft: Path) -> tuple[dict, dict, None]:
    """EAGLE-3 tensors (cnets.py names, with d2t and t2d) and config keys of an EAGLE-3 student."""
    arch = net.arch
    layers = list(arch.target_layers)
    if len(layers) != 3 or arch.fused_size != 3 * arch.hidden_size:
        raise InputError(
            f"'{draft}' fuses {len(layers)} target layers {layers}; the EAGLE-3 layout's fc reads "
            "exactly three (2, L // 2 and L − 3): distill with student.fused_layers unset"
        )
    num_layers = layers[2] + 3
    if layers != [2, num_layers // 2, num_layers - 3]:
        raise InputError(
            f"'{draft}' fuses target layers {layers}, but the EAGLE-3 layout (EAGLE's code, vLLM, "
            "SGLang) reads the inputs of layers 2, L // 2 and L − 3 of an L-layer target: the fc "
            "part cannot be expressed; distill with student.fused_layers unset"
        )
    if arch.qkv_bias:
        raise InputError(
            f"'{draft}' has q/k/v biases, which the EAGLE-3 layout (EAGLE's cnets.py, vLLM, SGLang) "
            "does not have: the attention part cannot be expressed"
        )
    if arch.vocab_size <= 0:
        raise InputError(f"'{draft}' does not record its target's vocabulary size, which t2d needs: distill it again")
    own = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    tensors = {theirs: own[ours] for ours, theirs in eagle3_names().items()}
    subset = own["subset"].long()
    tensors["d2t"] = subset - torch.arange(len(subset))  # target id = draft id + d2t[draft id]
    t2d = torch.zeros(arch.vocab_size, dtype=torch.bool)
    t2d[subset] = True
    tensors["t2d"] = t2d
    # EAGLE's layer keeps the fused state un-normed as the residual; vLLM's speculators reader takes true when absent
    config = {
        "num_hidden_layers": 1,
        "vocab_size": arch.vocab_size,
        "draft_vocab_size": arch.draft_vocab_size,
        "norm_before_residual": False,
    }
    return tensors, config, None


def speculators_config(
    llama: dict[str, Any], config: dict[str, Any], verifier: str, speculative_tokens: Optional[int] = 3
) -> dict[str, Any]:
    """The keys of vLLM's speculators format for an EAGLE-3 export (read by
    ``vllm/transformers_utils/configs/speculators/base.py`` and ``algos.py``): the model type, the
    decoder layer's Llama config, and ``speculators_config`` with one greedy proposal method of
    ``speculative_tokens`` tokens and the ``verifier`` (the target as the serving machine names it).
    The top-level keys stay too (vLLM's reader ignores them; this project's loader reads them)."""
    speculative_tokens = 3 if speculative_tokens is None else speculative_tokens
    check_range(speculative_tokens, 1, MAX_SPECULATIVE_TOKENS, "--speculative-tokens")
    if not isinstance(verifier, str) or not verifier.strip():
        raise InputError(
            "--speculators needs --verifier NAME_OR_PATH: the target as the serving machine names it "
            "(a Hugging Face id or a path there)"
        )
    return {
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": {**llama, "num_hidden_layers": 1, "vocab_size": config["vocab_size"]},
        **speculators_section("eagle3", verifier, speculative_tokens),
    }


def portable(text: Any) -> Any:
    """``text`` with an absolute path cut to its last part (a path of the exporting machine means
    nothing where the export is served, and should not travel with it)."""
    if isinstance(text, str) and (text.startswith(("/", "~")) or PurePath(text).is_absolute()):
        return PurePath(text).name
    return text


def check_range(value: Any, low: int, high: int, option: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(f"{option} must be a whole number from {low} to {high}, not {value!r}")
    return value


def _write(out: Path, tensors: dict, config: dict, files: dict[str, Any]) -> None:
    """The export's files (``files``: name → what ``torch.save`` writes beside the weights, or a dict
    written as JSON under a name ending ``.json``), written
    into ``out`` in one rename (``writing_atomically``)."""
    from safetensors.torch import save_file

    with writing_atomically(out) as partial:
        save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
        share(partial / "model.safetensors")  # safetensors writes it owner-only (0600)
        write_json(partial / CONFIG, config)
        for name, value in files.items():
            if name.endswith(".json") and isinstance(value, dict):
                write_json(partial / name, value)
            else:
                torch.save(value, partial / name)


@contextlib.contextmanager
def writing_atomically(out: Path) -> Iterator[Path]:
    """A temporary folder beside ``out`` to write an export into, which then replaces ``out`` (absent
    or empty) in one rename: an interrupted export leaves no half-written folder."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.{os.getpid()}.partial"
    try:
        partial.mkdir()
        yield partial
        os.replace(partial, out)  # onto an absent or empty folder
    except OSError as exc:
        raise InputError(
            f"out '{out}' cannot be written ({exc.strerror or type(exc).__name__}): give a new or "
            "empty folder that can be written"
        ) from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def check_draft(draft: Path) -> None:
    """``draft`` must be a folder ``pacer distill`` wrote (manifest and weights), else ``InputError``."""
    if not draft.is_dir():
        raise InputError(f"draft '{draft}' is not a folder: give a folder `pacer distill` wrote")
    if (draft / MANIFEST).is_file() and exporting_kind(draft) is not None:
        return  # a kind a plugin adds checks its own drafts
    if (draft / MANIFEST).is_file() and not (draft / WEIGHTS).is_file():
        raise InputError(
            f"'{draft}' holds a token-level draft (a causal LM of its own, student.kind=token): the "
            "EAGLE layouts express feature-level networks only; export a feature or eagle3 student"
        )
    if not (draft / MANIFEST).is_file() or not (draft / WEIGHTS).is_file():
        published = (draft / CONFIG).is_file() and any(
            (draft / n).exists() for n in ("model.safetensors", "pytorch_model.bin")
        )
        hint = "it is already in the published layout" if published else "give a folder `pacer distill` wrote"
        raise InputError(f"'{draft}' is not a draft `pacer distill` wrote (no {MANIFEST} and {WEIGHTS}): {hint}")


def check_export_out(out: str) -> Path:
    """``out`` as the export's folder: absent (created when written) or an empty folder, in a place that
    can be written; else ``InputError``."""
    folder = check_out_dir(out, "out", create=False)
    if folder.is_dir() and any(folder.iterdir()):
        raise InputError(
            f"out '{folder}' exists and is not empty: give a new or empty folder (an export never overwrites files)"
        )
    return folder


@command(
    "export",
    "write a draft `pacer distill` made (feature-level or EAGLE-3) in the published EAGLE layout "
    "that vLLM, SGLang and EAGLE's code load (docs/eagle-checkpoints.md), or a dflash block draft "
    "in speculators' dflash format (docs/block-checkpoints.md)",
)
def _setup(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("draft", help="a draft folder `pacer distill` wrote (manifest.json, draft.safetensors)")
    p.add_argument("out", help="the folder to write (new or empty)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float16", help="weights' dtype (default float16)")
    p.add_argument(
        "--max-position-embeddings",
        type=bounded_int(1, MAX_POSITIONS),
        default=None,
        metavar="N",
        help=f"the config's max_position_embeddings: the target's context length, 1 to {MAX_POSITIONS} "
        "(default 32768, or the student's own with rope scaling)",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="vllm",
        help="EAGLE-1: whose architecture name the config gives, vllm (EagleLlamaForCausalLM, the "
        "default), sglang (LlamaForCausalLMEagle) or eagle (LlamaForCausalLM, EAGLE's own code); "
        "EAGLE-3 drafts are LlamaForCausalLMEagle3 for every engine",
    )
    p.add_argument(
        "--speculators",
        action="store_true",
        help="EAGLE-3: also write vLLM's speculators-format keys, so `vllm serve OUT` serves it (needs --verifier)",
    )
    p.add_argument(
        "--verifier",
        metavar="NAME_OR_PATH",
        help="with --speculators: the target as the serving machine names it (a Hugging Face id or a path there)",
    )
    p.add_argument(
        "--speculative-tokens",
        type=bounded_int(1, MAX_SPECULATIVE_TOKENS),
        default=None,
        metavar="K",
        help=f"with --speculators: the draft length vLLM uses by default, 1 to {MAX_SPECULATIVE_TOKENS} "
        "(default 3; a dflash draft: its block)",
    )
    p.add_argument(
        "--target",
        metavar="PATH",
        help="dflash drafts sharing the target's output layer: the target to read its rows from "
        "(default: the one the draft's recipe names)",
    )

    def runner(args: argparse.Namespace) -> int:
        if args.verifier is not None and not args.speculators:
            raise InputError("--verifier is read with --speculators only: add --speculators, or leave --verifier out")
        speculators = None
        if args.speculators:
            if not args.verifier or not args.verifier.strip():
                raise InputError(
                    "--speculators needs --verifier NAME_OR_PATH: the target as the serving machine "
                    "names it (a Hugging Face id or a path there)"
                )
            speculators = {"verifier": args.verifier, "speculative_tokens": args.speculative_tokens}
        draft = Path(args.draft).expanduser()
        check_draft(draft)
        out = check_export_out(args.out)
        result = export_draft(
            draft,
            out,
            DTYPES[args.dtype],
            args.max_position_embeddings,
            args.engine,
            speculators,
            target_path=args.target,
        )
        extra = "".join(f" and {name}" for name in result["files"])
        print(
            f"wrote {result['layout']} checkpoint {out} ({result['tensors']} tensors in model.safetensors, "
            f"config.json{extra})"
        )
        return 0

    return runner
