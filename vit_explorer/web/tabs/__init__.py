"""The app's tabs, one module each, in the order the page shows them (``TABS``), each named for its tab.

Each module builds its tab's components, renders its views from the session, and wires its own
events; ``base`` says what a tab is and how tabs render lazily, ``shared`` holds the events every tab
follows (upload, model, target, view controls, query). To add a tab, see ``base.Tab`` and the README.
"""

from __future__ import annotations

from vit_explorer.web.tabs import (
    class_maps,
    compare,
    contributions,
    export,
    head_ablation,
    head_atlas,
    head_statistics,
    layers_heads,
    overview,
    query_keys,
    registers,
    rollout_options,
    token_norms,
    tokens,
)
from vit_explorer.web.tabs.base import Tab

TABS: tuple[Tab, ...] = (overview.TAB, layers_heads.TAB, query_keys.TAB, rollout_options.TAB, class_maps.TAB, head_statistics.TAB,
                         head_ablation.TAB,
                         contributions.TAB, token_norms.TAB, registers.TAB, tokens.TAB, compare.TAB, head_atlas.TAB, export.TAB)
