"""Packaging rules: what `import draftgraph.runtime` loads, optional dependencies, the public API."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _python(code: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (this one's sys.path, so the checkout is found)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def test_import_runtime_loads_neither_models_nor_engine():
    # ../shared/DESIGN.md §2: the component never imports runtime/models or runtime/engine
    code = (
        "import json, sys\n"
        "import draftgraph.runtime\n"
        "from draftgraph.runtime.testing import TinyDraftModel, make_draft_input\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(\n"
        "    ('draftgraph.runtime.models', 'draftgraph.runtime.engine')))))\n"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


_STATE = (
    "import json, signal, sys, warnings\n"
    "import torch  # first: torch installs warning filters of its own\n"
    "def state():\n"
    "    return [str(signal.getsignal(signal.SIGHUP)), [str(f) for f in warnings.filters]]\n"
    "before = state()\n"
    "import draftgraph.runtime, draftgraph.runtime.engine, draftgraph.runtime.commands.entry\n"
    "from draftgraph.runtime import EagleDraftWorker\n"
    "{then}\n"
    "print(json.dumps([before, state()]))\n"
)


@pytest.mark.parametrize("argv0,command,prepare", [("some-program", "simulate", False), ("pytest", "info", False),
                                                   ("/venv/bin/draftgraph", "simulate", False),
                                                   ("/venv/bin/draftgraph", "simulate", True),
                                                   ("/venv/bin/draftgraph", "info", True)])
def test_import_runtime_changes_no_process_state(argv0, command, prepare):
    """Importing the library (its commands' modules included) leaves the SIGHUP handler and the
    warning filters as they were in any program, whatever ``argv`` says (issue 39: it sniffed
    argv); only the command's entry sets up its process (`runtime.console.prepare_console`, called
    by `runtime.commands.entry.main`: the filter for every command, the hold for simulate and generate):
    the rows where it runs show the check can fail."""
    import signal

    if not hasattr(signal, "SIGHUP"):
        pytest.skip("needs SIGHUP (POSIX)")
    then = f"draftgraph.runtime.console.prepare_console([{command!r}])" if prepare else "pass"
    done = _python(f"import sys; sys.argv = [{argv0!r}, {command!r}]\n" + _STATE.replace("{then}", then))
    assert done.returncode == 0, done.stderr
    before, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert (before != after) is prepare
    if prepare:
        assert ("HeldSighup" in after[0]) is (command == "simulate")


def test_test_helpers_live_in_the_component_and_stay_importable():
    from draftgraph.runtime import models, testing

    assert testing.TinyDraftModel is models.TinyDraftModel
    assert testing.make_draft_input is models.make_draft_input


def test_no_hidden_re_exports():
    """The package exports its API (`__all__`) and its subpackages; the five names it once
    re-exported without listing them live in their own modules only (issue 29)."""
    import draftgraph.runtime as rt

    for name in ("ChainBuffers", "max_tree_candidates", "organize_chain_steps", "TinyDraftModel",
                 "make_draft_input"):
        assert not hasattr(rt, name), name


def test_runtime_all_is_sorted_unique_and_resolves():
    import draftgraph.runtime as rt

    names = rt.__all__
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    assert [n for n in names if not hasattr(rt, n)] == []
    assert 25 <= len(names) <= 35  # what a serving engine needs, not every helper


def test_graphs_all_is_sorted_unique_and_resolves():
    import draftgraph.graphs as graphs

    names = graphs.__all__
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    assert [n for n in names if not hasattr(graphs, n)] == []


def test_star_import_gives_exactly_all():
    namespace: dict[str, object] = {}
    exec("from draftgraph.runtime import *", namespace)
    import draftgraph.runtime as rt

    assert sorted(k for k in namespace if k != "__builtins__") == rt.__all__


def test_no_re_export_modules():
    """One import path per name: the earlier re-export modules are gone (issue 29)."""
    import importlib.util

    for name in ("distributed", "rank_launch", "sglang_adapter"):
        assert importlib.util.find_spec(f"draftgraph.runtime.{name}") is None, name


def test_one_route_from_sglang_to_runtime_args():
    import types

    import draftgraph.runtime as rt
    from draftgraph.runtime import RuntimeArgs, runtime_args_from_sglang
    from draftgraph.runtime.sglang import config as sglang_config

    root = Path(rt.__file__).parent
    defined = [str(f.relative_to(root)) for f in root.rglob("*.py")
               if "def runtime_args_from_sglang(" in f.read_text()]
    assert defined == ["sglang/config.py"]
    assert runtime_args_from_sglang is sglang_config.runtime_args_from_sglang
    assert not hasattr(RuntimeArgs, "from_sglang")  # the second route (a call-time import) is gone
    src = types.SimpleNamespace(speculative_num_steps=3, speculative_eagle_topk=1,
                                speculative_num_draft_tokens=4, cuda_graph_config=None,
                                max_running_requests=8)
    assert isinstance(runtime_args_from_sglang(src), RuntimeArgs)


@pytest.mark.slow  # the slow tier: one fresh interpreter importing every module alone (~19 s)
def test_each_runtime_module_imports_alone():
    """Each module of draftgraph.runtime and draftgraph.graphs (subpackages included) imported
    first, in an interpreter holding no draftgraph module (an import order a circle would break;
    the circle itself: tests/project/test_structure.py)."""
    from structure_support import modules

    root = Path(__file__).resolve().parents[2]
    names = [*modules(root / "runtime", "draftgraph.runtime"), *modules(root / "graphs", "draftgraph.graphs")]
    code = (
        "import importlib, json, sys, traceback\n"
        "import torch  # loaded once; draftgraph's modules are dropped before each import\n"
        f"names = {names!r}\n"
        "failed = {}\n"
        "for name in names:\n"
        "    for m in [m for m in sys.modules if m == 'draftgraph' or m.startswith('draftgraph.')]:\n"
        "        del sys.modules[m]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        failed[name] = traceback.format_exc(limit=3)\n"
        "print(json.dumps({'count': len(names), 'failed': failed}))\n"
    )
    done = _python(code, timeout=600.0)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failed"] == {}
    assert result["count"] > 40


# ---- optional dependencies ---------------------------------------------------------------------
_NO_PSUTIL = "import sys; sys.modules['psutil'] = None\n"  # `import psutil` raises ImportError


def test_cli_help_works_without_psutil():
    for argv in (["--help"], ["simulate", "--help"]):
        code = (_NO_PSUTIL + f"sys.argv = ['draftgraph', *{argv!r}]\n"
                "from draftgraph.runtime.commands.cli import main\n"
                "sys.exit(main())\n")
        done = _python(code)
        assert done.returncode == 0, done.stderr
        assert "usage: draftgraph" in done.stdout
        assert "Traceback" not in done.stderr


def test_rss_without_psutil_reads_proc_or_nan():
    code = (_NO_PSUTIL + "import math\n"
            "from draftgraph.runtime.commands.simulate import _rss_mib\n"
            "v = _rss_mib()\n"
            "assert math.isnan(v) or v > 1.0, v\n")
    done = _python(code)
    assert done.returncode == 0, done.stderr


_ARGS = {"speculative": {"num_steps": 2, "topk": 1}, "max_running_requests": 4}
_TOML = "max_running_requests = 4\n[speculative]\nnum_steps = 2\ntopk = 1\n"


def _hide(monkeypatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_toml_without_tomllib_or_tomli_names_the_missing_piece(tmp_path, monkeypatch):
    from draftgraph.runtime import load_runtime_args

    (tmp_path / "a.json").write_text(json.dumps(_ARGS))
    (tmp_path / "a.toml").write_text(_TOML)
    _hide(monkeypatch, "tomllib", "tomli")  # Python 3.10 without tomli
    assert load_runtime_args(tmp_path / "a.json").speculative.num_steps == 2  # JSON keeps working
    with pytest.raises(ValueError) as info:
        load_runtime_args(tmp_path / "a.toml")
    text = str(info.value)
    assert "a.toml" in text and "Python 3.11" in text and "tomli" in text and "JSON" in text


def test_toml_falls_back_to_tomli(tmp_path, monkeypatch):
    import types

    from draftgraph.runtime import load_runtime_args

    real = pytest.importorskip("tomllib")  # the parser behind the fake tomli

    (tmp_path / "a.toml").write_text(_TOML)
    calls = []
    fake = types.SimpleNamespace(loads=lambda text: calls.append(text) or real.loads(text))
    _hide(monkeypatch, "tomllib")
    monkeypatch.setitem(sys.modules, "tomli", fake)
    args = load_runtime_args(tmp_path / "a.toml")
    assert calls == [_TOML] and args.speculative.num_steps == 2 and args.max_running_requests == 4


def test_runtime_imports_without_tomllib():
    done = _python("import sys; sys.modules['tomllib'] = None; sys.modules['tomli'] = None\n"
                   "import draftgraph.runtime\n")
    assert done.returncode == 0, done.stderr


def test_lint_is_clean_and_no_module_reads_another_ones_privates():
    """`make lint` as a test (ruff, pinned in requirements.txt): the whole tree is clean, and
    runtime/ and graphs/ touch no private attribute of another object (SLF001; the few reads
    of torch's or SGLang's own privates carry a noqa with the reason)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    if subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True).returncode != 0:
        pytest.skip("ruff is not installed (pip install -r requirements.txt)")
    for argv in (["check", "runtime", "graphs", "tests", "scripts"],
                 ["check", "--select", "SLF001", "runtime", "graphs"]):
        done = subprocess.run([sys.executable, "-m", "ruff", *argv], cwd=root, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, f"ruff {' '.join(argv)}:\n{done.stdout[-3000:]}{done.stderr[-1000:]}"


# ---- CI runs every tier --------------------------------------------------------------------------
@pytest.mark.parametrize("make_rc,ci_rc", [(0, 0), (5, 1), (2, 2)])
def test_ci_runs_every_tier_and_fails_when_no_test_ran(tmp_path, make_rc, ci_rc):
    """.ci/run calls `make test-all` (a stand-in `make` on PATH records its arguments); pytest's
    exit 5 (nothing collected) becomes a failure, other exit codes pass through."""
    import os

    root = Path(__file__).resolve().parents[2]
    seen = tmp_path / "argv"
    fake = tmp_path / "make"
    fake.write_text(f'#!/bin/sh\necho "$@" > {seen}\nexit {make_rc}\n')
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(["bash", str(root / ".ci" / "run")], capture_output=True, text=True, env=env,
                          timeout=60)
    assert seen.read_text().split() == ["test-all"]
    assert done.returncode == ci_rc, done.stderr
    if make_rc == 5:
        assert "exit 5" in done.stderr
