"""One set of input rules for every path of a draft step (issue 25): a graph replay, the eager
fallback above the largest captured size and the eager backend give an input the same answer or
the same error. One table over dtypes, devices, shapes, grad, inference mode and strides; and an
input that requires grad never poisons a worker's static inputs."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from draftgraph.runtime import CudaGraphConfig, DraftInput, EagleDraftWorker, PhaseGraphConfig, RuntimeArgs
from draftgraph.runtime import SpeculativeConfig as Spec
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input

SIZES = (2, 4)
# path -> (backend, b): b=3 replays the graph of 4; b=6 is above the largest size (eager fallback)
PATHS = {"replay": ("trace", 3), "fallback": ("trace", 6), "eager": ("eager", 3)}
SPECS = {"chain": Spec(3, 1), "tree": Spec(3, 2, 6)}
H = 32


@pytest.fixture(scope="module")
def workers() -> dict[tuple[str, str], EagleDraftWorker]:
    out = {}
    for sname, spec in SPECS.items():
        args = RuntimeArgs(spec, CudaGraphConfig(PhaseGraphConfig(bs=SIZES)), max_running_requests=8)
        for backend in ("trace", "eager"):
            w = EagleDraftWorker(args, TinyDraftModel(hidden_size=H))
            if backend != "eager":
                w.capture_graphs(backend)
            out[sname, backend] = w
    return out


def _run(worker: EagleDraftWorker, inp: DraftInput, inference: bool = False) -> tuple[torch.Tensor, ...]:
    if inference:
        with torch.inference_mode():
            out = worker.draft_forward(inp)
    else:
        out = worker.draft_forward(inp)
    return tuple(t.clone() for t in out)  # replay outputs are views the next replay overwrites


def _plain(inp: DraftInput) -> DraftInput:
    """The same values as ordinary contiguous tensors (the expected answer's input)."""
    def fix(t):
        return None if t is None else t.detach().clone().contiguous()
    return DraftInput(fix(inp.topk_p), fix(inp.topk_index), fix(inp.hidden_states))


def _infer(inp: DraftInput) -> DraftInput:
    with torch.inference_mode():
        return DraftInput(inp.topk_p.clone(), inp.topk_index.clone(), inp.hidden_states.clone())


def _transposed(t: torch.Tensor) -> torch.Tensor:
    """The same values in column-major storage (a non-contiguous view)."""
    return t.t().contiguous().t()


def _every_other(t: torch.Tensor) -> torch.Tensor:
    """The same values as every other column of a wider tensor (stride 2)."""
    wide = torch.zeros(t.shape[0], 2 * t.shape[1], dtype=t.dtype)
    wide[:, ::2] = t
    return wide[:, ::2]


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[DraftInput], DraftInput]
    error: type[Exception] | None = None  # None: the same answer as the plain input
    match: str = ""
    inference: bool = False  # call draft_forward under torch.inference_mode()
    cuda: bool = False


def _with(**kw):
    def make(inp: DraftInput) -> DraftInput:
        fields = {"topk_p": inp.topk_p, "topk_index": inp.topk_index, "hidden_states": inp.hidden_states}
        for k, fn in kw.items():
            fields[k] = fn(fields[k])
        return DraftInput(**fields)
    return make


CASES = [
    Case("plain", _with()),
    # dtypes
    Case("topk_p float64", _with(topk_p=lambda t: t.double()), TypeError, r"topk_p has dtype torch.float64"),
    Case("topk_p float16", _with(topk_p=lambda t: t.half()), TypeError, r"topk_p has dtype torch.float16"),
    Case("topk_index int32", _with(topk_index=lambda t: t.int()), TypeError, r"topk_index has dtype torch.int32"),
    Case("hidden float16", _with(hidden_states=lambda t: t.half()), TypeError,
         r"hidden_states has dtype torch.float16"),
    Case("hidden float64", _with(hidden_states=lambda t: t.double()), TypeError,
         r"hidden_states has dtype torch.float64"),
    # devices
    Case("topk_p on meta", _with(topk_p=lambda t: t.to("meta")), ValueError, r"topk_p is on meta"),
    Case("hidden on meta", _with(hidden_states=lambda t: t.to("meta")), ValueError, r"hidden_states is on meta"),
    Case("hidden on cuda", _with(hidden_states=lambda t: t.cuda()), ValueError, r"hidden_states is on cuda",
         cuda=True),
    # shapes
    Case("topk_index one column more", _with(topk_p=lambda t: torch.cat([t, t[:, :1]], 1),
                                             topk_index=lambda t: torch.cat([t, t[:, :1]], 1)),
         ValueError, r"topk_index has \d+ columns"),
    Case("topk_p shape differs", _with(topk_p=lambda t: t[:-1]), ValueError, r"must have the same shape"),
    Case("topk_index 1-D", _with(topk_p=lambda t: t[:, 0], topk_index=lambda t: t[:, 0]), TypeError,
         r"must be a 2-D tensor"),
    Case("hidden wider", _with(hidden_states=lambda t: torch.cat([t, t[:, :1]], 1)), ValueError,
         r"hidden_states=\(\d+, 33\)"),
    Case("hidden one row more", _with(hidden_states=lambda t: torch.cat([t, t[:1]], 0)), ValueError,
         r"hidden_states=\(\d+, 32\)"),
    Case("hidden 3-D", _with(hidden_states=lambda t: t[:, None]), ValueError, r"hidden_states=\(\d+, 1, 32\)"),
    Case("hidden missing", _with(hidden_states=lambda t: None), ValueError, r"hidden_states=None"),
    # grad and inference mode: the same answer
    Case("hidden requires grad", _with(hidden_states=lambda t: t.clone().requires_grad_(True))),
    Case("topk_p and hidden require grad", _with(topk_p=lambda t: t.clone().requires_grad_(True),
                                                 hidden_states=lambda t: t.clone().requires_grad_(True))),
    Case("inference-mode tensors", _infer),
    Case("called in inference mode", _with(), inference=True),
    Case("inference-mode tensors in inference mode", _infer, inference=True),
    # strides: the same answer
    Case("column-major hidden", _with(hidden_states=_transposed)),
    Case("column-major topk", _with(topk_p=_transposed, topk_index=_transposed)),
    Case("stride-2 columns", _with(topk_p=_every_other, topk_index=_every_other, hidden_states=_every_other)),
    Case("expanded hidden rows", _with(hidden_states=lambda t: t[:1].expand(t.shape[0], -1))),
]


