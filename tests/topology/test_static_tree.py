"""Static draft trees: layout constants, build_tree's constant route, the worker's depth-by-depth
draft (eager and graph) against a brute-force per-node draft, the chain as one case, buffer
identity across override / switch / reload, and memory over many reloads."""

from __future__ import annotations

import pytest
import torch
from draft_support import assert_same
from hypothesis import given, settings
from hypothesis import strategies as st
from memory_support import assert_no_growth
from torch.utils._python_dispatch import TorchDispatchMode

from draftgraph.runtime.config import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.draft_io import DraftInput
from draftgraph.runtime.topology.buffers import TopologyBuffers
from draftgraph.runtime.topology.verify_tree import build_tree
from draftgraph.runtime.tree_choices import StaticTopology, chain_choices
from draftgraph.runtime.worker.eagle import EagleDraftWorker

V, H = 64, 16
CAPACITY = 6
FIELDS = ("tokens", "positions", "parents", "tree_mask", "retrieve_index", "retrieve_next_token",
          "retrieve_next_sibling")


class ExactDraftModel(torch.nn.Module):
    """float64 with small integer values: every sum is exact, so a row's result never depends on
    how many rows a forward batches (the brute-force reference runs one row at a time)."""

    def __init__(self, seed: int = 0, device: str = "cpu") -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.hidden_size = H
        self.embed = torch.nn.Parameter(torch.randint(-3, 4, (V, H), generator=gen).double().to(device),
                                        requires_grad=False)
        self.mix = torch.nn.Parameter(torch.randint(-1, 2, (H, H), generator=gen).double().to(device),
                                      requires_grad=False)
        # distinct logits in every row: integer part + j/64 (exact), so top-k has no ties
        self.register_buffer("tie", torch.arange(V, dtype=torch.float64, device=device) / 64)

    def forward(self, ids: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.remainder(self.embed[ids] + hidden @ self.mix, 7.0) - 3.0
        return h @ self.embed.t() + self.tie, h


MODEL = ExactDraftModel()


@st.composite
def trees(draw, max_depth=5, max_children=4, max_nodes=32):
    """A random valid tree: depth 1..5, up to 4 children per node (ranks any subset of 0..3)."""
    depth = draw(st.integers(1, max_depth))
    frontier, paths = [()], []
    for d in range(1, depth + 1):
        nxt = []
        for i, parent in enumerate(frontier):
            room = max_nodes - len(paths) - (depth - d)  # keep one node per deeper level
            low = 1 if i == 0 else 0  # the first node continues, so every depth is reached
            count = draw(st.integers(low, max(low, min(max_children, room))))
            ranks = sorted(draw(st.sets(st.integers(0, max_children - 1), min_size=count,
                                        max_size=count)))
            for r in ranks:
                paths.append(parent + (r,))
                nxt.append(parent + (r,))
        frontier = nxt
    shuffled = draw(st.permutations(paths))
    return tuple(shuffled), depth


def reference_layout(choices):
    """Per-node constants from prefix relations alone (no parent walk): a slow, independent path."""
    nodes = sorted(choices, key=lambda p: (len(p), p))
    parent = [nodes.index(p[:-1]) if len(p) > 1 else -1 for p in nodes]
    full = [()] + nodes  # node 0 = root
    n = len(full)
    mask = [[full[i][:len(full[j])] == full[j] for j in range(n)] for i in range(n)]
    kids = [[j for j in range(1, n) if full[j][:-1] == full[i]] for i in range(n)]
    sibling = [-1] * n
    for i in range(1, n):
        later = [j for j in kids[full.index(full[i][:-1])] if j > i]
        sibling[i] = later[0] if later else -1
    return {
        "parent_list": parent if max(map(len, nodes)) > 1 else [],
        "depth": [len(p) for p in full],
        "node_parents": [-1] + [p + 1 for p in parent],
        "mask": mask,
        "next_token": [k[0] if k else -1 for k in kids],
        "next_sibling": sibling,
    }


@settings(max_examples=60, deadline=None)
@given(trees())
def test_layout_constants_match_slow_reference(tree):
    choices, _ = tree
    buf = TopologyBuffers(StaticTopology(tuple(sorted(choices, key=lambda p: (len(p), p)))), 3)
    ref = reference_layout(choices)
    n = len(choices) + 1
    v = buf.verify
    for r in range(3):
        assert buf.parents[r].tolist() == ref["parent_list"]
        assert buf.score_indices[r].tolist() == list(range(n - 1))
        assert v.node_parents[r].tolist() == ref["node_parents"]
        assert v.tree_mask[r].tolist() == ref["mask"]
        assert v.next_token[r].tolist() == ref["next_token"]
        assert v.next_sibling[r].tolist() == ref["next_sibling"]
        assert v.retrieve_index[r].tolist() == list(range(r * n, (r + 1) * n))
    assert v.depth.tolist() == [ref["depth"]]
    assert buf.parents.is_contiguous() and buf.score_indices.is_contiguous()


def test_chain_is_the_first_static_layout():
    for s in range(1, 6):
        buf = TopologyBuffers(StaticTopology(chain_choices(s)), 2)
        assert buf.parents.tolist() == [list(range(-1, s - 1)) if s > 1 else []] * 2
        assert buf.score_indices.tolist() == [list(range(s))] * 2


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.compute = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.compute.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@settings(max_examples=40, deadline=None)
@given(trees(), st.integers(1, 2 * CAPACITY), st.integers(0, 999))
def test_build_tree_constant_route_equals_general(tree, b, seed):
    choices, depth = tree
    spec = SpeculativeConfig(depth, 4, tree_choices=choices)
    w = worker_for(spec)
    inp = draft_input(b, 4, seed)
    result = w.draft_forward(inp)
    parents, indices, tokens = result
    assert result.layout is w.state.topology_buffers.verify  # views and copies above the capacity alike
    gen = torch.Generator().manual_seed(seed)
    verified = torch.randint(0, V, (b,), generator=gen)
    seq_lens = torch.randint(0, 100, (b,), generator=gen, dtype=torch.int32)
    n = spec.num_draft_tokens
    with _Count() as counter:
        fast = build_tree(verified, parents, indices, tokens, seq_lens, spec.topk, depth, n,
                          layout=result.layout)
    # without the layout: the general route (topk=1: the static layout)
    slow = build_tree(verified, parents, indices, tokens, seq_lens, spec.layout_topk, depth, n)
    for name in FIELDS:
        assert_same(getattr(fast, name), getattr(slow, name), name)
    if b <= CAPACITY:
        assert len(counter.compute) <= 2, counter.compute  # tokens (cat) and positions (add)
        assert fast.tree_mask.data_ptr() == w.state.topology_buffers.verify.tree_mask.data_ptr()


def worker_for(spec, capture=None, model=MODEL, capacity=CAPACITY, device="cpu"):
    graphs = CudaGraphConfig(PhaseGraphConfig(bs=capture)) if capture else None
    args = RuntimeArgs(spec, graphs, max_running_requests=capacity, device=device)
    return EagleDraftWorker(args, model)


def draft_input(b, k, seed, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return DraftInput(torch.rand(b, k, generator=gen).to(device),
                      torch.randint(0, V, (b, k), generator=gen).to(device),
                      torch.randint(-3, 4, (b, H), generator=gen).double().to(device))


def brute_force(choices, inp, model=MODEL):
    """Each request, each node on its own: a one-row forward of (its token, its parent's hidden)
    and its children's tokens by rank of that forward's probabilities."""
    nodes = sorted(choices, key=lambda p: (len(p), p))
    out = []
    for r in range(inp.topk_index.shape[0]):
        token = {(c,): inp.topk_index[r, c] for c in range(inp.topk_index.shape[1])}
        hidden_in = {p: inp.hidden_states[r:r + 1] for p in nodes if len(p) == 1}
        for p in nodes:
            kids = [q for q in nodes if q[:-1] == p]
            if not kids:
                continue
            logits, h = model(token[p].view(1), hidden_in[p])
            order = torch.argsort(torch.softmax(logits, -1)[0], descending=True, stable=True)
            for q in kids:
                token[q] = order[q[-1]]
                hidden_in[q] = h
        out.append(torch.stack([token[p] for p in nodes]))
    return torch.stack(out)


@settings(max_examples=30, deadline=None)
@given(trees(max_depth=4, max_nodes=20), st.integers(1, 2 * CAPACITY), st.integers(0, 999))
def test_worker_tokens_equal_brute_force_eager(tree, b, seed):
    choices, depth = tree
    spec = SpeculativeConfig(depth, 4, tree_choices=choices)
    w = worker_for(spec)
    inp = draft_input(b, 4, seed)
    parents, indices, tokens = w.draft_forward(inp)
    assert_same(tokens, brute_force(choices, inp), "draft tokens")
    buf = w.state.topology_buffers
    assert parents.shape == (b, buf.topology.parent_width) and indices.shape == (b, len(choices))
    if b <= CAPACITY:
        assert parents._base is buf.parents and indices._base is buf.score_indices
        assert w.counters.fast_path_hits == 1
    else:
        assert w.counters.capacity_fallbacks == 1
        assert torch.equal(parents, buf.parents[:1].expand(b, -1))


GRAPH_TREES = [
    ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (1, 0, 0)),  # EAGLE-1-like
    ((1,), (3,), (1, 0), (3, 2), (3, 2, 1)),  # ranks with gaps: gathers, not slices
    ((0,), (1,), (2,), (3,)),  # depth 1
    chain_choices(4),
]


@pytest.mark.parametrize("choices", GRAPH_TREES, ids=["eagle1", "gaps", "flat", "chain"])
def test_worker_tokens_equal_brute_force_graph(choices):
    depth = max(map(len, choices))
    spec = SpeculativeConfig(depth, 4, tree_choices=choices)
    w = worker_for(spec, capture=(1, 4))
    w.capture_graphs("trace")
    bare = w.drafting.graph_step(w.state, 4, "cpu", organize=False)
    for b in (1, 3, 4, 5):
        inp = draft_input(b, 4, seed=b)
        replays = w.counters.graph_replays
        result = w.draft_forward(inp)
        assert result.layout is w.state.topology_buffers.layout  # from a replay (b <= 4) and eager alike
        got = [t.clone() for t in result]
        assert w.counters.graph_replays == replays + (1 if b <= 4 else 0)
        assert_same(got[2], brute_force(choices, inp), f"b={b} tokens")
        assert torch.equal(got[0], w.state.topology_buffers.parents[:1].expand(b, -1))
    # organize adds no graph node: the captured step == the same step returning tokens only
    from draftgraph.graphs import GraphCaptureManager

    manager = GraphCaptureManager(bare[0], bare[1], (1, 4), backend="trace", pad_values=bare[2])
    manager.capture()
    for size in (1, 4):
        assert w.state.graphs.node_count(size) == manager.node_count(size)
    manager.release()


def test_chain_shaped_tree_is_the_chain_through_the_same_buffers():
    """topk=2 with chain-shaped choices: bitwise the chain's outputs from the chain's tensors."""
    w = worker_for(SpeculativeConfig(3, 1), capture=(1, 2, 4))
    w.capture_graphs("trace")
    chain_buf = w.state.topology_buffers
    ptrs = (chain_buf.parents.data_ptr(), chain_buf.score_indices.data_ptr())
    inputs, wants = [], []
    for b in (1, 3, 4, 7):
        inp2 = draft_input(b, 2, seed=b)
        inp1 = DraftInput(inp2.topk_p[:, :1].contiguous(), inp2.topk_index[:, :1].contiguous(),
                          inp2.hidden_states)
        inputs.append(inp2)
        wants.append([t.clone() for t in w.draft_forward(inp1)])
    with w.override_worker_state(3, topk=2, tree_choices=chain_choices(3)) as st2:
        assert st2.topology_buffers is chain_buf
        for captured in (False, True):
            if captured:
                w.capture_graphs("trace")
            for inp2, want in zip(inputs, wants):
                got = w.draft_forward(inp2)
                for j in range(3):
                    assert_same(got[j], want[j], f"b={inp2.topk_index.shape[0]} graph={captured} output {j}")
    assert (chain_buf.parents.data_ptr(), chain_buf.score_indices.data_ptr()) == ptrs


TREE = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))


