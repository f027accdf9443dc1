"""install_chain_buffers on SGLang 0.5.23's real MultiLayerEagleDraftWorker (CPU).

The worker is built as DESIGN.md §9 says (``cls.__new__`` plus the attributes its methods read);
reference results are SGLang's own ``draft_forward`` / ``_draft_forward_organize`` on an unpatched
twin, and the override is SGLang's own ``EAGLEWorkerV2._override_worker_state``.
"""

from __future__ import annotations

import types

import pytest
import torch
from draft_support import assert_same
from sglang_support import import_sglang, published, resolved_server_args, write_tiny_model

from draftgraph.graphs import record_spans
from draftgraph.runtime.sglang.adapter import install_chain_buffers


@pytest.fixture(scope="module")
def sg(tmp_path_factory):
    mods = import_sglang("sglang.srt.speculative.multi_layer_eagle_worker_v2",
                         "sglang.srt.speculative.eagle_worker_v2", "sglang.srt.speculative.eagle_info")
    sa = resolved_server_args(write_tiny_model(tmp_path_factory.mktemp("tiny_llama")),
                              cuda_graph_config={"decode": {"bs": [1, 2, 4, 8]}}, max_running_requests=8)
    with published(sa):
        yield types.SimpleNamespace(**vars(mods), server_args=sa)


def make_worker(sg, steps=3):
    """SGLang's MultiLayerEagleDraftWorker with what its methods (and the override) read."""
    cls = sg.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker
    w = cls.__new__(cls)
    w.topk, w.speculative_num_steps, w.speculative_num_draft_tokens = 1, steps, steps + 1
    w.server_args, w.device = sg.server_args, torch.device("cpu")
    for name in ("draft_attn_backend", "draft_extend_attn_backend", "cuda_graph_runner",
                 "cuda_graph_runner_for_draft_extend"):
        setattr(w, name, None)
    w.draft_runner = types.SimpleNamespace(draft_attn_backend=None, attn_backend=None)
    w._rebuild_topk1_chain_buffers()  # what SGLang's __init__ does
    return w


def batch(sg, b, width, seed=0):
    g = torch.Generator().manual_seed(seed)
    info = sg.eagle_info.EagleDraftInput(topk_p=torch.rand(b, width, generator=g),
                                         topk_index=torch.randint(0, 256, (b, width), generator=g),
                                         hidden_states=torch.randn(b, 16, generator=g))
    return types.SimpleNamespace(spec_info=info)


def override(sg, w, steps):
    """SGLang's own _override_worker_state on an outer worker holding ``w``."""
    outer = types.SimpleNamespace(speculative_num_steps=w.speculative_num_steps,
                                  speculative_num_draft_tokens=w.speculative_num_draft_tokens,
                                  _draft_worker=w)
    return sg.eagle_worker_v2.EAGLEWorkerV2._override_worker_state(outer, steps, steps + 1)


def assert_results(ours, ref, what):
    for name, a, b in zip(("parent_list", "top_scores_index", "draft_tokens"), ours, ref):
        assert_same(a, b, f"{what} {name}")


@pytest.mark.parametrize("steps", range(1, 7))
def test_draft_forward_bitwise_equal_to_sglang(sg, steps):
    ref, w = make_worker(sg, steps), make_worker(sg, steps)
    handle = install_chain_buffers(w)
    capacity = ref._topk1_parents_prealloc.shape[0]
    sizes = [1, 3, capacity, capacity + 1, capacity + 5]
    for b in sizes:
        fb = batch(sg, b, steps, seed=b)
        assert_results(w.draft_forward(fb), ref.draft_forward(fb), f"S={steps} b={b}")
        # and SGLang's general path (the organize the fast path replaces) agrees too
        info = fb.spec_info
        assert_results(w.draft_forward(fb), ref._draft_forward_organize(info.topk_p, info.topk_index,
                                                                        info.hidden_states), f"b={b}")
    fast = sum(b <= capacity for b in sizes)
    assert handle.counters.fast_path_hits == 2 * fast
    assert handle.counters.tree_path_calls == handle.counters.capacity_fallbacks == 2 * (len(sizes) - fast)


