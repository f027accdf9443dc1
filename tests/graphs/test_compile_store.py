"""The compiled-code store (`runtime.compile_store`) and the entry format (`graphs.compile.entry`):
digests, refusals, the size cap, the folder rules; no compiling here."""

from __future__ import annotations

import logging
import os
import time

import pytest
import torch

from draftgraph.graphs.compile.entry import ConstantTable, EntryError, entry_key, pack_entry, unpack_entry
from draftgraph.runtime.compile_store import CompileStore, default_compile_store
from draftgraph.runtime.private_dir import UnsafeFolderError

KEY_A = "a" * 64
KEY_B = "b" * 64
KEY_C = "c" * 64


def test_put_then_get_returns_the_payload(tmp_path):
    store = CompileStore(tmp_path / "s")
    assert store.get(KEY_A) is None
    store.put(KEY_A, b"payload")
    assert store.get(KEY_A) == b"payload"
    assert store.written_here(KEY_A) and not store.written_here(KEY_B)
    assert (store.hits, store.misses, store.written) == (1, 1, 1)
    assert oct(os.stat(store.folder).st_mode & 0o777) == "0o700"
    assert oct(os.stat(store.path(KEY_A)).st_mode & 0o777) == "0o600"


def test_a_damaged_entry_is_named_refused_and_removed(tmp_path, caplog):
    store = CompileStore(tmp_path / "s")
    store.put(KEY_A, b"x" * 100)
    path = store.path(KEY_A)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING):
        assert store.get(KEY_A) is None
    assert str(path) in caplog.text and "digest mismatch" in caplog.text
    assert not path.exists() and store.refused == 1


def test_a_cut_entry_is_refused(tmp_path):
    store = CompileStore(tmp_path / "s")
    store.put(KEY_A, b"x" * 100)
    path = store.path(KEY_A)
    path.write_bytes(path.read_bytes()[:20])
    assert store.get(KEY_A) is None and store.refused == 1


def test_an_entry_writable_by_others_is_refused(tmp_path, caplog):
    store = CompileStore(tmp_path / "s")
    store.put(KEY_A, b"code")
    os.chmod(store.path(KEY_A), 0o666)
    with caplog.at_level(logging.WARNING):
        assert store.get(KEY_A) is None
    assert "writable by group or others" in caplog.text


def test_a_symlinked_entry_is_refused(tmp_path, caplog):
    store = CompileStore(tmp_path / "s")
    store.put(KEY_B, b"code")
    os.symlink(store.path(KEY_B), store.path(KEY_A))
    with caplog.at_level(logging.WARNING):
        assert store.get(KEY_A) is None
    assert "symlink" in caplog.text
    assert store.get(KEY_B) == b"code"  # the target itself is untouched


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to chown")
def test_an_entry_of_another_user_is_not_loaded(tmp_path, caplog):
    store = CompileStore(tmp_path / "s")
    store.put(KEY_A, b"code")
    os.chown(store.path(KEY_A), 65534, 65534)
    with caplog.at_level(logging.WARNING):
        assert store.get(KEY_A) is None
    assert "owned by uid 65534" in caplog.text


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to chown")
def test_a_folder_of_another_user_is_refused(tmp_path):
    folder = tmp_path / "s"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(UnsafeFolderError, match="owned by uid 65534"):
        CompileStore(folder)


def test_the_store_stays_under_its_cap_least_recently_used_out(tmp_path):
    store = CompileStore(tmp_path / "s", max_bytes=2000)
    store.put(KEY_A, b"a" * 700)
    store.put(KEY_B, b"b" * 700)
    old = time.time() - 100
    os.utime(store.path(KEY_B), (old, old))  # B is the least recently used now
    os.utime(store.path(KEY_A), (old + 50, old + 50))
    store.put(KEY_C, b"c" * 700)
    assert store.total_bytes() <= 2000
    assert store.path(KEY_A).exists() and store.path(KEY_C).exists() and not store.path(KEY_B).exists()
    assert store.evicted == 1


def test_an_entry_over_the_cap_is_not_written(tmp_path):
    store = CompileStore(tmp_path / "s", max_bytes=100)
    store.put(KEY_A, b"a" * 200)
    assert store.get(KEY_A) is None and store.total_bytes() == 0


def test_bad_keys_and_caps(tmp_path):
    store = CompileStore(tmp_path / "s")
    with pytest.raises(ValueError, match="64 lowercase hex"):
        store.get("../../etc/passwd")
    with pytest.raises(ValueError, match="max_bytes"):
        CompileStore(tmp_path / "t", max_bytes=0)


_KILLED_WRITER = """
import os, sys
from draftgraph.runtime.compile_store import CompileStore
store = CompileStore(sys.argv[1], max_bytes=8 << 20)
os.replace = lambda *a, **k: os.kill(os.getpid(), 9)  # killed between the write and the rename
store.put("a" * 64, b"x" * (2 << 20))
"""


def _on_disk(folder) -> int:
    return sum(p.stat().st_size for p in folder.iterdir())


