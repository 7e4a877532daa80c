"""What the drafters running a draft model share: its shipped default and its cache kept in step.

Two plugin packages draft with a token-level draft model (``pacer_builtins``' ``draft_model``,
``ouroboros``); neither imports the other, so what both need lives here.
"""

from __future__ import annotations

from typing import Optional

from .registry import shipped_folder

TOKEN_DRAFT = "token_draft"
"""The name the built-in plugins ship the token-level draft for the embedded SmolLM2 target under
(``pacer_shipped``; made by `pacer distill student.kind=token`, see its manifest.json)."""


def shipped_draft() -> Optional[str]:
    """The folder of the shipped token-level draft, the ``default_draft`` of the drafters that run a
    draft model (used when a config for the embedded target omits ``draft``); ``None`` when no
    installed plugin ships it. Reached by its name (``registry.shipped_folder``), never by a path
    into the plugin that ships it: the engine imports no plugin. Call it when the draft is needed,
    not while a plugin module is imported (the registry loads the plugin modules)."""
    found = shipped_folder(TOKEN_DRAFT)
    return None if found is None else str(found)


def sync_cache(model, context: list[int]) -> list[int]:
    """Crop ``model``'s cache to its longest prefix shared with ``context``; return what to feed.

    ``model`` is a ``LanguageModel`` (``cached_tokens``, ``crop``). At least the last context token
    is always returned (its logits are what the caller needs).
    """
    cached = model.cached_tokens
    shared = 0
    for a, b in zip(cached, context):
        if a != b:
            break
        shared += 1
    shared = min(shared, len(context) - 1)
    model.crop(shared)
    return context[shared:]
