"""The server's pieces in-process: the admin access rule with forged client addresses (httpx's
ASGI transport), the request checks, the text cursor, and a failing engine step through the
bridge (it fails its batch only; the next request is served and equals greedy)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from serve_support import greedy_ids

from draftgraph.runtime.serve import EngineBridge, ServeConfig, ServeState, build_app
from draftgraph.runtime.serve.text import TextCursor
from draftgraph.runtime.serve.validation import BadRequest, parse_chat, parse_completion

TOKEN = "s3cret-admin-token-0123456789"


def _admin(client_host: str, token: str | None, headers: dict[str, str] | None = None) -> int:
    app = build_app(ServeState(ServeConfig(host="0.0.0.0", admin_token=token)))

    async def call() -> int:
        transport = httpx.ASGITransport(app=app, client=(client_host, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as c:
            r = await c.post("/admin/reload", content=b"{}", headers=headers or {})
            return r.status_code

    return asyncio.run(call())


@pytest.mark.parametrize("host, token, headers, allowed", [
    ("10.1.2.3", None, None, False),  # not loopback, no token configured
    ("10.1.2.3", TOKEN, None, False),  # token configured, none sent
    ("10.1.2.3", TOKEN, {"Authorization": "Bearer wrong-token-wrong-token"}, False),
    ("10.1.2.3", TOKEN, {"Authorization": f"Bearer {TOKEN}"}, True),
    ("127.0.0.1", None, None, True),
    ("::1", None, None, True),
    ("127.0.0.2", None, None, True),  # 127.0.0.0/8 is loopback
])
def test_admin_answers_loopback_or_the_token_else_403(host, token, headers, allowed):
    status = _admin(host, token, headers)
    # allowed callers pass the access rule and meet the next one: the engine is still "starting"
    assert status == (503 if allowed else 403)


def test_a_non_loopback_host_without_token_warns_that_admin_is_off():
    from draftgraph.runtime.serve.admin import admin_warning

    assert "admin routes are off" in admin_warning("0.0.0.0", None)
    assert admin_warning("0.0.0.0", TOKEN) is None and admin_warning("127.0.0.1", None) is None
    assert TOKEN not in repr(ServeConfig(admin_token=TOKEN))


@pytest.mark.parametrize("data, field", [
    ({"model": "m", "prompt": "x", "top_p": 0.0}, "top_p"),
    ({"model": "m", "prompt": "x", "top_k": 2.5}, "top_k"),
    ({"model": "m", "prompt": "x", "min_p": -0.1}, "min_p"),
    ({"model": "m", "prompt": "x", "seed": -1}, "seed"),
    ({"model": "m", "prompt": "x", "n": 2, "stream": True}, "n"),
    ({"model": "m", "prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
    ({"model": "m", "prompt": ["a", "b"]}, "prompt"),
    ({"model": "m", "prompt": "x", "stop": ["a"] * 5}, "stop"),
    ({"model": "m", "prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"model": "m", "prompt": "x", "echo": True}, "echo"),
])
def test_completion_fields_refused_name_the_field(data, field):
    with pytest.raises(BadRequest) as info:
        parse_completion(data, "m", 64)
    assert info.value.field == field and info.value.status == 400


def test_chat_fields_refused_name_the_field():
    for data, field in [({"model": "m", "messages": []}, "messages"),
                        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
                        ({"model": "m", "messages": [{"role": "user", "content": "x", "tool": 1}]},
                         "messages[0].tool"),
                        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 65},
                         "max_completion_tokens")]:
        with pytest.raises(BadRequest) as info:
            parse_chat(data, "m", 64)
        assert info.value.field == field


class _Bytes:
    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_text_cursor_holds_back_a_possible_stop_and_a_partial_character():
    cur = TextCursor(_Bytes(), stop=["END"])
    ids = list(b"abcEN")
    assert cur.advance(ids, False) == "abc"  # "EN" could start "END"
    ids += list("é".encode())[:1]
    assert cur.advance(ids, False) == ""  # a partial character is held back (and "EN" still)
    ids += list("é".encode())[1:] + list(b"xEND tail")
    assert cur.advance(ids, False) == "ENéx" and cur.stopped
    assert cur.advance(ids + [65], True) == ""


class _FailingSteps:
    """A real engine whose step raises while ``fail`` is set and a batch runs (a fault inside
    the batched step, after admission)."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.fail = False

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def step(self):
        ended = self._engine.step()
        if self.fail and self._engine.running:
            raise RuntimeError("injected step fault")
        return ended


def test_a_failing_step_fails_its_batch_only(make_engine):
    engine = _FailingSteps(make_engine(backend="eager"))
    bridge = EngineBridge(engine, max_waiting=4).start()
    prompt = list(b"The engine steps")

    async def run() -> tuple[str | None, list[int]]:
        engine.fail = True
        doomed = bridge.submit(prompt, 50)
        while not doomed.done:
            await doomed.changed(1.0)
        engine.fail = False
        ok = bridge.submit(prompt, 20)
        while not ok.done:
            await ok.changed(1.0)
        return doomed.error, ok.tokens

    try:
        error, tokens = asyncio.run(asyncio.wait_for(run(), 120))
    finally:
        assert bridge.stop(30)
    assert "injected step fault" in error
    assert tuple(tokens) == greedy_ids([tuple(prompt)], 20)[0]
    assert bridge.step_failures >= 1 and bridge.counts()["live"] == 0


def test_a_port_in_use_exits_2_before_the_models_load():
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "draftgraph.runtime", "serve", "--port", str(port)],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"--port={port}" in done.stderr and "in use" in done.stderr
