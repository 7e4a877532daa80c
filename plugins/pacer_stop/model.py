"""M_B, PACER's pre-verification layer, in plain torch.

It reads the draft's hidden state of each draft token (the draft model's last-layer state, or an
EAGLE-style draft's predicted feature), projects it to a small width, adds a learned embedding of
the token's position in the current draft, runs causal self-attention over the current draft's
tokens, and predicts the probability that the verifier accepts the token (i.e. that it and every
earlier draft token are accepted):

    x_i = W_in · LayerNorm(h_i) [+ W_c · (log q(x_i), H(q_i))] + P[pos_i]
    x   = x + Attn(LN(x)) ; x = x + FFN(LN(x))          (``layers`` times, causal)
    p_i = sigmoid(w_out · LN(x_i) + b_out  [+ α · logit(Π_{j≤i} q(x_j))])

With ``confidence_prior`` the logit starts from the draft's own estimate: the head starts at zero
and α at 1, so an untrained M_B predicts the draft's cumulative confidence exactly, and training
learns a correction to it from the hidden states (and α).

Training packs many steps into one sequence with a block-diagonal causal mask (``packing_mask``);
decoding feeds each block once and keeps the keys and values of earlier draft tokens
(``IncrementalPredictor``), so a check costs one tiny forward over the new block only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional, Sequence

import attrs
import torch
from torch import nn
from torch.nn import functional as F

from pacer_core.errors import InputError
from pacer_core.jsonfile import read_json

WEIGHTS = "preverify.safetensors"
CONFIG = "config.json"
MANIFEST = "manifest.json"
FAMILY = "pacer_preverify"


@attrs.define
class PreVerifierArch:
    """M_B's shape (stored in the checkpoint's config.json)."""

    input_size: int = 576  # the draft hidden size (SmolLM2-135M: 576)
    width: int = 64
    layers: int = 1  # causal self-attention layers (0 = none: a per-token linear head)
    heads: int = 4
    ffn_size: int = 128  # feed-forward width after each attention (0 = none)
    positional: bool = True  # learned embedding of the position in the current draft (ablation: false)
    max_positions: int = 64  # positions beyond this share the last embedding
    draft_confidence: bool = False  # also read log q(x) and the entropy of q (needs draft_probs)
    confidence_prior: bool = False  # start the logit from the draft's cumulative confidence (needs draft_confidence)
    dropout: float = 0.0  # training only

    def __attrs_post_init__(self) -> None:
        if self.width < 1 or self.input_size < 1 or self.max_positions < 1 or self.layers < 0:
            raise ValueError("input_size, width and max_positions must be >= 1 and layers >= 0")
        if self.confidence_prior and not self.draft_confidence:
            raise ValueError("confidence_prior starts from the draft's confidence: set draft_confidence too")
        if self.layers and (self.heads < 1 or self.width % self.heads):
            raise ValueError(f"width ({self.width}) must be a multiple of heads ({self.heads})")


class AttentionLayer(nn.Module):
    """Pre-norm causal self-attention and feed-forward, with residuals."""

    def __init__(self, width: int, heads: int, ffn_size: int, dropout: float):
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.attn_norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.ffn_size = ffn_size
        if ffn_size:
            self.ffn_norm = nn.LayerNorm(width)
            self.up = nn.Linear(width, ffn_size)
            self.down = nn.Linear(ffn_size, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: [B, T, W]; mask: [B, 1, T, T] bool (True = may attend)."""
        b, t, w = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, heads, T, head_dim]
        x = x + self.dropout(self.out(attn.transpose(1, 2).reshape(b, t, w)))
        if self.ffn_size:
            x = x + self.dropout(self.down(F.gelu(self.up(self.ffn_norm(x)), approximate="tanh")))
        return x


