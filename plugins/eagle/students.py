"""The feature-level students of ``pacer distill`` (``student.kind`` feature or eagle3), the ``eagle``
drafter's drafts: ``FeatureDraft`` (EAGLE-1 style, reads the target's last hidden states) or
``Eagle3Draft`` (EAGLE-3 style, fuses several target layers' inputs). Their loss is the
training-time test (``unrolled_features``, ``draft_loss``), their held-out measure ``evaluate``,
and ``train`` runs the loop every student kind shares (pacer_train.distillation), from ``init``
weights when given (``load_init``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import attrs
import numpy as np
import torch
from torch.nn import functional as F

from pacer_core.draft_folders import MANIFEST
from pacer_core.errors import InputError
from pacer_train import load_run_file, read_json
from pacer_train.distillation import CHECKPOINT, SCALING, fit, log, scaling_points

from .features import target_greedy
from .model import ArchConfig, Eagle3Arch, Eagle3Draft, FeatureDraft, UnrolledKeys, draft_logits, load_draft
from .published import eagle3_layers

if TYPE_CHECKING:
    from .distill_config import DistillConfig


def unrolled_features(
    net: torch.nn.Module, embed: torch.Tensor, tokens: torch.Tensor, inputs: torch.Tensor, steps: int
) -> list[torch.Tensor]:
    """The training-time test (HASS, EAGLE-3): the draft run ``steps`` times over every row of a batch
    at once. tokens [B, L]; inputs [B, L-1, d]: what step-1 row t reads beside x_{t+1} (the target's
    f_t, or the fused layers' states for an ``Eagle3Draft``). Row t of step j ≥ 2 reads x_{t+j} (the
    last token for rows past the end, which callers leave out) and its own step j−1 output, at
    position t + j − 1, attending as the drafter's cache does (``UnrolledKeys``). Gradients flow through
    the fed-back outputs. Returns per step [B, L-1, d]: row t of step j predicts the feature at t + j."""
    length = tokens.shape[1]
    rows = torch.arange(length - 1)
    keys, feed, outputs = UnrolledKeys(), inputs, []
    for j in range(1, steps + 1):
        index = (rows + j).clamp(max=length - 1).to(tokens.device)
        feed = net(embed[tokens[:, index]], feed, rows + (j - 1), keys)
        outputs.append(feed)
    return outputs


def draft_loss(
    net: torch.nn.Module,
    embed: torch.Tensor,
    head_sub: torch.Tensor,
    tokens: torch.Tensor,
    feats: torch.Tensor,
    noise: float,
    feature_weight: float,
    ce_weight: float,
    generator: Optional[torch.Generator],
    unroll: int = 1,
    fused: Optional[torch.Tensor] = None,
    decay: float = 1.0,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss on a batch: tokens [B, L], feats [B, L, d] (the target's last-layer states, float32), fused
    [B, L, n·d] (an ``Eagle3Draft``'s fused layers' inputs; None for a ``FeatureDraft``).

    Over the ``unroll`` steps of ``unrolled_features``, row t of step j predicts the feature at t + j;
    its draft logits over the subset are trained towards the target's distribution for x_{t+j+1},
    softmax(W_subset f_{t+j}) (soft cross-entropy: the KL divergence up to a constant) — the whole loss
    of an ``Eagle3Draft``; a ``FeatureDraft`` adds ``feature_weight`` × smooth-L1 to f_{t+j} and weighs
    the cross-entropy by ``ce_weight``. Step j weighs ``decay`` ** (j − 1); rows past the sequence's end
    (t + j > L − 1) are left out. Uniform noise ±``noise`` on the step-1 inputs. ``unroll=1`` is
    EAGLE-1's loss. ``temperature`` divides the target's logits before the softmax: below 1 the
    cross-entropy leans towards the target's greedy token (greedy verification compares only that)."""
    eagle3 = fused is not None
    inputs = (fused if eagle3 else feats)[:, :-1]
    if noise > 0:
        inputs = inputs + ((torch.rand(inputs.shape, generator=generator) * 2 - 1) * noise).to(inputs.device)
    if eagle3:
        inputs = net.fuse(inputs)
    length = tokens.shape[1]
    rows = torch.arange(length - 1, device=feats.device)
    teachers = torch.softmax(feats[:, 1:] @ head_sub.T / temperature, -1)  # [B, L-1, subset]: for x_{t+2}, every t once
    loss, parts = 0.0, {}
    for j, guess in enumerate(unrolled_features(net, embed, tokens, inputs, unroll), start=1):
        valid = (rows + j <= length - 1).to(feats.dtype)  # [T]
        count = valid.sum() * tokens.shape[0]
        at = (rows + j).clamp(max=length - 1)
        wanted = feats[:, at]  # [B, T, d]: f_{t+j}
        teacher = teachers[:, at - 1]  # [B, T, subset]: softmax(W_subset f_{t+j})
        student = torch.log_softmax(draft_logits(net, guess, head_sub), -1)
        ce = (-(teacher * student).sum(-1) * valid).sum() / count
        if eagle3:
            step = ce
            feature_loss = None
        else:
            feature_loss = (F.smooth_l1_loss(guess, wanted, reduction="none").mean(-1) * valid).sum() / count
            step = feature_weight * feature_loss + ce_weight * ce
        loss = loss + decay ** (j - 1) * step
        if j == 1:
            agree = (student.argmax(-1) == teacher.argmax(-1)).float().mean()
            parts = {"ce": float(ce.detach()), "top1": float(agree)}
            if feature_loss is not None:
                parts["feature"] = float(feature_loss.detach())
    return loss, parts


