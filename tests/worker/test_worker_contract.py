"""The written contract between a draft worker and its hosts (`runtime.worker.contract.DraftWorker`).

Both workers have every member the Protocol names; the hosts (runtime/engine/, the rank
coordinator) use nothing of their worker outside it. The host check walks the source: every
attribute read on an expression that holds the worker (``worker``, ``self.worker``,
``engine.worker``, ...), and every ``getattr(worker, "name")``; it first runs on a planted
violation, so a check that cannot fail proves nothing.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

from draftgraph.runtime.config import RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.worker.contract import CONTRACT_MEMBERS, DraftWorker
from draftgraph.runtime.worker.eagle import EagleDraftWorker
from draftgraph.runtime.worker.multi_layer import MultiLayerEagleDraftWorker

ROOT = Path(__file__).resolve().parents[2]
HOSTS = sorted((ROOT / "runtime" / "engine").glob("*.py")) + [ROOT / "runtime" / "ranks" / "coordinator.py",
                                                         ROOT / "runtime" / "ranks" / "two_phase.py",
                                                         ROOT / "runtime" / "prometheus.py"]
WORKER_NAMES = {"worker"}  # a name, or an attribute of that name (self.worker, engine.worker, ...)
# read with getattr and a default, outside the contract on purpose (name: why)
OPTIONAL = {"drafting": "the rank coordinator's fingerprint names an EAGLE worker's row layout (None for others)"}
MAX_PUBLIC = 22  # the worker's own surface (issue 39 item 3: about 20; it was 60)


class _Head(torch.nn.Module):
    """The smallest draft model a worker accepts."""

    hidden_size = 4

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(4, 8))

    def forward(self, ids, hidden):
        return hidden @ self.w, hidden


def _workers() -> list[object]:
    return [EagleDraftWorker(RuntimeArgs(SpeculativeConfig(2, 1)), _Head()),
            MultiLayerEagleDraftWorker(RuntimeArgs(SpeculativeConfig(2, 1)))]


def _declared() -> set[str]:
    """Every name `DraftWorker` declares: annotated attributes, properties and methods."""
    names = set(getattr(DraftWorker, "__annotations__", {}))
    names |= {n for n, v in vars(DraftWorker).items()
              if not n.startswith("_") and (inspect.isfunction(v) or isinstance(v, property))}
    return names


def _public(worker: object) -> set[str]:
    return {n for n in dir(worker) if not n.startswith("_")}


def host_uses(source: str) -> set[tuple[int, str]]:
    """(line, name) of every attribute the code reads or calls on its worker."""
    found: set[tuple[int, str]] = set()

    def holds_worker(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in WORKER_NAMES) or (
            isinstance(node, ast.Attribute) and node.attr in WORKER_NAMES)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and holds_worker(node.value):
            found.add((node.lineno, node.attr))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and holds_worker(node.args[0])
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            found.add((node.lineno, node.args[1].value))
    return found


def test_the_protocol_lists_what_it_declares():
    assert _declared() == CONTRACT_MEMBERS


@pytest.mark.parametrize("index", [0, 1], ids=["eagle", "multi_layer"])
def test_each_worker_has_every_member_of_the_contract(index):
    worker = _workers()[index]
    assert isinstance(worker, DraftWorker)
    missing = sorted(n for n in CONTRACT_MEMBERS if not hasattr(worker, n))
    assert missing == []


def test_the_worker_surface_stays_small():
    for worker in _workers():
        public = _public(worker)
        assert CONTRACT_MEMBERS <= public | {"weights"}
        assert len(public) <= MAX_PUBLIC, sorted(public)


def test_the_host_check_sees_a_planted_violation():
    planted = ("def f(engine, worker):\n"
               "    engine.worker.capture_queue.max_threads = 2\n"
               "    getattr(worker, 'row_layout', None)\n"
               "    self.worker.reloads.prepare(1)\n"
               "    other.capture_queue\n")
    uses = host_uses(planted)
    assert uses == {(2, "capture_queue"), (3, "row_layout"), (4, "reloads")}
    assert {name for _, name in uses} - CONTRACT_MEMBERS == {"capture_queue", "row_layout"}


def test_hosts_use_nothing_of_the_worker_outside_the_contract():
    outside = {f"{path.relative_to(ROOT)}:{line}": name for path in HOSTS
               for line, name in sorted(host_uses(path.read_text()))
               if name not in CONTRACT_MEMBERS and name not in OPTIONAL}
    assert outside == {}
    # the walk reads real hosts: the engine's boundary goes through the reload object
    assert (ROOT / "runtime" / "engine" / "boundary.py") in HOSTS
    assert any(name == "reloads" for _, name in host_uses((ROOT / "runtime" / "engine" / "boundary.py").read_text()))
