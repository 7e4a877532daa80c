"""The ``eagle`` drafter: a feature-level draft (see model.py) reading the target's hidden states."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

import attrs
import torch

from pacer_core import Component, DraftBlock, FeatureModel, InputError, Resources, hookimpl
from pacer_core.kernels import PackedMatrix, pack_linears
from pacer_core.sampling import logits_to_probs, sample

from .model import MANIFEST, WEIGHTS, FeatureDraft, KVCache

DEFAULT_DRAFT = Path(__file__).parent / "default"


@attrs.define
class EagleConfig:
    path: Optional[str] = None  # a folder written by `pacer distill`; None = the shipped default draft
    allow_other_target: bool = False  # experts: use a draft distilled from another target


def draft_folder(path: Optional[str]) -> Path:
    folder = DEFAULT_DRAFT if path is None else Path(path).expanduser()
    if not (folder / MANIFEST).exists():
        hint = "the shipped draft is missing: reinstall" if path is None else "run `pacer distill` to make one"
        raise InputError(f"'{folder}' is not a feature draft folder (no {MANIFEST}): {hint}")
    return folder


def draft_identity(folder: Path) -> str:
    """Names a draft folder for components trained on its drafts (PACER's M_B): the digest of the
    target it was distilled from and a hash of its weights file."""
    manifest = json.loads((folder / MANIFEST).read_text())
    weights = hashlib.sha256((folder / WEIGHTS).read_bytes()).hexdigest()[:16]
    return f"eagle:{manifest.get('target_digest')}:{weights}"


class EagleDrafter:
    """Drafts with predicted target features: row t of the draft network reads (x_{t+1}, f_t).

    Rows whose f_t is the target's true feature are kept across steps; rows fed with predicted
    features are recomputed once the target has scored those tokens. The draft's hidden states
    (for PACER) are the predicted features that produced each draft token.
    """

    def __init__(self, config: EagleConfig, resources: Resources):
        folder = draft_folder(config.path)
        target = resources.target
        if not isinstance(target, FeatureModel):
            raise InputError(f"the eagle drafter reads its target's weights, which this target "
                             f"({type(target).__name__}) does not show: give it a pacer_core.types.FeatureModel "
                             "such as pacer_core.hf.HFModel")
        manifest = json.loads((folder / MANIFEST).read_text())
        target_digest = target.digest
        if target_digest and manifest.get("target_digest") != target_digest and not config.allow_other_target:
            raise InputError(
                f"draft '{folder}' was distilled from target {manifest.get('target_digest')}, but this "
                f"target is {target_digest}: distill a draft for it (`pacer distill`) or set "
                "strategy.drafter.allow_other_target=true"
            )
        self.net = FeatureDraft.load(folder)
        self.draft_identity = draft_identity(folder)  # Resources.draft_identity of later components
        if self.net.arch.vocab_size != target.vocab_size or self.net.arch.hidden_size != target.hidden_size:
            raise InputError(f"draft '{folder}' does not fit this target (vocabulary or hidden size differ)")
        embed, head = target.embedding_weights()
        self.embed = embed
        packed = bool(target.packed_weights)  # pack as the target does
        if packed:
            pack_linears(self.net)
        self.head = PackedMatrix(head[self.net.subset].float(), pack=packed)  # x @ [subset, hidden].T
        self.subset = self.net.subset
        self.sampling = resources.sampling
        self.vocab_size = target.vocab_size
        self.reset(torch.empty(0, self.net.arch.hidden_size))

    def reset(self, features: torch.Tensor) -> None:
        self.features = features.float()  # [F, hidden]: true target features of tokens 0..F-1
        self.cache = KVCache()
        self.true_rows = 0  # leading cache rows fed with true features
        self.row_tokens: list[int] = []  # token x_{r+1} fed at row r
        self.row_out: list[torch.Tensor] = []  # predicted f_{r+1} from row r

    @hookimpl
    def pacer_start(self, state, target_hidden) -> None:
        self.reset(target_hidden if target_hidden is not None else torch.empty(0, self.net.arch.hidden_size))

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        if step.target_hidden is not None:
            start = step.target_hidden_start
            self.features = torch.cat([self.features[:start], step.target_hidden.float()])

    def _truncate_rows(self, keep: int) -> None:
        self.cache.crop(keep)
        del self.row_tokens[keep:], self.row_out[keep:]
        self.true_rows = min(self.true_rows, keep)

    @torch.inference_mode()
    def _feed(self, tokens: list[int], features: torch.Tensor) -> torch.Tensor:
        start = len(self.cache)
        out = self.net(self.embed[tokens].float(), features, torch.arange(start, start + len(tokens)), self.cache)
        self.row_tokens.extend(tokens)
        self.row_out.extend(out.unbind(0))
        return out

    def _sync(self, context: list[int]) -> int:
        """Bring the cache to rows 0..len(context)-2; returns the number of forwards spent."""
        forwards, known = 0, len(self.features)
        if known > self.true_rows:  # new true features: recompute rows fed with predictions
            self._truncate_rows(self.true_rows)
        else:  # same step: keep predicted rows whose tokens still match the context
            keep = self.true_rows
            while keep < len(self.row_tokens) and keep + 1 < len(context) and self.row_tokens[keep] == context[keep + 1]:
                keep += 1
            self._truncate_rows(keep)
        rows = len(self.row_tokens)
        if rows < known and known <= len(context) - 1:
            self._feed(context[rows + 1: known + 1], self.features[rows:known])
            self.true_rows = known
            forwards += 1
        while len(self.row_tokens) < len(context) - 1 and self.row_out:
            r = len(self.row_tokens)
            self._feed([context[r + 1]], self.row_out[r - 1][None])
            forwards += 1
        return forwards

    def _choose(self, feature: torch.Tensor, generator) -> tuple[int, torch.Tensor]:
        logits = self.head(feature[None])[0]  # [subset]
        if self.sampling.greedy:
            index, probs = int(logits.argmax()), torch.softmax(logits, -1)
        else:
            probs = logits_to_probs(logits, self.sampling)
            index = int(sample(probs, generator))
        full = torch.zeros(self.vocab_size)
        full[self.subset] = probs  # tokens outside the draft's vocabulary have probability 0
        return int(self.subset[index]), full

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        context = state.tokens + draft.tokens.tolist()
        if len(self.features) == 0:
            return None  # a one-token prompt: no target feature yet, the first step decodes plainly
        forwards = self._sync(context)
        if len(self.row_tokens) != len(context) - 1:
            return None
        tokens, probs, hidden = [], [], []
        feature = self.row_out[-1]
        for i in range(num_tokens):
            token, token_probs = self._choose(feature, state.generator)
            tokens.append(token)
            probs.append(token_probs)
            hidden.append(feature)
            if token in state.eos_token_ids or i == num_tokens - 1:
                break
            feature = self._feed([token], feature[None])[-1]
            forwards += 1
        return DraftBlock(tokens=torch.tensor(tokens, dtype=torch.long), draft_probs=torch.stack(probs),
                          hidden_states=torch.stack(hidden), forwards=forwards)


@hookimpl
def pacer_components() -> list[Component]:
    return [Component(
        "drafter", "eagle", EagleConfig, EagleDrafter,
        "feature-level draft (EAGLE-style) distilled from the target; reads its hidden states",
        needs={"target_hidden"}, provides={"draft_probs", "draft_hidden"},
    )]
