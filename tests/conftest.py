"""Shared fixtures: engines and workers closed after their test, the default models trained
once, the NVTX switch, the ``python -O`` harness, the SGLang reference (differential oracle).

The tests live in folders by wing (graphs/, topology/, worker/, engine/, models/, serve/, ranks/,
sglang_adapter/, cli/, project/); a fixture only one wing uses is in that folder's conftest.py.
Their support modules (builders in engine_support.py, helpers in draft_support.py, ...) live in
tests/support/, which this file puts on sys.path: every test imports them by bare name
(``from engine_support import models``) from any folder. Test files' basenames are unique across
folders (no __init__.py: pytest's default import mode imports each by its basename).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

# SGLang wraps select_top_k_tokens' later steps in torch.compile; eagerly it is bitwise the same
# (see shared/sglang-oracle.md) and skips a multi-second CPU compile per shape.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
# The compiled-code store is off unless a test turns it on (tests/graphs/test_compile_store.py): a
# test that counts compiles must not load what an earlier test stored.
os.environ.setdefault("DRAFTGRAPH_COMPILED", "0")
# The commands' default target is SmolLM2 (a 538 MB conversion, 30 layers): the tests and the
# commands they start serve the small embedded pair unless a test names a target (the slow tier
# runs the real model by name: tests/models/test_smollm2.py).
os.environ.setdefault("DRAFTGRAPH_TARGET", "toy")

# The support modules, importable by bare name from every test folder (and by this file).
SUPPORT = pathlib.Path(__file__).resolve().parent / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _capture_threads_finish_within_their_test():
    """A background capture thread a test started finishes before the next test runs, so no
    test measures memory or time beside another test's captures (bounded: a hang fails)."""
    yield
    for t in threading.enumerate():
        if t.name == "draftgraph-capture":
            t.join(180)
            assert not t.is_alive(), "a draftgraph capture thread outlived its test by 180 s"


@pytest.fixture(scope="session")
def trained_models() -> None:
    """The default models trained (or loaded) once in this process, so that a subprocess a test
    starts (the CLI, ranks) only loads them from the cache."""
    from engine_support import models

    models("eagle")


def _closing(build: Callable[..., Any], close: Callable[[Any], Any]) -> Iterator[Callable[..., Any]]:
    """A factory over ``build`` that calls ``close`` on everything it built once the test ends."""
    made: list[Any] = []

    def make(*args: Any, **kw: Any) -> Any:
        made.append(build(*args, **kw))
        return made[-1]

    yield make
    for obj in made:
        close(obj)


@pytest.fixture
def make_engine() -> Iterator[Callable[..., Any]]:
    """`engine_support.build_engine` as a factory; every engine it made is closed after the test
    (its background capture stopped)."""
    from engine_support import build_engine

    yield from _closing(build_engine, lambda engine: engine.close())


@pytest.fixture
def make_worker() -> Iterator[Callable[..., Any]]:
    """`engine_support.tiny_worker` as a factory; background capture of every worker it made is
    stopped after the test."""
    from engine_support import tiny_worker

    yield from _closing(tiny_worker, lambda worker: worker.capture.stop(60))


@pytest.fixture
def nvtx_off() -> Iterator[None]:
    """NVTX switched off for the test (a ``DRAFTGRAPH_NVTX=1`` environment switches it on at
    import), restored after it."""
    from draftgraph.graphs.spans import disable_nvtx, enable_nvtx, nvtx_enabled

    was = nvtx_enabled()
    disable_nvtx()
    yield
    if was:
        enable_nvtx()


_STRIPPED_CHECK = """\
try:
    assert False
except AssertionError:
    raise SystemExit("asserts are not stripped: not running under -O")
"""

_RULES_SCRIPT = """\
import importlib, os, sys
sys.path[:0] = sys.argv[1].split(os.pathsep)
module = importlib.import_module(sys.argv[2])
checked = 0
for pair in sys.argv[3:]:
    where, cases = pair.split(":")
    owner, name = where.rsplit(".", 1)
    make = getattr(importlib.import_module(owner), name)
    for kwargs, exc, fragment in getattr(module, cases):
        try:
            make(**kwargs)
        except exc as err:
            if fragment not in str(err):
                sys.exit(f"{kwargs}: wrong message {err}")
        else:
            sys.exit(f"{kwargs}: no error under -O")
        checked += 1
print(checked)
"""


def run_python_O(code: str, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``code`` (dedented) in a fresh ``python -O`` (asserts stripped, which it checks first)."""
    script = _STRIPPED_CHECK + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-O", "-c", script, *argv], capture_output=True, text=True,
                          timeout=timeout)


class PythonO:
    """The ``python -O`` harness: `run` any code; `rules` re-checks tables of validation cases
    (the test module is found in ``folder``, the asking test's own)."""

    run = staticmethod(run_python_O)

    def __init__(self, folder: pathlib.Path) -> None:
        self.folder = folder

    def rules(self, module: str, tables: dict[str, str]) -> int:
        """Under ``python -O``, every ``(kwargs, exception, message fragment)`` case of the test
        module's tables (``{"package.module.Maker": "CASES"}``) raises that exception with that
        fragment; returns how many cases were checked (or fails naming the case)."""
        where = os.pathsep.join((str(self.folder), str(SUPPORT)))
        proc = run_python_O(_RULES_SCRIPT, where, module, *(f"{k}:{v}" for k, v in tables.items()))
        assert proc.returncode == 0, proc.stderr or proc.stdout
        return int(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def python_O(request: pytest.FixtureRequest) -> PythonO:
    """Run code or validation tables with asserts stripped: rules must hold without ``assert``."""
    return PythonO(request.path.parent)


@pytest.fixture(scope="session")
def sglang_ref() -> types.SimpleNamespace:
    """SGLang 0.5.23's select_top_k_tokens and organize_draft_results, or a skip with the reason.

    With DRAFTGRAPH_REQUIRE_SGLANG=1 (CI) a missing reference is an error, not a skip.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from sglang.srt.speculative import eagle_utils, spec_utils
    except Exception as exc:  # ImportError, or an import-time failure of its dependencies
        if os.environ.get("DRAFTGRAPH_REQUIRE_SGLANG") == "1":
            raise
        pytest.skip(f"SGLang reference not importable (pip install --no-deps sglang==0.5.23 "
                    f"plus requirements-oracle.txt): {exc!r}")
    return types.SimpleNamespace(
        select_top_k_tokens=spec_utils.select_top_k_tokens,
        organize_draft_results=eagle_utils.organize_draft_results,
    )