@torch.no_grad()
def evaluate(
    net: torch.nn.Module, embed, head_full, subset, tokens, feats, fused=None, target_next=None, chunk: int = 4
) -> dict[str, float]:
    """Held-out top-1 agreement with the target's greedy next token (full vocabulary) at draft
    position 1 (true features) and 2 (the net's own predicted feature fed back with the corpus token,
    attending as at inference), and for both in a row. ``target_next``: ``target_greedy(feats)``."""
    net.eval()
    if target_next is None:
        target_next = target_greedy(feats, head_full)
    head_sub = head_full[subset]
    first_hits, second_hits = [], []
    for i in range(0, tokens.shape[0], chunk):
        rows = slice(i, i + chunk)
        inputs = feats[rows, :-1] if fused is None else net.fuse(fused[rows, :-1])
        first, second = unrolled_features(net, embed, tokens[rows], inputs, 2)
        wanted = target_next[rows]
        # row t of step 1 drafts x_{t+2} (the target's greedy token after position t+1), of step 2 x_{t+3}
        first_hits.append(subset[draft_logits(net, first, head_sub).argmax(-1)][:, :-1] == wanted[:, 1:-1])
        second_hits.append(subset[draft_logits(net, second, head_sub).argmax(-1)][:, :-1] == wanted[:, 2:])
    net.train()
    hit1, hit2 = torch.cat(first_hits), torch.cat(second_hits)
    return {
        "heldout_top1_first": float(hit1.float().mean()),
        "heldout_top1_second": float(hit2.float().mean()),
        "heldout_top1_first_two": float((hit1 & hit2).float().mean()),
    }


def _attention_shape(target) -> dict[str, Any]:
    return attrs.asdict(target.attention_shape())


def fused_layers(cfg: DistillConfig, target) -> Optional[list[int]]:
    """The target layers an eagle3 student (or a kind a plugin adds) fuses (``student.fused_layers``,
    else EAGLE-3's 2, L // 2, L − 3, or the plugin kind's default); None for feature and token."""
    from pacer_train.students import student_kinds

    kind = cfg.student.kind
    if kind in ("feature", "token") or (kind != "eagle3" and not student_kinds()[kind].fuses):
        return None
    if cfg.student.fused_layers:
        layers = list(cfg.student.fused_layers)
    elif kind == "eagle3":
        layers = list(eagle3_layers(target.num_layers))
    else:
        layers = list(student_kinds()[kind].default_layers(target))
    if any(not 0 <= i <= target.num_layers for i in layers):
        raise InputError(
            f"student.fused_layers {layers} must lie in 0..{target.num_layers} (the inputs of this "
            "target's decoder layers; L is the last layer's output)"
        )
    return layers