class PreVerifier(nn.Module):
    """M_B: draft hidden states (+ positions in the draft) → acceptance logits, causally."""

    def __init__(self, arch: PreVerifierArch):
        super().__init__()
        self.arch = arch
        self.in_norm = nn.LayerNorm(arch.input_size)
        self.proj = nn.Linear(arch.input_size, arch.width)
        if arch.draft_confidence:
            self.confidence = nn.Linear(2, arch.width)
        if arch.positional:
            self.position = nn.Embedding(arch.max_positions, arch.width)
            nn.init.normal_(self.position.weight, std=0.02)
        self.blocks = nn.ModuleList(
            AttentionLayer(arch.width, arch.heads, arch.ffn_size, arch.dropout) for _ in range(arch.layers)
        )
        self.head_norm = nn.LayerNorm(arch.width)
        self.head = nn.Linear(arch.width, 1)
        if arch.confidence_prior:
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
            self.prior_scale = nn.Parameter(torch.ones(1))  # α
        self.dropout = nn.Dropout(arch.dropout)

    def embed(
        self, hidden: torch.Tensor, positions: torch.Tensor, confidence: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """hidden: [..., T, input_size]; positions: [..., T] (0 = first draft token);
        confidence: [..., T, 2] (log q(x), H(q)) when the arch reads it."""
        x = self.proj(self.in_norm(hidden))
        if self.arch.draft_confidence:
            if confidence is None:
                raise ValueError("this M_B reads the draft's confidence: give log q(x) and H(q)")
            x = x + self.confidence(confidence)
        if self.arch.positional:
            x = x + self.position(positions.clamp(max=self.arch.max_positions - 1))
        return self.dropout(x)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        confidence: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Acceptance logits [B, T] for a batch: hidden [B, T, input_size], positions [B, T] and
        ``mask`` [B, T, T] bool (True = may attend; default causal). For packed steps use
        ``packing_mask``; positions restart at 0 in each step."""
        if hidden.dim() == 2:
            return self.forward(
                hidden[None],
                positions[None],
                None if mask is None else mask[None],
                None if confidence is None else confidence[None],
            )[0]
        b, t, _ = hidden.shape
        if mask is None:
            mask = torch.ones(t, t, dtype=torch.bool, device=hidden.device).tril()[None].expand(b, t, t)
        x = self.embed(hidden, positions, confidence)
        for block in self.blocks:
            x = block(x, mask[:, None])
        logits = self.head(self.head_norm(x)).squeeze(-1)
        if self.arch.confidence_prior:
            # Σ_{j≤i} log q(x_j) within each draft: the rows a row may attend to are its draft's earlier rows
            cumulative = torch.matmul(mask.to(confidence.dtype), confidence[..., 0:1]).squeeze(-1)  # [B, T]
            logits = logits + self.prior_scale * prior_logit(cumulative)
        return logits

    # -- storage -----------------------------------------------------------------------------
    def save(self, folder: Path, manifest: dict[str, Any]) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().float().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(folder / WEIGHTS))
        (folder / CONFIG).write_text(json.dumps({"family": FAMILY, **attrs.asdict(self.arch)}, indent=2))
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))

    @classmethod
    def load(cls, folder: Path) -> "PreVerifier":
        from pacer_core.hf import check_sizes, load_safetensors, safetensors_shapes

        fix = "train the checkpoint again (`pacer train-preverify`)"
        config = read_json(Path(folder) / CONFIG, "M_B config", fix)
        config.pop("family", None)
        try:
            arch = PreVerifierArch(**config)
            # every size checked against the weights' header before the network is built from it
            check_sizes(
                Path(folder) / CONFIG,
                Path(folder) / WEIGHTS,
                safetensors_shapes(Path(folder) / WEIGHTS, fix),
                fix,
                *arch_sizes(arch),
            )
            model = cls(arch)
        except (TypeError, ValueError, ZeroDivisionError, RuntimeError) as exc:  # missing, unknown or bad options
            raise InputError(
                f"M_B config '{Path(folder) / CONFIG}' does not describe an M_B "
                f"({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__}): the file is "
                f"damaged; {fix}"
            ) from None
        try:
            model.load_state_dict(load_safetensors(Path(folder) / WEIGHTS, fix))
        except RuntimeError as exc:  # missing, unexpected or mis-shaped tensors
            detail = str(exc).strip().splitlines()[-1].strip()[:160]
            raise InputError(
                f"M_B '{folder}' does not match the layout its config.json describes ({detail}): {fix}"
            ) from None
        return model.eval()


def arch_sizes(arch: PreVerifierArch) -> tuple[list, list]:
    """(sizes, layers) of ``pacer_core.hf.check_sizes`` for an M_B checkpoint: each size ``arch``
    allocates by and the tensor dimension of its weights holding it."""
    sizes = [("input_size", arch.input_size, "proj.weight", 1), ("width", arch.width, "proj.weight", 0)]
    if arch.positional:
        sizes.append(("max_positions", arch.max_positions, "position.weight", 0))
    if arch.layers and arch.ffn_size:
        sizes.append(("ffn_size", arch.ffn_size, "blocks.0.up.weight", 0))
    return sizes, [("layers", arch.layers, "blocks.")]


PRIOR_MAX_LOG_Q = -1e-4  # Σ log q is kept below this (a certain draft) so logit(Π q) stays finite


def prior_logit(cumulative_log_q: torch.Tensor) -> torch.Tensor:
    """logit(Π q) from Σ log q: s − log(1 − e^s), with s kept below ``PRIOR_MAX_LOG_Q``."""
    s = cumulative_log_q.clamp(max=PRIOR_MAX_LOG_Q)
    return s - torch.log(-torch.expm1(s))


def confidence_features(draft_probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(log q(x), entropy of q) per draft token: draft_probs [n, vocab], tokens [n] → [n, 2]."""
    probs = draft_probs.float()
    chosen = probs.gather(-1, tokens[:, None].to(probs.device)).squeeze(-1)
    entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1)
    return torch.stack([chosen.clamp_min(1e-6).log(), entropy], dim=-1)


