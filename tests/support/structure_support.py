"""The structure checks of tests/project/test_structure.py as functions over any package tree.

Each check takes a package root (a folder holding ``__init__.py``) and its dotted name, so a test
can run it on draftgraph and, first, on a planted violation in a temporary tree (a check that
cannot fail proves nothing). Everything reads source with `ast`; nothing is imported.

- `import_graph` / `find_cycle`: module -> the package's modules it imports. **Every import
  counts, at module level or inside a function**: a function-level import runs in the same
  process and closes the same circle the moment it runs (issue 39: the compile process imported
  two functions of the backend inside a function, and the backend imported the worker at the
  top). Package ``__init__`` files are nodes for what they import themselves; the implicit
  import of a parent package that every ``import a.b.c`` makes is not an edge (Python finds the
  parent in ``sys.modules`` half-built, by design).
- `private_imports`: ``from m import _name`` of another module, and ``m._name`` where ``m`` is an
  imported module (dunder names are public).
- `long_definitions`: classes and functions (methods and nested ones too) longer than a limit.
- `env_reads`: ``os.environ[...]``, ``os.environ.get(...)``, ``os.getenv(...)`` and ``... in
  os.environ`` of a ``DRAFTGRAPH_*`` name (a literal, or a module constant holding one).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module under ``root`` by dotted name (a package's ``__init__`` as the package)."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        if "__pycache__" in f.parts:
            continue
        parts = list(f.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package, *parts])] = f
    return out


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _target(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` in module ``name`` (at ``path``) reads from."""
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    parts = package.split(".")
    base = parts[:len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports anywhere (top level or inside a function)."""
    found = set()
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.ImportFrom):
            target = _target(name, path, node)
            candidates = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        found.update(c for c in candidates if c in known and c != name)
    return found


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``mods`` it imports."""
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (``[a, b, ..., a]``), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class PrivateUse:
    """``module`` (at ``line``) uses ``source``'s private ``name``."""

    module: str
    line: int
    source: str
    name: str


def private_imports(name: str, path: Path) -> Iterator[PrivateUse]:
    """Private names ``path`` takes from another module (see the module docstring)."""
    tree = _parse(path)
    module_names: dict[str, str] = {}  # local name -> the module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                local = a.asname or a.name.split(".")[0]
                module_names[local] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            target = _target(name, path, node)
            for a in node.names:
                if _private(a.name):
                    yield PrivateUse(name, node.lineno, target, a.name)
                else:  # maybe a submodule: ``from torch import fx`` then ``fx._x``
                    module_names.setdefault(a.asname or a.name, f"{target}.{a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = _dotted(node.value)
            if base is not None and base.split(".")[0] in module_names:
                head, _, rest = base.partition(".")
                source = module_names[head] + (f".{rest}" if rest else "")
                yield PrivateUse(name, node.lineno, source, node.attr)


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and public attributes, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        if _private(node.attr):
            return None  # ``m._a._b``: reported at ``m._a``
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


@dataclass(frozen=True)
class LongDefinition:
    """``qualname`` in ``module`` spans ``lines`` lines (a "class" or a "function")."""

    module: str
    qualname: str
    kind: str
    lines: int


def long_definitions(name: str, path: Path, max_class: int, max_function: int) -> Iterator[LongDefinition]:
    """Classes over ``max_class`` lines and functions over ``max_function`` (docstring included)."""

    def walk(node: ast.AST, prefix: str) -> Iterator[LongDefinition]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = f"{prefix}{child.name}"
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                limit = max_class if kind == "class" else max_function
                if lines > limit:
                    yield LongDefinition(name, qual, kind, lines)
                yield from walk(child, qual + ".")
            else:
                yield from walk(child, prefix)

    yield from walk(_parse(path), "")


def env_reads(path: Path, prefix: str = "DRAFTGRAPH_") -> list[int]:
    """Lines where ``path`` reads an environment variable named ``prefix...``."""
    tree = _parse(path)
    constants = {t.id for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 and node.value.value.startswith(prefix) for t in node.targets if isinstance(t, ast.Name)}

    def is_key(node: ast.AST | None) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and node.value.startswith(prefix)
        return isinstance(node, ast.Name) and node.id in constants

    def is_environ(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
            (isinstance(node, ast.Name) and node.id == "environ")

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_environ(node.value) and is_key(node.slice):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and node.args and is_key(node.args[0]):
            func = node.func
            environ_call = isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault") \
                and is_environ(func.value)
            getenv = (isinstance(func, ast.Attribute) and func.attr == "getenv") or \
                (isinstance(func, ast.Name) and func.id == "getenv")
            if environ_call or getenv:
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and is_key(node.left) and any(is_environ(c) for c in node.comparators):
            lines.append(node.lineno)
    return sorted(lines)


def imported_modules(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports (``from a import b``: a and a.b), anywhere."""
    found = set()
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def imports_of_test_code(path: Path, test_modules: set[str]) -> set[str]:
    """What ``path`` imports from the test suite: ``tests`` and its modules, or a module of
    ``test_modules`` (tests/support/ on sys.path makes ``engine_support`` importable by its bare name)."""
    return {m for m in imported_modules(path)
            if m == "tests" or m.startswith("tests.") or m.split(".")[0] in test_modules}


def name_comparisons(path: Path, names: frozenset[str]) -> list[tuple[int, str]]:
    """(line, name) of each comparison of something with one of ``names`` (a string literal):
    ``x == "name"``, ``x != "name"``, ``x in ("name", ...)`` (a literal tuple, list or set).
    A device's type (``d.type == "cuda"``) is not a backend's name and does not count."""

    def literal(node: ast.AST) -> str | None:
        return node.value if isinstance(node, ast.Constant) and node.value in names else None

    found = []
    for node in ast.walk(_parse(path)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if any(isinstance(side, ast.Attribute) and side.attr == "type" for side in (left, right)):
                continue
            if isinstance(op, (ast.Eq, ast.NotEq)):
                hits = [h for h in (literal(left), literal(right)) if h]
            elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                hits = [h for h in map(literal, right.elts) if h]
            else:
                hits = []
            found.extend((node.lineno, h) for h in hits)
    return found


def folder_of(module: str, path: Path) -> str:
    """The folder (package) ``module`` lives in; a package's ``__init__`` is its own folder's.

    A ``__main__`` module is a node of its own: ``python -m`` runs it and no module imports it,
    so its imports cannot close a loop through its folder (``runtime/__main__.py`` starts the
    command line, which builds on the top folder). A module that did import it would still show
    as an edge into that node, and a loop through it would still be found."""
    if path.name == "__main__.py":
        return module
    return module if path.name == "__init__.py" else module.rsplit(".", 1)[0]


def folder_graph(mods: dict[str, Path]) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """Folder -> each other folder its modules import -> the module edges (importer, imported)
    that make the folder edge. Every import counts, as in `import_graph`."""
    graph = import_graph(mods)
    out: dict[str, dict[str, list[tuple[str, str]]]] = {folder_of(m, p): {} for m, p in mods.items()}
    for m, deps in graph.items():
        a = folder_of(m, mods[m])
        for d in sorted(deps):
            b = folder_of(d, mods[d])
            if a != b:
                out[a].setdefault(b, []).append((m, d))
    return out
