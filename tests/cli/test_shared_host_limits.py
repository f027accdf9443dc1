"""Memory and threads a small file or an idle client can claim (issue 32, "files" surface).

A reload is budgeted whole (its own state and every adaptive candidate, summed) against the
operator's limit, which a reload file cannot raise; the metrics server keeps its threads bounded
whatever clients do, closes idle connections, and still answers a real scrape.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from engine_support import engine_args

from draftgraph.runtime import SpeculativeConfig

ROOT = Path(__file__).resolve().parents[2]
HUGE_POOL = 2_563_709  # max_running_requests of the reload file (8-slot engine)


# ---- item 4: a reload's memory ------------------------------------------------------------------
def test_reload_is_budgeted_whole_before_anything_is_allocated(make_engine):
    engine = make_engine(max_bs=8, running=8, adaptive_steps=(1, 2, 3, 4, 5))
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    # each of the five adaptive states fits 1 GiB alone (the largest, S=5: ~753 MiB); together ~2.3 GiB
    with pytest.raises(ValueError, match=r"5 states .* together: over max_state_bytes") as info:
        engine.request_reload(engine_args(max_bs=8, running=HUGE_POOL))
    assert "2,352" in str(info.value)  # MiB, the 2.3 GiB
    engine.add_request([1, 2, 3, 4], 6)
    for _ in range(4):
        engine.step()
    assert (proc.memory_info().rss - rss0) < 200 * 2**20  # flat: nothing was built
    assert engine.args.max_running_requests == 8 and engine.worker.reloads.log.succeeded == 0


def test_reload_file_cannot_raise_the_memory_limit_but_may_lower_it(make_engine):
    engine = make_engine(max_bs=8, running=8, adaptive_steps=())  # one state per reload: the per-state check alone
    # one state of S=5 over 4,000,000 rows needs ~1.15 GiB: over the operator's 1 GiB
    raised = engine_args(SpeculativeConfig(5, 1), max_bs=8, running=4_000_000, max_state_bytes=1 << 40)
    with pytest.raises(ValueError, match="a reload can only lower it"):
        engine.request_reload(raised)
    with pytest.raises(ValueError, match="max_state_bytes=4096"):  # lowering applies to that reload
        engine.request_reload(engine_args(SpeculativeConfig(2, 1), max_bs=8, running=8, max_state_bytes=4096))
    # the operator's own configuration may raise it
    big = make_engine(args=engine_args(max_bs=8, running=8, max_state_bytes=8 << 30))
    big.worker.reloads.check(raised)  # checked only: nothing is built
    assert engine.worker.budget.limit == 1 << 30 and big.worker.budget.limit == 8 << 30


# ---- item 5: the metrics server -----------------------------------------------------------------
def _registry():
    from prometheus_client import CollectorRegistry, Counter
    registry = CollectorRegistry()
    Counter("draftgraph_test_scrapes", "a series to scrape", registry=registry).inc(3)
    return registry


@pytest.mark.slow  # the slow tier: hundreds of idle connections to the metrics server
def test_idle_connections_hold_no_threads_and_a_scrape_answers():
    from draftgraph.runtime.engine.metrics import serve_metrics

    port = serve_metrics(0, _registry())
    time.sleep(0.2)
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(300)]
    try:
        time.sleep(1.0)  # the server has accepted them
        during = threading.active_count()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
        assert "draftgraph_test_scrapes_total 3.0" in body
        assert during - before <= 9, f"{during - before} threads for 300 idle connections"
        # each idle connection is closed by the server after its timeout (10 s): EOF, not a hang
        closed = 0
        for conn in idle:
            try:
                closed += conn.recv(1) == b""
            except ConnectionResetError:
                closed += 1
        assert closed == len(idle)
    finally:
        for conn in idle:
            conn.close()


@pytest.mark.parametrize("host, url", [("0.0.0.0", "http://0.0.0.0:"), ("::", "http://[::]:")])
def test_metrics_host_option_warns_when_not_loopback(host, url):
    if ":" in host and not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    p = subprocess.run([sys.executable, "-m", "draftgraph.runtime", "simulate", "--requests", "1",
                        "--no-greedy", "--backend", "eager", "--adaptive", "", "--json",
                        "--metrics-port", "0", "--metrics-host", host],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"--metrics-host={host} is not loopback" in p.stderr
    assert f"metrics at {url}" in p.stderr  # issue 40: "::" printed http://:::PORT/metrics


def test_metrics_url_brackets_ipv6_hosts():
    from draftgraph.runtime.engine.metrics import metrics_url

    assert metrics_url("::", 9) == "http://[::]:9/metrics"
    assert metrics_url("::1", 9) == "http://[::1]:9/metrics"
    assert metrics_url("[::1]", 9) == "http://[::1]:9/metrics"
    assert metrics_url("127.0.0.1", 9) == "http://127.0.0.1:9/metrics"
    assert metrics_url("localhost", 9) == "http://localhost:9/metrics"