@pytest.mark.parametrize("spec", sorted(SPECS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_path_gives_the_same_answer_or_the_same_error(workers, spec, case):
    if case.cuda and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    outcomes = {}
    for path, (backend, b) in PATHS.items():
        worker = workers[spec, backend]
        inp = make_draft_input(b, SPECS[spec].topk, hidden_size=H, seed=b)
        variant = case.make(inp)
        if case.error is not None:
            with pytest.raises(case.error, match=case.match) as info:
                _run(worker, variant, case.inference)
            # the same message up to the batch size (3 or 6 rows)
            outcomes[path] = (type(info.value), re.sub(r"\b\d+\b", "#", str(info.value)))
            continue
        got = _run(worker, variant, case.inference)
        want = _run(workers[spec, "eager"], _plain(variant))
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), path
            assert not g.requires_grad, path
        outcomes[path] = "same answer"
    assert len(set(outcomes.values())) == 1, outcomes


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_an_input_that_requires_grad_does_not_poison_the_worker(spec):
    """After a replay of an input that requires grad, replays at every other padded size still
    load and answer as before, and the static inputs record no autograd history."""
    args = RuntimeArgs(SPECS[spec], CudaGraphConfig(PhaseGraphConfig(bs=SIZES)), max_running_requests=8)
    worker = EagleDraftWorker(args, TinyDraftModel(hidden_size=H))
    worker.capture_graphs("trace")
    ref = EagleDraftWorker(args, TinyDraftModel(hidden_size=H))
    k = SPECS[spec].topk
    bad = make_draft_input(3, k, hidden_size=H, seed=3)
    bad = DraftInput(bad.topk_p.requires_grad_(True), bad.topk_index, bad.hidden_states.requires_grad_(True))
    _run(worker, bad)
    static = worker.state.graphs.static_inputs
    assert not any(t.requires_grad for t in static.values())
    for b in (1, 2, 3, 4, 1):
        inp = make_draft_input(b, k, hidden_size=H, seed=10 + b)
        assert all(torch.equal(g, w) for g, w in zip(_run(worker, inp), _run(ref, inp)))
    assert worker.counters.graph_replays == 6


@pytest.mark.parametrize("backend", ["trace", "eager"])
def test_the_manager_records_no_history_on_any_path(backend):
    """GraphCaptureManager.run: replay, eager fallback and the eager backend return tensors
    without autograd history for inputs that require grad, in any grad mode."""
    from draftgraph.graphs import GraphCaptureManager

    def step(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * 2.0 + 1.0)

    mgr = GraphCaptureManager(step, {"x": torch.zeros(4, 3)}, [2, 4], backend=backend)
    mgr.capture()
    for b in (3, 1, 6, 2):  # 6: above the largest size (eager fallback on trace)
        x = torch.randn(b, 3, requires_grad=True)
        out = mgr.run({"x": x}, clone=True)
        assert not out.requires_grad and torch.equal(out, step(x.detach()))
        with torch.inference_mode():
            y = torch.randn(b, 3)
        assert torch.equal(mgr.run({"x": y}, clone=True), step(y.clone()))
    assert not mgr.static_inputs["x"].requires_grad


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_the_worker_entry_is_the_only_input_check(monkeypatch, spec):
    """Issue 29: a replay from the worker checks its input once, at the worker's entry; the
    manager and its static rows trust it (their checks stay for `run` / `replay` callers)."""
    from draftgraph.graphs import static as static_module

    args = RuntimeArgs(SPECS[spec], CudaGraphConfig(PhaseGraphConfig(bs=SIZES)), max_running_requests=8)
    worker = EagleDraftWorker(args, TinyDraftModel(hidden_size=H))
    worker.capture_graphs("trace")
    ref = EagleDraftWorker(args, TinyDraftModel(hidden_size=H))
    calls = []

    def recorded(name, original):
        def wrapper(*a, **k):
            calls.append(name)
            return original(*a, **k)
        return wrapper

    monkeypatch.setattr(static_module.LoadPlan, "match", recorded("match", static_module.LoadPlan.match))
    monkeypatch.setattr(static_module.StaticInputs, "batch_size",
                        recorded("batch_size", static_module.StaticInputs.batch_size))
    k = SPECS[spec].topk
    for b in (1, 3, 4, 3):
        inp = make_draft_input(b, k, hidden_size=H, seed=b)
        assert all(torch.equal(g, w) for g, w in zip(_run(worker, inp), _run(ref, inp)))
    assert worker.counters.graph_replays == 4 and calls == []
    with pytest.raises(TypeError, match="topk_index has dtype torch.int32"):  # still refused, at the entry
        worker.draft_forward(DraftInput(inp.topk_p, inp.topk_index.int(), inp.hidden_states))
    worker.state.graphs.run({"topk_p": inp.topk_p, "topk_index": inp.topk_index, "hidden_states": inp.hidden_states})
    assert calls == ["match"]  # the manager's own entry keeps its check
