"""Live reload: both policies, failure handling, validation, threads, signals, memory."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest
import torch
from draft_support import assert_same
from memory_support import assert_no_growth

from draftgraph.graphs import record_spans
from draftgraph.runtime import (
    CudaGraphConfig,
    EagleDraftWorker,
    MultiLayerEagleDraftWorker,
    PhaseGraphConfig,
    ReloadError,
    RuntimeArgs,
    SpeculativeConfig,
    install_reload_signal,
    load_runtime_args,
)
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input

MODEL = TinyDraftModel(vocab_size=64, hidden_size=32, seed=0)


def args_for(s, k=1, n=None, bs=(1, 2, 4), mrr=None):
    return RuntimeArgs(SpeculativeConfig(s, k, n), CudaGraphConfig(PhaseGraphConfig(bs=bs)),
                       max_running_requests=mrr)


def captured(args, model=MODEL):
    w = EagleDraftWorker(args, model)
    w.capture_graphs("trace")
    return w


def outputs(w, b, seed):
    return [t.clone() for t in w.draft_forward(make_draft_input(b, w.spec.topk, seed=seed))]


class FailingModel(torch.nn.Module):
    """Delegates to the tiny model until armed, then raises inside the forward (capture fails)."""

    def __init__(self):
        super().__init__()
        self.inner = MODEL
        self.hidden_size = MODEL.hidden_size
        self.armed = False

    def forward(self, ids, hidden):
        if self.armed:
            raise RuntimeError("injected draft model failure")
        return self.inner(ids, hidden)


@pytest.mark.parametrize("policy", ["swap", "release_first"])
@pytest.mark.parametrize("new", [args_for(5), args_for(2, 4, 6, bs=(1, 3, 8), mrr=16)])
def test_reload_matches_fresh_worker(policy, new):
    w = captured(args_for(3))
    old_state = w.state
    w.reload(new, policy=policy)
    assert w.args is new and w.state is not old_state and old_state.graphs is None
    fresh = captured(new)
    for b in (1, 2, 3, 4, 9):
        assert_pairs(outputs(w, b, b), outputs(fresh, b, b), f"{policy} b={b}")
    assert w.counters.reloads == 1 and w.reloads.history[-1]["ok"]
    assert w.reloads.history[-1]["capture_bytes"] > 0 and w.reloads.history[-1]["capture_s"] > 0
    assert w.state.has_graphs and w.counters.graph_replays > 0


def assert_pairs(a, b, what):
    for j in range(3):
        assert_same(a[j], b[j], f"{what} output {j}")


def test_reload_emits_span_with_policy():
    w = captured(args_for(3))
    with record_spans() as spans:
        w.reload(args_for(2), policy="release_first")
    reloads = [attrs for name, attrs in spans if name == "reload"]
    assert reloads == [{"policy": "release_first"}]
    assert any(name == "capture" for name, _ in spans)  # the recapture inside it


def test_swap_failure_keeps_old_state_serving():
    model = FailingModel()
    w = captured(args_for(3), model)
    old = w.state
    before = outputs(w, 3, 1)
    model.armed = True
    with pytest.raises(ReloadError, match="injected draft model failure") as info:
        w.reload(args_for(4), policy="swap")
    assert "old state keeps serving" in str(info.value)
    assert isinstance(info.value.__cause__, Exception)
    model.armed = False
    assert w.state is old and w.state.has_graphs and w.args.speculative.num_steps == 3
    replays = w.counters.graph_replays
    assert_pairs(outputs(w, 3, 1), before, "after failed swap")
    assert w.counters.graph_replays == replays + 1
    assert w.counters.failed_reloads == 1 and not w.reloads.history[-1]["ok"]
    w.reload(args_for(4))  # a later reload succeeds
    assert w.spec.num_steps == 4 and w.state.has_graphs


def test_release_first_failure_serves_eager_then_recovers():
    model = FailingModel()
    w = captured(args_for(3), model)
    before = outputs(w, 2, 5)
    model.armed = True
    with pytest.raises(ReloadError, match="released first"):
        w.reload(args_for(4), policy="release_first")
    model.armed = False
    assert w.state.graphs is None and w.spec.num_steps == 3
    eager_steps = w.counters.eager_steps
    assert_pairs(outputs(w, 2, 5), before, "eager after failed release_first")
    assert w.counters.eager_steps == eager_steps + 1
    w.reload(args_for(4), policy="release_first", backend="trace")
    assert w.state.has_graphs and w.spec.num_steps == 4


def test_invalid_reload_rejected_before_anything_changes():
    w = captured(args_for(3))
    old = w.state
    with pytest.raises(TypeError, match="must be a RuntimeArgs"):
        w.reload({"speculative": {"num_steps": 4}})
    with pytest.raises(ValueError, match="policy='later'"):
        w.reload(args_for(4), policy="later")
    with pytest.raises(ValueError, match="draft model's parameters are on cpu"):
        w.reload(RuntimeArgs(SpeculativeConfig(2, 1), device="meta"))
    ml = MultiLayerEagleDraftWorker(args_for(3))
    with pytest.raises(ValueError, match="topk must be 1"):
        ml.reload(args_for(2, 2, 4))
    assert w.state is old and w.state.has_graphs and w.counters.reloads == 0


def test_load_runtime_args_json_and_toml(tmp_path):
    j = tmp_path / "a.json"
    j.write_text(json.dumps({"speculative": {"num_steps": 4, "topk": 1},
                             "cuda_graph_config": {"decode": {"bs": [1, 2, 4]}},
                             "max_running_requests": 8}))
    a = load_runtime_args(j)
    assert a.speculative.num_draft_tokens == 5 and a.decode.bs == (1, 2, 4)
    t = tmp_path / "a.toml"
    t.write_text('max_running_requests = 8\n[speculative]\nnum_steps = 2\ntopk = 4\n'
                 'num_draft_tokens = 6\n[cuda_graph_config.decode]\nmax_bs = 16\n')
    b = load_runtime_args(t)
    assert b.speculative.topk == 4 and b.decode.max_bs == 16
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"speculative": {"num_steps": 4, "topk": 1, "steps": 2}}))
    with pytest.raises(ValueError, match="unknown keys \\['steps'\\]"):
        load_runtime_args(bad)
    bad.write_text(json.dumps({"speculative": {"num_steps": 4, "topk": 1, "num_draft_tokens": 9}}))
    with pytest.raises(ValueError, match="bad.json.*num_draft_tokens=9"):
        load_runtime_args(bad)
    with pytest.raises(ValueError, match="cannot read"):
        load_runtime_args(tmp_path / "missing.json")


def test_reload_on_signal_applies_at_next_step(tmp_path):
    w = captured(args_for(3))
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"speculative": {"num_steps": 5, "topk": 1},
                                "cuda_graph_config": {"decode": {"bs": [1, 2]}}}))
    uninstall = install_reload_signal(w, path)
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        assert w.spec.num_steps == 3  # only requested
        out = w.draft_forward(make_draft_input(2, 1))
        assert out[2].shape == (2, 5) and w.spec.num_steps == 5 and w.state.has_graphs
        path.write_text("{not json")
        os.kill(os.getpid(), signal.SIGHUP)  # a bad file is logged, serving goes on
        w.draft_forward(make_draft_input(2, 1))
        assert w.spec.num_steps == 5
    finally:
        uninstall()


def test_reload_from_thread_every_step_matches_its_state():
    configs = [args_for(2), args_for(4), args_for(3, 2, 5), args_for(5)]
    w = captured(configs[0])
    errors: list[BaseException] = []
    steps_done = [0]
    progressed = threading.Condition()

    def reloader():
        # reload i waits until the serving loop has run 30 * (i + 1) steps, so reloads interleave
        # with steps whatever the scheduler does (a free-running thread could finish all 50
        # before the loop took the lock once)
        try:
            for i in range(50):
                with progressed:
                    progressed.wait_for(lambda i=i: steps_done[0] >= 30 * (i + 1), timeout=60)
                w.reload(configs[(i + 1) % len(configs)])
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    t = threading.Thread(target=reloader)
    t.start()
    seen = set()
    for step in range(2000):
        with progressed:
            steps_done[0] = step
            progressed.notify_all()
        b = 1 + step % 5
        state_topk = w.state.spec.topk
        inp = make_draft_input(b, state_topk, seed=step % 17)
        try:
            got = [x.clone() for x in w.draft_forward(inp)]
        except ValueError:
            # the state was swapped to another topk between building the input and the step
            continue
        ran = w.drafting.last_state
        seen.add(ran.spec.key)
        want = w.drafting.step(ran, inp.topk_p, inp.topk_index, inp.hidden_states, count=False)
        assert_pairs(got, want, f"step {step} under {ran}")
    t.join()
    assert not errors, errors
    assert w.counters.reloads == 50 and len(seen) >= 2


@pytest.mark.slow
def test_500_reload_cycles_do_not_grow_rss():
    """Two windows of 250 reloads after 40 of warm-up. Bound: 2 KB per reload (a state's
    topology buffers or recorded graph left behind is tens of KB), plus a noise floor of 1 MB
    per window."""
    w = captured(args_for(3, bs=(1,)))
    cycle = [args_for(4, bs=(1,)), args_for(3, bs=(1,))]

    def reload(i: int) -> None:
        w.reload(cycle[i % 2])
        if i % 100 == 0:
            w.draft_forward(make_draft_input(1, 1))

    assert_no_growth(reload, warmup=40, window=250, every=25, per_cycle=2 * 1024, noise_floor=2**20,
                     unit="reload")
    assert len(w._topology_cache) <= 2  # buffers of released states were freed
