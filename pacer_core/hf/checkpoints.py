"""The files of a published draft checkpoint (EAGLE, DFlash): ``config.json`` and its weights, one
file or shards named by an index, and the copy of its named tensors into a network.

A checkpoint folder holds ``config.json`` and its weights as ``model.safetensors`` or
``pytorch_model.bin``, or sharded as ``model.safetensors.index.json`` / ``pytorch_model.bin.index.json``
(transformers' ``weight_map`` from tensor name to shard file) beside the shards. ``.bin`` files are
unpickled with ``weights_only=True`` only: a pickle holding more than tensors is refused, never run.
``fill_tensors`` copies a checkpoint's tensors into a network by a name map (ours → theirs), each
checked for presence, shape and kind, so a file missing a tensor is one line naming it.
"""

from __future__ import annotations

import hashlib
import math
import zipfile
from pathlib import Path
from typing import Any, Optional

import torch

from pacer_core.errors import InputError
from pacer_core.jsonfile import parse_json, read_bytes

CONFIG = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
FIX = "download the checkpoint again"
_MISSING = object()


def weights_file(folder: Path) -> Optional[Path]:
    """The weights file (or shard index) of a checkpoint folder, else None."""
    if not (folder / CONFIG).is_file():
        return None
    return next((folder / name for name in WEIGHT_FILES + INDEX_FILES if (folder / name).is_file()), None)


