"""The routes refuse a request by the engine's own admission rules, not copies of its limits
(issue 50): a 400 says what the engine's request table would say, and only requests the table
takes reach the engine."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from draftgraph.runtime.engine.request_table import RequestTable
from draftgraph.runtime.engine.stats import EngineStats
from draftgraph.runtime.serve import ServeConfig, ServeState, build_app
from draftgraph.runtime.serve.bridge import QueueFull

VOCAB, MAX_LEN, RESERVE = 100, 50, 7  # odd limits: a copy of the engine's usual ones would not match


class Bridge:
    """Hands each request to a real request table (the engine's check), then reports a full
    queue (429), so no stream is needed."""

    def __init__(self, table: RequestTable) -> None:
        self.table, self.submitted = table, []

    def submit(self, ids, max_tokens, params=None):
        self.table.add(ids, max_tokens)  # raises what the engine would
        self.submitted.append(len(ids))
        raise QueueFull("stub")

    def abort(self, stream):
        pass


@pytest.fixture
def served():
    table = RequestTable(4, VOCAB, MAX_LEN, RESERVE, EngineStats())
    state = ServeState(ServeConfig(model_name="m", max_tokens_limit=40))
    bridge = Bridge(table)
    state.serving(bridge, None, table.rules)
    return build_app(state), table, bridge


def _post(app, body: dict) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as c:
            return await c.post("/v1/completions", json=body)
    return asyncio.run(call())


@pytest.mark.parametrize("prompt,max_tokens", [
    ([1] * 30, 13), ([1] * 30, 14), ([1] * 42, 1), ([1] * 43, 1), ([1] * 3, 40),  # around 50 - 7
    ([1, 2, VOCAB], 4), ([1, -1], 4), ([VOCAB - 1], 4),
])
def test_the_route_refuses_exactly_what_the_engine_refuses(served, prompt, max_tokens):
    app, table, bridge = served
    fits = len(prompt) + max_tokens + RESERVE <= MAX_LEN and bool(prompt) and all(0 <= t < VOCAB for t in prompt)
    r = _post(app, {"model": "m", "prompt": prompt, "max_tokens": max_tokens})
    if fits:
        assert r.status_code == 429 and bridge.submitted == [len(prompt)], r.text
        return
    assert r.status_code == 400 and bridge.submitted == [], r.text
    err = r.json()["error"]
    assert err["param"] == "prompt"
    with pytest.raises(ValueError) as engine_says:  # the same rule, the engine's field names
        table.add(prompt, max_tokens)
    rule = str(engine_says.value).split(": ", 1)[1]  # after the engine's "field=value: "
    assert err["message"].endswith(rule), (err, rule)
