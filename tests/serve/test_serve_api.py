"""`draftgraph serve` through the real `openai` client and httpx: one server subprocess (eager
backend, quick to start) shared by the module; every answer is checked against greedy decoding
of the same target (serve_support.greedy_text), not against the server's own code."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from serve_support import MODEL, ServerProcess, greedy_text, greedy_texts, metric, plain_chat

pytestmark = pytest.mark.usefixtures("trained_models")

PROMPTS = ["Hello there", "The quick brown fox", "Once upon a time, in a land", "def main():",
           "Speculative decoding is", "In the beginning", "import torch\n", "A long time ago",
           "She said that", "The engine steps", "Graphs captured once", "Why is the sky",
           "Numbers: 1, 2, 3,", "Dear friend,", "To be or not", "The server answers"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    greedy_texts(PROMPTS, 100)  # the oracle for every prompt, decoded together once
    srv = ServerProcess("--backend", "eager", "--max-running", "8", "--max-waiting", "8",
                        "--max-tokens-limit", "200", "--drain-s", "10",
                        log_dir=str(tmp_path_factory.mktemp("serve")))
    try:
        srv.wait_serving()
        yield srv
    finally:
        rc = srv.stop()
    assert rc == 0, f"the server exited {rc} on SIGTERM:\n{srv.log()}"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _run(coro, timeout_s: float = 180.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    h = server.health()
    assert h["status"] == "serving" and h["graphs_ready"] is True and h["running"] == 0


def test_completion_equals_greedy(client):
    r = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=32)
    assert r.choices[0].text == greedy_text("Hello there", 32)
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (11, 32, 43)


def test_streamed_completion_equals_greedy_and_ends_with_done(server, client):
    pieces = [c.choices[0].text for c in client.completions.create(model=MODEL, prompt="The quick brown fox",
                                                                    max_tokens=40, stream=True)]
    assert "".join(pieces) == greedy_text("The quick brown fox", 40)
    assert len([p for p in pieces if p]) > 1  # streamed as committed, not in one piece
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"model": MODEL, "prompt": "Hello", "max_tokens": 8, "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert r.headers["content-type"].startswith("text/event-stream") and lines[-1] == "data: [DONE]"


def test_chat_uses_the_plain_template_and_equals_greedy(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    want = greedy_text(plain_chat(messages), 24)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, stream=True,
                                                 stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].usage.completion_tokens == 24


def test_stop_string_cuts_the_answer(client):
    full = greedy_text("Once upon a time, in a land", 48)
    stop = full[10:12]  # a string the greedy answer holds
    r = client.completions.create(model=MODEL, prompt="Once upon a time, in a land", max_tokens=48, stop=[stop])
    assert r.choices[0].text == greedy_text("Once upon a time, in a land", 48, (stop,))
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="Once upon a time, in a land", max_tokens=48, stop=stop, stream=True))
    assert streamed == r.choices[0].text


def test_sixteen_concurrent_streams_each_equal_greedy(server):
    server.wait_idle()  # an earlier test's aborted request ends at the next step: 16 places free
    aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    async def one(prompt: str) -> str:
        out = []
        async for c in await aclient.completions.create(model=MODEL, prompt=prompt, max_tokens=24, stream=True):
            out.append(c.choices[0].text)
        return "".join(out)

    async def all_of() -> list[str]:
        try:
            return await asyncio.gather(*(one(p) for p in PROMPTS))
        finally:
            await aclient.close()

    got = _run(all_of())
    assert got == greedy_texts(PROMPTS, 24)
    server.wait_idle()


def test_disconnect_mid_stream_frees_the_slot(server):
    server.wait_idle()
    before = metric(httpx.get(server.url + "/metrics").text, "draftgraph_requests_aborted_total")
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"model": MODEL, "prompt": "A long time ago", "max_tokens": 190, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then the client goes away
    h = server.wait_idle()
    assert h["running"] == 0 and h["waiting"] == 0
    after = metric(httpx.get(server.url + "/metrics").text, "draftgraph_requests_aborted_total")
    assert after == before + 1


def test_disconnect_while_waiting_for_a_whole_answer_aborts_it(server):
    server.wait_idle()
    before = metric(httpx.get(server.url + "/metrics").text, "draftgraph_requests_aborted_total")
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(server.url + "/v1/completions", timeout=httpx.Timeout(30, read=0.3),
                   json={"model": MODEL, "prompt": "A long time ago", "max_tokens": 200})
    server.wait_idle()
    after = metric(httpx.get(server.url + "/metrics").text, "draftgraph_requests_aborted_total")
    assert after == before + 1


BAD = [  # (body or raw bytes, the field the 400 must name, a word of the rule)
    ({"model": MODEL, "prompt": "x", "temperature": 2.5}, "temperature", "[0.0, 2.0]"),
    ({"model": MODEL, "prompt": "x", "n": 9}, "n", "[1, 8]"),
    ({"model": MODEL, "prompt": "x", "logprobs": 6}, "logprobs", "[0, 5]"),
    ({"model": MODEL, "prompt": "x", "presence_penalty": 0.5}, "presence_penalty", "only 0"),
    ({"model": MODEL, "prompt": "x", "logit_bias": {"5": 1}}, "logit_bias", "unknown field"),
    ({"model": MODEL, "prompt": "x", "frobnicate": True}, "frobnicate", "unknown field"),
    ({"model": MODEL, "prompt": "x", "max_tokens": "ten"}, "max_tokens", "integer"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 201}, "max_tokens", "[1, 200]"),
    ({"model": MODEL, "prompt": 12}, "prompt", "string"),
    ({"model": MODEL, "prompt": "x" * 500, "max_tokens": 100}, "prompt", "cache"),
    ({"model": MODEL, "prompt": "x", "stream": "yes"}, "stream", "true or false"),
    ({"model": MODEL, "prompt": "x", "stop": [1]}, "stop", "strings"),
    (b'{"model": "draftgraph-default", "prompt": ', "body", "malformed JSON"),
    (b"[1, 2]", "body", "JSON object"),
    (json.dumps({"model": MODEL, "prompt": "x" * (1 << 20)}).encode(), "body", "1 MiB"),
]


@pytest.mark.parametrize("body, field, rule", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_bad_input_is_400_naming_the_field_and_nothing_is_enqueued(server, body, field, rule):
    page = httpx.get(server.url + "/metrics").text
    before = (metric(page, "draftgraph_tokens_generated_total"), metric(page, "draftgraph_requests_finished_total"))
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {
        "json": body}
    r = httpx.post(server.url + "/v1/completions", timeout=30, **kw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and rule in err["message"], err
    page = httpx.get(server.url + "/metrics").text
    after = (metric(page, "draftgraph_tokens_generated_total"), metric(page, "draftgraph_requests_finished_total"))
    assert after == before and server.health()["live"] == 0


def test_bad_chat_message_names_its_index(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [1]}])
    assert info.value.body["param"] == "messages[0].content"


def test_past_max_waiting_is_429_with_retry_after(server):
    """24 requests at once into 8 slots and 8 waiting places: some are refused with 429 and
    Retry-After, every accepted one still equals greedy."""
    server.wait_idle()
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(24)]
    want = dict(zip(PROMPTS, greedy_texts(PROMPTS, 60)))

    async def all_of() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as c:
            return await asyncio.gather(*(c.post(server.url + "/v1/completions", json={
                "model": MODEL, "prompt": p, "max_tokens": 60}) for p in prompts))

    answers = _run(all_of())
    refused = [r for r in answers if r.status_code == 429]
    assert refused and all(r.headers.get("retry-after") == "1" for r in refused)
    ok = [(p, r) for p, r in zip(prompts, answers) if r.status_code == 200]
    assert len(ok) + len(refused) == 24 and len(ok) >= 16
    for p, r in ok:
        assert r.json()["choices"][0]["text"] == want[p]
    server.wait_idle()


def test_reload_during_streams_is_lossless(server):
    """Four streams; a reload (S=3 -> S=2) is posted while they stream; every stream equals greedy
    and the server serves the new generation afterwards."""
    gen0 = server.health()["generation"]

    async def stream(c: httpx.AsyncClient, prompt: str) -> str:
        out = []
        async with c.stream("POST", server.url + "/v1/completions", json={
                "model": MODEL, "prompt": prompt, "max_tokens": 100, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    out.append(json.loads(line[6:])["choices"][0]["text"])
        return "".join(out)

    async def run() -> tuple[list[str], httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as c:
            tasks = [asyncio.create_task(stream(c, p)) for p in PROMPTS[:4]]
            await asyncio.sleep(0.3)
            reload = await c.post(server.url + "/admin/reload",
                                  json={"speculative": {"num_steps": 2, "topk": 1}, "max_running_requests": 8})
            return await asyncio.gather(*tasks), reload

    outs, reload = _run(run())
    assert reload.status_code == 202, reload.text
    assert outs == greedy_texts(PROMPTS[:4], 100)
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 8})
    assert r.json()["choices"][0]["text"] == greedy_text("Hello", 8)
    assert server.health()["generation"] > gen0


def test_bad_reload_body_is_400_and_serving_goes_on(server):
    r = httpx.post(server.url + "/admin/reload", content=b'{"speculative": {"num_steps": "x"}}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    r = httpx.post(server.url + "/admin/reload", json={"speculative": {"num_steps": 3, "topk": 1}, "bogus": 1})
    assert r.status_code == 400 and "bogus" in r.json()["error"]["message"]


def test_profile_window_answers_trace_and_table(server):
    async def run() -> httpx.Response:
        async with httpx.AsyncClient(timeout=120) as c:
            gen = asyncio.create_task(c.post(server.url + "/v1/completions", json={
                "model": MODEL, "prompt": "The engine steps", "max_tokens": 100}))
            await asyncio.sleep(0.2)
            prof = await c.post(server.url + "/admin/profile", json={"steps": 3})
            await gen
            return prof

    r = _run(run())
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["steps_recorded"] >= 1 and body["trace"].endswith("trace.json") and "step" in body["table"]


def test_metrics_on_the_same_port(server, client):
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=4)
    page = httpx.get(server.url + "/metrics").text
    assert metric(page, "draftgraph_http_requests_total") >= 1
    assert 'route="/v1/completions"' in page and "draftgraph_http_request_duration_seconds_bucket" in page
    assert metric(page, "draftgraph_tokens_generated_total") >= 4


def test_unknown_model_is_404_naming_the_field(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-4", prompt="x")
    assert info.value.body["param"] == "model"


def test_health_answers_while_streams_run(server):
    """The event loop never waits on a step: /health answers within a second under 8 streams."""
    async def run() -> float:
        async with httpx.AsyncClient(timeout=120) as c:
            tasks = [asyncio.create_task(c.post(server.url + "/v1/completions", json={
                "model": MODEL, "prompt": p, "max_tokens": 60})) for p in PROMPTS[:8]]
            await asyncio.sleep(0.3)
            worst = 0.0
            for _ in range(5):
                start = time.perf_counter()
                assert (await c.get(server.url + "/health")).status_code == 200
                worst = max(worst, time.perf_counter() - start)
            await asyncio.gather(*tasks)
            return worst

    assert _run(run()) < 1.0