def test_buffers_keep_data_ptr_across_override_switch_reload():
    static = SpeculativeConfig(3, 2, tree_choices=TREE)
    w = worker_for(static, capture=(1, 2))
    w.capture_graphs("trace")
    buf = w.state.topology_buffers
    ptrs = [t.data_ptr() for t in (buf.parents, buf.score_indices, buf.verify.tree_mask)]
    inp = draft_input(2, 2, seed=3)
    before = [t.clone() for t in w.draft_forward(inp)]
    with w.override_worker_state(4, capture_bs=[1, 2], topk=1):  # a chain
        w.capture_graphs("trace")
        w.draft_forward(draft_input(2, 1, seed=1))
    with w.override_worker_state(3, 8, capture_bs=[1]):  # a dynamic tree, topk 2
        assert w.state.topology_buffers is None
    states = [w.build_runtime_state(3, capture_bs=[1, 2], backend="trace", topk=2, tree_choices=TREE),
              w.build_runtime_state(2, capture_bs=[1, 2], backend="trace", topk=1),
              w.build_runtime_state(3, 6, capture_bs=[1, 2], backend="trace", topk=2)]
    assert states[0].topology_buffers is buf  # same key, same tensors
    original = w.state
    for st_ in states + [original]:
        w.apply_runtime_state(st_)
        k = st_.spec.topk
        w.draft_forward(draft_input(2, k, seed=k))
    w.reload(RuntimeArgs(static, CudaGraphConfig(PhaseGraphConfig(bs=(1, 2, 4))),
                         max_running_requests=CAPACITY))
    assert w.state.topology_buffers is buf  # the old state still held them while the new one was built
    assert [t.data_ptr() for t in (buf.parents, buf.score_indices, buf.verify.tree_mask)] == ptrs
    after = w.draft_forward(inp)
    for j in range(3):
        assert_same(after[j], before[j], f"output {j} after reload")


