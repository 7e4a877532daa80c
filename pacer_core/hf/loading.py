"""Loading a config's model sections: (adapter, tokenizer, weights digest); a new model of a config."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from ..errors import InputError
from ..jsonfile import read_json
from ..kernels import should_pack
from .adapter import DTYPES, HFModel, HFTokenizer, _quiet_transformers, eos_token_ids
from .artifacts import SUBSET_FILE, _first_line, materialize, weights_digest

# the files any transformers tokenizer is read from (fast, sentencepiece, BPE and WordPiece vocabularies)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tiktoken.model",
)


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when a GPU is visible, else ``cpu``; any other name is returned as is."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_model(
    path: Optional[str],
    dtype: str,
    device: str,
    device_map: Optional[str],
    name: str,
    pack_weights: Optional[bool] = None,
):
    """(model adapter, tokenizer, weights digest) for a config's ``target`` or ``draft`` section.

    ``device`` may be ``auto`` (CUDA when available); ``pack_weights`` (None: wherever possible) see
    ``pacer_core.kernels.should_pack``."""
    if dtype not in DTYPES:  # the options first: the files may take long to read or convert
        raise InputError(f"unknown dtype '{dtype}' for {name}: use one of {', '.join(DTYPES)}")
    if device_map and pack_weights:
        raise InputError(
            f"{name}: pack_weights=true needs the whole model on the CPU, not device_map; "
            "set pack_weights to null or false"
        )
    source = Path(path).expanduser() if path is not None else None
    if source is not None and (source / "config.json").is_file():
        check_causal_lm(source, name)  # the user's own files, before any is converted or copied
    folder = materialize(path)
    if folder != source:  # a converted GGUF file, a completed draft
        check_causal_lm(folder, name)
    tokenizer = load_tokenizer(folder, name)  # before the weights: it is quick to fail
    device = resolve_device(device)
    model = HFModel.load(folder, dtype=dtype, device=device, device_map=device_map, name=name)
    home = source if source is not None and (source / SUBSET_FILE).is_file() else folder  # the user's file
    if (home / SUBSET_FILE).exists():
        subset = read_json(home / SUBSET_FILE, f"{name} vocabulary subset", "export the draft again", expect=list)
        if not subset or not all(type(t) is int for t in subset):
            raise InputError(
                f"{name} vocabulary subset '{home / SUBSET_FILE}' must be a non-empty list of token "
                "ids: the file is damaged; export the draft again"
            )
        model.use_vocab_subset(subset)
    if not device_map and should_pack(pack_weights, model.dtype, model.device, name):
        model.pack_weights()
    model.digest = weights_digest(folder)
    model.folder = folder
    return model, tokenizer, model.digest


def model_from_config(config: Any, dtype: torch.dtype = torch.float32) -> Any:
    """A new causal LM of ``config``'s architecture with fresh weights (transformers'
    ``AutoModelForCausalLM.from_config``): what a trainer fills with copied target layers."""
    return _quiet_transformers().AutoModelForCausalLM.from_config(config, dtype=dtype)


def check_causal_lm(folder: Path, name: str) -> None:
    """Refuse, from its config.json alone, a model folder transformers cannot load as a causal LM without
    running code from the model's repository: a damaged config.json, a ``model_type`` this transformers
    does not know (one needing custom code: ``auto_map``), an encoder-decoder model (T5, BART) or any
    other model that is not a causal LM. Pacer never runs a model's own code (``trust_remote_code``)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    transformers = _quiet_transformers()
    config = read_json(folder / "config.json", f"{name} config", "download or export the model again")
    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING_NAMES:
        if "auto_map" in config:
            raise InputError(
                f"{name} '{folder}': model_type {model_type!r} needs the custom code of the model's repository "
                f"(auto_map in config.json), and pacer never runs a model's own code: use a model of an "
                f"architecture transformers {transformers.__version__} supports, or convert the weights to one "
                "(e.g. a llama-format export)"
            )
        raise InputError(
            f"{name} '{folder}': model_type {model_type!r} is not one transformers "
            f"{transformers.__version__} knows: use a supported architecture, or upgrade transformers"
        )
    if config.get("is_encoder_decoder") or model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        kind = "an encoder-decoder model" if config.get("is_encoder_decoder") else "not a causal language model"
        raise InputError(
            f"{name} '{folder}' is a {model_type} model, {kind}: pacer decodes with causal "
            "(decoder-only) language models only; give one such as llama, qwen2, mistral or gpt2"
        )


def load_tokenizer(folder: Path, name: str) -> HFTokenizer:
    """The tokenizer of a model folder; a folder without tokenizer files, or whose files transformers
    cannot read, is an ``InputError`` naming the folder."""
    fix = (
        "copy the model's tokenizer files (tokenizer.json, tokenizer_config.json, ...) from its repository "
        "into the folder"
    )
    if not any((folder / file).is_file() for file in TOKENIZER_FILES):
        raise InputError(
            f"{name} folder '{folder}' has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...): {fix}"
        )
    try:
        return HFTokenizer.load(folder)
    except Exception as exc:  # transformers raises ValueError, OSError, TypeError, KeyError... for bad files
        raise InputError(
            f"{name} folder '{folder}': its tokenizer cannot be loaded ({type(exc).__name__}: "
            f"{_first_line(exc)[:160]}): {fix}"
        ) from None


def model_facts(folder: Path, name: str) -> dict[str, Any]:
    """What a model folder says of its model without loading the weights, as ``HFModel.load`` reads
    them: ``vocab_size``, ``hidden_size``, ``max_positions``, ``eos_token_ids`` (the generation config's,
    else the config's) and ``digest`` (``weights_digest``). A folder another engine serves is described
    so to the components drafting for it (``pacer_core.serving.ServedTarget``)."""
    transformers = _quiet_transformers()
    check_causal_lm(folder, name)
    config = transformers.AutoConfig.from_pretrained(folder)
    try:
        generation = transformers.GenerationConfig.from_pretrained(folder)
    except OSError:  # no generation_config.json: transformers builds it from the config, as for a loaded model
        generation = transformers.GenerationConfig.from_model_config(config)
    text = config.get_text_config()
    return {
        "vocab_size": int(text.vocab_size),
        "hidden_size": int(text.hidden_size),
        "max_positions": int(getattr(text, "max_position_embeddings", 2048)),
        "eos_token_ids": eos_token_ids(generation, config),
        "digest": weights_digest(folder),
    }


def load_section(section: Any, name: str):
    """``load_model`` for a config's model section (``pacer_core.config.ModelConfig``)."""
    return load_model(section.path, section.dtype, section.device, section.device_map, name, section.pack_weights)


def load_draft(section: Any, target_tokenizer) -> HFModel:
    """The draft model of a ``draft`` section, refused unless it shares the target's tokenizer."""
    draft, draft_tokenizer, _ = load_section(section, "draft")
    if draft_tokenizer.vocab() != target_tokenizer.vocab():
        raise InputError(
            f"draft '{section.path}' and target use different tokenizers: speculative decoding "
            "needs a draft trained with the target's tokenizer"
        )
    return draft
