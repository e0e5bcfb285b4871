"""The app's tabs, one module each, in the order the page shows them (``TABS``).

Each module builds its tab's components, renders its views from the session, and wires its own
events; ``base`` says what a tab is and how tabs render lazily, ``shared`` holds the events every tab
follows (upload, model, view controls, query). To add a tab, see ``base.Tab`` and the README.
"""

from __future__ import annotations

from . import ablation, class_maps, compare, export, heads, norms, overview, rollout, statistics
from .base import Tab

TABS: tuple[Tab, ...] = (overview.TAB, heads.TAB, rollout.TAB, class_maps.TAB, statistics.TAB, ablation.TAB, norms.TAB, compare.TAB, export.TAB)
