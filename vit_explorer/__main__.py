"""``python -m vit_explorer``: the command line (also what ``torchrun -m vit_explorer`` runs)."""

import sys

from vit_explorer.cli import main

sys.exit(main())