def test_override_and_restore_keep_the_same_tensors(sg):
    ref, w = make_worker(sg), make_worker(sg)
    sglang_before = ref._topk1_parents_prealloc  # held, as a captured graph would hold it
    before = w._topk1_parents_prealloc
    handle = install_chain_buffers(w)
    assert w._topk1_parents_prealloc is before  # adopted: graphs captured before install keep theirs
    parents, indices = w._topk1_parents_prealloc, w._topk1_score_indices_prealloc
    saved = (parents.data_ptr(), indices.data_ptr(), parents.clone(), indices.clone())
    for worker in (w, ref):
        with override(sg, worker, 5):
            assert worker.speculative_num_steps == 5 and worker._topk1_parents_prealloc.shape[1] == 5
            fb = batch(sg, 4, 5)
            if worker is w:
                assert_results(w.draft_forward(fb), make_worker(sg, 5).draft_forward(fb), "in the override")
    assert w.speculative_num_steps == 3 and w.speculative_num_draft_tokens == 4
    assert w._topk1_parents_prealloc is parents and w._topk1_score_indices_prealloc is indices
    assert (parents.data_ptr(), indices.data_ptr()) == saved[:2]
    assert torch.equal(parents, saved[2]) and torch.equal(indices, saved[3])
    assert handle.counters.rebuilds == 2
    # SGLang's own rebuild gave the twin other tensors: a graph holding the old ones reads stale memory
    assert ref._topk1_parents_prealloc is not sglang_before
    assert ref._topk1_parents_prealloc.data_ptr() != sglang_before.data_ptr()
    # a second round still hands out the same tensors (S=5's set is held too)
    with override(sg, w, 5):
        inside = w._topk1_parents_prealloc
    with override(sg, w, 5):
        assert w._topk1_parents_prealloc is inside


def test_raw_step_write_without_rebuild_takes_the_general_path(sg):
    ref, w = make_worker(sg), make_worker(sg)
    handle = install_chain_buffers(w)
    for worker in (w, ref):
        worker.speculative_num_steps, worker.speculative_num_draft_tokens = 4, 5  # no rebuild
    fb = batch(sg, 2, 4)
    info = fb.spec_info
    ours = w.draft_forward(fb)
    assert_results(ours, ref._draft_forward_organize(info.topk_p, info.topk_index, info.hidden_states),
                   "raw S write")
    assert handle.counters.fast_path_hits == 0 and handle.counters.tree_path_calls == 1
    # SGLang's own fast path returns the stale S=3 parents for an S=4 chain
    assert ref.draft_forward(fb)[0].shape != ours[0].shape


def test_chain_rule_is_a_value_error_and_changes_nothing(sg):
    w = make_worker(sg)
    install_chain_buffers(w)
    parents = w._topk1_parents_prealloc
    w.speculative_num_draft_tokens = 6
    with pytest.raises(ValueError, match="speculative_num_draft_tokens=6 with topk=1"):
        w._rebuild_topk1_chain_buffers()
    assert w._topk1_parents_prealloc is parents


def test_uninstall_restores_sglang_and_install_twice_is_an_error(sg):
    cls = sg.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker
    ref, w = make_worker(sg), make_worker(sg)
    handle = install_chain_buffers(w)
    assert handle.patched == ("_rebuild_topk1_chain_buffers", "draft_forward")
    with pytest.raises(ValueError, match="already installed"):
        install_chain_buffers(w)
    handle.uninstall()
    assert not handle.installed
    assert "draft_forward" not in vars(w) and "_rebuild_topk1_chain_buffers" not in vars(w)
    assert w._rebuild_topk1_chain_buffers.__func__ is cls._rebuild_topk1_chain_buffers
    assert w.draft_forward.__func__ is cls.draft_forward
    held = w._topk1_parents_prealloc
    w._rebuild_topk1_chain_buffers()
    assert w._topk1_parents_prealloc is not held  # SGLang's behaviour again: new tensors
    for b in (2, 40):
        fb = batch(sg, b, 3)
        assert_results(w.draft_forward(fb), ref.draft_forward(fb), f"uninstalled b={b}")
    with pytest.raises(ValueError, match="not installed"):
        handle.uninstall()
    install_chain_buffers(w).uninstall()  # installable again