@pytest.mark.slow  # the slow tier: a memory soak
def test_memory_flat_over_300_reloads_cycling_topologies():
    """Reloads chain -> static tree -> dynamic tree (eager states: the buffers are the subject;
    every tenth one with captured graphs), two windows of 150 after 39 of warm-up. Bound: 2 KB
    per reload (a released state's topology buffers left alive are tens of KB), plus a noise
    floor of 1 MB per window; released buffers are freed."""
    specs = (SpeculativeConfig(3, 1), SpeculativeConfig(3, 2, tree_choices=TREE),
             SpeculativeConfig(3, 2, 6))
    eager = [RuntimeArgs(s, max_running_requests=64) for s in specs]
    graphs = [RuntimeArgs(s, CudaGraphConfig(PhaseGraphConfig(bs=(1,))), max_running_requests=64)
              for s in specs]
    w = EagleDraftWorker(eager[0], MODEL)
    for i in range(39):  # warm-up: allocator pools, tracer caches (the first captures: ~190 MB)
        w.reload(eager[i % 3] if i < 24 else graphs[i % 3], backend="trace")

    def reload(i: int) -> None:
        if i % 10 == 9:
            w.reload(graphs[i % 3], backend="trace")
            w.draft_forward(draft_input(1, w.spec.topk, seed=i))
        else:
            w.reload(eager[i % 3])  # an eager state: nothing captured
            w.draft_forward(draft_input(2, w.spec.topk, seed=i))

    assert_no_growth(reload, warmup=0, window=150, every=15, per_cycle=2 * 1024, noise_floor=2**20,
                     unit="reload")
    assert len(w._topology_cache) <= 1  # only the active state's buffers (or none) are alive


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("choices", GRAPH_TREES, ids=["eagle1", "gaps", "flat", "chain"])
def test_cuda_graph_static_tree(choices):
    depth = max(map(len, choices))
    spec = SpeculativeConfig(depth, 4, tree_choices=choices)
    w = worker_for(spec, capture=(1, 4), model=ExactDraftModel(device="cuda"), device="cuda")
    w.capture_graphs("cuda")
    cpu_model = MODEL
    for b in (1, 3, 4, 5):
        inp = draft_input(b, 4, seed=b, device="cuda")
        result = w.draft_forward(inp)
        parents, indices, tokens = result
        assert result.layout is w.state.topology_buffers.verify  # graph replay (b <= 4) and eager
        cpu_inp = DraftInput(*(t.cpu() for t in (inp.topk_p, inp.topk_index, inp.hidden_states)))
        assert torch.equal(tokens.cpu(), brute_force(choices, cpu_inp, cpu_model))
        seq = torch.full((b,), 5, device="cuda")
        fast = build_tree(inp.topk_index[:, 0], parents, indices, tokens, seq, 4, depth,
                          spec.num_draft_tokens, layout=result.layout)
        slow = build_tree(inp.topk_index[:, 0], parents, indices, tokens, seq, 1,
                          depth, spec.num_draft_tokens)
        for name in FIELDS:
            assert torch.equal(getattr(fast, name), getattr(slow, name)), name
        if b <= 4:
            assert fast.tree_mask.data_ptr() == w.state.topology_buffers.verify.tree_mask.data_ptr()


