"""The ``pard`` drafter: a target-independent parallel token draft (PARD, arXiv 2504.18583).

A small causal LM sharing the target's tokenizer (the ``draft`` section, as for ``draft_model``),
fine-tuned with a mask token (``pacer distill student.kind=pard``; pard_files.py) so that one forward
over ``[context, m, …, m]`` predicts the next ``block`` tokens: the last real row predicts position 1
as a language model does, mask row j position j + 1. The draft keeps its own KV cache of the
context (committed tokens, then the tokens drafted on the step's main path); the mask rows are
cropped right after the forward, and a rejected draft is rolled back at the next step by keeping
the cache's longest prefix shared with the committed tokens (``sync_cache``, as ``draft_model``).

Its blocks are handed out as chains or as a tree over one block by the base every block drafter
shares (handout.py); a further block is one more forward over the drafted tokens and fresh masks.
It reads nothing of the target but its tokens, so any target sharing its tokenizer can use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import attrs
import torch

from pacer_core import Component, DraftInfo, InputError, Resources, hookimpl
from pacer_core.context_vocab import ContextVocab
from pacer_core.draft_model_helpers import sync_cache
from pacer_core.priors import lookup_bias_for
from pacer_core.protocols import MASK_ROW, ParallelDraftModel, StoredModel
from pacer_core.trees import TreeConfig, node_budget
from pacer_train.corpus.prior import corpus_prior

from .handout import BlockDrafter
from .pard_files import MAX_BLOCK, load_pard_files

DEFAULT_DRAFT = Path(__file__).parent / "default_pard"  # made by the command in its manifest.json
COST_KIND = "block"  # one forward of its draft model drafts a block (pacer_core.cost_profiles.DRAFTER_KINDS)


@attrs.define
class PardConfig:
    # positions one forward drafts (the last token's row and block − 1 mask rows); None = the block the
    # draft was trained on
    block: Optional[int] = attrs.field(
        default=None, validator=attrs.validators.optional([attrs.validators.ge(2), attrs.validators.le(MAX_BLOCK)])
    )
    tree: Optional[TreeConfig] = None  # a tree ({topk, depth, nodes}; past the block: further blocks); None = a chain
    # [b_1, b_2, …]: b_n added to a row's logits of the tokens that followed an earlier occurrence, in the
    # committed text, of the last n tokens of its path (pacer_core/priors.py); None = [2, 4, 4] for a draft
    # made here (pard.json), none for a published checkpoint; [] = none
    lookup_bias: Optional[List[float]] = None
    # added, times its share, to a row's logits of each token that followed the longest n-gram (up to 4,
    # seen 5 times or more) ending its path in `corpus` (pacer_core/priors.py); None = 3 for a draft made here
    # (pard.json) where this target wrote the corpus (or it is a file), none for a published checkpoint; 0 = none
    corpus_bias: Optional[float] = None
    # what corpus_bias reads: "shipped" (the answers the embedded target wrote), a folder `pacer corpus`
    # wrote, a .json of token ids or a text file (as the eagle drafter's `corpus`)
    corpus: str = "shipped"


class PardDrafter(BlockDrafter):
    """Drafts a block of tokens per forward of a PARD token draft."""

    def __init__(self, config: PardConfig, resources: Resources):
        model = resources.draft
        folder = model.folder if isinstance(model, StoredModel) else None
        if folder is None or not isinstance(model, ParallelDraftModel):
            raise InputError(
                "the pard drafter needs a pard draft folder loaded as the draft model: set draft.path "
                "to one (`pacer distill student.kind=pard` makes it)"
            )
        if model.vocab_size != resources.target.vocab_size:
            raise InputError(
                f"pard draft '{folder}' has a vocabulary of {model.vocab_size} tokens, the target "
                f"{resources.target.vocab_size}: use a draft sharing the target's tokenizer"
            )
        mask, trained, distilled = load_pard_files(Path(folder), model.embedding_weights()[0])
        if trained is None and config.block is None:
            raise InputError(
                f"pard draft '{folder}' does not say the block it was trained to fill (a published PARD "
                "checkpoint): set strategy.drafter.block"
            )
        self.model = model
        self.mask = mask.to(model.device, model.dtype)
        self.block = trained if config.block is None else config.block
        subset = model.vocab_subset
        # the draft model's own vocabulary subset (it has no rows of the target's output layer to grow by)
        ids = torch.arange(model.vocab_size) if subset is None else subset
        self.columns = ContextVocab(ids, model.vocab_size, None, False, torch.float32)
        self.sampling = resources.sampling
        self.lookup_bias = lookup_bias_for(distilled, config.lookup_bias)  # by default on drafts made here
        self.corpus_bias, self.corpus = corpus_prior(
            distilled, config.corpus_bias, config.corpus, resources.tokenizer, model.vocab_size, resources.target.digest
        )
        self.tree = config.tree
        self.draft_info = DraftInfo(identity=f"pard:{model.digest}", tree=config.tree, tokens_per_forward=self.block)
        self.budget = (
            None
            if config.tree is None
            else node_budget(
                config.tree,
                resources.target.device,
                COST_KIND,
                resources.target.digest,
                folder,
                self.draft_info.identity,
                self.block,
            )
        )
        self.pacer_start(None)

    def _reset(self) -> None:
        self.model.reset()

    def _ready(self, committed: list[int]) -> bool:
        """Whether a block (with a further block's drafted tokens) fits the draft's positions."""
        return len(committed) + 3 * self.block <= self.model.max_length

    @torch.inference_mode()
    def _forward(self, committed: list[int], known: list[int]) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """One forward over the uncached tokens of ``committed + known`` and ``block − 1`` mask rows (then
        cropped): the logits of the last real token's row and the masks' ([block, w]) and their hidden states."""
        context = committed + known
        if len(context) + self.block > self.model.max_length:
            return None
        feed = sync_cache(self.model, context)
        masks = self.block - 1
        out = self.model.forward(
            feed + [MASK_ROW] * masks, mask_embedding=self.mask, logits_from=len(feed) - 1, hidden=True
        )
        self.model.crop(len(self.model.cached_tokens) - masks)
        logits = out.logits.float().cpu()  # [block, vocab]
        if self.draft_vocab is not None:
            logits = logits[:, self.draft_vocab.ids]  # [block, w]: the draft's own columns
        return logits, out.hidden_states[len(feed) - 1 :].float()


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component(
            "drafter",
            "pard",
            PardConfig,
            PardDrafter,
            "parallel token draft (PARD): a small LM sharing the target's tokenizer drafts a whole block per forward "
            "from mask tokens; a chain or a tree over the block",
            needs={"draft_model"},
            provides={"draft_probs", "draft_hidden"},
            default_draft=str(DEFAULT_DRAFT) if (DEFAULT_DRAFT / "pard.json").is_file() else None,
            cost_kind=COST_KIND,
        )
    ]