def test_spans_and_other_workers(sg):
    w = make_worker(sg)
    install_chain_buffers(w)
    with record_spans() as records:
        w.draft_forward(batch(sg, 2, 3))
        w.draft_forward(batch(sg, 100, 3))
        w._rebuild_topk1_chain_buffers()
    assert [name for name, _ in records] == ["organize_fast", "organize_tree", "rebuild"]
    # EagleDraftWorker: only the rebuild is replaced (its draft_forward runs the draft model)
    cls = sg.eagle_worker_v2.EagleDraftWorker
    e = cls.__new__(cls)
    e.topk, e.speculative_num_steps, e.speculative_num_draft_tokens = 1, 2, 3
    e.server_args, e.device = sg.server_args, torch.device("cpu")
    handle = install_chain_buffers(e)
    assert handle.patched == ("_rebuild_topk1_chain_buffers",)
    first = e._topk1_parents_prealloc
    e.speculative_num_steps, e.speculative_num_draft_tokens = 4, 5
    e._rebuild_topk1_chain_buffers()
    e.speculative_num_steps, e.speculative_num_draft_tokens = 2, 3
    e._rebuild_topk1_chain_buffers()
    assert e._topk1_parents_prealloc is first
    with pytest.raises(TypeError, match="not an SGLang draft worker"):
        install_chain_buffers(object())


def test_chain_rule_holds_under_python_O(python_O):
    # a duck-typed worker (no SGLang import: seconds saved); the check must not be an assert
    out = python_O.run("""
        import types
        from draftgraph.runtime.sglang.adapter import install_chain_buffers
        class W:
            topk, speculative_num_steps, speculative_num_draft_tokens, device = 1, 3, 4, "cpu"
            server_args = types.SimpleNamespace(cuda_graph_config={"decode": {"max_bs": 4}},
                                                max_running_requests=2)
            def _rebuild_topk1_chain_buffers(self):
                raise AssertionError("SGLang's own method must not run")
        w = W()
        install_chain_buffers(w)
        assert w._topk1_parents_prealloc.shape == (4, 3)
        w.speculative_num_draft_tokens = 7
        try:
            w._rebuild_topk1_chain_buffers()
        except ValueError as exc:
            print("ValueError", exc)
    """)
    assert out.returncode == 0, out.stderr
    assert "ValueError speculative_num_draft_tokens=7 with topk=1" in out.stdout


@pytest.mark.parametrize("module,name", [
    ("sglang.srt.speculative.multi_layer_eagle_worker_v2", "MultiLayerEagleDraftWorker"),
    ("sglang.srt.speculative.eagle_worker_v2", "EagleDraftWorker")])
def test_the_adapters_contract_names_what_sglangs_workers_assign(sg, module, name):
    """`SGLangDraftWorker` (what the adapter reads of SGLang's worker) against SGLang's own source:
    every attribute it names is assigned by the class or a base (``self.<name> =``), and the
    methods it replaces or calls are defined there; a worker built as SGLang's __init__ leaves it
    passes ``isinstance``, one without ``topk`` does not."""
    import importlib
    import inspect
    import re

    from draftgraph.runtime.sglang.adapter import SGLangDraftWorker

    cls = getattr(importlib.import_module(module), name)
    src = "".join(inspect.getsource(c) for c in cls.__mro__ if c.__module__.startswith("sglang"))
    members = [n for n in vars(SGLangDraftWorker).get("__annotations__", {})]
    assert sorted(members) == ["device", "server_args", "speculative_num_draft_tokens", "speculative_num_steps",
                               "topk"]
    assert [n for n in members if not re.search(rf"self\.{n}\s*=", src)] == []
    assert [n for n in ("_topk1_parents_prealloc", "_topk1_score_indices_prealloc")
            if not re.search(rf"self\.{n}\s*=", src)] == []
    assert re.search(r"def _rebuild_topk1_chain_buffers\b", src)
    w = make_worker(sg)
    assert isinstance(w, SGLangDraftWorker)
    del w.topk
    assert not isinstance(w, SGLangDraftWorker)
