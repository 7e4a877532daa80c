"""The block draft network (DFlash-style, arXiv 2602.06036), in plain torch.

One forward drafts a whole block. Its inputs:

- **the context**: the target's states at the committed tokens whose target forward has run (every
  committed token but the last), the inputs of a few target decoder layers (``target_layers``,
  shallow to deep) concatenated and fused by ``fc`` into one feature per position. Each draft layer
  projects the context features (after ``context_norm``) with its own key and value projections: the
  context enters every layer as keys and values only, so the draft attends to the target's view of
  the text, never to its own embeddings of it. These keys and values depend on nothing drafted, so
  the drafter keeps them across steps (``ContextCache``) and only appends, projecting a step's new rows
  when it next drafts.
- **the block**: the last committed token (its feature is not known yet), then the tokens already
  drafted in this step on the main path (``known``: a further block is conditioned on them), then
  ``block`` mask rows (one learned embedding). Row j sits at position ``len(committed) - 1 + j``.
  Each row's input joins its embedding with the latest context feature (``inject``, as EAGLE's fc
  joins a token with a feature): a direct path from the target's newest state, which a small draft
  trained briefly learns far faster than through attention alone. Every block row sees every
  context row and every block row (not causal).

The mask rows' outputs, after the final norm, go through the target's output layer restricted to
``subset`` (the draft's vocabulary, the target's rows: not stored): mask row i predicts the token
at its own position, so one forward gives ``block`` distributions. The target's embeddings are
shared too; only fc, the layers, the norms and the mask embedding are stored.

The published DFlash drafts (z-lab/dflash, speculators, vLLM's ``qwen3_dflash.py``) are this network
with ``inject`` off (a row's input is its embedding alone), ``qk_norm`` on (Qwen3's RMS norm over each
head of q and k, before the rotation, context keys included) and the mask rows' embedding that of a
mask token; a speculators checkpoint may carry an output layer of its own (``own_head``). published.py
reads them into this class.

Example (committed ``a b c``, features of ``a b`` known, block 3, nothing drafted yet)::

    context rows:  f(a)@0  f(b)@1
    block rows:    c@2  m@3  m@4  m@5   ->  m@3 predicts x3, m@4 x4, m@5 x5
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, Optional

import attrs
import torch
from torch import nn
from torch.nn import functional as F

from pacer_core.draft_folders import CONFIG, WEIGHTS, save_draft_folder
from pacer_core.draft_folders import draft_identity as folder_identity
from pacer_core.errors import InputError
from pacer_core.jsonfile import read_json

FAMILY = "dflash"


@attrs.define
class BlockArch:
    """The block draft's shape (``config.json`` beside its weights)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_eps: float
    vocab_size: int  # the target's
    subset_size: int  # rows of the target's output layer the draft predicts over
    target_layers: List[int] = attrs.field(factory=list)  # target decoder layers whose inputs fc fuses
    num_layers: int = 2  # draft decoder layers
    block: int = 4  # mask rows it was trained to fill (a drafter may ask for fewer)
    # the published DFlash architecture (z-lab/dflash, vLLM's and speculators' Qwen3 DFlash layers) is
    # inject false, qk_norm true; a checkpoint with a head of its own (speculators) own_head true
    inject: bool = True  # each block row joins its embedding with the newest context feature (ours)
    qk_norm: bool = False  # an RMS norm over each head of q and k before the rotation
    own_head: bool = False  # an output layer of its own over the subset (else the target's rows)
    mask_token_id: Optional[int] = None  # the token whose embedding the mask rows take (published drafts)

    def __attrs_post_init__(self) -> None:
        sizes = {
            "hidden_size": self.hidden_size,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "subset_size": self.subset_size,
            "num_layers": self.num_layers,
            "block": self.block,
        }
        for name, value in sizes.items():
            top = 64 if name in ("num_layers", "block") else 1 << 20  # a meta network of the shape is built
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ValueError(f"{name} must be a whole number in 1..{top}, got {value!r}")
        if self.num_heads % self.num_kv_heads or not self.target_layers:
            raise ValueError("num_heads must be a multiple of num_kv_heads, and target_layers non-empty")
        if not isinstance(self.target_layers, list) or any(type(i) is not int for i in self.target_layers):
            raise ValueError(f"target_layers must be a list of layer numbers, got {self.target_layers!r:.60}")
        for name in ("inject", "qk_norm", "own_head"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r:.30}")
        if self.mask_token_id is not None and (
            type(self.mask_token_id) is not int or not 0 <= self.mask_token_id < self.vocab_size
        ):
            raise ValueError(f"mask_token_id must be a token id of the vocabulary, got {self.mask_token_id!r:.30}")
        for name in ("rope_theta", "rms_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r:.30}")

    @property
    def fused_size(self) -> int:
        return len(self.target_layers) * self.hidden_size