def test_build_tree_refuses_a_layout_of_another_tree():
    """The layout is an argument now: one of the wrong size or type is named, never ignored."""
    spec = SpeculativeConfig(2, 4, tree_choices=((0,), (1,), (0, 0)))
    w = worker_for(spec)
    result = w.draft_forward(draft_input(2, 4, seed=0))
    chain5 = worker_for(SpeculativeConfig(5, 1)).state.topology_buffers.layout  # 5 nodes
    args = (torch.tensor([1, 2]), *result, torch.tensor([5, 6]), 1, 2, spec.num_draft_tokens)
    with pytest.raises(ValueError, match=r"layout has 5 nodes: top_scores_index has 3 columns"):
        build_tree(*args, layout=chain5)
    with pytest.raises(TypeError, match="layout=TopologyBuffers: must be a VerifyConstants"):
        build_tree(*args, layout=w.state.topology_buffers)


def test_draft_result_unpacks_as_sglang_s_three_tensors():
    spec = SpeculativeConfig(2, 4, tree_choices=((0,), (1,), (0, 0)))
    w = worker_for(spec)
    result = w.draft_forward(draft_input(2, 4, seed=0))
    parents, indices, tokens = result
    fields = (result.parent_list, result.top_scores_index, result.draft_tokens)
    assert all(a is b for a, b in zip((parents, indices, tokens), fields, strict=True))
    assert all(a is b for a, b in zip(result[:], fields, strict=True)) and len(result) == 3
    assert result[0] is parents and result[-1] is tokens
    assert result.layout is w.state.topology_buffers.layout
    with pytest.raises(AttributeError):
        result.layout = None  # frozen: the layout travels with the tensors it describes
