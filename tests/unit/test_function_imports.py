"""Project imports stand at the top of their module, where a reader sees what a module builds on and the
import contracts (pyproject.toml) see it too: none inside a function in gpustack_models/ or config/, but at
the process entry points listed here, each of which says in a comment why it must import late."""

import ast

from tests.support.paths import REPO

PROJECT = ("gpustack_models", "config")

# (module, function): the documented exceptions, one per process at most.
ENTRY_POINTS = {
    # Django imports the app's config while it loads the apps; the API's server, only in the API process.
    ("gpustack_models/apps.py", "ready"),
    # The roles' metrics exist once imported: a Celery worker picks multiprocess mode first.
    ("config/celery.py", "_roles"),
}


def _project_module(node: ast.Import | ast.ImportFrom) -> str | None:
    if isinstance(node, ast.ImportFrom):
        if node.level:  # relative: inside the project by definition
            return "." * node.level + (node.module or "")
        names = [node.module or ""]
    else:
        names = [alias.name for alias in node.names]
    return next((n for n in names if n.split(".")[0] in PROJECT), None)


class _Finder(ast.NodeVisitor):
    """Project imports inside functions: (innermost function, line, module) of each."""

    def __init__(self):
        self.functions: list[str] = []
        self.found: list[tuple[str, int, str]] = []

    def _function(self, node):
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def _import(self, node):
        module = _project_module(node)
        if module and self.functions:
            self.found.append((self.functions[-1], node.lineno, module))

    visit_Import = visit_ImportFrom = _import


def function_imports(source: str) -> list[tuple[str, int, str]]:
    finder = _Finder()
    finder.visit(ast.parse(source))
    return finder.found


def project_files():
    for root in PROJECT:
        for path in sorted((REPO / root).rglob("*.py")):
            if not {"migrations", "generated"} & set(path.parts):
                yield path


def test_it_finds_a_project_import_inside_a_function_however_deep():
    source = """
import os
from gpustack_models import kube

def outer():
    import json
    def inner():
        from gpustack_models.kube import client
        from . import sibling
    return lambda: None

class Thing:
    async def method(self):
        import config.celery
"""
    assert function_imports(source) == [
        ("inner", 8, "gpustack_models.kube"),
        ("inner", 9, "."),
        ("method", 14, "config.celery"),
    ]


def test_it_keeps_project_imports_at_the_top_of_their_module():
    found = {}
    for path in project_files():
        for function, line, module in function_imports(path.read_text()):
            found.setdefault((str(path.relative_to(REPO)), function), []).append(f"{line}: {module}")
    late = {key: lines for key, lines in found.items() if key not in ENTRY_POINTS}
    assert late == {}
    # Each exception is still needed (else it leaves the list), and says so and why where it imports.
    assert set(found) == ENTRY_POINTS
    for module, function in ENTRY_POINTS:
        source = (REPO / module).read_text()
        node = next(n for n in ast.walk(ast.parse(source)) if getattr(n, "name", None) == function)
        assert "project import inside a function" in ast.get_source_segment(source, node), f"{module}:{function}"
