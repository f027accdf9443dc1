"""A `draftgraph serve` subprocess on a free loopback port, and the greedy oracle its answers are
checked against (the embedded default target decoded greedily, independent of the engine)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

MODEL = "draftgraph-toy"  # the toy target the tests serve (DRAFTGRAPH_TARGET=toy)
START_TIMEOUT_S = 240.0  # models from the cache and, with graphs, their capture on a loaded 2-core box


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 10.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


class ServerProcess:
    """`draftgraph serve --port P [args]`: started, waited for (``/health`` serving, bounded),
    stopped with SIGTERM then SIGKILL; its stderr kept in a file for failure messages."""

    def __init__(self, *args: str, log_dir: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(log_dir, f"serve-{self.port}.log")
        self._log = open(self.log_path, "w")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "draftgraph.runtime", "serve",
                                      "--port", str(self.port), *args], stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env)

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def wait_serving(self, timeout_s: float = START_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode} while starting:\n{self.log()}")
            try:
                status, body = get_json(self.url + "/health", timeout=2.0)
                if status == 200 and body["status"] == "serving" and body.get("graphs_ready"):
                    return body
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"server not serving within {timeout_s:.0f} s:\n{self.log()}")

    def health(self) -> dict:
        return get_json(self.url + "/health")[1]

    def wait_idle(self, timeout_s: float = 30.0) -> dict:
        """``/health`` once no request is live (bounded: a clear failure otherwise)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            h = self.health()
            if h.get("live") == 0 and h.get("running") == 0:
                return h
            time.sleep(0.05)
        raise AssertionError(f"requests still live after {timeout_s:.0f} s: {self.health()}")

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


def metric(text: str, name: str) -> float:
    """The sum of every sample of ``name`` (any labels) in a Prometheus text page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


_GREEDY: dict[tuple[int, ...], tuple[int, ...]] = {}  # prompt -> its longest greedy continuation so far


def greedy_ids(prompts: list[tuple[int, ...]], max_tokens: int) -> list[tuple[int, ...]]:
    """The target's greedy continuations (the oracle), decoded together for the prompts not
    known this far yet, each cut after EOS as a server stops there."""
    from draftgraph.runtime.models import default_models, greedy_generate
    from draftgraph.runtime.models.tokenizer import EOS_ID

    todo = sorted({p for p in prompts if len(_GREEDY.get(p, ())) < max_tokens and EOS_ID not in _GREEDY.get(p, ())})
    if todo:
        target, _ = default_models(seed=0, draft="eagle")
        for p, out in zip(todo, greedy_generate(target, [list(p) for p in todo], max_tokens)):
            _GREEDY[p] = tuple(out)
    outs = []
    for p in prompts:
        out = list(_GREEDY[p][:max_tokens])
        outs.append(tuple(out[:out.index(EOS_ID) + 1] if EOS_ID in out else out))
    return outs


def greedy_texts(texts: list[str], max_tokens: int) -> list[str]:
    """What the server must answer for each of ``texts``: the greedy continuation's text."""
    from draftgraph.runtime.models import default_tokenizer

    tok = default_tokenizer()
    return [tok.decode(list(ids)) for ids in greedy_ids([tuple(tok.encode(t)) for t in texts], max_tokens)]


def greedy_text(text: str, max_tokens: int, stop: tuple[str, ...] = ()) -> str:
    """`greedy_texts` of one text, cut at the first stop string."""
    out = greedy_texts([text], max_tokens)[0]
    cuts = [i for i in (out.find(s) for s in stop) if i >= 0]
    return out[:min(cuts)] if cuts else out


def plain_chat(messages: list[dict]) -> str:
    """The plain chat template for the byte tokenizer, written out here (the oracle's copy)."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