def shard_files(index: Path) -> dict[str, Path]:
    """Tensor name → shard file of a ``*.index.json``; shards must lie beside it and exist."""
    data = parse_json(read_bytes(index, "shard index", FIX), f"shard index '{index}'", FIX)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError(f"'{index}' has no 'weight_map' object naming each tensor's shard: {FIX}")
    suffix = ".safetensors" if index.name.startswith("model.safetensors") else ".bin"
    files = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or not shard.endswith(suffix):
            raise InputError(f"'{index}' maps '{name}' to {shard!r}, not a {suffix} file beside the index: {FIX}")
        path = index.parent / shard
        if not path.is_file():
            raise InputError(f"'{index}' names shard '{shard}', which is missing from '{index.parent}': {FIX}")
        files[name] = path
    return files


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint file or of every shard of an index; anything unreadable is one
    ``InputError``. A sharded checkpoint must hold each tensor in the shard its index names."""
    if path.name.endswith(".index.json"):
        files = shard_files(path)
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(files.values())):
            for name, tensor in _read_file(shard).items():
                if files.get(name) == shard:
                    state[name] = tensor
        missing = sorted(set(files) - set(state))
        if missing:
            raise InputError(
                f"'{path}' places tensor '{missing[0]}' in '{files[missing[0]].name}', which does not "
                f"hold it: the shards are incomplete; {FIX}"
            )
        return state
    return _read_file(path)


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from .artifacts import load_safetensors

        state = load_safetensors(path, FIX)
    else:
        try:  # never unpickle arbitrary objects: plain tensors only
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
        except Exception as exc:  # noqa: BLE001 — corrupt, truncated or holding more than tensors
            raise InputError(
                f"'{path}' cannot be loaded as PyTorch weights ({type(exc).__name__}): it is truncated, "
                f"corrupt or holds more than tensors; {FIX}"
            ) from exc
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise InputError(f"'{path}' does not hold a dict of named tensors: it is not a draft checkpoint")
    return state


def read_token_map(path: Path, vocab: int) -> torch.Tensor:
    """[n] distinct target ids of an EAGLE-1/2 draft vocabulary (SGLang's ``--speculative-token-map``
    file: a tensor or list of ids saved with ``torch.save``), loaded with ``weights_only=True``."""
    if not path.is_file():
        raise InputError(f"'{path}' (the config's speculative_token_map) is missing: {FIX}")
    try:
        ids = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"'{path}' cannot be loaded as a token map ({type(exc).__name__}): {FIX}") from exc
    if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        ids = torch.tensor(ids, dtype=torch.long)
    if (
        not isinstance(ids, torch.Tensor)
        or ids.dim() != 1
        or ids.is_floating_point()
        or ids.dtype == torch.bool
        or not len(ids)
    ):
        raise InputError(f"'{path}' does not hold a list of token ids: {FIX}")
    ids = ids.long()
    if bool((ids < 0).any()) or bool((ids >= vocab).any()) or len(set(ids.tolist())) != len(ids):
        raise InputError(
            f"'{path}' names ids outside the target's {vocab} tokens or one id twice: the token map "
            "belongs to another target"
        )
    return ids


def digest(path: Path) -> str:
    """16 hex digits naming the weights: the file's SHA-256, or for an index that of its shards' digests."""
    if path.name.endswith(".index.json"):
        shards = sorted(set(shard_files(path).values()))
        return hashlib.sha256("".join(digest(shard) for shard in shards).encode()).hexdigest()[:16]
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            sha.update(chunk)
    return sha.hexdigest()[:16]


def fill_tensors(
    net: torch.nn.Module, state: dict[str, torch.Tensor], names: dict[str, str], path: Path, layout: str
) -> None:
    """Copy the checkpoint's tensors ``state`` into ``net`` (``names``: our name → theirs), each checked
    for presence and shape; a missing or misshapen tensor is one ``InputError`` naming it (``layout``
    names the checkpoint's kind in the message, e.g. "EAGLE")."""
    own = net.state_dict()
    loaded = {}
    for ours, theirs in names.items():
        if theirs not in state:
            raise InputError(
                f"'{path}' has no tensor '{theirs}': the file is incomplete or not this {layout} layout; {FIX}"
            )
        tensor = state[theirs]
        if tuple(tensor.shape) != tuple(own[ours].shape):
            raise InputError(
                f"'{path}': tensor '{theirs}' has shape {tuple(tensor.shape)}, but its config.json "
                f"implies {tuple(own[ours].shape)}: the config and weights do not belong together"
            )
        if not tensor.is_floating_point():
            raise InputError(f"'{path}': tensor '{theirs}' holds {tensor.dtype} values, not weights; {FIX}")
        loaded[ours] = tensor.float()
    net.load_state_dict(loaded, strict=False)


class ConfigReader:
    """Typed reads of one checkpoint config (``kind``: whose, e.g. "EAGLE"; ``layout``: the layout a
    refusal points to), each failing as one ``InputError`` naming the key and ``fix``."""

    def __init__(self, config: dict, path: Path, kind: str, layout: str, fix: str = FIX):
        self.config, self.path, self.kind, self.layout, self.fix = config, path, kind, layout, fix

    def bad(self, message: str) -> InputError:
        return InputError(f"'{self.path}': {message}; fix the value or {self.fix}")

    def get(self, key: str, default: Any = _MISSING) -> Any:
        value = self.config.get(key)
        if value is None:
            if default is _MISSING:
                raise InputError(f"'{self.path}' has no '{key}': it is not the config of {self.kind} checkpoint")
            return default
        return value

    def whole(self, key: str, default: Any = _MISSING, minimum: int = 1) -> int:
        value = self.get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value != int(value)
            or value < minimum
        ):
            raise self.bad(f"{key} must be a whole number ≥ {minimum}, not {value!r}")
        return int(value)

    def positive(self, key: str, default: Any = _MISSING) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise self.bad(f"{key} must be a number > 0, not {value!r}")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise self.bad(f"{key} must be true or false, not {value!r}")
        return value

    def attention(self) -> tuple[int, int, int, int]:
        """(hidden_size, num_attention_heads, num_key_value_heads, head_dim): the heads divide evenly
        and the head dimension is even (rotary embeddings), else one ``InputError``."""
        hidden, heads = self.whole("hidden_size"), self.whole("num_attention_heads")
        kv_heads = self.whole("num_key_value_heads", heads)
        if heads % kv_heads:
            raise self.bad(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})")
        if self.config.get("head_dim") is None and hidden % heads:
            raise self.bad(
                f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads}) and there is no head_dim"
            )
        head_dim = self.whole("head_dim", hidden // heads)
        if head_dim % 2:
            raise self.bad(f"head_dim must be even for rotary embeddings, not {head_dim}")
        return hidden, heads, kv_heads, head_dim

    def refuse_true(self, key: str, why: str) -> None:
        if self.config.get(key) not in (None, False):
            raise InputError(
                f"'{self.path}': {key}: {self.config[key]!r} is not supported ({why}); use a checkpoint "
                f"in {self.layout}"
            )

    def rope(self, default_theta: float) -> tuple[float, Optional[dict]]:
        """θ and the scaling: ``rope_theta`` / ``rope_scaling`` (transformers 4) or ``rope_parameters``
        (transformers 5, θ inside); a default type is no scaling; θ is ``default_theta`` when absent."""
        params = self.config.get("rope_parameters")
        scaling = self.config.get("rope_scaling")
        if params is not None and scaling is None:
            if not isinstance(params, dict):
                raise self.bad(f"rope_parameters must be an object, not {params!r}")
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
            inner = ConfigReader(params, self.path, self.kind, self.layout, self.fix)
            theta = inner.positive("rope_theta", self.config.get("rope_theta") or default_theta)
        else:
            theta = self.positive("rope_theta", default_theta)
        if (
            isinstance(scaling, dict)
            and scaling.get("rope_type", scaling.get("type", "default")) == "default"
            and set(scaling) <= {"type", "rope_type"}
        ):
            scaling = None
        return theta, scaling


def draft_vocabulary(state: dict[str, torch.Tensor], draft_vocab: int, vocab: int, path: Path) -> torch.Tensor:
    """[draft vocab] target id of each row of a draft's own head: i + d2t[i] (every id when the vocabularies
    are equal); checked to be distinct ids of the target and to agree with ``t2d`` when present."""
    if draft_vocab == vocab and "d2t" not in state:
        return torch.arange(vocab)
    d2t = state.get("d2t")
    if d2t is None:
        raise InputError(
            f"'{path}' has no tensor 'd2t' (the draft→target token map of its {draft_vocab}-token "
            f"vocabulary): the file is incomplete; {FIX}"
        )
    if tuple(d2t.shape) != (draft_vocab,):
        raise InputError(f"'{path}': d2t has shape {tuple(d2t.shape)}, but draft_vocab_size is {draft_vocab}")
    ids = torch.arange(draft_vocab) + d2t.long()
    if bool((ids < 0).any()) or bool((ids >= vocab).any()) or len(set(ids.tolist())) != draft_vocab:
        raise InputError(
            f"'{path}': d2t maps the draft vocabulary outside the target's {vocab} tokens or onto "
            "one token twice: the checkpoint belongs to another target"
        )
    t2d = state.get("t2d")
    if t2d is not None:
        if tuple(t2d.shape) != (vocab,):
            raise InputError(f"'{path}': t2d has {tuple(t2d.shape)} entries, but the target's vocabulary has {vocab}")
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[ids] = True
        if not torch.equal(t2d.bool(), mask):
            raise InputError(f"'{path}': t2d and d2t disagree on the draft vocabulary: {FIX}")
    return ids
