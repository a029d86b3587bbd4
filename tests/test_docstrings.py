"""Every module of tinkrl, and every public function and class at its top level, says what it is."""

from __future__ import annotations

import ast
from pathlib import Path

import tinkrl

ROOT = Path(tinkrl.__file__).parent


def test_every_module_and_public_top_level_name_has_a_docstring():
    missing = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        where = path.relative_to(ROOT.parent)
        if not ast.get_docstring(tree):
            missing.append(f"{where}: module")
        for node in tree.body:
            public = not node.name.startswith("_") if hasattr(node, "name") else False
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and public:
                if not ast.get_docstring(node):
                    missing.append(f"{where}:{node.lineno} {node.name}")
    assert not missing, "no docstring:\n" + "\n".join(missing)
