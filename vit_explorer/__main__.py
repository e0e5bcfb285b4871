"""``python -m vit_explorer``: the command line (also what ``torchrun -m vit_explorer`` runs)."""

import sys

from .cli import main

sys.exit(main())