def init_scale(arch: BlockArch) -> float:
    """The std the output projections start with, scaled down by depth (GPT-2's rule)."""
    return 0.02 / math.sqrt(2 * arch.num_layers)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMS norm, computed in float32 and scaled in x's dtype."""
    wide = x.float()
    return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding, half-split layout (Llama's): x [..., T, head_dim] at ``positions`` [T]."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = positions.to(x.device).float()[:, None] * freqs[None]  # [T, half]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    low, high = x[..., :half], x[..., half:]
    return torch.cat([low * cos - high * sin, high * cos + low * sin], dim=-1)


class BlockLayer(nn.Module):
    """One pre-norm Llama decoder layer whose keys and values also cover the context features."""

    def __init__(self, arch: BlockArch):
        super().__init__()
        d, h, kv, hd = arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim
        self.input_norm = nn.Parameter(torch.ones(d))
        self.q_proj = nn.Linear(d, h * hd, bias=False)
        self.k_proj = nn.Linear(d, kv * hd, bias=False)
        self.v_proj = nn.Linear(d, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        if arch.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(hd))
            self.k_norm = nn.Parameter(torch.ones(hd))
        self.post_norm = nn.Parameter(torch.ones(d))
        self.gate_proj = nn.Linear(d, arch.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, arch.intermediate_size, bias=False)
        self.down_proj = nn.Linear(arch.intermediate_size, d, bias=False)


class ContextCache:
    """Each draft layer's keys and values of the context rows fed so far ([kv_heads, T, head_dim]);
    they depend only on the target's states, so they are appended to and never recomputed.

    ``pending``: the target's states of the rows after those, observed but not yet projected
    ([t, n·d] each, in order): the drafter projects them all in one ``extend_context`` before its next
    forward, so a step the draft gate decodes plainly costs the draft nothing."""

    def __init__(self, layers: int):
        self.keys: list[Optional[torch.Tensor]] = [None] * layers
        self.values: list[Optional[torch.Tensor]] = [None] * layers
        self.latest: Optional[torch.Tensor] = None  # [d]: the last context row's feature (the block reads it)
        self.pending: list[torch.Tensor] = []

    def __len__(self) -> int:
        return 0 if self.keys[0] is None else int(self.keys[0].shape[1])

    @property
    def known(self) -> int:
        """The rows whose target states are held: projected, then pending."""
        return len(self) + sum(int(rows.shape[0]) for rows in self.pending)

    def crop(self, length: int) -> None:
        """Keep the first ``length`` rows, projected or pending."""
        if length < len(self):
            self.keys = [k[:, :length] for k in self.keys]
            self.values = [v[:, :length] for v in self.values]
            self.latest = None  # until rows are appended again
            self.pending = []
            return
        room, kept = length - len(self), []
        for rows in self.pending:
            if room <= 0:
                break
            kept.append(rows[:room])
            room -= int(kept[-1].shape[0])
        self.pending = kept

    def take_pending(self) -> Optional[torch.Tensor]:
        """The pending rows in one tensor ([t, n·d]; None when there are none), no longer pending."""
        rows, self.pending = self.pending, []
        return None if not rows else rows[0] if len(rows) == 1 else torch.cat(rows)

    def append(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        old_k, old_v = self.keys[layer], self.values[layer]
        self.keys[layer] = keys if old_k is None else torch.cat([old_k, keys], dim=1)
        self.values[layer] = values if old_v is None else torch.cat([old_v, values], dim=1)


class BlockDraft(nn.Module):
    """fc(target layers' inputs) → context features; ``num_layers`` decoder layers over the block rows,
    each attending to the context's keys and values and to all block rows; a final norm. Logits come
    from the target's output layer over ``subset`` (the drafter's, or the trainer's)."""

    model_work = ("extend_context", "block_inputs")  # model time outside forward (pacer_bench.hosttime)

    def __init__(self, arch: BlockArch):
        super().__init__()
        self.arch = arch
        d = arch.hidden_size
        self.fc = nn.Linear(arch.fused_size, d, bias=False)
        self.context_norm = nn.Parameter(torch.ones(d))
        self.mask_embedding = nn.Parameter(torch.zeros(d))
        if arch.inject:
            self.inject = nn.Linear(2 * d, d, bias=False)  # [a row's embedding; the latest context feature]
        self.layers = nn.ModuleList([BlockLayer(arch) for _ in range(arch.num_layers)])
        self.norm = nn.Parameter(torch.ones(d))
        if arch.own_head:
            self.lm_head = nn.Linear(d, arch.subset_size, bias=False)
        self.register_buffer("subset", torch.zeros(arch.subset_size, dtype=torch.long))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
        for layer in self.layers:  # what writes into the residual stream starts small (GPT-2's rule)
            nn.init.normal_(layer.o_proj.weight, std=init_scale(arch))
            nn.init.normal_(layer.down_proj.weight, std=init_scale(arch))

    # -- the context ---------------------------------------------------------------------------
    def context_features(self, fused: torch.Tensor) -> torch.Tensor:
        """[..., T, n·d] the target layers' inputs → [..., T, d] normed context features."""
        return rms_norm(self.fc(fused), self.context_norm, self.arch.rms_eps)

    def context_kv(
        self, layer: BlockLayer, features: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's keys and values of context features [B, T, d] at ``positions`` [T] →
        ([B, kv_heads, T, head_dim] rotated keys, values)."""
        a = self.arch
        b, t, _ = features.shape
        k = self.head_norm(layer, "k", layer.k_proj(features).view(b, t, a.num_kv_heads, a.head_dim)).transpose(1, 2)
        v = layer.v_proj(features).view(b, t, a.num_kv_heads, a.head_dim).transpose(1, 2)
        return rotate(k, positions, a.rope_theta), v

    def head_norm(self, layer: BlockLayer, which: str, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., heads, head_dim] (q or k of ``layer``) with each head RMS-normed when the arch
        has ``qk_norm`` (Qwen3's layers, the published DFlash drafts), else unchanged."""
        if not self.arch.qk_norm:
            return x
        return rms_norm(x, getattr(layer, f"{which}_norm"), self.arch.rms_eps)

    def extend_context(self, cache: ContextCache, fused: torch.Tensor) -> None:
        """Append the context rows of ``fused`` [T, n·d] (the next positions after the cached ones)."""
        start = len(cache)
        positions = torch.arange(start, start + fused.shape[0])
        features = self.context_features(fused)[None]
        for i, layer in enumerate(self.layers):
            k, v = self.context_kv(layer, features, positions)
            cache.append(i, k[0], v[0])
        cache.latest = features[0, -1]

    # -- the block -----------------------------------------------------------------------------
    def block_inputs(self, embeds: torch.Tensor, masks: int, latest: torch.Tensor) -> torch.Tensor:
        """The block rows' inputs: [..., R, d] embeddings of the known tokens, then ``masks`` mask rows,
        each joined with ``latest`` [..., d] (the context feature of the last position whose target
        state is known: the one before the block) → [..., R + masks, d]."""
        mask = self.mask_embedding.to(embeds.dtype).expand(*embeds.shape[:-2], masks, embeds.shape[-1])
        rows = torch.cat([embeds, mask], dim=-2)
        return self.join(rows, latest.unsqueeze(-2).expand(rows.shape))

    def join(self, rows: torch.Tensor, latest: torch.Tensor) -> torch.Tensor:
        """[..., R, d] row embeddings and [..., R, d] the latest context feature of each → inputs (the
        embeddings themselves without ``inject``, as in the published DFlash drafts)."""
        if not self.arch.inject:
            return rows
        return self.inject(torch.cat([rows, latest], dim=-1))

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        context: list[tuple[torch.Tensor, torch.Tensor]],
        mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Block rows x [B, R, d] at ``positions`` [R] → their outputs after the final norm [B, R, d].

        ``context[i]``: layer i's context keys and values ([B or 1, kv_heads, T, head_dim]);
        ``mask`` [R, T + R] bool (True = may attend) over the context rows, then the block rows;
        None: every row sees everything (one block at inference)."""
        a = self.arch
        b, r, _ = x.shape
        groups = a.num_heads // a.num_kv_heads
        for layer, (ctx_k, ctx_v) in zip(self.layers, context):
            h = rms_norm(x, layer.input_norm, a.rms_eps)
            q = self.head_norm(layer, "q", layer.q_proj(h).view(b, r, a.num_heads, a.head_dim))
            k = self.head_norm(layer, "k", layer.k_proj(h).view(b, r, a.num_kv_heads, a.head_dim))
            q = rotate(q.transpose(1, 2), positions, a.rope_theta)
            k = rotate(k.transpose(1, 2), positions, a.rope_theta)
            v = layer.v_proj(h).view(b, r, a.num_kv_heads, a.head_dim).transpose(1, 2)
            keys = torch.cat([ctx_k.expand(b, -1, -1, -1), k], dim=2).repeat_interleave(groups, dim=1)
            values = torch.cat([ctx_v.expand(b, -1, -1, -1), v], dim=2).repeat_interleave(groups, dim=1)
            allowed = None if mask is None else mask.to(q.device)
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)
            x = x + layer.o_proj(attn.transpose(1, 2).reshape(b, r, -1))
            h = rms_norm(x, layer.post_norm, a.rms_eps)
            x = x + layer.down_proj(F.silu(layer.gate_proj(h)) * layer.up_proj(h))
        return rms_norm(x, self.norm, a.rms_eps)


def save_block_draft(net: BlockDraft, folder: Path, manifest: dict) -> None:
    """A block draft folder (``pacer_core.draft_folders``): ``draft.safetensors`` (fp16 weights and
    the ``subset`` buffer), ``config.json`` (``family: dflash`` and the ``BlockArch``), ``manifest.json``."""
    save_draft_folder(net, folder, {"family": FAMILY, **attrs.asdict(net.arch)}, manifest)


def expected_shapes(arch: BlockArch) -> dict[str, tuple[int, ...]]:
    """Every tensor a ``BlockDraft`` of ``arch`` holds and its shape (checked against a weights file's
    header before the network is built): read from a network built on the meta device (no memory)."""
    with torch.device("meta"):
        return {name: tuple(t.shape) for name, t in BlockDraft(arch).state_dict().items()}


def draft_identity(folder: Path, manifest: dict) -> str:
    """Names a block draft folder for components trained on its drafts (PACER's M_B): the digest of
    the target it was distilled from (``manifest``'s) and a hash of its weights file."""
    return folder_identity(FAMILY, folder, manifest)


def load_block_draft(folder: Path) -> BlockDraft:
    """The network of a block draft folder (float32, eval mode). Its config is checked against the
    weights' shapes before anything is allocated; a damaged folder is one ``InputError``."""
    from pacer_core.hf import load_safetensors, safetensors_shapes

    fix = "distill the draft again (`pacer distill student.kind=dflash`), or reinstall for the shipped one"
    config = read_json(folder / CONFIG, "block draft config", fix)
    if not isinstance(config, dict) or config.pop("family", None) != FAMILY:
        raise InputError(f"'{folder / CONFIG}' is not a dflash block draft's config (family: {FAMILY}): {fix}")
    try:
        arch = BlockArch(**config)
        shapes = expected_shapes(arch)
    except (TypeError, ValueError) as exc:
        raise InputError(
            f"'{folder / CONFIG}' does not describe a block draft ({str(exc).splitlines()[0][:120]}): {fix}"
        ) from None
    header = safetensors_shapes(folder / WEIGHTS, fix)
    wrong = sorted(set(shapes) ^ set(header)) or [k for k in shapes if shapes[k] != header[k]]
    if wrong:
        raise InputError(f"'{folder / WEIGHTS}' does not match its config.json (tensor '{wrong[0]}'): {fix}")
    net = BlockDraft(arch)
    state = load_safetensors(folder / WEIGHTS, fix)
    net.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    if not bool(((net.subset >= 0) & (net.subset < arch.vocab_size)).all()):
        raise InputError(f"'{folder / WEIGHTS}' holds a subset of token ids outside 0..{arch.vocab_size - 1}: {fix}")
    return net.eval()
