"""``python -m hilbert_hpc`` is the ``hilbert-hpc`` command."""

import sys

from .cli import main

sys.exit(main())