# -- packing -------------------------------------------------------------------------------------
def packing_mask(segments: torch.Tensor) -> torch.Tensor:
    """Block-diagonal causal mask for packed steps: segments [B, L] int (the step each row belongs
    to, -1 = padding) → [B, L, L] bool. Row i may attend to row j iff both belong to the same step
    and j <= i; a padding row attends to itself only (so no row is fully masked)."""
    length = segments.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segments.device).tril()
    same = segments[..., :, None] == segments[..., None, :]
    mask = same & causal & (segments[..., :, None] >= 0)
    return mask | torch.eye(length, dtype=torch.bool, device=segments.device)


def pack(lengths: Sequence[int], order: Sequence[int], pack_len: int) -> list[list[int]]:
    """Greedily pack steps (in ``order``) into sequences of at most ``pack_len`` rows; returns the
    step indices of each sequence. A step longer than ``pack_len`` gets a sequence of its own (cut)."""
    sequences, current, used = [], [], 0
    for index in order:
        n = min(int(lengths[index]), pack_len)
        if current and used + n > pack_len:
            sequences.append(current)
            current, used = [], 0
        current.append(index)
        used += n
    if current:
        sequences.append(current)
    return sequences


# -- decoding ------------------------------------------------------------------------------------
class IncrementalPredictor:
    """M_B during decoding: ``predictor(hidden, start)`` scores the draft tokens ``start..`` whose
    hidden states are ``hidden`` [k, input_size], attending to the earlier tokens of the current
    draft through cached keys and values. ``reset()`` starts a new draft.

    A lean copy of ``PreVerifier.forward`` (same math, checked by the tests): plain functional
    calls on detached weights, no module dispatch or autograd, since a check is a handful of tiny
    matrix products whose cost is mostly per-call overhead. M_B runs on the CPU in float32 (on an
    accelerator each product would be a kernel launch); the hidden states are copied there.
    """

    def __init__(self, net: PreVerifier):
        net = net.float().cpu().eval()
        self.arch = a = net.arch
        w = {name: t.detach().clone() for name, t in net.state_dict().items()}
        self.w = w
        self.eps = net.in_norm.eps
        self.layers = []
        for i, block in enumerate(net.blocks):
            p = f"blocks.{i}."
            self.layers.append({k[len(p) :]: v for k, v in w.items() if k.startswith(p)})
        self.heads, self.head_dim = a.heads, a.width // max(1, a.heads)
        self.keys: list[Optional[torch.Tensor]] = [None] * len(self.layers)  # [heads, T, head_dim]
        self.values: list[Optional[torch.Tensor]] = [None] * len(self.layers)
        self.cumulative: list[float] = []  # Σ_{j≤i} log q(x_j) of the tokens seen (confidence_prior)
        self.prior_scale = float(w["prior_scale"]) if a.confidence_prior else 0.0
        self.length = 0

    def reset(self) -> None:
        self.keys = [None] * len(self.layers)
        self.values = [None] * len(self.layers)
        self.cumulative = []
        self.length = 0

    def _norm(self, x: torch.Tensor, prefix: str, weights: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], weights[prefix + ".weight"], weights[prefix + ".bias"], self.eps)

    def __call__(self, hidden: torch.Tensor, start: int, confidence: Optional[torch.Tensor] = None) -> torch.Tensor:
        # One intra-op thread: these products are far too small to share, and a thread team's
        # wake-up (or a busy machine) would cost 100x the arithmetic.
        threads = torch.get_num_threads()
        if threads == 1:
            return self._predict(hidden, start, confidence)
        torch.set_num_threads(1)
        try:
            return self._predict(hidden, start, confidence)
        finally:
            torch.set_num_threads(threads)

    def _predict(self, hidden: torch.Tensor, start: int, confidence: Optional[torch.Tensor]) -> torch.Tensor:
        if start < self.length:  # re-judging earlier tokens: forget them
            self.keys = [None if k is None else k[:, :start] for k in self.keys]
            self.values = [None if v is None else v[:, :start] for v in self.values]
            self.cumulative = self.cumulative[:start]
            self.length = start
        if start != self.length:
            raise RuntimeError(f"M_B has seen {self.length} draft tokens, cannot score from {start}")
        a, w = self.arch, self.w
        if hidden.shape[-1] != a.input_size:
            raise ValueError(f"M_B reads hidden states of size {a.input_size}, the draft gives {hidden.shape[-1]}")
        k = int(hidden.shape[0])
        h = hidden.detach().to("cpu", torch.float32)
        x = F.linear(self._norm(h, "in_norm", w), w["proj.weight"], w["proj.bias"])  # [k, width]
        if a.draft_confidence:
            if confidence is None:
                raise ValueError("this M_B reads the draft's confidence: give log q(x) and H(q)")
            x = x + F.linear(confidence.to("cpu", torch.float32), w["confidence.weight"], w["confidence.bias"])
        if a.positional:
            table = w["position.weight"]  # [max_positions, width]
            if start + k <= a.max_positions:
                x = x + table[start : start + k]
            else:
                x = x + table[torch.arange(start, start + k).clamp(max=a.max_positions - 1)]
        # a token attends to the cached draft tokens and causally within the block
        future = None if k == 1 else torch.ones(k, start + k, dtype=torch.bool).triu(start + 1)
        scale = self.head_dim**-0.5
        for i, lw in enumerate(self.layers):
            qkv = F.linear(self._norm(x, "attn_norm", lw), lw["qkv.weight"], lw["qkv.bias"])
            q, key, value = qkv.view(k, 3, self.heads, self.head_dim).permute(1, 2, 0, 3)  # [heads, k, hd] each
            if self.keys[i] is not None:
                key = torch.cat([self.keys[i], key], dim=1)
                value = torch.cat([self.values[i], value], dim=1)
            self.keys[i], self.values[i] = key, value
            scores = torch.matmul(q, key.transpose(1, 2)).mul_(scale)  # [heads, k, start + k]
            if future is not None:
                scores.masked_fill_(future, float("-inf"))
            attn = torch.matmul(torch.softmax(scores, dim=-1), value)  # [heads, k, hd]
            x = x + F.linear(attn.transpose(0, 1).reshape(k, -1), lw["out.weight"], lw["out.bias"])
            if a.ffn_size:
                up = F.gelu(F.linear(self._norm(x, "ffn_norm", lw), lw["up.weight"], lw["up.bias"]), approximate="tanh")
                x = x + F.linear(up, lw["down.weight"], lw["down.bias"])
        self.length = start + k
        logits = F.linear(self._norm(x, "head_norm", w), w["head.weight"], w["head.bias"])[:, 0]  # [k]
        if a.confidence_prior:  # a handful of scalars: plain floats cost less than tensor calls
            running, prior = self.cumulative[-1] if self.cumulative else 0.0, []
            for log_q in confidence[:, 0].tolist():
                running += log_q
                self.cumulative.append(running)
                s = min(running, PRIOR_MAX_LOG_Q)  # prior_logit on one float
                prior.append(self.prior_scale * (s - math.log(-math.expm1(s))))
            logits = logits + torch.tensor(prior, dtype=logits.dtype)
        return torch.sigmoid(logits)  # [k]