def build_student(cfg: DistillConfig, target, subset: torch.Tensor, head_full: torch.Tensor) -> torch.nn.Module:
    """A fresh ``FeatureDraft`` (kind feature) or ``Eagle3Draft`` (kind eagle3, its head initialised
    from the target's output-layer rows of the subset) for ``target``."""
    shape = _attention_shape(target)
    torch.manual_seed(cfg.seed)
    if cfg.student.kind == "eagle3":
        layers = fused_layers(cfg, target)
        net = Eagle3Draft(
            Eagle3Arch(
                hidden_size=target.hidden_size,
                intermediate_size=cfg.student.intermediate_size,
                draft_vocab_size=len(subset),
                fused_size=len(layers) * target.hidden_size,
                vocab_size=target.vocab_size,
                target_layers=layers,
                **shape,
            )
        )
        with torch.no_grad():
            net.lm_head.weight.copy_(head_full[subset])
    else:
        net = FeatureDraft(
            ArchConfig(
                hidden_size=target.hidden_size,
                vocab_size=target.vocab_size,
                subset_size=len(subset),
                intermediate_size=cfg.student.intermediate_size,
                extra_layers=cfg.student.extra_layers,
                **shape,
            )
        )
    net.subset.copy_(subset)
    return net


def load_init(path: str, net: torch.nn.Module) -> dict[str, Any]:
    """Load ``init`` (a draft folder ``pacer distill`` wrote, or a run folder's ``checkpoint.pt``) into
    ``net``, every tensor checked for presence and shape (one-line ``InputError`` otherwise; the vocabulary
    subset comes with the weights). Returns the run's start: {init, tokens_before (the tokens the
    weights had seen), points (their scaling curve)}."""
    source = Path(path).expanduser()
    if source.is_dir():
        if not (source / MANIFEST).is_file():
            raise InputError(
                f"init '{source}' is not a draft folder `pacer distill` wrote (no {MANIFEST}): give one, "
                "or a run folder's checkpoint.pt"
            )
        draft = load_draft(source)
        if type(draft) is not type(net):
            raise InputError(
                f"init '{source}' holds another draft family ({type(draft).__name__}) than student.kind="
                f"{'eagle3' if isinstance(net, Eagle3Draft) else 'feature'}: set student.kind to "
                "the draft's"
            )
        layers = getattr(draft.arch, "target_layers", None)
        if layers is not None and list(layers) != list(net.arch.target_layers):
            raise InputError(
                f"init '{source}' fuses target layers {list(layers)}, this run's student "
                f"{list(getattr(net.arch, 'target_layers', []))}: set student.fused_layers={list(layers)}"
            )
        state = draft.state_dict()
        manifest = read_json(source / MANIFEST, "draft manifest")
        training = manifest.get("training", {}) if isinstance(manifest, dict) else {}
        tokens_before = int(training.get("tokens_total", training.get("tokens_seen", 0)) or 0)
        curve = read_json(source / SCALING, "scaling curve") if (source / SCALING).is_file() else {}
        points = list(curve.get("points", []))
        seen = manifest.get("corpus_sources") if isinstance(manifest, dict) else None
    else:
        saved = load_run_file(source, "init checkpoint")
        if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
            raise InputError(
                f"init '{source}' is not a checkpoint `pacer distill` wrote (no model state): give a "
                "draft folder or a run folder's checkpoint.pt"
            )
        state = saved["model"]
        begun = saved.get("start") or {"tokens_before": 0, "points": []}
        history = list(saved.get("history", []))
        tokens_before = int(history[-1].get("tokens", 0)) if history else int(begun.get("tokens_before", 0))
        points = scaling_points(begun, history)
        run_corpus = source.parent / "corpus.pt"  # what the checkpoint's own run trained on
        corpus = load_run_file(run_corpus, "corpus") if run_corpus.is_file() else None
        seen = corpus.get("sources_used") if isinstance(corpus, dict) else None
        if isinstance(seen, dict) and begun.get("corpus_sources"):
            seen = {**seen, "init": begun["corpus_sources"]}
    own = net.state_dict()
    have = 1 + len({name.split(".")[1] for name in state if name.startswith("extra.")})  # the init's layers
    want = 1 + len(getattr(net, "extra", ()))
    if have > want:
        raise InputError(
            f"init '{source}' has {have} decoder layers, this run's student {want}: set student.extra_layers={have - 1}"
        )
    grown = [f"extra.{i - 1}." for i in range(have, want)]  # layers the init lacks: they start as the identity
    for name, tensor in own.items():
        if name.startswith(tuple(grown)):
            continue
        if name not in state:
            raise InputError(
                f"init '{source}' holds no tensor '{name}': it is another draft family than "
                f"student.kind={'eagle3' if isinstance(net, Eagle3Draft) else 'feature'}"
            )
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise InputError(
                f"init '{source}': tensor '{name}' has shape {tuple(state[name].shape)}, this run's "
                f"student {tuple(tensor.shape)}: set student.subset_size, student.intermediate_size "
                "and student.fused_layers to the draft's, or choose another init"
            )
    kept = {k: state[k].float() if state[k].is_floating_point() else state[k] for k in own if k in state}
    net.load_state_dict(kept, strict=not grown)
    for i in range(have, want):
        net.extra[i - 1].start_as_identity()
    log(
        f"starting from init '{source}' ({tokens_before:,} tokens seen before)"
        + (f"; grown from {have} to {want} decoder layers, the new ones starting as the identity" if grown else "")
    )
    return {
        "init": str(source),
        "tokens_before": tokens_before,
        "points": points,
        "corpus_sources": seen if isinstance(seen, dict) else None,
    }


