"""Churn against one `draftgraph serve` at ``--max-waiting 2000`` (issue 49, point 1): hundreds of
clients that submit and hang up beside honest clients whose answers are checked against greedy
decoding. Afterwards no step failed, nothing is left live and every honest answer is exact.
Loopback only; every loop bounded in count and time. On the code before the request table had
one owner: 2 step failures and 247 requests left "waiting" for ever (77 s here after)."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
import urllib.request

import pytest
from serve_support import MODEL, ServerProcess, greedy_texts

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("trained_models")]

PROMPTS = ["Hello there", "The quick brown fox", "Once upon a time", "def main():", "In the beginning",
           "A long time ago", "Dear friend,", "Why is the sky"]
CHURNERS, CHURN_EACH = 16, 80  # 1,280 requests that leave
HONEST, HONEST_EACH = 3, 6  # 18 checked answers
MAX_TOKENS = 24
DEADLINE_S = 420.0


def _leave(port: int, body: bytes, rng: random.Random) -> None:
    """Send a whole request, wait 0..40 ms, hang up."""
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5.0) as s:
            s.sendall(head + body)
            time.sleep(rng.random() * 0.04)
    except OSError:
        pass


def _honest(url: str, prompt: str) -> str:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["text"]


def test_clients_leaving_while_queued_fail_no_other_client(tmp_path):
    expected = dict(zip(PROMPTS, greedy_texts(PROMPTS, MAX_TOKENS)))
    srv = ServerProcess("--backend", "eager", "--max-running", "2", "--max-waiting", "2000",
                        "--max-tokens-limit", "64", "--drain-s", "10", log_dir=str(tmp_path))
    stop_at = time.monotonic() + DEADLINE_S
    answers: list[tuple[str, str]] = []
    errors: list[str] = []
    try:
        srv.wait_serving()

        def churn(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(CHURN_EACH):
                if time.monotonic() > stop_at:
                    return
                prompt = rng.choice(PROMPTS)
                _leave(srv.port, json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 64,
                                             "stream": rng.random() < 0.5}).encode(), rng)

        def honest(seed: int) -> None:
            rng = random.Random(1000 + seed)
            for _ in range(HONEST_EACH):
                if time.monotonic() > stop_at:
                    return
                prompt = rng.choice(PROMPTS)
                try:
                    answers.append((prompt, _honest(srv.url, prompt)))
                except Exception as exc:  # an HTTP 500 ("engine step failed") lands here
                    errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=churn, args=(i,), daemon=True) for i in range(CHURNERS)]
        threads += [threading.Thread(target=honest, args=(i,), daemon=True) for i in range(HONEST)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(1.0, stop_at - time.monotonic()))
        assert not any(t.is_alive() for t in threads), "clients still running at the deadline"
        health = srv.wait_idle(60.0)  # no phantom entry: every request that left is gone
        assert health["step_failures"] == 0, health
        assert not errors, errors[:3]
        assert len(answers) == HONEST * HONEST_EACH
        assert all(text == expected[prompt] for prompt, text in answers)
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log()
