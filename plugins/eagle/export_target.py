"""``pacer export-target``: the target (the embedded one by default) as a folder SafeAILab/EAGLE's code
reads with transformers 4.53 (safetensors and their index, ``rope_theta`` at the top level, a transformers 4
tokenizer config) and transformers 5 reads as before (docs/eagle-checkpoints.md#the-target-for-eagles-code).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path, PurePath
from typing import Any, Optional

from pacer_core.commands import Runner, command
from pacer_core.draft_folders import CONFIG
from pacer_core.errors import InputError
from pacer_core.jsonfile import read_json

from .export import check_export_out, portable, write_json, writing_atomically

INDEX = "model.safetensors.index.json"
SOURCE_RECORD = "pacer-source.json"  # the GGUF file a converted target came from: its digest names the target
# rewritten, or made by transformers 5 for itself (weights and the index are written anew)
NOT_COPIED = (CONFIG, "tokenizer_config.json", INDEX, SOURCE_RECORD, "pacer-shared.json")
TRANSFORMERS5_TOKENIZER_KEYS = ("backend", "is_local", "local_files_only")  # tokenizer_config keys 4.x never wrote


def export_target(out: Path, target: Optional[str] = None) -> dict[str, Any]:
    """Write the target (``None``: the embedded one; else what ``target.path`` takes: a model folder or
    a ``.gguf`` file) into ``out`` (absent or empty) as a folder that transformers 4 (EAGLE's code:
    transformers 4.53) and 5 both read as the same model: the safetensors weights as they are, with
    ``model.safetensors.index.json`` (EAGLE's ``cnets1.py``/``cnets.py`` find ``embed_tokens`` there),
    ``config.json`` with transformers 4's keys beside transformers 5's (``transformers4_config``) and
    a tokenizer config transformers 4 can load (``transformers4_tokenizer``). Returns
    {out, shards, tensors, rope_theta}; bad input is one ``InputError``."""
    from pacer_core.hf import materialize, weights_digest

    folder = materialize(target)
    fix = "give a model folder with safetensors weights or a .gguf file (target.path takes the same)"
    config = transformers4_config(read_json(folder / CONFIG, "target config", fix), folder / CONFIG)
    shards = target_shards(folder, fix)
    tokenizer = transformers4_tokenizer(folder)
    index = weight_index(folder, shards, fix)
    name = "embedded " + folder.name.rsplit("-", 1)[0] if target is None else portable(str(Path(target).expanduser()))
    config["pacer_export"] = {"target": name, "target_digest": weights_digest(folder)}
    with writing_atomically(out) as partial:
        for item in sorted(folder.iterdir()):
            if item.is_file() and (
                item.name in shards
                or item.suffix not in (".safetensors", ".bin")
                and item.name not in NOT_COPIED
                and not item.name.endswith(".index.json")
            ):
                shutil.copyfile(item, partial / item.name)  # the permissions open() gives: 0644 usually
        if (folder / SOURCE_RECORD).is_file():  # the same bytes, so the same digest (drafts check it)
            record = read_json(folder / SOURCE_RECORD, "target source record", fix)
            write_json(partial / SOURCE_RECORD, {**record, "gguf": portable(record.get("gguf"))})
        write_json(partial / INDEX, index)
        write_json(partial / CONFIG, config)
        write_json(partial / "tokenizer_config.json", tokenizer)
    return {
        "out": str(out),
        "shards": shards,
        "tensors": len(index["weight_map"]),
        "rope_theta": config.get("rope_theta"),
    }


def transformers4_config(config: dict[str, Any], where: Path) -> dict[str, Any]:
    """``config`` (a transformers 5 ``config.json``) with the keys transformers 4 reads beside it:
    ``rope_theta`` and ``rope_scaling`` at the top level (transformers 5 keeps both in
    ``rope_parameters``; transformers 4 ignores that key and falls back to RoPE base 10000 silently)
    and ``torch_dtype`` (5's ``dtype``). transformers 5 reads ``rope_parameters`` first, so both read
    the same rotation. A config that already has the top-level keys keeps them."""
    config = dict(config)
    rope = config.get("rope_parameters")
    if rope is not None:
        theta = rope.get("rope_theta") if isinstance(rope, dict) else None
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
            raise InputError(
                f"'{where}': rope_parameters {rope!r} is not one rotation with a rope_theta > 0 (one per "
                "layer type cannot be written as transformers 4's rope_theta): this target's folder "
                "cannot be written for transformers 4"
            )
        config.setdefault("rope_theta", theta)
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default" and config.get("rope_scaling") is None:
            # transformers 4 reads rope_type (its own rope functions) or type (EAGLE's modeling_llama_kv.py)
            config["rope_scaling"] = {
                **{k: v for k, v in rope.items() if k != "rope_theta"},
                "rope_type": kind,
                "type": kind,
            }
    elif not isinstance(config.get("rope_theta", 10000.0), (int, float)):
        raise InputError(f"'{where}': rope_theta {config['rope_theta']!r} is not a number: the config is damaged")
    if "dtype" in config:
        config.setdefault("torch_dtype", config["dtype"])
    return config


def transformers4_tokenizer(folder: Path) -> dict[str, Any]:
    """``folder``'s ``tokenizer_config.json`` as transformers 4 reads it: transformers 5's
    ``TokenizersBackend`` (a tokenizer built from ``tokenizer.json``) is transformers 4's
    ``PreTrainedTokenizerFast``, which both load (EAGLE's code asks for ``use_fast=False`` and gets it
    too: it has no slow counterpart); 5's bookkeeping keys go; the chat template is kept inline
    as well as in ``chat_template.jinja`` (transformers before 4.50 read only the inline one)."""
    fix = "give a target with its tokenizer files (tokenizer.json and tokenizer_config.json)"
    tokenizer = dict(read_json(folder / "tokenizer_config.json", "tokenizer config", fix))
    if tokenizer.get("tokenizer_class") == "TokenizersBackend":
        if not (folder / "tokenizer.json").is_file():
            raise InputError(
                f"'{folder}' has a TokenizersBackend tokenizer but no tokenizer.json, which transformers "
                f"4 builds it from: {fix}"
            )
        tokenizer["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in TRANSFORMERS5_TOKENIZER_KEYS:
        tokenizer.pop(key, None)
    template = folder / "chat_template.jinja"
    if "chat_template" not in tokenizer and template.is_file():
        tokenizer["chat_template"] = template.read_text()
    return tokenizer


def target_shards(folder: Path, fix: str) -> list[str]:
    """The safetensors files holding ``folder``'s weights: those its index names, or ``model.safetensors``."""
    if (folder / INDEX).is_file():
        weight_map = read_json(folder / INDEX, "weights index", fix).get("weight_map")
        files = list(weight_map.values()) if isinstance(weight_map, dict) else []
        if not files or not all(
            isinstance(v, str) and PurePath(v).name == v and v.endswith(".safetensors") for v in files
        ):
            raise InputError(
                f"'{folder / INDEX}' has no weight_map from tensor names to .safetensors files beside it: "
                "the index is damaged; download the model again"
            )
        return sorted(set(weight_map.values()))
    if (folder / "model.safetensors").is_file():
        return ["model.safetensors"]
    raise InputError(
        f"'{folder}' has no safetensors weights (model.safetensors or {INDEX}): convert its "
        f"PyTorch .bin weights to safetensors first, or {fix}"
    )


def weight_index(folder: Path, shards: list[str], fix: str) -> dict[str, Any]:
    """transformers' index of ``shards``: ``weight_map`` (tensor name → shard) and ``metadata.total_size``
    (the bytes of every tensor), read from each shard's header."""
    from pacer_core.hf import safetensors_shapes

    weight_map, total = {}, 0
    for shard in shards:
        path = folder / shard
        names = safetensors_shapes(path, fix)  # refuses a missing, truncated or damaged file
        with open(path, "rb") as handle:
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        for name in names:
            if name in weight_map:
                raise InputError(
                    f"tensor '{name}' is in both '{weight_map[name]}' and '{shard}': the weights of "
                    f"'{folder}' are damaged; {fix}"
                )
            weight_map[name] = shard
            start, end = header[name]["data_offsets"]
            total += end - start
    return {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}


@command(
    "export-target",
    "write the target (the embedded one by default) as a folder EAGLE's code reads with "
    "transformers 4.53 (safetensors and their index, rope_theta at the top level, a "
    "transformers 4 tokenizer config) and transformers 5 reads as before "
    "(docs/eagle-checkpoints.md#the-target-for-eagles-code)",
)
def _setup_target(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("out", help="the folder to write (new or empty)")
    p.add_argument(
        "--target",
        metavar="PATH",
        help="a model folder or a .gguf file, as target.path takes (default: the embedded target)",
    )

    def runner(args: argparse.Namespace) -> int:
        out = check_export_out(args.out)
        result = export_target(out, args.target)
        rope = "" if result["rope_theta"] is None else f" with rope_theta {result['rope_theta']:g}"
        print(
            f"wrote target {out} ({result['tensors']} tensors in {', '.join(result['shards'])} and {INDEX}, "
            f"config.json{rope}, tokenizer_config.json)"
        )
        return 0

    return runner
