"""Backends are asked what they can do, never compared by name (issue 50, item 3): outside the
backend registry (graphs/backends.py) no module of graphs/ or runtime/ compares anything with a
backend's name; the code asks `capabilities` (captures, compiled code, device replay, stored code)."""

from __future__ import annotations

from pathlib import Path

import pytest
from structure_support import modules, name_comparisons

from draftgraph.graphs.backends import BACKEND_NAMES, backend_class, capabilities

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = "draftgraph.graphs.backends"
NAMES = frozenset(BACKEND_NAMES) - {"auto"}  # "auto" is also a capture mode's name


def test_the_check_sees_equality_and_membership_but_not_a_device_type(tmp_path):
    src = tmp_path / "a.py"
    src.write_text('def f(backend, d, name):\n'
                   '    a = backend == "eager"\n'
                   '    b = "cuda" != name\n'
                   '    c = backend in ("trace", "compile")\n'
                   '    e = d.type == "cuda"\n'
                   '    g = "trace" in {}\n'
                   '    return a, b, c, e, g\n')
    assert name_comparisons(src, NAMES) == [(2, "eager"), (3, "cuda"), (4, "trace"), (4, "compile")]


def test_no_backend_name_comparison_outside_the_registry():
    found = {}
    for folder, package in (("graphs", "draftgraph.graphs"), ("runtime", "draftgraph.runtime")):
        for name, path in modules(ROOT / folder, package).items():
            if name != REGISTRY and (hits := name_comparisons(path, NAMES)):
                found[name] = hits
    assert found == {}


DECLARED = {  # name: (captures, compiles_code, replays_on_device, stores_code, records_on_copies)
    "eager": (False, False, False, False, False),  # runs the step as it is
    "trace": (True, False, False, False, True),  # an FX recording, replayed in Python
    "compile": (True, True, False, True, True),  # the trace recording compiled by inductor, stored
    "cuda": (True, False, True, False, False),  # a CUDA graph: device replay on the live buffers
}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_backend_declares_its_capabilities(name):
    can = capabilities(name)
    assert can.name == name
    assert (can.captures, can.compiles_code, can.replays_on_device, can.stores_code,
            can.records_on_copies) == DECLARED[name]
    assert backend_class(name).captures is can.captures  # declared by the class, read from it


def test_auto_is_resolved_before_its_capabilities_are_read():
    assert capabilities("auto").name in NAMES
    with pytest.raises(ValueError, match="backend='nope'"):
        capabilities("nope")
