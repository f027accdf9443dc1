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
import typing
from pathlib import Path

import pytest
import torch

from draftgraph.runtime.config import RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.worker.contract import CONTRACT_MEMBERS, OPTIONAL_MEMBERS, DraftWorker
from draftgraph.runtime.worker.eagle import EagleDraftWorker
from draftgraph.runtime.worker.multi_layer import MultiLayerEagleDraftWorker

ROOT = Path(__file__).resolve().parents[2]
HOSTS = sorted((ROOT / "runtime" / "engine").glob("*.py")) + [ROOT / "runtime" / "ranks" / "coordinator.py",
                                                         ROOT / "runtime" / "ranks" / "two_phase.py",
                                                         ROOT / "runtime" / "prometheus" / "__init__.py"]
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


# ---- whole paths (issue 50 item 2) ------------------------------------------------------------------
PATH_HOSTS = sorted(p for d in ("engine", "serve", "sglang", "ranks", "commands")
                    for p in (ROOT / "runtime" / d).rglob("*.py")) + \
    [ROOT / "runtime" / "prometheus" / "__init__.py"] + sorted((ROOT / "scripts").glob("*.py"))
# files whose ``worker`` is not a draftgraph worker (file: why)
FOREIGN = {"runtime/sglang/adapter.py": "SGLang's own draft worker, which the adapter patches (its own contract: "
                                        "SGLangDraftWorker)"}


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; ``getattr(a.b, "c"[, d])`` as ["a", "b", "c"]; else None."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            parts.append(node.args[1].value)
            node = node.args[0]
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            return parts[::-1]
        else:
            return None


