"""Opening a run folder: what every trainer does first, before any model loads.

``open_run(out, cfg, data_keys, free, export=None)``:

1. ``out`` is created and checked writable (``check_out_dir``); ``export``, when given, is checked
   too (it is written at the end, so it is not created now);
2. the recipe guard (``guard_recipe``): a folder made by an earlier run refuses ``cfg`` when an
   option under ``data_keys`` differs from its stored recipe; then ``cfg`` becomes the stored recipe.

It returns a ``RunFolder``: the folder, the recipe as stored (trainers record it in the manifest of
what they export) and where the export goes (``export_dir(default)``: ``export``, else
``out/<default>``). Everything a later stage writes resumes from this folder (pacer_train's
``TrainingRun`` for checkpoints; the trainers' own files for their data stages).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional, Union

import attrs

from .files import check_out_dir
from .recipe import guard_recipe

__all__ = ["RunFolder", "open_run"]


@attrs.frozen
class RunFolder:
    out: Path  # the run folder: data stages, checkpoints, recipe.json
    recipe: dict[str, Any] = attrs.field(eq=False)  # the run's recipe as recipe.json stores it
    export: Optional[Path] = None  # the export folder asked for; None: the trainer's default under out

    def export_dir(self, default: str) -> Path:
        """Where the trained model is written: the ``export`` asked for, else ``out / default``."""
        return self.export if self.export is not None else self.out / default


def open_run(
    out: Union[str, Path], cfg: Any, data_keys: Iterable[str], free: str, export: Optional[Union[str, Path]] = None
) -> RunFolder:
    """Check and create the run folder ``out`` (and check ``export``), refuse ``cfg`` if the folder
    holds a run whose recipe differs under ``data_keys`` (``free`` names, for the message, what may
    change between runs), store ``cfg`` as its recipe. One-line errors, before any model loads."""
    folder = check_out_dir(out)
    if export:
        check_out_dir(export, "export", create=False)
    recipe = guard_recipe(folder, cfg, data_keys, free)
    return RunFolder(folder, recipe, Path(export) if export else None)
