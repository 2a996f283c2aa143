"""``python -m hilbert_hpc`` is the ``hilbert-hpc`` command."""

import sys

from hilbert_hpc.cli import main

sys.exit(main())