def host_paths(source: str) -> set[tuple[int, str, bool]]:
    """(line, path after the worker, written) of every attribute path the code takes through a
    worker: ``worker.a.b``, ``self.worker.a.b``, ``getattr(worker.a, "b")``, and paths through
    a name bound to one (``queue = self.worker.capture.queue`` then ``queue.pending``, in the
    same module). A value passed on to another function is not followed."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    aliases: dict[str, list[str]] = {}

    def through_worker(parts: list[str]) -> list[str] | None:
        if parts[0] in aliases:
            return aliases[parts[0]] + parts[1:]
        if "worker" in parts[:-1]:
            return parts[parts.index("worker") + 1:]
        return None

    for node in ast.walk(tree):  # aliases first: a name bound to a path through the worker
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            parts = _chain(node.value)
            if parts and (path := through_worker(parts)):
                aliases[node.targets[0].id] = path
    found: set[tuple[int, str, bool]] = set()
    for node in ast.walk(tree):
        parent = parents.get(node)
        if not isinstance(node, (ast.Attribute, ast.Call)) or isinstance(parent, ast.Attribute) or (
                isinstance(parent, ast.Call) and parent.args and parent.args[0] is node and _chain(parent)):
            continue  # only the end of a chain (its inner links are part of it)
        parts = _chain(node)
        if not parts or len(parts) < 2 or (path := through_worker(parts)) is None or not path:
            continue
        written = isinstance(getattr(node, "ctx", None), (ast.Store, ast.Del))
        found.add((node.lineno, ".".join(path), written))
    return found


def _member_type(face: type, name: str) -> object:
    """What ``face.name`` holds: an annotation's type, a property's return type, or "method"."""
    value = inspect.getattr_static(face, name, None)
    if isinstance(value, property):
        return typing.get_type_hints(value.fget).get("return")
    if inspect.isfunction(value):
        return "method"
    return typing.get_type_hints(face).get(name, None) if name in _annotations(face) else None


def _annotations(face: type) -> set[str]:
    return {n for klass in face.__mro__ for n in getattr(klass, "__annotations__", {})}


def _protocol_in(kind: object) -> type | None:
    """The Protocol class ``kind`` names (``X | None`` included), None for a plain value type."""
    for option in typing.get_args(kind) or (kind,):
        if isinstance(option, type) and getattr(option, "_is_protocol", False):
            return option
    return None


def unnamed(path: str) -> str | None:
    """None when every link of ``path`` (after the worker) is named by the face it is read on,
    down to a value type; else the first link that is not, with the face it is missing from."""
    first, *rest = path.split(".")
    face: type | None = DraftWorker
    if first in OPTIONAL_MEMBERS:
        face = OPTIONAL_MEMBERS[first]
    elif first not in CONTRACT_MEMBERS:
        return f"{first} (not in DraftWorker)"
    else:
        face = _protocol_in(_member_type(DraftWorker, first))
    for link in rest:
        if link.startswith("_"):
            return f"{link} (private)"
        if face is None:  # a value type: its public attributes are its own contract
            continue
        kind = _member_type(face, link)
        if kind is None:
            return f"{link} (not in {face.__name__})"
        face = None if kind == "method" else _protocol_in(kind)
    return None


def test_the_path_walk_sees_planted_uses_in_a_file(tmp_path):
    planted = tmp_path / "host.py"
    planted.write_text(
        "def f(engine, worker):\n"
        "    engine.worker.capture.queue.max_threads = 2\n"
        "    queue = self.worker.capture.queue\n"
        "    queue.pending()\n"
        "    queue.entries\n"
        "    getattr(worker.capture, 'compile_process', None)\n"
        "    worker.reloads.commit(1)\n"
        "    worker.state.graphs.backend_name\n"
        "    worker.drafting._tree_lists\n"
        "    other.capture.queue\n")
    paths = host_paths(planted.read_text())
    assert paths == {(2, "capture.queue.max_threads", True), (3, "capture.queue", False),
                     (4, "capture.queue.pending", False), (5, "capture.queue.entries", False),
                     (6, "capture.compile_process", False), (7, "reloads.commit", False),
                     (8, "state.graphs.backend_name", False), (9, "drafting._tree_lists", False)}
    verdicts = {path: unnamed(path) for _, path, _ in paths}
    assert verdicts == {"capture.queue.max_threads": "max_threads (not in CaptureQueueFace)",
                        "capture.queue": None, "capture.queue.pending": None,
                        "capture.queue.entries": "entries (not in CaptureQueueFace)",
                        "capture.compile_process": "compile_process (not in CaptureFace)",
                        "reloads.commit": None, "state.graphs.backend_name": None,
                        "drafting._tree_lists": "_tree_lists (private)"}


def test_every_path_a_host_takes_through_its_worker_is_named():
    outside, written = {}, {}
    for path in PATH_HOSTS:
        rel = str(path.relative_to(ROOT))
        for line, walked, write in sorted(host_paths(path.read_text())):
            if rel in FOREIGN:
                continue
            if write:
                written[f"{rel}:{line}"] = walked
            why = unnamed(walked)
            if why is not None:
                outside[f"{rel}:{line} {walked}"] = why
    assert outside == {}
    assert written == {}  # hosts write nothing through the worker
    # the walk reads real hosts and real depth
    walked = {p for path in PATH_HOSTS for _, p, _ in host_paths(path.read_text())}
    assert {"reloads.commit", "capture.queue.pending", "capture.set_compile_processes"} <= walked


# ---- a new worker: one written Protocol (WorkerKind) -------------------------------------------------
class _ShortKind:
    """A kind that serves S <= 2 and captures nothing."""

    captures_graphs = False

    def check_args(self, args):
        if args.speculative.num_steps > 2:
            raise ValueError(f"num_steps={args.speculative.num_steps}: this kind drafts at most 2")

    def row_input_bytes(self):
        return 0

    def graph_step(self, state, max_size, args):
        raise NotImplementedError

    def stored_code(self, state, compiler, args):
        return None


def test_a_new_worker_gives_the_base_one_kind_and_its_rules_hold_on_every_path():
    from draftgraph.runtime.worker import EagleDraftWorkerBase

    class ShortWorker(EagleDraftWorkerBase):
        def __init__(self, args):
            super().__init__(args, _ShortKind())

        def draft_forward(self, draft_input):
            raise NotImplementedError

    with pytest.raises(ValueError, match="num_steps=3: this kind drafts at most 2"):
        ShortWorker(RuntimeArgs(SpeculativeConfig(3, 1)))
    w = ShortWorker(RuntimeArgs(SpeculativeConfig(2, 1)))
    assert isinstance(w, DraftWorker)
    with pytest.raises(ValueError, match="num_steps=3: this kind drafts at most 2"):
        w.request_reload(RuntimeArgs(SpeculativeConfig(3, 1)))
    w.reload(RuntimeArgs(SpeculativeConfig(1, 1)))
    assert w.spec.num_steps == 1 and w.generation == 1


def test_a_kind_missing_a_member_is_refused_naming_it():
    from draftgraph.runtime.worker import EagleDraftWorkerBase

    class Partial:
        captures_graphs = False

        def check_args(self, args):
            pass

    with pytest.raises(TypeError, match=r"kind=Partial: needs row_input_bytes \(a WorkerKind\)"):
        EagleDraftWorkerBase(RuntimeArgs(SpeculativeConfig(2, 1)), Partial())


# ---- hosts import the worker's face only ---------------------------------------------------------------
def inner_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import of a module inside the worker wing (``draftgraph.runtime.worker.x``,
    or ``..worker.x`` relative), top level or inside a function."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            name = ("." * node.level) + node.module
            if name.startswith("draftgraph.runtime.worker.") or (node.level and node.module.startswith("worker.")):
                found.append((node.lineno, name))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("draftgraph.runtime.worker.")]
    return sorted(found)


def test_the_face_check_sees_inner_imports_in_a_file(tmp_path):
    planted = tmp_path / "host.py"
    planted.write_text("from draftgraph.runtime.worker import DraftWorker\n"
                       "from draftgraph.runtime.worker.reload import Reloads\n"
                       "def f():\n"
                       "    from ..worker.state import RuntimeState\n"
                       "    import draftgraph.runtime.worker.budget\n")
    assert inner_imports(planted.read_text()) == [(2, "draftgraph.runtime.worker.reload"), (4, "..worker.state"),
                                                  (5, "draftgraph.runtime.worker.budget")]


def test_hosts_import_only_the_worker_face():
    inner = {f"{path.relative_to(ROOT)}:{line}": name for path in PATH_HOSTS
             for line, name in inner_imports(path.read_text())}
    assert inner == {}
