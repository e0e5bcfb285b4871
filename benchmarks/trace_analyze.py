"""How far a reader travels following ``vit-explorer analyze`` from the command line to the files it writes.

Traces one ``analyze`` of an example image (no faithfulness score) with ``sys.setprofile`` and counts, over the calls
the package's code makes to the package's code (a hook that torch calls during a forward pass is not a call a reader
follows):

- files: the package's files those calls enter or leave;
- edges: distinct caller file → callee file pairs (hops a reader makes between files);
- climbs: distinct pairs where the callee's file is still open further up the call stack, that is the reader goes
  back into a file left a moment ago (A → B → A).

    python benchmarks/trace_analyze.py [IMAGE]      # prints the figures and the climbs

Issue 29 asked for fewer files and far fewer climbs than the flat layout had; run it on an old checkout with
``PYTHONPATH=OLD_CHECKOUT`` to compare.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def trace(image: str) -> dict:
    import vit_explorer
    from vit_explorer.cli import main

    root = os.path.dirname(vit_explorer.__file__)
    edges, climbs = set(), set()

    def ours(frame) -> bool:
        return frame is not None and frame.f_code.co_filename.startswith(root)

    def follow(frame, event, arg) -> None:
        if event != "call" or frame.f_code.co_name == "<module>" or not ours(frame) or not ours(frame.f_back):
            return
        callee, caller = (os.path.relpath(f.f_code.co_filename, root) for f in (frame, frame.f_back))
        if callee == caller:
            return
        edges.add((caller, callee))
        above, up = set(), frame.f_back.f_back
        while up is not None:
            if ours(up):
                above.add(os.path.relpath(up.f_code.co_filename, root))
            up = up.f_back
        if callee in above:
            climbs.add((caller, callee))

    out = tempfile.mkdtemp()
    sys.setprofile(follow)
    try:
        main(["analyze", image, "--out", str(Path(out) / "analysis"), "--no-faithfulness"])
    finally:
        sys.setprofile(None)
    files = {name for edge in edges for name in edge}
    return {"files": len(files), "edges": len(edges), "climbs": sorted(climbs)}


if __name__ == "__main__":
    default = Path(__file__).resolve().parent.parent / "assets" / "examples" / "00-ring.png"
    figures = trace(sys.argv[1] if len(sys.argv) > 1 else str(default))
    print(f"files {figures['files']}, edges {figures['edges']}, climbs {len(figures['climbs'])}", file=sys.stderr)
    for caller, callee in figures["climbs"]:
        print(f"  {caller} -> {callee}", file=sys.stderr)
