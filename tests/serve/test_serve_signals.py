"""`draftgraph serve` as a long-running process (the slow tier): graphs captured as by default and
answers equal to `draftgraph generate`'s; SIGHUP reloads while clients stream; SIGTERM drains
with streams in flight (new requests 503, the streams finish whole, exit 0), and a drain that
runs out of time ends what is left with an error event. Every wait is bounded."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import httpx
import openai
import pytest
from serve_support import MODEL, ServerProcess, greedy_texts

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("trained_models"),
              pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="needs SIGHUP/SIGTERM (POSIX)")]

PROMPTS = ["Hello there", "The quick brown fox", "Once upon a time", "Speculative decoding is"]


async def _stream(c: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, first: asyncio.Event | None = None
                  ) -> tuple[str, list[str]]:
    """(text, the SSE data lines) of one streamed completion."""
    out, lines = [], []
    async with c.stream("POST", url + "/v1/completions", json={
            "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}) as r:
        async for line in r.aiter_lines():
            if not line:
                continue
            lines.append(line)
            if line.startswith("data: {") and "choices" in line:
                out.append(json.loads(line[6:])["choices"][0]["text"])
                if first is not None:
                    first.set()
    return "".join(out), lines


def test_default_backend_answers_equal_draftgraph_generate_and_sighup_reloads_during_streams(tmp_path):
    reload_file = tmp_path / "reload.json"
    reload_file.write_text(json.dumps({"speculative": {"num_steps": 2, "topk": 1}, "max_running_requests": 8}))
    srv = ServerProcess("--reload-config", str(reload_file), log_dir=str(tmp_path))
    try:
        srv.wait_serving()
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        text = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=32).choices[0].text
        gen = subprocess.run([sys.executable, "-m", "draftgraph.runtime", "generate", "Hello there",
                              "--max-new-tokens", "32", "--backend", "eager"], capture_output=True, text=True,
                             timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert gen.returncode == 0, gen.stderr[-2000:]
        assert gen.stdout.split("\n\n-- accept length")[0] == "Hello there" + text
        gen0 = srv.health()["generation"]

        async def run() -> list[str]:
            async with httpx.AsyncClient(timeout=120) as c:
                first = asyncio.Event()
                tasks = [asyncio.create_task(_stream(c, srv.url, p, 120, first)) for p in PROMPTS]
                await asyncio.wait_for(first.wait(), 60)
                srv.proc.send_signal(signal.SIGHUP)
                return [t for t, _ in await asyncio.gather(*tasks)]

        outs = asyncio.run(asyncio.wait_for(run(), 240))
        assert outs == greedy_texts(PROMPTS, 120)
        deadline_steps = 0
        while srv.health()["generation"] == gen0 and deadline_steps < 100:  # applied at a step boundary
            client.completions.create(model=MODEL, prompt="Hi", max_tokens=4)
            deadline_steps += 1
        assert srv.health()["generation"] > gen0, srv.log()
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log()


def test_sigterm_drains_streams_in_flight_then_exits_0(tmp_path):
    srv = ServerProcess("--backend", "eager", "--drain-s", "120", log_dir=str(tmp_path))
    try:
        srv.wait_serving()

        async def run() -> tuple[list[tuple[str, list[str]]], int]:
            async with httpx.AsyncClient(timeout=180) as c:
                first = asyncio.Event()
                tasks = [asyncio.create_task(_stream(c, srv.url, p, 150, first)) for p in PROMPTS]
                await asyncio.wait_for(first.wait(), 60)
                srv.proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.3)
                late = await c.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "x"})
                return await asyncio.gather(*tasks), late.status_code

        streams, late = asyncio.run(asyncio.wait_for(run(), 240))
        assert late == 503
        assert [t for t, _ in streams] == greedy_texts(PROMPTS, 150)
        assert all(lines[-1] == "data: [DONE]" for _, lines in streams)
        srv.proc.wait(60)
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log()


def test_a_drain_out_of_time_ends_the_stream_with_an_error_and_exits_0(tmp_path):
    srv = ServerProcess("--backend", "eager", "--drain-s", "0.5", "--max-tokens-limit", "400", log_dir=str(tmp_path))
    try:
        srv.wait_serving()

        async def run() -> tuple[str, list[str]]:
            async with httpx.AsyncClient(timeout=180) as c:
                first = asyncio.Event()
                task = asyncio.create_task(_stream(c, srv.url, "Once upon a time", 400, first))
                await asyncio.wait_for(first.wait(), 60)
                srv.proc.send_signal(signal.SIGTERM)
                return await task

        text, lines = asyncio.run(asyncio.wait_for(run(), 120))
        assert lines[-1] == "data: [DONE]" and "drain time ran out" in lines[-2]
        assert greedy_texts(["Once upon a time"], 400)[0].startswith(text)  # what came was exact
        srv.proc.wait(60)
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log()
