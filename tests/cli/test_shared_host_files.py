"""Files, folders and signals on a host shared with other users (issue 32, "files" surface).

The model cache's fallback folder is refused unless it is this user's own private folder; lock
and temporary files are never opened through a symlink; a `.pt`, `.sha256` or runtime args file
that is a FIFO or a device is refused before a byte is read; an empty digest does not delete
valid weights; SIGHUP is read off the serving thread and never kills `draftgraph simulate`,
from its first import to its exit. Tests that need a second user run as root and give a folder
to uid 65534 (nobody); they skip where that is not possible.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from signal_support import sighup_at_start

from draftgraph.runtime import load_runtime_args
from draftgraph.runtime.args_file import MAX_ARGS_FILE_BYTES
from draftgraph.runtime.models import defaults
from draftgraph.runtime.models.corpus import load_corpus
from draftgraph.runtime.models.training import TrainPlan

NOBODY = 65534
TINY = TrainPlan(target_steps=1, target_batch=1, target_seq=16, distill_prompts=1, distill_prompt_len=8,
                 distill_new=2, eagle_steps=1, multi_layer_steps=1, draft_batch=1)
WEIGHTS = {"target": {"w": torch.ones(64)}, "eagle": {}, "multi_layer": {}}
ARGS = '{"speculative": {"num_steps": 2, "topk": 2, "num_draft_tokens": 4}, "max_running_requests": 8}'

needs_root = pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0,
                                reason="needs root to give a folder to another user (uid 65534)")


def _key() -> str:
    return defaults._cache_key(0, TINY, load_corpus().digest)


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """An unwritable primary cache (a folder under a regular file) and a fallback of the test's
    choosing: (set_fallback, tmp_path)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DRAFTGRAPH_CACHE", str(blocker / "cache"))
    defaults._weights.cache_clear()
    yield lambda path: monkeypatch.setattr(defaults, "_fallback_dir", lambda: path)
    defaults._weights.cache_clear()


def _in_thread(fn, timeout_s: float = 30.0):
    """fn() in a daemon thread: (finished, result or exception); a hang guard, not a timing test."""
    out: list = []

    def run():
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    return (not t.is_alive()), (out[0] if out else None)