def test_a_temp_file_of_a_writer_killed_mid_put_is_removed_at_open(tmp_path, caplog):
    import subprocess
    import sys

    folder = tmp_path / "s"
    p = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(folder)], capture_output=True, timeout=120)
    assert p.returncode == -9, p.stderr[-2000:]
    left = [f for f in folder.iterdir() if ".tmp" in f.name]
    assert len(left) == 1 and left[0].stat().st_size > 2 << 20  # what issue 40 found: never removed
    with caplog.at_level(logging.WARNING):
        store = CompileStore(folder, max_bytes=1 << 20)
    assert not left[0].exists() and store.temp_removed == 1
    assert left[0].name in caplog.text and "died mid-put" in caplog.text
    assert _on_disk(folder) == 0


def test_temp_files_being_written_count_under_the_cap(tmp_path):
    from draftgraph.runtime.private_dir import create_exclusive

    store = CompileStore(tmp_path / "s", max_bytes=2000)
    fd, live = create_exclusive(store.folder, f".{'d' * 16}.tmp", 0o600)  # this process: a live writer
    with os.fdopen(fd, "wb") as fh:
        fh.write(b"t" * 700)
    store.put(KEY_A, b"a" * 600)
    store.put(KEY_B, b"b" * 600)
    assert live.exists() and store.temp_removed == 0  # a live writer's file is left alone
    assert _on_disk(store.folder) <= 2000 and store.evicted == 1


@pytest.mark.parametrize("raw", ["inf", "-inf", "nan", "1e400", "-1", "0", "abc", str(2**31)])
def test_a_bad_cap_variable_is_a_value_error_naming_it(monkeypatch, raw):
    monkeypatch.setenv("DRAFTGRAPH_COMPILED", "1")
    monkeypatch.setenv("DRAFTGRAPH_COMPILED_MAX_MB", raw)
    with pytest.raises(ValueError, match=r"DRAFTGRAPH_COMPILED_MAX_MB=.*finite number of MiB > 0"):
        default_compile_store()


def test_a_cap_too_small_for_any_entry_says_so_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DRAFTGRAPH_COMPILED", "1")
    monkeypatch.setenv("DRAFTGRAPH_COMPILED_DIR", str(tmp_path / "s"))
    monkeypatch.setenv("DRAFTGRAPH_COMPILED_MAX_MB", "0.0001")  # 104 bytes
    store = default_compile_store()
    assert store is not None and store.max_bytes == 104
    with caplog.at_level(logging.WARNING):
        store.put(KEY_A, b"a" * 1000)
        store.put(KEY_B, b"b" * 1000)
    assert store.get(KEY_A) is None and store.total_bytes() == 0
    warned = [r for r in caplog.records if "over the store's cap" in r.getMessage()]
    assert len(warned) == 1 and "DRAFTGRAPH_COMPILED_MAX_MB" in warned[0].getMessage()


