"""The feature-level draft networks (EAGLE family), in plain torch.

``FeatureDraft`` (EAGLE-1 style, also the layout of published EAGLE-1/2 checkpoints): at position t
it reads the target's last-layer hidden state f_t (after the final norm) and the embedding of the
next token x_{t+1}, and predicts f_{t+1}; the target's own output layer (restricted to a
frequent-token subset of the vocabulary for the drafts `pacer distill` makes, the full one for
EAGLE checkpoints) turns the predicted feature into draft logits for x_{t+2}. Only the small
network (fc + one decoder layer, or more with ``extra_layers``) is stored; the embeddings and the
output layer are the target's.

``Eagle3Draft`` (EAGLE-3): the true rows read several target layers (three) fused by ``fc``, the
layer attends over [norm(embedding); norm(feature)], and the draft has its own norm and output
layer over a reduced vocabulary (see published.py for the checkpoint layout; ``pacer distill
student.kind=eagle3`` trains one, its config recording ``target_layers``).

Both keep ``subset``, the target id of each draft logit, with their weights (``save_draft`` /
``load_draft``: the folder format of ``pacer distill``). ``UnrolledKeys`` lets one forward per step
train k draft steps of every row at once (the training-time test).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, Optional, Union

import attrs
import torch
from torch import nn
from torch.nn import functional as F

from pacer_core.draft_folders import CONFIG, WEIGHTS, save_draft_folder
from pacer_core.errors import InputError
from pacer_core.jsonfile import read_json

from .rotary import Rotary


@attrs.define
class ArchConfig:
    hidden_size: int = 576
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    intermediate_size: int = 1536
    rope_theta: float = 100000.0
    rms_eps: float = 1e-5
    vocab_size: int = 49152  # the target's
    subset_size: int = 8192  # draft head: the most frequent corpus tokens
    input_norm: bool = True  # RMS norm before attention (EAGLE-1 checkpoints have none in layer 0)
    fc_bias: bool = False  # fc has a bias (EAGLE-1 checkpoints: their config's `bias`, default true)
    extra_layers: int = 0  # decoder layers after the first (a deeper draft; EAGLE's has none)
    qkv_bias: bool = False  # q/k/v projections have biases (EAGLE checkpoints whose config says qkv_bias)
    rope_scaling: Optional[dict] = None  # a Llama config's rope_scaling (rotary.py); None: plain rotary
    max_position_embeddings: int = 2048  # read by rope_scaling types dynamic and yarn only


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised in float32, then scaled in x's dtype (as Llama and EAGLE do in bf16/fp16)."""
        wide = x.float()
        return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: Union[float, Rotary]) -> torch.Tensor:
    """Rotary embedding (half-split layout) for x: [..., T, head_dim], positions: [T]; ``theta``: θ of
    plain rotary embeddings, or a ``Rotary`` with a scaling."""
    half = x.shape[-1] // 2
    if isinstance(theta, Rotary):
        cos, sin = theta.cos_sin(2 * half, positions, x.device)  # [T, half]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    else:
        freqs = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
        angles = positions.to(x.device).float()[:, None] * freqs[None]  # [T, half]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class KVCache:
    """Keys and values of the draft layer for the positions fed so far; cropped on rollback. A deeper
    draft's later layers keep theirs in ``layer(i)``, cropped with this one."""

    def __init__(self):
        self.keys: Optional[torch.Tensor] = None  # [kv_heads, T, head_dim]
        self.values: Optional[torch.Tensor] = None
        self.deeper: list[KVCache] = []  # the caches of decoder layers 1, 2, ...

    def layer(self, i: int) -> "KVCache":
        """The cache of decoder layer i ≥ 1 (created on first use)."""
        while len(self.deeper) < i:
            self.deeper.append(KVCache())
        return self.deeper[i - 1]

    def __len__(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[1])

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = torch.cat([self.keys, keys], dim=1)
            self.values = torch.cat([self.values, values], dim=1)
        return self.keys, self.values

    def crop(self, length: int) -> None:
        if self.keys is not None and length < len(self):
            self.keys, self.values = self.keys[:, :length], self.values[:, :length]
        for cache in self.deeper:
            cache.crop(length)


