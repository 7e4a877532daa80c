"""The training scaffold shared by ``pacer distill`` (plugins/eagle/distill.py) and
``pacer train-preverify`` (plugins/pacer_stop/train.py); docs/draft.md and docs/pacer.md.

A trainer keeps a **run folder** (``out=``) from which every stage resumes:

- ``open_run`` (run.py): what a trainer does first, before any model loads: ``check_out_dir`` and
  ``guard_recipe`` below; it returns a ``RunFolder`` (the folder, the stored recipe, the export folder).
- ``check_out_dir`` (files.py): the folder is created and checked writable before any model loads;
  an existing file, ``/dev/null``, a path under a file or an unwritable place is refused in one line.
- ``guard_recipe`` (recipe.py): ``recipe.json`` records the run's recipe. Rerunning on the folder,
  the options that decide what it holds (the trainer's ``data_keys``) must agree with it: a recorded
  option must equal its recorded value; an option newer than the folder (not recorded) must equal
  its default, which is what the older run used; a recorded option since removed is ignored.
  Other options (training, model shape) may change between runs.
- ``atomic_save``/``atomic_write_*`` (files.py): temp file + rename, so a crash mid-write keeps the
  previous file; ``load_run_file`` reads ``.pt`` files with ``weights_only=True`` (plain data only:
  a crafted pickle runs no code) and refuses an unreadable one in one line.
- ``TrainingRun`` (loop.py): AdamW steps with ``cosine_lr`` (warm-up, cosine decay to a floor the
  trainer passes), gradient-norm clipping, a tqdm bar with ETA, checkpoints every
  ``checkpoint_every`` steps and at the end, resume from the checkpoint's step (the schedule is a
  function of the step, so it continues), and ``interruptible``: Ctrl-C or SIGTERM finishes the
  step, saves and exits with the interrupted code (130).
- ``training_command`` (command.py): ``pacer <name> [--config FILE] [key=value ...]``.
"""

from .command import training_command
from .files import (
    atomic_save,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    check_out_dir,
    load_run_file,
    read_json,
)
from .loop import TrainingRun, cosine_lr, count_parameters, interruptible, load_checkpoint, progress, set_threads
from .recipe import RECIPE, guard_recipe, recipe_difference
from .run import RunFolder, open_run

__all__ = [
    "RECIPE",
    "RunFolder",
    "TrainingRun",
    "atomic_save",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_out_dir",
    "cosine_lr",
    "count_parameters",
    "guard_recipe",
    "interruptible",
    "load_checkpoint",
    "load_run_file",
    "open_run",
    "progress",
    "read_json",
    "recipe_difference",
    "set_threads",
    "training_command",
]
