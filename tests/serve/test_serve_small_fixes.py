"""The small ones of issue 49: a deeply nested reload body is a 400 naming the body, stop strings
cut where they end first whatever the step's size, a second SIGTERM keeps draining, profile
folders are capped in count and bytes."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest
import uvicorn

from draftgraph.runtime.engine.admission import AdmissionRules
from draftgraph.runtime.serve import ServeConfig, ServeState, build_app
from draftgraph.runtime.serve.admin import prune_profile_dirs, reload_args_from_body
from draftgraph.runtime.serve.server import DrainingServer
from draftgraph.runtime.serve.text import TextCursor
from draftgraph.runtime.serve.validation import BadRequest

DEEP = 100_000


@pytest.mark.parametrize("body, content_type", [
    (b"[" * DEEP + b"]" * DEEP, "application/json"),
    (b'{"speculative": ' + b"[" * DEEP + b"]" * DEEP + b"}", "application/json"),
    (b"a = " + b"[" * DEEP + b"]" * DEEP, "application/toml"),
    (b"a = " + b"[" * DEEP, None),  # not JSON: read as TOML
])
def test_a_deeply_nested_reload_body_is_a_400_naming_the_body(body, content_type):
    with pytest.raises(BadRequest) as info:
        reload_args_from_body(body, content_type)
    assert info.value.field == "body" and info.value.status == 400


def test_a_deeply_nested_reload_body_over_http_is_a_400():
    """Through the route (the engine a stub that checks nothing): 400, never a 500."""
    state = ServeState(ServeConfig())

    class Bridge:
        class engine:  # noqa: N801 - a stand-in for the engine's one method the route calls
            @staticmethod
            def request_reload(args, policy):
                return None

    state.serving(Bridge(), None, AdmissionRules(vocab_size=100, max_len=64, reserve=4))
    app = build_app(state)

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as c:
            return await c.post("/admin/reload", content=b"a = " + b"[" * 50_000 + b"]" * 50_000,
                                headers={"content-type": "application/toml"})

    r = asyncio.run(call())
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"


class Chars:
    """A tokenizer whose ids are characters."""

    def decode(self, ids, **_):
        return "".join(chr(i) for i in ids)


@pytest.mark.parametrize("stop, text", [
    (("xyz", "y"), "abxyzcd"),  # the shorter one ends first
    (("bc", "abcd"), "zabcdz"),
    (("aaa", "aab"), "xaaab"),
    (("ab", "b"), "xab"),  # both end at the same place: cut before the longer
])
def test_stop_strings_cut_the_same_whatever_the_step_size(stop, text):
    """The same tokens committed 1, 2, 3, ... at a time, or all at once: the same text comes out.
    Before: with overlapping stop strings the cut depended on how many tokens a step committed."""
    ids = [ord(c) for c in text]
    outs = set()
    for size in range(1, len(ids) + 1):
        cursor, out = TextCursor(Chars(), stop), ""
        for end in range(size, len(ids) + size, size):
            out += cursor.advance(ids[:end], end >= len(ids))
            if cursor.stopped:
                break
        outs.add(out)
    assert len(outs) == 1, f"cuts by step size: {sorted(outs)}"


def test_a_second_sigterm_keeps_draining_and_a_third_stops():
    """Before: the second SIGTERM stopped the server (exit -15) in the middle of the drain."""
    state = ServeState(ServeConfig())
    drains: list[float] = []

    class Bridge:
        def begin_drain(self, drain_s):
            drains.append(drain_s)

    state.bridge, state.phase = Bridge(), "serving"
    server = DrainingServer(uvicorn.Config(build_app(state)), state)
    server.handle_exit(signal.SIGTERM, None)
    assert state.phase == "draining" and drains == [30.0] and not server.should_exit
    server.handle_exit(signal.SIGTERM, None)
    assert not server.should_exit and not server.force_exit  # still draining
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit  # the third stops as uvicorn does


def test_profile_folders_are_capped_in_count_and_bytes(tmp_path):
    now = time.time()
    for i in range(12):
        d = tmp_path / f"draftgraph-profile-{i:02d}"
        d.mkdir()
        (d / "trace.json").write_bytes(b"x" * 1000)
        os.utime(d, (now - 100 + i, now - 100 + i))  # folder 11 the newest
    (tmp_path / "other").mkdir()  # not ours: never touched
    removed = prune_profile_dirs(str(tmp_path), keep=7, max_bytes=1 << 20)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(removed) == 5 and left == [f"draftgraph-profile-{i:02d}" for i in range(5, 12)] + ["other"]
    prune_profile_dirs(str(tmp_path), keep=7, max_bytes=3500)  # bytes: the 3 newest fit
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["draftgraph-profile-09", "draftgraph-profile-10", "draftgraph-profile-11", "other"]
