"""attrs fields for tensors: the value objects of ``pacer_core.types``, ``drafts`` and ``protocols``
hold tensors that are excluded from equality and shown by shape in ``repr``."""

from __future__ import annotations

from typing import Any

import attrs
import torch


def _shape_repr(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)}"
    if isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):
        return "(" + ", ".join(f"Tensor{tuple(v.shape)}" for v in value) + ")"
    return repr(value)


def tensor_field(**kwargs: Any) -> Any:
    """An attrs field holding a tensor: excluded from equality, shown by shape."""
    return attrs.field(eq=False, repr=_shape_repr, **kwargs)