def test_entries_renamed_among_their_keys_are_refused_and_removed(tmp_path, caplog):
    """Issue 40: the digest covered the payload only, so a valid entry renamed to another key
    loaded there. The digest now covers the key too."""
    store = CompileStore(tmp_path / "s")
    store.put(KEY_A, b"code of a")
    store.put(KEY_B, b"code of b")
    a, b = store.path(KEY_A), store.path(KEY_B)
    tmp = a.with_name("swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    with caplog.at_level(logging.WARNING):
        assert store.get(KEY_A) is None and store.get(KEY_B) is None
    assert store.refused == 2 and not a.exists() and not b.exists()
    assert "another key" in caplog.text


def test_entry_manifests_bind_their_key_and_structure():
    from draftgraph.graphs.compile.entry import check_request, check_tensors, describe_request, describe_tensors

    x, y = torch.zeros(2, 3), torch.zeros(2, 4, dtype=torch.int64)
    request = describe_request("step S=3", 2, (x, y))
    manifest = {"key": KEY_A, "request": request}
    check_request(manifest, KEY_A, request)
    with pytest.raises(EntryError, match="made under key aaaa.*found under bbbb"):
        check_request(manifest, KEY_B, request)
    with pytest.raises(EntryError, match="structure"):
        check_request(manifest, KEY_A, describe_request("step S=2", 2, (x, y)))
    with pytest.raises(EntryError, match="inputs"):
        check_request(manifest, KEY_A, describe_request("step S=3", 2, (x, y.float())))
    with pytest.raises(EntryError, match="no description"):
        check_request({"key": KEY_A}, KEY_A, request)
    symbolic = describe_request("step S=3", None, (x, y))
    assert symbolic["size"] == "symbolic" and symbolic["inputs"][0]["shape"] == [3]
    described = describe_tensors((x, y), ["fresh", "input"])
    assert described[1] == {"role": "input", "shape": [2, 4], "dtype": "int64"}
    check_tensors(described, (x, y), "output")
    with pytest.raises(EntryError, match=r"output 1: the entry describes .*bound \[2, 3\]"):
        check_tensors(described, (x, x), "output")
    with pytest.raises(EntryError, match="describes 2, 1 bound"):
        check_tensors(described, (x,), "output")


def test_an_unusable_folder_falls_back_with_one_warning(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DRAFTGRAPH_COMPILED", "1")
    monkeypatch.setenv("DRAFTGRAPH_COMPILED_DIR", str(blocker / "compiled"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with caplog.at_level(logging.WARNING):
        store = default_compile_store()
        again = default_compile_store()
    assert store is not None and store is again
    assert str(store.folder).startswith(str(tmp_path / "tmp"))
    assert caplog.text.count("not writable") == 1


def test_the_store_is_off_on_request(monkeypatch):
    monkeypatch.setenv("DRAFTGRAPH_COMPILED", "0")
    assert default_compile_store() is None


def test_entry_payload_round_trip_and_refusals():
    manifest = {"size": 4, "outputs": []}
    manifest_back, artifact = unpack_entry(pack_entry(manifest, b"ART"))
    assert (manifest_back, artifact) == (manifest, b"ART")
    with pytest.raises(EntryError, match="shorter than the header"):
        unpack_entry(b"xx")
    with pytest.raises(EntryError, match="not a draftgraph compiled entry"):
        unpack_entry(b"ELF!" + bytes(20))


def test_keys_differ_by_structure_torch_version_size_and_shapes(monkeypatch):
    w = torch.zeros(3, 4)
    table = ConstantTable({"w": w})
    x = (torch.zeros(2, 4),)
    base = entry_key("model-1", 2, x, table, "compile")
    assert entry_key("model-1", 2, x, table, "compile") == base
    assert entry_key("model-2", 2, x, table, "compile") != base
    assert entry_key("model-1", 4, x, table, "compile") != base
    assert entry_key("model-1", 2, x, table, "trace") != base
    assert entry_key("model-1", 2, x, ConstantTable({"w": torch.zeros(3, 5)}), "compile") != base
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    assert entry_key("model-1", 2, x, table, "compile") != base


def test_constant_table_locates_views_and_refuses_views_outside():
    w = torch.arange(12.0).reshape(3, 4)
    table = ConstantTable({"w": w})
    where = table.locate(w[1:, 2:])
    assert where == {"name": "w", "offset": 6, "shape": [2, 2], "stride": [4, 1]}
    assert torch.equal(table.view(where), w[1:, 2:])
    assert table.locate(torch.zeros(2)) is None
    with pytest.raises(EntryError, match="outside its storage"):
        table.view({**where, "offset": 11})


def test_an_empty_constant_needs_no_name():
    table = ConstantTable({})
    where = table.locate(torch.zeros(8, 0, dtype=torch.long))
    assert where is not None and where["name"] is None
    view = table.view(where)
    assert view.shape == (8, 0) and view.dtype == torch.long


def test_unit_seconds_persist_for_the_next_process_and_count_nothing(tmp_path):
    store = CompileStore(tmp_path / "s")
    assert store.unit_seconds() is None
    for seconds in (2.0, 4.0, 0.0, -1.0):  # not a duration: ignored
        store.note_unit_seconds(seconds)
    assert store.unit_seconds() == pytest.approx(3.0)
    assert (store.hits, store.misses, store.written) == (0, 0, 0)  # the store's own figure
    later = CompileStore(tmp_path / "s")  # as a new process opens it
    assert later.unit_seconds() == pytest.approx(3.0)
    for _ in range(1000):  # a moving mean: the latest units count the most
        later.note_unit_seconds(10.0)
    assert CompileStore(tmp_path / "s").unit_seconds() == pytest.approx(10.0, rel=1e-3)


def test_units_that_only_checked_are_kept_apart_from_units_that_compiled(tmp_path):
    store = CompileStore(tmp_path / "s")
    store.note_unit_seconds(12.0)
    for seconds in (0.2, 0.4):
        store.note_unit_seconds(seconds, compiled=False)
    later = CompileStore(tmp_path / "s")  # as a new process opens it
    assert later.unit_seconds() == pytest.approx(12.0)
    assert later.unit_seconds(compiled=False) == pytest.approx(0.3)
    later.note_unit_seconds(0.6, compiled=False)
    assert CompileStore(tmp_path / "s").unit_seconds(False) == pytest.approx(0.4)
    assert CompileStore(tmp_path / "s").unit_seconds() == pytest.approx(12.0)


def test_a_damaged_unit_seconds_entry_is_refused_and_reads_as_none(tmp_path, caplog):
    from draftgraph.runtime.compile_store import _UNIT_SECONDS_KEY

    store = CompileStore(tmp_path / "s")
    store.note_unit_seconds(5.0)
    path = store.path(_UNIT_SECONDS_KEY)
    path.write_bytes(path.read_bytes()[:-1] + b"x")
    with caplog.at_level(logging.WARNING):
        assert CompileStore(tmp_path / "s").unit_seconds() is None
    assert "digest mismatch" in caplog.text and not path.exists()