def _unblock_fifo(path: Path) -> None:
    """Let a reader blocked on FIFO ``path`` go (open it for writing, close: EOF)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


# ---- item 2: the cache folder ------------------------------------------------------------------
@needs_root
def test_fallback_folder_created_by_another_user_is_refused(isolated, tmp_path, monkeypatch):
    fallback = tmp_path / f"draftgraph-{os.getuid()}"
    fallback.mkdir(mode=0o755)
    planted = fallback / f"models-{_key()}.pt"
    torch.save(WEIGHTS, planted)  # the attacker's weights, with a matching digest
    defaults._digest_path(planted).write_text(defaults._file_digest(planted) + "\n")
    for p in (fallback, planted, defaults._digest_path(planted)):
        os.chown(p, NOBODY, NOBODY)
    isolated(fallback)
    loaded = []
    monkeypatch.setattr(defaults, "_load_cached", lambda path: loaded.append(path))
    monkeypatch.setattr(defaults, "_train_all", lambda *a: pytest.fail("trained in another user's folder"))
    with pytest.raises(defaults.UnsafeFolderError, match=f"owned by uid {NOBODY}") as info:
        defaults.default_models(plan=TINY)
    assert str(fallback) in str(info.value) and "DRAFTGRAPH_CACHE" in str(info.value)
    assert loaded == [] and sorted(p.name for p in fallback.iterdir()) == sorted(
        [planted.name, planted.name + ".sha256"])


def test_symlinked_fallback_folder_is_refused(isolated, tmp_path, monkeypatch):
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    link = tmp_path / "draftgraph-link"
    link.symlink_to(real)
    isolated(link)
    monkeypatch.setattr(defaults, "_train_all", lambda *a: pytest.fail("trained through a symlink"))
    with pytest.raises(defaults.UnsafeFolderError, match="symlink"):
        defaults.default_models(plan=TINY)
    assert list(real.iterdir()) == []


def test_group_writable_fallback_folder_is_refused(isolated, tmp_path, monkeypatch):
    fallback = tmp_path / "draftgraph-shared"
    fallback.mkdir()
    os.chmod(fallback, 0o777)
    isolated(fallback)
    monkeypatch.setattr(defaults, "_train_all", lambda *a: pytest.fail("trained in a shared folder"))
    with pytest.raises(defaults.UnsafeFolderError, match="writable by group or others"):
        defaults.default_models(plan=TINY)


def test_missing_fallback_folder_is_created_private(isolated, tmp_path):
    fallback = tmp_path / "draftgraph-new"
    isolated(fallback)
    defaults.default_models(plan=TINY)
    assert (fallback.stat().st_mode & 0o777) == 0o700 and list(fallback.glob("models-*.pt"))


def test_lock_symlink_to_a_victim_file_leaves_it_intact(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("DRAFTGRAPH_CACHE", str(cache))
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's notes\n")
    (cache / f"models-{_key()}.lock").symlink_to(victim)
    defaults._weights.cache_clear()
    try:
        with pytest.raises(defaults.UnsafeFolderError, match="lock file .* symlink"):
            defaults.default_models(plan=TINY)
    finally:
        defaults._weights.cache_clear()
    assert victim.read_text() == "the victim's notes\n"


def test_digest_temp_file_symlink_is_not_followed(tmp_path):
    path = tmp_path / "models-x.pt"
    torch.save(WEIGHTS, path)  # no digest yet: it is written on this load
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    planted = tmp_path / f"models-x.pt.sha256.tmp{os.getpid()}"  # the name a save used to pick
    planted.symlink_to(victim)
    assert defaults._load_cached(path) is not None
    assert victim.read_text() == "keep me\n"
    assert defaults._digest_path(path).read_text().strip() == defaults._file_digest(path)


# ---- item 3c: the cache files ------------------------------------------------------------------
def test_fifo_weights_file_is_refused_without_hanging(tmp_path, caplog):
    path = tmp_path / "models-x.pt"
    os.mkfifo(path)
    try:
        with caplog.at_level(logging.WARNING, logger=defaults.__name__):
            finished, result = _in_thread(lambda: defaults._load_cached(path))
    finally:
        _unblock_fifo(path)
    assert finished, "loading a FIFO named like a weights file hung"
    assert result is None and not path.exists()  # refused by name, removed, trained again
    assert any("not a regular file" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)


def test_dev_zero_symlink_weights_file_is_refused_without_reading(tmp_path):
    path = tmp_path / "models-x.pt"
    path.symlink_to("/dev/zero")
    defaults._digest_path(path).write_text("0" * 64 + "\n")
    finished, result = _in_thread(lambda: defaults._load_cached(path))
    assert finished, "loading a symlink to /dev/zero hung"
    assert result is None and not os.path.lexists(path) and os.path.exists("/dev/zero")


@pytest.mark.parametrize("digest", ["", "\n", "not hex at all\n"])
def test_empty_digest_file_keeps_valid_weights(tmp_path, digest):
    path = tmp_path / "models-x.pt"
    torch.save(WEIGHTS, path)
    raw = path.read_bytes()
    defaults._digest_path(path).write_text(digest)
    weights = defaults._load_cached(path)
    assert weights is not None and torch.equal(weights["target"]["w"], WEIGHTS["target"]["w"])
    assert path.read_bytes() == raw  # not deleted
    assert defaults._digest_path(path).read_text().strip() == defaults._file_digest(path)  # rewritten


# ---- item 3a: the runtime args file -------------------------------------------------------------
def test_fifo_args_file_is_refused_without_blocking(tmp_path):
    path = tmp_path / "args.json"
    os.mkfifo(path)
    try:
        finished, result = _in_thread(lambda: load_runtime_args(path))
    finally:
        _unblock_fifo(path)
    assert finished, "reading a FIFO args file blocked"
    assert isinstance(result, ValueError) and "not a regular file" in str(result) and str(path) in str(result)


def test_dev_zero_args_file_is_refused_without_reading(tmp_path):
    path = tmp_path / "args.json"
    path.symlink_to("/dev/zero")  # main read this until MemoryError: not run there
    finished, result = _in_thread(lambda: load_runtime_args(path))
    assert finished and isinstance(result, ValueError) and "not a regular file" in str(result)
    real = tmp_path / "real.json"  # a symlink to a regular file (a Kubernetes ConfigMap mount) still loads
    real.write_text(ARGS)
    path.unlink()
    path.symlink_to(real)
    assert load_runtime_args(path).speculative.num_steps == 2


def test_oversized_args_file_is_refused_unread_with_a_short_error(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(ARGS[:-1] + ', "pad": "' + "x" * (2 * MAX_ARGS_FILE_BYTES) + '"}')
    with pytest.raises(ValueError, match="over the limit") as info:
        load_runtime_args(path)
    assert len(str(info.value)) < 1000


@pytest.mark.parametrize("field", ["num_steps", "device", "tree_choices"])
def test_error_quotes_a_few_hundred_characters_of_a_huge_value(tmp_path, field):
    data = json.loads(ARGS)
    huge = "9" * 500_000
    if field == "device":
        data["device"] = huge
    else:
        data["speculative"][field] = huge
    path = tmp_path / "args.json"
    path.write_text(json.dumps(data))
    with pytest.raises((TypeError, ValueError)) as info:
        load_runtime_args(path)
    text = str(info.value)
    assert len(text) < 1000 and str(path) in text and field in text
    assert info.value.__cause__ is None or len(str(info.value.__cause__)) < 1000  # a traceback quotes it


# ---- item 3b: SIGHUP reads off the serving thread -----------------------------------------------
@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="needs SIGHUP (POSIX)")
def test_sighup_reads_the_args_file_off_the_serving_thread(tmp_path, monkeypatch):
    from draftgraph.runtime.commands import signals

    path = tmp_path / "args.json"
    path.write_text(ARGS)
    release, readers, requests = threading.Event(), [], []

    def slow_load(p):  # a read that takes long (a slow disk): the serving thread must not wait
        readers.append(threading.current_thread())
        release.wait(10.0)
        return load_runtime_args(p)

    class Engine:
        def request_reload(self, args, policy="swap"):
            requests.append(args)

    monkeypatch.setattr(signals, "load_runtime_args", slow_load)
    hup = signals.ProcessReloadSignal(str(path)).install()
    try:
        hup.attach(Engine())
        threading.Timer(5.0, release.set).start()  # hang guard for the old, in-handler read
        os.kill(os.getpid(), signal.SIGHUP)
        served_before_read = not release.is_set()  # the handler returned while the read waits
        release.set()
        assert hup.flush(10.0)
    finally:
        hup.uninstall()
    assert readers and readers[0] is not threading.main_thread()
    assert served_before_read and len(requests) == 1 and hup.as_dict()["requested"] == 1


# ---- item 13: SIGHUP from start to exit ----------------------------------------------------------
def _console() -> Path:
    script = Path(sys.executable).parent / "draftgraph"
    if not script.exists():
        pytest.skip(f"no console script at {script}")
    return script


SIM = ("simulate", "--requests", "2", "--json", "--backend", "eager", "--adaptive", "", "--no-greedy")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc (Linux)")
def test_sighup_while_the_console_script_starts_does_not_kill_it(tmp_path, trained_models):
    args = tmp_path / "args.json"
    args.write_text(ARGS)
    proc = subprocess.Popen([str(_console()), *SIM, "--reload-config", str(args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        torch_loading = sighup_at_start(proc)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"rc {proc.returncode}: {err[-2000:]}"
    assert not torch_loading  # the signal came before torch was imported
    r = json.loads(out)
    assert r["sighup"]["received"] == 1 and r["sighup"]["early"] == 1 and r["sighup"]["requested"] == 1
    assert r["reloads"]["applied"] == 1 and r["spec"][:3] == [2, 2, 4]


EXIT_DRIVER = textwrap.dedent("""
    import os, signal, sys, time
    from draftgraph.runtime.commands.cli import main
    rc = main(sys.argv[1:])
    os.kill(os.getpid(), signal.SIGHUP)  # as the process exits
    time.sleep(0.5)
    sys.exit(rc)
""")


def test_sighup_as_simulate_exits_does_not_kill_it(tmp_path):
    from engine_support import models
    models("eagle")
    p = subprocess.run([sys.executable, "-c", EXIT_DRIVER, *SIM], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"rc {p.returncode}: {p.stderr[-2000:]}"
    assert "SIGHUP after the serving loop ended: ignored" in p.stderr
    json.loads(p.stdout)  # the report was printed whole