def train(
    cfg: DistillConfig,
    out: Path,
    tokens: torch.Tensor,
    features: np.memmap,
    target,
    subset: torch.Tensor,
    fused: Optional[np.memmap] = None,
    deadline: Optional[float] = None,
):
    """The feature-level students (``eagle``): ``FeatureDraft``, or ``Eagle3Draft`` reading ``fused``
    (the inputs of its target layers), from ``cfg.init`` when given, on the target's device."""
    t = cfg.train
    embed_w, head_w = target.embedding_weights()
    embed, head_full = embed_w.float(), head_w.float()
    net = build_student(cfg, target, subset, head_full).to(embed.device)
    resumed = (out / CHECKPOINT).exists()  # the run's own weights and start come from its checkpoint
    start = load_init(cfg.init, net) if cfg.init and not resumed else None
    held = cfg.corpus.heldout_sequences

    def held_out(source):
        if source is None:
            return None
        return torch.from_numpy(np.asarray(source[:held], dtype=np.float32)).to(embed.device)

    held_tokens, held_feats, held_fused = tokens[:held].to(embed.device), held_out(features), held_out(fused)
    held_next = target_greedy(held_feats, head_full)

    def measure() -> dict[str, float]:
        return evaluate(net, embed, head_full, net.subset, held_tokens, held_feats, held_fused, held_next)

    # the subset rows are read from the net at every step: a resumed or init-started run brings its own
    def loss(batch_tokens, batch_feats, batch_fused, generator):
        return draft_loss(
            net,
            embed,
            head_full[net.subset],
            batch_tokens,
            batch_feats,
            t.noise,
            t.feature_weight,
            t.ce_weight,
            generator,
            t.unroll,
            batch_fused,
            t.unroll_decay,
            t.teacher_temperature,
        )

    training = fit(
        cfg, out, net, tokens, features, loss, fused=fused, evaluate_fn=measure, start=start, deadline=deadline
    )
    return net, measure(), training
