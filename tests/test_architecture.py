"""The package's shape: its folders are its layers, imports point one way (web, cli → run → methods → core → models;
draw reads core only), and no module imports itself back through others, counting imports inside functions, the
package's own ``__init__`` included."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vit_explorer"
# a layer may import its own layer and those to its right; errors is the package's one exception, below everything
ORDER = ("web", "cli", "explain", "shapes", "run", "draw", "methods", "core", "models", "errors")
ALLOWED = {
    # the app offers the built-in model's examples; it runs methods through the run layer only
    "web": {"web", "run", "draw", "core", "models", "errors", "shapes"},
    "cli": {"cli", "web", "run", "shapes", "draw", "methods", "core", "models", "errors"},
    "explain": {"explain", "run", "draw", "core", "models", "errors"},
    "shapes": {"shapes", "draw", "methods", "core", "models", "errors"},
    # the words of its progress lines are the app's and the terminal's (``draw.words``)
    "run": {"run", "draw", "methods", "core", "models", "errors"},
    # drawing reads results (core) and never computes them: nothing of methods, which run the model
    "draw": {"draw", "core", "models", "errors"},
    "methods": {"methods", "core", "models", "errors"},
    "core": {"core", "models", "errors"},
    "models": {"models", "errors"},
    "errors": set(),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every vit_explorer module ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vit_explorer"):
            assert node.level == 0, f"{path}: relative import"
            for alias in node.names:  # ``from package import module`` imports the module
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists()
                          or (PACKAGE.parent / candidate.replace(".", "/")).is_dir() else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("vit_explorer")}
    return found


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


GRAPH = {module_name(path): imports(path) for path in PACKAGE.rglob("*.py")}


def test_at_most_six_modules_at_the_top_and_a_folder_per_layer():
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    folders = sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists() and path.name != "assets")
    assert len(top) <= 6, top
    assert folders == ["core", "draw", "methods", "models", "shapes", "web"], folders


def test_the_package_init_only_reexports():
    """``vit_explorer/__init__.py`` imports and lists names; it assigns nothing onto other modules' types (it patched the
    notebook display onto ``Analysis``, an upward dependency)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    assigned = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AugAssign))
                and any(isinstance(target, ast.Attribute)
                        for target in getattr(node, "targets", [getattr(node, "target", None)]))]
    assert assigned == [], assigned
    assert {type(node).__name__ for node in tree.body} <= {"Expr", "ImportFrom", "Import", "Assign"}


def test_imports_point_down_the_layers_only():
    wrong = [f"{module} → {imported}" for module, imported_set in GRAPH.items() for imported in imported_set
             if layer(module) and layer(imported) and layer(imported) not in ALLOWED[layer(module)]]
    assert not wrong, wrong


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle a depth-first walk meets, as the chain of modules that closes it."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycles.append(trail[trail.index(target):] + [target])
            elif target not in state:
                visit(target, [*trail, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_drawing_takes_the_maps_it_draws_and_computes_none():
    """``draw`` imports types and constants of ``core.maps`` (what a map, an overview, a grid is), never one of its
    functions: the maps it draws are handed to it (a ``Run``, an ``Overview``, a ``HeadsView``, a ``ClassMap``)."""
    import inspect

    from vit_explorer.core import maps

    functions = {name for name, value in vars(maps).items() if inspect.isfunction(value) and value.__module__ == maps.__name__}
    assert {"class_map", "heads_view", "overview", "rollout_map"} <= functions  # the checker sees them
    for path in (PACKAGE / "draw").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "vit_explorer.core.maps":
                assert not {alias.name for alias in node.names} & functions, f"{path.name} computes maps"
            if isinstance(node, ast.ImportFrom) and node.module == "vit_explorer.core":
                assert "maps" not in {alias.name for alias in node.names}, f"{path.name} imports core.maps whole"


def own_workflow(folder: Path) -> list[str]:
    """Where the modules under ``folder`` run a workflow of their own: an import from ``methods``, an import of a function
    of ``core.analysis`` (its types and constants are results the app shows), and each call of ``analyze`` or
    ``class_evidence``."""
    import inspect

    from vit_explorer.core import analysis

    functions = {name for name, value in vars(analysis).items()
                 if inspect.isfunction(value) and value.__module__ == analysis.__name__}
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {alias.name for alias in node.names}
                if node.module.startswith("vit_explorer.methods") or (node.module == "vit_explorer" and "methods" in names):
                    found.append(f"{path.name}: imports {node.module}")
                if node.module == "vit_explorer.core.analysis" and names & functions:
                    found.append(f"{path.name}: imports {sorted(names & functions)} of core.analysis")
            if isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                owner = getattr(node.func.value, "id", None) if isinstance(node.func, ast.Attribute) else None
                if called in ("analyze", "class_evidence") and owner != "run":
                    found.append(f"{path.name}: calls {called}")
    return found


def test_the_app_runs_no_workflow_of_its_own(tmp_path):
    """``web/`` parses, calls the run layer's stages and shows: an upload, a target, a button, compare and export each
    go through ``run`` (DESIGN: "cli, explain and web only parse, call run and show")."""
    assert own_workflow(PACKAGE / "web") == []
    planted = tmp_path / "tab.py"
    planted.write_text("from vit_explorer.methods.norms import for_analysis\nfrom vit_explorer.core.analysis import Analysis, "
                       "class_evidence\n\ndef f(model, image):\n    return analyze(model, image)\n")
    assert own_workflow(tmp_path) == ["tab.py: imports vit_explorer.methods.norms",
                                      "tab.py: imports ['class_evidence'] of core.analysis", "tab.py: calls analyze"]


def test_no_import_cycle_counting_function_level_imports():
    graph = {module: {target for target in targets if target in GRAPH} for module, targets in GRAPH.items()}
    assert find_cycles(graph) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]  # the walk finds a planted one


def test_the_checker_sees_a_function_level_import(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text("def late():\n    from vit_explorer.draw import charts\n")
    assert imports(source) == {"vit_explorer.draw.charts"}


def test_following_analyze_climbs_back_less_than_on_the_flat_layout():
    # benchmarks/trace_analyze.py traced on the flat tree the regrouping replaced (e2b5a63), without the faithfulness
    # score: 19 files, 39 file-to-file hops, 28 calls back into a file already left (35 with the score, issue 29's figure)
    script = PACKAGE.parent / "benchmarks" / "trace_analyze.py"
    result = subprocess.run([sys.executable, str(script), "--no-faithfulness"], capture_output=True, text=True, timeout=300,
                            cwd=PACKAGE.parent)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = re.search(r"files (\d+), edges (\d+), climbs (\d+)", result.stderr)
    files, edges, climbs = (int(value) for value in figures.groups())
    assert files >= 15 and edges >= files - 1  # the trace followed the whole path: a tracer that saw nothing would pass below
    assert climbs < 28, result.stderr
    # issue 38's two kinds of avoidable climbs: the CLI going back to modules it had used (it now parses, calls run, and
    # shows what draw says), and drawing calling back into the map math (it now draws the maps the run computed)
    pairs = re.findall(r"^  (\S+) -> (\S+)$", result.stderr, flags=re.MULTILINE)
    assert len(pairs) == climbs
    avoidable = [pair for pair in pairs if pair[0] == "cli.py" or (pair[0].startswith("draw/") and pair[1] == "core/maps.py")]
    assert not avoidable, pairs


LONGEST_FUNCTION = 80  # lines: a function that needs more than one screen is two functions (DESIGN.md)


def test_no_function_is_longer_than_a_screen():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION:
                long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long
