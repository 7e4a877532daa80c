"""Model adapter for Hugging Face causal LMs: the only package of the engine importing transformers.

``artifacts`` model files on disk (cache root, embedded target, GGUF conversion, draft folders
completed with their target's shared tensors, weight digests); ``adapter`` ``HFModel`` (one model and
its KV cache, a ``pacer_core.protocols.FeatureModel``) and ``HFTokenizer``; ``loading`` a config's model
sections (and a new model of a config); ``batched`` batched greedy answers (corpus-making, draft
evaluation); ``baselines`` transformers' own ``generate``, traced for benchmarks; ``checkpoints`` a published draft
checkpoint's files (config, weights or shards) and the copy of its tensors into a network. What the trainers
build on the target (students made of its layers, its hidden states for a batch) is in
``pacer_train.students``. Every public name is re-exported here: ``from pacer_core.hf import X``.
"""

from .adapter import DTYPES, HFModel, HFTokenizer
from .artifacts import (
    EMBEDDED_TARGET,
    SHARED_FILE,
    SUBSET_FILE,
    cache_root,
    check_sizes,
    check_weights,
    embedded_target_file,
    layer_count,
    load_safetensors,
    materialize,
    safetensors_shapes,
    weights_digest,
)
from .baselines import hf_generate, hf_generate_traced
from .batched import batch_generate, greedy_batch
from .checkpoints import fill_tensors, read_tensors, weights_file
from .loading import (
    load_draft,
    load_model,
    load_section,
    load_tokenizer,
    model_facts,
    model_from_config,
    resolve_device,
)

__all__ = [
    "DTYPES",
    "EMBEDDED_TARGET",
    "HFModel",
    "HFTokenizer",
    "SHARED_FILE",
    "SUBSET_FILE",
    "batch_generate",
    "greedy_batch",
    "cache_root",
    "check_sizes",
    "check_weights",
    "embedded_target_file",
    "fill_tensors",
    "read_tensors",
    "hf_generate",
    "hf_generate_traced",
    "layer_count",
    "load_draft",
    "load_model",
    "load_safetensors",
    "load_section",
    "load_tokenizer",
    "materialize",
    "model_facts",
    "model_from_config",
    "resolve_device",
    "safetensors_shapes",
    "weights_digest",
    "weights_file",
]
