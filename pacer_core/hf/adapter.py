"""The adapter: ``HFModel`` owns one transformers causal LM and its KV cache (and the token ids in
it); the engine and drafters see only ``pacer_core.protocols.LanguageModel`` (and plugins that read
weights, ``FeatureModel``). ``HFTokenizer`` turns text into ids and back."""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence, Union, cast

import torch

from ..errors import InputError
from ..kernels import PackedLinear, PackedMatrix, fuse_siblings, pack_linears
from ..protocols import MASK_ROW, AttentionShape, ModelOutput

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", module="transformers")
    return transformers


def _layer_inputs(hidden_states: Sequence[torch.Tensor], layers: Sequence[int]) -> torch.Tensor:
    """transformers' ``hidden_states`` (entry i: the input of decoder layer i, [1, k, hidden]) of
    ``layers``, concatenated: [k, len(layers) × hidden]."""
    return torch.cat([hidden_states[i][0] for i in layers], dim=-1)


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` (built on the CPU) on ``device`` without a host sync: a blocking copy to a GPU
    waits for the GPU's queued work; a non-blocking one from pageable memory is staged at once and
    queued behind it (the source may be freed right away)."""
    return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)


_GROWING_LAYER: Optional[type] = None


def growing_layer() -> type:
    """A transformers ``DynamicLayer`` whose keys and values are views of buffers with room to spare:
    appending a step's rows writes them in place, where ``DynamicLayer`` concatenates — copying the
    whole cache of every layer at every step (on this CPU 5 ms per token at 500 cached tokens, 14 ms
    at 1,500, for SmolLM2-135M). When a buffer is full (or the keys were replaced, e.g. by
    ``HFModel.crop`` on another layer type) it is reallocated 1.5× larger. Crops stay views."""
    global _GROWING_LAYER
    if _GROWING_LAYER is None:
        DynamicLayer: Any = _quiet_transformers().cache_utils.DynamicLayer

        class GrowingLayer(DynamicLayer):
            keys: torch.Tensor
            values: torch.Tensor

            def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
                super().lazy_initialization(key_states, value_states)
                self._key_buffer: Optional[torch.Tensor] = None
                self._value_buffer: Optional[torch.Tensor] = None

            def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
                if not self.is_initialized:
                    self.lazy_initialization(key_states, value_states)
                length = int(self.keys.shape[-2]) if self.keys.dim() == 4 else 0
                end = length + int(key_states.shape[-2])
                keys, values = self._key_buffer, self._value_buffer
                if (
                    keys is None
                    or values is None
                    or end > keys.shape[-2]
                    or (length and self.keys.data_ptr() != keys.data_ptr())
                ):
                    capacity = end + max(256, end // 2)
                    keys = key_states.new_empty(*key_states.shape[:-2], capacity, key_states.shape[-1])
                    values = value_states.new_empty(*value_states.shape[:-2], capacity, value_states.shape[-1])
                    if length:
                        keys[..., :length, :] = self.keys
                        values[..., :length, :] = self.values
                    self._key_buffer, self._value_buffer = keys, values
                keys[..., length:end, :] = key_states
                values[..., length:end, :] = value_states
                self.keys, self.values = keys[..., :end, :], values[..., :end, :]
                return self.keys, self.values

        _GROWING_LAYER = GrowingLayer
    return _GROWING_LAYER


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
            return self.encode_chat([{"role": "user", "content": text}])
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    def encode_chat(self, messages: Sequence[dict]) -> list[int]:
        """A conversation (``[{"role": "user" | "assistant", "content": text}, ...]``, ending with
        the user's turn) through the chat template, with the assistant's generation prompt."""
        ids = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def cache_keyword(model: Any) -> str:
    """The keyword a transformers model's forward takes its KV cache by: ``cache`` since transformers
    renamed it (5.24 here), ``past_key_values`` before (the 5.19 vLLM 0.32 pins; docs/serving.md).
    An older forward swallows an unknown ``cache=`` in its ``**kwargs`` and runs without the cache."""
    parameters = inspect.signature(model.forward).parameters
    return "past_key_values" if "cache" not in parameters and "past_key_values" in parameters else "cache"


def eos_token_ids(generation_config: Any, config: Any) -> list[int]:
    """The end-of-sequence ids a model stops at: its generation config's, else its config's."""
    eos = generation_config.eos_token_id if generation_config else None
    if eos is None:
        eos = config.eos_token_id
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


class HFModel:
    """One causal LM and its KV cache (``pacer_core.protocols.LanguageModel``), showing its weights and
    layout to plugins as ``pacer_core.protocols.FeatureModel``."""

    def __init__(self, model: Any, eos_token_ids: Sequence[int] = (), name: str = "model"):
        transformers = _quiet_transformers()
        self.model = model.eval()
        self.name = name
        config = model.config.get_text_config()
        self.config = config
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.hidden_size = int(config.hidden_size)
        self.num_layers = int(config.num_hidden_layers)
        self.max_length = int(getattr(config, "max_position_embeddings", 2048))
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._cache_cls = transformers.DynamicCache
        self._cache_keyword = cache_keyword(model)
        # per decoder layer: "full_attention", "sliding_attention" or another kind of cache layer;
        # sliding-window layers keep every row like full ones and get the window from the attention
        # mask, by position, so tree rows and crops behind the window stay exact (see reset)
        self._layer_kinds: tuple[str, ...] = ()
        self._window: Optional[int] = None
        self.num_forwards = 0
        self.digest: Optional[str] = None  # content hash of the weights, set by load_model
        self.folder: Optional[Path] = None  # the folder the weights were read from, set by load_model
        self.vocab_subset: Optional[torch.Tensor] = None  # see use_vocab_subset
        self._subset_index: Optional[torch.Tensor] = None  # vocab_subset on the output layer's device
        self._head_subset: Optional[PackedMatrix] = None
        self.packed_weights = False  # see pack_weights
        self.reset()

    def pack_weights(self) -> int:
        """Multiply with weights packed once (``pacer_core.kernels``): on CPU a verification block then
        costs about what one token does. Call after the weights are final; returns the layers packed.
        Sibling projections of one input (q/k/v, gate/up) run as one product each (``fuse_siblings``,
        as vLLM does: 151 products a token instead of 211 for SmolLM2-135M, the same outputs bit for
        bit; docs/serving.md#plain-decoding-against-vllm). The full output layer is packed even while
        a vocabulary subset replaces it here, because other callers (transformers' assisted
        generation) run the whole model."""
        count = pack_linears(self.model.base_model)
        fuse_siblings(self.model.base_model)
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
            self.vocab_subset, self._subset_index, self._head_subset = None, None, None
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
        self._subset_index = ids.to(head.weight.device)  # where the logits are scattered
        self._head_subset = PackedMatrix(
            head.weight.detach()[self._subset_index].contiguous(), pack=self.packed_weights
        )

    @classmethod
    def load(
        cls,
        folder: Path,
        dtype: str = "float32",
        device: str = "cpu",
        device_map: Optional[str] = None,
        name: str = "model",
    ) -> "HFModel":
        transformers = _quiet_transformers()
        kwargs: dict[str, Any] = {"dtype": DTYPES[dtype]}
        if device_map:
            kwargs["device_map"] = device_map
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)
        if not device_map:
            model = model.to(device)
        return cls(model, eos_token_ids=eos_token_ids(model.generation_config, model.config), name=name)

    def embedding_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(input embeddings [vocab, hidden], output layer [vocab, hidden]) — feature-level drafts
        share them with the target instead of storing copies."""
        return (self.model.get_input_embeddings().weight.detach(), self.model.get_output_embeddings().weight.detach())

    def attention_shape(self) -> AttentionShape:
        """The attention layout of the decoder layers, read from the model's config."""
        config = self.config
        heads = int(config.num_attention_heads)
        rope = getattr(config, "rope_parameters", None) or {}
        return AttentionShape(
            num_heads=heads,
            num_kv_heads=int(getattr(config, "num_key_value_heads", heads)),
            head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
            rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
            rms_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
        )

    # -- cache -------------------------------------------------------------------------------
    @property
    def cached_tokens(self) -> Sequence[int]:
        return self._tokens

    def reset(self) -> None:
        """An empty cache. Full-attention and sliding-window layers alike become growing layers
        holding every position: transformers' sliding-window layer keeps only the last window − 1
        rows and slices its keys by row count, which a tree's rows (positions ≠ row indices) and a
        crop after the window was passed both break. The window is applied by the attention mask
        instead: transformers' own for consecutive tokens (rows are positions then), ``forward``'s
        for trees (by each row's position). Exact for every window, at full attention's memory."""
        self._cache = self._cache_cls(config=self.model.config)
        growing = growing_layer()
        dynamic: Any = growing.__base__  # transformers' DynamicLayer
        kinds, windows, layers = [], set(), []
        for layer in self._cache.layers:
            if type(layer) is dynamic:
                kinds.append("full_attention")
            elif getattr(layer, "is_sliding", False) and isinstance(layer, dynamic):
                kinds.append("sliding_attention")
                windows.add(int(layer.sliding_window))
            else:  # another kind (e.g. linear attention): kept as transformers made it
                kinds.append(type(layer).__name__)
                layers.append(layer)
                continue
            layers.append(growing())
        self._cache.layers = layers
        self._layer_kinds = tuple(kinds)
        self._window = min(windows) if windows else None
        self._tokens: list[int] = []
        self._positions: list[int] = []  # the position each cached row was computed at

    @torch.inference_mode()  # the cache's tensors are inference tensors, moved in place
    def crop(self, length: int, rows: Sequence[int] = ()) -> None:
        """Keep the first ``length`` cached positions, then the cached ``rows`` (ascending indices ≥
        ``length``, an accepted tree path) moved into the positions after them; drop the rest (the
        KV cache and its token ids). Rows right after ``length`` need no move: a plain crop."""
        rows = [int(r) for r in rows]
        contiguous = rows == list(range(length, length + len(rows)))
        if not contiguous:
            total = len(self._tokens)
            if any(r < length or r >= total for r in rows) or rows != sorted(set(rows)):
                raise ValueError(f"rows must be ascending cache indices in [{length}, {total})")
            for layer in self._cache.layers:
                self._move_rows(layer, total, length, rows)
            self._tokens[length:] = [self._tokens[r] for r in rows]
            self._positions[length:] = [self._positions[r] for r in rows]
            return
        length += len(rows)
        remove = len(self._tokens) - length
        if remove > 0:
            self._cache.crop(-remove)
            del self._tokens[length:], self._positions[length:]

    @staticmethod
    def _move_rows(layer: Any, total: int, length: int, rows: list[int]) -> None:
        """Keep positions [0, length) and ``rows`` of one cache layer, moving the rows in place."""
        if int(layer.keys.shape[-2]) != total:
            raise ValueError(f"cannot move tree rows in a {type(layer).__name__} cache layer")
        index = _to_device(torch.tensor(rows), layer.keys.device)
        end = length + len(rows)
        layer.keys[..., length:end, :] = layer.keys.index_select(-2, index)  # gathered first: rows ≥ their targets
        layer.values[..., length:end, :] = layer.values.index_select(-2, index)
        layer.keys, layer.values = layer.keys[..., :end, :], layer.values[..., :end, :]

    def _on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return _to_device(tensor, self.device)

    def _tree_attention_mask(self, allowed: torch.Tensor, query_positions: torch.Tensor) -> Any:
        """The additive attention mask(s) of a tree forward: ``allowed`` ([k, cached + k] bool) for
        full-attention layers; for sliding-window layers also only the keys whose position lies less
        than the window before the query's (transformers' rule, by position rather than row index).
        One [1, 1, k, cached + k] mask when every layer is of one kind, else a mask per kind, which
        the models with mixed layers (gemma-2/3, qwen2/3 with ``use_sliding_window``...) accept."""
        kinds = set(self._layer_kinds)
        if not kinds <= {"full_attention", "sliding_attention"}:
            other = ", ".join(sorted(kinds - {"full_attention", "sliding_attention"}))
            raise InputError(
                f"{self.name}: token trees need full or sliding-window attention layers, this model "
                f"also has {other}: draft chains instead (no tree option)"
            )
        masks = {}
        if "full_attention" in kinds:
            masks["full_attention"] = allowed
        if "sliding_attention" in kinds:
            key_positions = torch.tensor(self._positions + query_positions.tolist())  # [cached + k]
            window = cast(int, self._window)  # reset() sets it when a layer slides
            masks["sliding_attention"] = allowed & (key_positions[None, :] > query_positions[:, None] - window)
        for kind, mask in masks.items():
            additive = torch.zeros(mask.shape, dtype=self.dtype)
            additive.masked_fill_(~mask, torch.finfo(self.dtype).min)
            masks[kind] = self._on_device(additive[None, None])
        if len(masks) == 1:
            return next(iter(masks.values()))
        if not self._accepts_mask_per_kind():
            raise InputError(
                f"{self.name}: token trees on a model mixing full and sliding-window layers need "
                f"its transformers class to take a mask per layer kind, which "
                f"{type(self.model.base_model).__name__} does not: draft chains instead (no tree option)"
            )
        return masks

    def _accepts_mask_per_kind(self) -> bool:
        """Whether the decoder's forward takes ``attention_mask`` as {layer kind: mask} (transformers'
        models with mixed layers do, by checking ``isinstance(attention_mask, dict)``)."""
        import inspect

        try:
            source = inspect.getsource(type(self.model.base_model).forward)
        except (OSError, TypeError):
            return False
        return "isinstance(causal_mask_mapping := attention_mask, dict)" in source

    # -- forward -----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self,
        tokens: Sequence[int],
        *,
        positions: Optional[torch.Tensor] = None,
        tree_mask: Optional[torch.Tensor] = None,
        logits_from: int = 0,
        hidden: Union[bool, Sequence[int]] = False,
        mask_embedding: Optional[torch.Tensor] = None,
    ) -> ModelOutput:
        """Run ``tokens`` after the cached ones and append them to the cache.

        ``positions`` ([k], offsets from the cache length) and ``tree_mask`` ([k, k] bool: may new
        token i attend to new token j, every cached token visible; or [k, cached + k] over the
        cached tokens too) score a token tree in one forward; by default the new tokens are causal
        and consecutive. Logits (float32, on the output layer's device) are returned for rows
        ``logits_from:`` only, and hidden states for all rows when ``hidden``: True gives the last layer's (after the
        final norm, [k, hidden]); a sequence of decoder-layer indices gives the input of each of those
        layers (index i: the state entering layer i, 0 the embeddings, ``num_layers`` the last
        layer's output after the final norm), concatenated in that order ([k, len(layers) × hidden]).
        ``mask_embedding`` ([hidden]): the input of every row whose token is ``MASK_ROW`` (a mask
        token a parallel draft learned, which its vocabulary lacks); such rows are cached as
        ``MASK_ROW`` and are the caller's to crop.
        """
        k = len(tokens)
        past = len(self._tokens)
        ids = torch.tensor([list(tokens)], dtype=torch.long)
        if mask_embedding is None:
            if MASK_ROW in tokens:
                raise ValueError("a MASK_ROW token needs mask_embedding")
            inputs: dict[str, Any] = {"input_ids": self._on_device(ids)}
        else:
            embeds = self.model.get_input_embeddings()(self._on_device(ids.clamp_min(0)))  # [1, k, hidden]
            row = mask_embedding.to(embeds.device, embeds.dtype)
            inputs = {"inputs_embeds": torch.where(self._on_device(ids == MASK_ROW)[..., None], row, embeds)}
        kwargs: dict[str, Any] = {self._cache_keyword: self._cache, "use_cache": True, **inputs}
        if tree_mask is not None:
            allowed = torch.ones(k, past + k, dtype=torch.bool)
            allowed[:, past + k - tree_mask.shape[1] :] = tree_mask
            query_positions = cast(torch.Tensor, positions) + past  # [k] (a tree forward passes positions)
            kwargs["attention_mask"] = self._tree_attention_mask(allowed, query_positions)
            kwargs["position_ids"] = self._on_device(query_positions[None])
            new_positions: Sequence[int] = query_positions.tolist()
        else:
            new_positions = range(past, past + k)
        layers = None if isinstance(hidden, bool) else tuple(int(i) for i in hidden)
        if layers is not None and any(not 0 <= i <= self.num_layers for i in layers):
            raise ValueError(f"hidden layers must lie in [0, {self.num_layers}], got {list(layers)}")
        if layers is not None:
            kwargs["output_hidden_states"] = True
        self.num_forwards += 1
        if self.vocab_subset is not None and logits_from < k:
            base = self.model.base_model(**kwargs)
            last = base.last_hidden_state[0]  # after the norm
            rows = cast(PackedMatrix, self._head_subset)(last[logits_from:]).float()  # set with vocab_subset
            out_logits = torch.full((k - logits_from, self.vocab_size), float("-inf"), device=rows.device)
            out_logits[:, self._subset_index] = rows
            out_hidden = _layer_inputs(base.hidden_states, layers) if layers else (last if hidden else None)
        elif logits_from >= k and not hidden:
            self.model.base_model(**kwargs)
            out_logits = torch.empty(0, self.vocab_size, device=self.device)
            out_hidden = None
        else:
            kwargs.setdefault("output_hidden_states", bool(hidden))
            out = self.model(logits_to_keep=max(k - logits_from, 1), **kwargs)
            out_logits = (
                out.logits[0, -(k - logits_from) :].float()
                if k > logits_from
                else torch.empty(0, self.vocab_size, device=out.logits.device)
            )
            out_hidden = (
                _layer_inputs(out.hidden_states, layers) if layers else (out.hidden_states[-1][0] if hidden else None)
            )
        self._tokens.extend(int(t) for t in tokens)
        self._positions.extend(new_positions)
        return ModelOutput(logits=out_logits, hidden_states=out_hidden)
