"""Model adapter for Hugging Face causal LMs: the only package of the engine importing transformers.

``artifacts`` model files on disk (cache root, embedded target, GGUF conversion, draft folders
completed with their target's shared tensors, weight digests); ``adapter`` ``HFModel`` (one model and
its KV cache, a ``pacer_core.protocols.FeatureModel``) and ``HFTokenizer``; ``loading`` a config's model
sections; ``students`` training helpers; ``baselines`` transformers' own ``generate``, traced for
benchmarks. Every public name is re-exported here: ``from pacer_core.hf import X``.
"""

from .adapter import DTYPES, HFModel, HFTokenizer
from .artifacts import (EMBEDDED_TARGET, SHARED_FILE, SUBSET_FILE, cache_root, check_weights, embedded_target_file,
                        load_safetensors, materialize, weights_digest)
from .baselines import hf_generate, hf_generate_traced
from .loading import load_draft, load_model, load_section, resolve_device
from .students import (batch_generate, greedy_batch, last_hidden_states, layer_inputs, save_student, target_states,
                       student_from_target)

__all__ = [
    "DTYPES", "EMBEDDED_TARGET", "HFModel", "HFTokenizer", "SHARED_FILE", "SUBSET_FILE", "batch_generate", "greedy_batch",
    "cache_root", "check_weights", "embedded_target_file", "hf_generate", "hf_generate_traced",
    "last_hidden_states", "layer_inputs", "target_states", "load_draft", "load_model", "load_safetensors", "load_section", "materialize",
    "resolve_device", "save_student", "student_from_target", "weights_digest",
]