class UnrolledKeys:
    """Keys and values of the draft layer over the unrolled steps of a training-time test (HASS,
    EAGLE-3): every row t of a sequence is drafted ahead k times in one batch. Step 1 rows are fed
    with the target's features; row t of step j ≥ 2 with step j−1's prediction of row t, at position
    t + j − 1. Row t of step j attends to the step-1 rows 0..t (causal) and to its own rows of steps
    2..j (the diagonal): exactly the rows the drafter's cache holds when it drafts token j after
    position t. Batches of any size (``KVCache`` holds one sequence)."""

    def __init__(self):
        self.keys: list[torch.Tensor] = []  # per step: [B, kv_heads, T, head_dim]
        self.values: list[torch.Tensor] = []
        self.deeper: list[UnrolledKeys] = []  # those of decoder layers 1, 2, ... (a deeper draft)

    def layer(self, i: int) -> "UnrolledKeys":
        """The keys of decoder layer i ≥ 1 (created on first use)."""
        while len(self.deeper) < i:
            self.deeper.append(UnrolledKeys())
        return self.deeper[i - 1]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int) -> torch.Tensor:
        """q: [B, heads, T, hd]; k, v: [B, kv_heads, T, hd] of this step (rotated) → [B, heads, T, hd]."""
        self.keys.append(k)
        self.values.append(v)
        t = q.shape[2]
        scale = q.shape[-1] ** -0.5
        first_k = self.keys[0].repeat_interleave(groups, dim=1)
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        scores = (q @ first_k.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # [B, H, T, T]
        diagonal = [
            (q * key.repeat_interleave(groups, dim=1)).sum(-1, keepdim=True) * scale for key in self.keys[1:]
        ]  # each [B, H, T, 1]: row t of an earlier step j ≥ 2
        weights = torch.softmax(torch.cat([scores, *diagonal], dim=-1).float(), dim=-1).to(q.dtype)
        out = weights[..., :t] @ self.values[0].repeat_interleave(groups, dim=1)
        for i, value in enumerate(self.values[1:]):
            out = out + weights[..., t + i : t + i + 1] * value.repeat_interleave(groups, dim=1)
        return out


def attend(
    layer: nn.Module,
    h: torch.Tensor,
    positions: torch.Tensor,
    cache: Optional[KVCache],
    mask: Optional[torch.Tensor],
    shape: tuple[int, int, int, float],
) -> torch.Tensor:
    """Self-attention of ``layer`` (its q/k/v/o_proj) over h: [B, T, in] → [B, T, d], appending the
    new keys and values to ``cache`` (B = 1 then; an ``UnrolledKeys`` takes batches and its own
    mask). ``shape`` = (heads, kv_heads, head_dim, rope θ); ``mask`` as in ``FeatureDraft.forward``
    (None: causal, every cached row visible)."""
    heads, kv_heads, head_dim, theta = shape
    b, t, _ = h.shape
    q = layer.q_proj(h).view(b, t, heads, head_dim).transpose(1, 2)
    k = layer.k_proj(h).view(b, t, kv_heads, head_dim).transpose(1, 2)
    v = layer.v_proj(h).view(b, t, kv_heads, head_dim).transpose(1, 2)
    q, k = rope(q, positions, theta), rope(k, positions, theta)
    if isinstance(cache, UnrolledKeys):
        return layer.o_proj(cache.attend(q, k, v, heads // kv_heads).transpose(1, 2).reshape(b, t, -1))
    past = 0
    if cache is not None:
        past = len(cache)
        keys, values = cache.append(k[0], v[0])
        k, v = keys[None], values[None]
    groups = heads // kv_heads
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if mask is None:
        allowed = torch.ones(t, past + t, dtype=torch.bool).tril(past)
    elif mask.shape[-1] == past + t:
        allowed = mask
    else:
        allowed = torch.cat([torch.ones(t, past, dtype=torch.bool), mask.cpu()], dim=1)
    attn = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed.to(q.device))
    return layer.o_proj(attn.transpose(1, 2).reshape(b, t, -1))


def decoder_block(
    layer: nn.Module,
    x: torch.Tensor,
    positions: torch.Tensor,
    cache,
    mask: Optional[torch.Tensor],
    shape: tuple[int, int, int, float],
) -> torch.Tensor:
    """One pre-norm Llama decoder layer (``layer``'s input_norm, q/k/v/o_proj, post_norm and
    gate/up/down_proj) over x: [B, T, d]; ``cache``, ``mask`` and ``shape`` as in ``attend``."""
    x = x + attend(layer, layer.input_norm(x), positions, cache, mask, shape)
    h = layer.post_norm(x)
    return x + layer.down_proj(F.silu(layer.gate_proj(h)) * layer.up_proj(h))


def add_decoder_weights(module: nn.Module, arch: "ArchConfig", input_norm: bool = True) -> None:
    """Give ``module`` the weights ``decoder_block`` reads (``input_norm`` False: no norm before
    attention, as layer 0 of EAGLE-1 checkpoints)."""
    d, h, kv, hd = arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim
    module.input_norm = RMSNorm(d, arch.rms_eps) if input_norm else nn.Identity()
    module.q_proj = nn.Linear(d, h * hd, bias=arch.qkv_bias)
    module.k_proj = nn.Linear(d, kv * hd, bias=arch.qkv_bias)
    module.v_proj = nn.Linear(d, kv * hd, bias=arch.qkv_bias)
    module.o_proj = nn.Linear(h * hd, d, bias=False)
    module.post_norm = RMSNorm(d, arch.rms_eps)
    module.gate_proj = nn.Linear(d, arch.intermediate_size, bias=False)
    module.up_proj = nn.Linear(d, arch.intermediate_size, bias=False)
    module.down_proj = nn.Linear(arch.intermediate_size, d, bias=False)


class DecoderLayer(nn.Module):
    """A deeper draft's later decoder layer (``ArchConfig.extra_layers``)."""

    def __init__(self, arch: "ArchConfig"):
        super().__init__()
        add_decoder_weights(self, arch)

    def start_as_identity(self) -> None:
        """Zero the projections that write into the residual stream (o_proj, down_proj): the layer
        then passes its input through unchanged, so a draft grown by it predicts what it did before
        (``pacer distill init=`` a shallower draft), and training moves it from there."""
        with torch.no_grad():
            self.o_proj.weight.zero_()
            self.down_proj.weight.zero_()


class FeatureDraft(nn.Module):
    """fc(concat(embedding(x_{t+1}), f_t)) → ``1 + extra_layers`` pre-norm decoder layers →
    predicted f_{t+1}. The first layer's weights sit on the module itself (the layout of published
    EAGLE-1 checkpoints), later ones in ``extra``."""

    model_work = ("fuse",)  # model time outside forward (pacer_bench.hosttime)

    def __init__(self, arch: ArchConfig):
        super().__init__()
        self.arch = arch
        self.rotary = rotary_of(arch)
        self.fc = nn.Linear(2 * arch.hidden_size, arch.hidden_size, bias=arch.fc_bias)
        add_decoder_weights(self, arch, arch.input_norm)
        self.extra = nn.ModuleList([DecoderLayer(arch) for _ in range(arch.extra_layers)])
        self.register_buffer("subset", torch.zeros(arch.subset_size, dtype=torch.long))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    def forward(
        self,
        token_embeds: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        cache: Optional[KVCache] = None,
        mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Predicted next features. token_embeds, features: [B, T, d] (or [T, d] with a cache);
        positions: [T]; ``mask`` (True = may attend) replaces the causal mask: [T, T] over the new
        rows (every cached row visible) or [T, past + T] over the cached rows too (a token tree).
        Every layer sees the same rows, positions and mask."""
        squeeze = token_embeds.dim() == 2
        if squeeze:
            token_embeds, features = token_embeds[None], features[None]
        a = self.arch
        shape = (a.num_heads, a.num_kv_heads, a.head_dim, self.rotary)
        x = self.fc(torch.cat([token_embeds, features], dim=-1))  # EAGLE-1: cat((embeds, features))
        x = decoder_block(self, x, positions, cache, mask, shape)
        for i, layer in enumerate(self.extra, start=1):
            x = decoder_block(layer, x, positions, None if cache is None else cache.layer(i), mask, shape)
        return x[0] if squeeze else x

    def fuse(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """The feature a row fed with the target's hidden states reads: the states themselves."""
        return target_hidden

    # -- storage -----------------------------------------------------------------------------
    def save(self, folder: Path, manifest: dict) -> None:
        save_draft(self, folder, manifest)

    @classmethod
    def load(cls, folder: Path) -> "FeatureDraft":
        net = load_draft(folder)
        if not isinstance(net, cls):
            raise InputError(f"'{folder}' holds an {type(net).__name__}, not a FeatureDraft")
        return net


def rotary_of(arch) -> Union[float, Rotary]:
    """What ``rope`` rotates a draft layer with: θ alone, or a ``Rotary`` when the arch has a scaling."""
    if arch.rope_scaling is None:
        return arch.rope_theta
    return Rotary.parse(
        arch.rope_theta,
        arch.rope_scaling,
        arch.max_position_embeddings,
        lambda message: InputError(f"draft rope_scaling: {message}"),
    )


def head_logits(features: torch.Tensor, head_weight_subset: torch.Tensor) -> torch.Tensor:
    """Draft logits over the vocabulary subset: features [..., d] @ W_subset.T → [..., subset]."""
    return features @ head_weight_subset.T


@attrs.define
class Eagle3Arch:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_eps: float
    draft_vocab_size: int  # rows of the draft's own output layer
    fused_size: int  # width of the fused target states fc reads (3 × the target's hidden size)
    vocab_size: int = 0  # the target's (drafts `pacer distill` makes; 0 = not recorded, published ones)
    target_layers: List[int] = attrs.field(factory=list)  # target decoder layers whose inputs fc reads
    # (drafts `pacer distill` makes; [] = published ones, which read EAGLE-3's 2, L // 2, L − 3)
    qkv_bias: bool = False  # as ArchConfig's
    rope_scaling: Optional[dict] = None
    max_position_embeddings: int = 2048


class Eagle3Draft(nn.Module):
    """EAGLE-3's draft network (SafeAILab/EAGLE ``eagle/model/cnets.py``), one layer:

    g_t = fc([l_a; l_b; l_c]_t) for rows fed with the target's states (three layers' inputs), else the
    predicted g of the row before; a_t = [input_norm(embed(x_{t+1})); hidden_norm(g_t)] (2d wide)
    feeds q/k/v; ĝ = g_t + attn(a_t); ĝ += mlp(post_norm(ĝ)). Draft logits = lm_head(norm(ĝ)) over
    the draft vocabulary (``d2t`` maps it to target ids in the drafter)."""

    def __init__(self, arch: Eagle3Arch):
        super().__init__()
        self.arch = arch
        self.rotary = rotary_of(arch)
        d, h, kv, hd = arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim
        self.fc = nn.Linear(arch.fused_size, d, bias=False)
        self.hidden_norm = RMSNorm(d, arch.rms_eps)
        self.input_norm = RMSNorm(d, arch.rms_eps)
        self.q_proj = nn.Linear(2 * d, h * hd, bias=arch.qkv_bias)
        self.k_proj = nn.Linear(2 * d, kv * hd, bias=arch.qkv_bias)
        self.v_proj = nn.Linear(2 * d, kv * hd, bias=arch.qkv_bias)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.post_norm = RMSNorm(d, arch.rms_eps)
        self.gate_proj = nn.Linear(d, arch.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, arch.intermediate_size, bias=False)
        self.down_proj = nn.Linear(arch.intermediate_size, d, bias=False)
        self.norm = RMSNorm(d, arch.rms_eps)
        self.lm_head = nn.Linear(d, arch.draft_vocab_size, bias=False)
        self.register_buffer("subset", torch.zeros(arch.draft_vocab_size, dtype=torch.long))  # target id per head row
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    def fuse(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[k, fused] target states (three layers, concatenated) → [k, d] features."""
        return self.fc(target_hidden)

    def forward(
        self,
        token_embeds: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        cache: Optional[KVCache] = None,
        mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Predicted next features; arguments as ``FeatureDraft.forward`` (features already fused)."""
        squeeze = token_embeds.dim() == 2
        if squeeze:
            token_embeds, features = token_embeds[None], features[None]
        a = self.arch
        h = torch.cat([self.input_norm(token_embeds), self.hidden_norm(features)], dim=-1)  # [B, T, 2d]
        x = features + attend(self, h, positions, cache, mask, (a.num_heads, a.num_kv_heads, a.head_dim, self.rotary))
        h = self.post_norm(x)
        x = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return x[0] if squeeze else x

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """[k, d] → [k, draft_vocab]: the draft's own head after its final norm."""
        return self.lm_head(self.norm(features))

    def save(self, folder: Path, manifest: dict) -> None:
        save_draft(self, folder, manifest)


FAMILIES = {"feature_draft": (FeatureDraft, ArchConfig), "eagle3": (Eagle3Draft, Eagle3Arch)}
# each family's sizes (a config key, or keys whose product it is) and the tensor dimension of its
# weights holding each, and its repeated layers (key, tensor prefix): compared with the weights'
# header before a network is built from a config (load_draft)
_ATTENTION = (("num_heads", "head_dim"), "q_proj.weight", 0), (("num_kv_heads", "head_dim"), "k_proj.weight", 0)
SIZES = {
    "feature_draft": (
        (("hidden_size",), "fc.weight", 0),
        (("intermediate_size",), "gate_proj.weight", 0),
        *_ATTENTION,
        (("subset_size",), "subset", 0),
    ),
    "eagle3": (
        (("hidden_size",), "fc.weight", 0),
        (("fused_size",), "fc.weight", 1),
        (("intermediate_size",), "gate_proj.weight", 0),
        *_ATTENTION,
        (("draft_vocab_size",), "lm_head.weight", 0),
        (("draft_vocab_size",), "subset", 0),
    ),
}
LAYERS = {"feature_draft": (("extra_layers", "extra."),), "eagle3": ()}


def save_draft(net: nn.Module, folder: Path, manifest: dict) -> None:
    """A draft folder `pacer distill` writes (``pacer_core.draft_folders``): ``draft.safetensors``
    (fp16 weights and the ``subset`` buffer: the target id of each draft logit), ``config.json``
    (``family`` and the architecture), ``manifest.json``."""
    family = next(name for name, (cls, _) in FAMILIES.items() if type(net) is cls)
    save_draft_folder(net, folder, {"family": family, **attrs.asdict(net.arch)}, manifest)


def load_draft(folder: Path) -> nn.Module:
    """The network of a draft folder `pacer distill` wrote (``FeatureDraft`` or ``Eagle3Draft``, float32,
    eval mode); an unknown family or a damaged file is one ``InputError``."""
    from pacer_core.hf import load_safetensors, safetensors_shapes

    fix = "distill the draft again (`pacer distill`), or reinstall for the shipped one"
    config = read_json(folder / CONFIG, "draft config", fix)
    family = config.pop("family", "feature_draft")
    if family not in FAMILIES:
        raise InputError(
            f"'{folder / CONFIG}' names draft family {family!r}, which this version does not read "
            f"({', '.join(FAMILIES)}): update pacer-sd or distill the draft again"
        )
    cls, arch_cls = FAMILIES[family]
    check_draft_sizes(folder, family, config, safetensors_shapes(folder / WEIGHTS, fix), fix)
    try:
        model = cls(arch_cls(**config))
    except (TypeError, ValueError, ZeroDivisionError, RuntimeError) as exc:  # missing, unknown or bad options
        raise InputError(
            f"draft config '{folder / CONFIG}' does not describe a {family} draft "
            f"({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__}): the file is "
            f"damaged; {fix}"
        ) from None
    state = load_safetensors(folder / WEIGHTS, fix)
    try:
        model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    except RuntimeError as exc:
        raise InputError(
            f"'{folder / WEIGHTS}' does not match its config.json ({str(exc).splitlines()[0][:120]}): {fix}"
        ) from None
    return model.eval()


def check_draft_sizes(folder: Path, family: str, config: dict, shapes: dict[str, tuple[int, ...]], fix: str) -> None:
    """Every size of a draft folder's ``config`` (``SIZES``, ``LAYERS``: the family's defaults for keys
    it omits) checked against its weights' header ``shapes`` before the network is built."""
    from pacer_core.hf import check_sizes

    defaults = {f.name: f.default for f in attrs.fields(FAMILIES[family][1]) if f.default is not attrs.NOTHING}
    value = {key: config.get(key, defaults.get(key)) for keys, _, _ in SIZES[family] for key in keys}
    for key, found in value.items():
        if key not in config and key not in defaults:
            raise InputError(f"'{folder / CONFIG}' has no '{key}': the file is damaged; {fix}")
        if isinstance(found, bool) or not isinstance(found, int) or found < 0:
            raise InputError(f"'{folder / CONFIG}': {key} is {found!r}, not a whole number: the file is damaged; {fix}")
    sizes = [(" × ".join(keys), math.prod(value[k] for k in keys), tensor, dim) for keys, tensor, dim in SIZES[family]]
    layers = [(key, config.get(key, defaults.get(key)), prefix) for key, prefix in LAYERS[family]]
    check_sizes(folder / CONFIG, folder / WEIGHTS, shapes, fix, sizes, layers)


def draft_logits(net: nn.Module, features: torch.Tensor, head_weight_subset: torch.Tensor) -> torch.Tensor:
    """Draft logits over the draft vocabulary ([..., d] → [..., subset]): an ``Eagle3Draft``'s own norm
    and head, else the target's output layer restricted to the subset rows."""
    if isinstance(net, Eagle3Draft):
        return net.logits(features)
    return head_logits(features, head_weight_subset)
