"""Imports point down, and no module imports itself in a circle.

Every `import` statement in tinkrl (module level and inside functions) is read with `ast` and
checked against the layers of docs/design.md: a module may import its own layer and the layers
below it, never one above. A circle between modules fails even within one layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tinkrl

ROOT = Path(tinkrl.__file__).parent

# Top to bottom. A module belongs to the layer of the longest prefix that names it.
LAYERS: list[tuple[str, list[str]]] = [
    ("commands", ["tinkrl.cli", "tinkrl.commands"]),
    ("harness adapters", ["tinkrl.harness"]),
    ("launch", ["tinkrl.launch"]),
    ("servers", ["tinkrl.tinker_server", "tinkrl.viewer", "tinkrl.env_server"]),
    ("environments", ["tinkrl.envs"]),
    ("OpenAI server", ["tinkrl.proxy"]),  # environments sample through the run's OpenAI server
    ("agents", ["tinkrl.agents"]),
    ("task directories", ["tinkrl.taskdirs"]),
    ("sandboxes", ["tinkrl.sandbox"]),
    ("rl", ["tinkrl.rl"]),
    ("chat and logs", ["tinkrl.renderers", "tinkrl.tracking", "tinkrl.traces"]),
    ("tinker seam", ["tinkrl.backends"]),
    ("engine", ["tinkrl.local"]),
    (
        "foundations",
        [
            "tinkrl.config",
            "tinkrl.dialects",
            "tinkrl.storage",
            "tinkrl.aio_thread",
            "tinkrl.errors",
            "tinkrl.access",
            "tinkrl.openapi",
            "tinkrl",
        ],
    ),
]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (annotations only: not a dependency at run time)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports_of(path: Path, known: set[str], name: str) -> set[str]:
    """The tinkrl modules the module `name` at `path` imports at run time, wherever the statement is.
    `from pkg import sub` counts as importing `pkg.sub` when that is a module, else `pkg`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            subs = {f"{base}.{a.name}" for a in node.names} & known
            found.update(subs or {base})
    return {m for m in found if m in known and m != name}


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def layer_of(module: str) -> int:
    best, index = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, index = len(prefix), i
    assert index is not None, f"{module} is in no layer: add it to LAYERS and docs/design.md"
    return index


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(path, set(known), name) for name, path in known.items()}


def test_every_import_points_down():
    wrong = []
    for module, targets in graph().items():
        for target in targets:
            if layer_of(target) < layer_of(module):
                wrong.append(
                    f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
                )
    assert not wrong, "imports that point up:\n" + "\n".join(sorted(wrong))


def test_no_import_circles():
    edges = graph()
    circles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_checker_sees_an_upward_import(tmp_path):
    """The reader finds imports inside functions, relative ones, and not type-only ones (so the tests
    above can fail, and fail only for real dependencies)."""
    known = set(modules())
    fake = tmp_path / "tinkrl" / "local" / "fake.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(
        "from typing import TYPE_CHECKING\nfrom . import losses\nif TYPE_CHECKING:\n    from tinkrl.envs import EnvContext\n"
        "def f():\n    from tinkrl.rl.train import main\n"
    )
    assert imports_of(fake, known, "tinkrl.local.fake") == {"tinkrl.local.losses", "tinkrl.rl.train"}
    assert layer_of("tinkrl.rl.train") < layer_of("tinkrl.local.fake")
