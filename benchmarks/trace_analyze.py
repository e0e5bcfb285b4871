"""How far a reader travels following ``vit-explorer analyze`` from the command line to the files it writes.

Traces one ``analyze`` of an example image (by default as a user runs it: with the faithfulness score) with
``sys.setprofile``. Each call into the package is charged to the nearest package frame up the stack (for a hook that
torch calls during a forward pass, the package code that ran the forward); calls made while a module is imported are
left out. Over the calls from one package file into another it counts:

- files: the package files those calls enter or leave;
- edges: distinct caller file → callee file pairs (the hops a reader makes between files);
- climbs: distinct pairs in which the call goes back into a file entered before and already left (not open further up
  the call stack): the reader returns to a file they had finished with. This is the reading that gives issue 29's
  figure, 35, on the flat layout it was filed against (commit e2b5a63);
- into open: distinct pairs in which the callee's file is still open up the stack (A → B → A, a callback).

Reading a property counts as a call, as it did for the issue's figure; ``--no-properties`` leaves property reads out,
counting only the functions a reader would open.

    python benchmarks/trace_analyze.py [IMAGE] [--no-faithfulness] [--no-properties]

Run it on an old checkout with ``PYTHONPATH=OLD_CHECKOUT`` (from that checkout, for its shipped model) to compare.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from pathlib import Path


def trace(image: str, faithfulness: bool = True, properties: bool = True) -> dict:
    import vit_explorer
    from vit_explorer.cli import main

    root = os.path.dirname(vit_explorer.__file__)
    edges, climbs, into_open = set(), set(), set()
    entered: set[str] = set()

    def ours(frame) -> bool:
        return frame.f_code.co_filename.startswith(root)

    def is_property(frame) -> bool:
        owner = frame.f_locals.get("self")
        return owner is not None and isinstance(getattr(type(owner), frame.f_code.co_name, None),
                                                (property, functools.cached_property))

    def follow(frame, event, arg) -> None:
        if event != "call" or frame.f_code.co_name == "<module>" or not ours(frame):
            return
        if not properties and is_property(frame):
            return
        above, up = [], frame.f_back
        while up is not None:
            if ours(up):
                if up.f_code.co_name == "<module>":
                    return  # import time
                above.append(os.path.relpath(up.f_code.co_filename, root))
            up = up.f_back
        callee = os.path.relpath(frame.f_code.co_filename, root)
        if above and above[0] != callee:
            pair = (above[0], callee)
            edges.add(pair)
            if callee in above:
                into_open.add(pair)
            elif callee in entered:
                climbs.add(pair)
        entered.update([callee, *above[:1]])

    out = tempfile.mkdtemp()
    sys.setprofile(follow)
    try:
        main(["analyze", image, "--out", str(Path(out) / "analysis")] + ([] if faithfulness else ["--no-faithfulness"]))
    finally:
        sys.setprofile(None)
    files = {name for edge in edges for name in edge}
    return {"files": len(files), "edges": len(edges), "climbs": sorted(climbs), "into_open": sorted(into_open)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image", nargs="?", default=str(Path("assets") / "examples" / "00-ring.png"))
    parser.add_argument("--no-faithfulness", action="store_true")
    parser.add_argument("--no-properties", action="store_true")
    args = parser.parse_args()
    figures = trace(args.image, faithfulness=not args.no_faithfulness, properties=not args.no_properties)
    print(f"files {figures['files']}, edges {figures['edges']}, climbs {len(figures['climbs'])}, "
          f"into open {len(figures['into_open'])}", file=sys.stderr)
    for caller, callee in figures["climbs"]:
        print(f"  {caller} -> {callee}", file=sys.stderr)
