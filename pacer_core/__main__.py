"""``python -m pacer_core``: the ``pacer`` command line."""

import sys

from .cli import main

sys.exit(main())
