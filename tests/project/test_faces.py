"""Every wing shows a face (issue 50, item 4): each package of graphs/ and runtime/ lists what
it exports in ``__all__`` (sorted, unique), and every listed name resolves to the object its
defining module holds."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from structure_support import modules

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {name: path for folder, package in (("graphs", "draftgraph.graphs"), ("runtime", "draftgraph.runtime"))
            for name, path in modules(ROOT / folder, package).items() if path.name == "__init__.py"}


def test_the_packages_are_found():
    assert {"draftgraph.runtime.worker", "draftgraph.runtime.topology", "draftgraph.graphs.compile"} <= set(PACKAGES)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_package_exports_its_face(package):
    face = importlib.import_module(package)
    names = getattr(face, "__all__", None)
    assert names, f"{package}: no __all__"
    assert list(names) == sorted(set(names)), f"{package}: __all__ must be sorted and unique"
    missing = [n for n in names if not hasattr(face, n)]
    assert missing == []
    for name in names:  # a face re-exports the defining module's own object
        value = getattr(face, name)
        home = getattr(value, "__module__", None)
        if isinstance(home, str) and home.startswith(package + "."):
            assert getattr(importlib.import_module(home), name, value) is value
