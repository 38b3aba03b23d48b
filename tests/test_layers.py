"""The floor plan holds (docs/DESIGN.md "Layout and dependency direction"): no import circle in seer_trt or
seer_export, every layer of seer_trt imports only the layers below it (lazy imports included), and one request
walks the runtime's stages one way."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"seer_trt": ROOT / "seer_trt", "seer_export": ROOT / "export"}
# layer -> the layers of seer_trt it may import (its own included)
ALLOWED = {
    "contracts": {"contracts"},
    "backends": {"contracts", "backends"},
    "runtime": {"contracts", "backends", "runtime"},
    "build": {"contracts", "backends", "build"},
    "eval": {"contracts", "backends", "runtime", "eval"},
    "serving": {"contracts", "backends", "runtime", "serving"},
    "cli": {"contracts", "backends", "runtime", "build", "eval", "serving", "cli"},
}
WALK = [
    "request",
    "decoding",
    "prompt",
    "image",
    "embed",
    "step_zero",
    "boundary",
    "schedule",
    "denoise",  # at every step: dispatch (its rows' split into calls), layout (each call's), kv_cache
    "detokenize",
]


def modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            if "templates" in path.parts:  # Triton's model.py runs inside the server, not in the package
                continue
            parts = [pkg, *path.relative_to(folder).with_suffix("").parts]
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(path: Path, mods: dict[str, Path], name: str) -> set[str]:
    """The project modules ``path`` imports anywhere in it (module level and inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for target in targets:
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def test_no_import_circle():
    mods = modules()
    graph = {m: imports(p, mods, m) for m, p in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    assert len(mods) > 60 and sum(map(len, graph.values())) > 200  # the walk saw the real tree
    assert circles == []


def test_each_layer_imports_only_the_layers_below_it():
    mods = modules()
    wrong = []
    for name, path in mods.items():
        parts = name.split(".")
        if parts[0] != "seer_trt":
            continue
        for target in imports(path, mods, name):
            if target.startswith("seer_export"):
                wrong.append(f"{name} imports {target}: the runtime never imports the exporter")
            elif len(parts) > 1 and parts[1] in ALLOWED:
                layer = target.split(".")[1] if target.count(".") else ""
                if layer not in ALLOWED[parts[1]]:
                    wrong.append(f"{name} ({parts[1]}) imports {target} ({layer or 'the package'})")
    assert wrong == []


def test_every_module_sits_in_a_layer():
    loose = [n for n in modules() if n.startswith("seer_trt.") and n.split(".")[1] not in ALLOWED]
    assert loose == [], "seer_trt/ holds layer folders only; put these in one"


@pytest.mark.slow
def test_one_request_walks_the_stages_one_way(fixture_export):
    spec = importlib.util.spec_from_file_location("request_walk", ROOT / "tools" / "request_walk.py")
    walker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(walker)
    from seer_trt import Request, SeerPipeline
    from seer_trt.eval.tasks import render

    pipe = SeerPipeline.from_manifest(fixture_export[0])
    image = render([("red", "square"), ("blue", "ring")], grid=4, cell_px=8)
    pipe.generate([Request("count the shapes one by one .", image=image)])  # warm
    stops, tools = walker.walk(pipe, Request("count the shapes one by one .", image=image))
    assert stops == WALK
    assert walker.returns(stops) == []
    # the stages' own tools are later stages' helpers, never an earlier stage's
    order = {s: i for i, s in enumerate(WALK + ["dispatch", "layout", "kv_cache"])}
    for edge in tools:
        caller, callee = edge.split(" -> ")
        assert order[callee.split(".")[0]] > order[caller], edge


@pytest.mark.parametrize(
    "cli",
    ["seer_trt.cli.run", "seer_trt.cli.build", "seer_trt.cli.triton", "seer_trt.cli.eval", "seer_trt.cli.prompt_ids"],
)
def test_a_cli_module_is_argparse_over_a_library(cli):
    """CLI modules hold parsing and printing; none defines a class (the work lives in a library layer)."""
    tree = ast.parse(mods_path(cli).read_text())
    assert not [n.name for n in tree.body if isinstance(n, ast.ClassDef)]


def mods_path(name: str) -> Path:
    return modules()[name]
