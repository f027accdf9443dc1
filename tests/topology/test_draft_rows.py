"""Named draft rows: a published EAGLE head (`HFEagleHead`, over a tiny random transformers
Llama target) takes slot, position and base as int64 tensors (not float columns); the worker
drafts a chain, a dynamic tree and a static tree over them, eager and replayed, and its answers
equal those of the same head behind the old one-float-row packing (a tensor-form model, whose
row ops the SGLang differential tests pin)."""

from __future__ import annotations

import pytest
import torch
from draft_support import assert_same

from draftgraph.runtime.config import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.draft_io import DraftInput
from draftgraph.runtime.models.eagle_heads import Eagle1Head
from draftgraph.runtime.models.hf_eagle import DraftRows, HFEagleHead
from draftgraph.runtime.models.hf_target import NORMED, HFTarget
from draftgraph.runtime.topology.draft_rows import RowLayout, leaves, map_rows, row_count
from draftgraph.runtime.worker.eagle import EagleDraftWorker

V, D, HEADS, A, SLOTS, MAX_LEN = 64, 32, 2, 4, 9, 64
HD = D // HEADS
ANC = (A, 1, 2, HEADS, HD)  # ancestors per row: [A, layers, K/V, kv heads, head_dim]
ANC_SIZE = A * 2 * HEADS * HD
SIZES = (1, 2, 4)
TREE = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
SPECS = {"chain": SpeculativeConfig(3, 1), "dynamic_tree": SpeculativeConfig(3, 2, 5),
         "static_tree": SpeculativeConfig(3, 2, tree_choices=TREE)}


def make_head(seed: int = 0) -> HFEagleHead:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=D, intermediate_size=64, num_hidden_layers=1, num_attention_heads=HEADS,
                         num_key_value_heads=HEADS, vocab_size=V, max_position_embeddings=MAX_LEN,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    target = HFTarget(LlamaForCausalLM(config), MAX_LEN, feature_layers=(NORMED,))
    head = Eagle1Head(config, target, max_ancestors=A)
    cache = head.allocate_cache(SLOTS)
    gen = torch.Generator().manual_seed(seed + 7)
    for t in (*cache.k, *cache.v):  # a prefix the rows attend to
        t.copy_(torch.randn(t.shape, generator=gen))
    return head.eval()


HEAD = make_head()


class PackedHead(torch.nn.Module):
    """HEAD behind one float row [feature | slot | position | base | ancestors K,V] (its old
    interface): the reference for the named rows, through the worker's tensor form."""

    def __init__(self, head: HFEagleHead) -> None:
        super().__init__()
        self.head = head
        self.hidden_size = D + 3 + ANC_SIZE

    def forward(self, ids: torch.Tensor, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, out = self.head(ids, unpack(packed))
        return logits, pack(out)


def pack(rows: DraftRows) -> torch.Tensor:
    meta = torch.stack([rows.slot, rows.position, rows.base], dim=1).to(torch.float32)
    return torch.cat([rows.feature, meta, rows.ancestors.flatten(1)], dim=1)


def unpack(packed: torch.Tensor) -> DraftRows:
    return DraftRows(packed[:, :D], packed[:, D].long(), packed[:, D + 1].long(), packed[:, D + 2].long(),
                     packed[:, D + 3:].reshape(-1, *ANC))


def args_for(spec: SpeculativeConfig) -> RuntimeArgs:
    return RuntimeArgs(spec, CudaGraphConfig(PhaseGraphConfig(bs=SIZES)), max_running_requests=8)


def draft_input(b: int, k: int, seed: int) -> DraftInput:
    gen = torch.Generator().manual_seed(seed)
    p, idx = torch.softmax(torch.randn(b, V, generator=gen), -1).topk(k, dim=-1)
    slots = torch.randint(1, SLOTS, (b,), generator=gen)
    lens = torch.randint(1, MAX_LEN - 8, (b,), generator=gen)
    rows = HEAD.initial_state(torch.randn(b, D, generator=gen), slots, lens)
    return DraftInput(p, idx, rows)


@pytest.fixture(scope="module", params=list(SPECS))
def workers(request):
    spec = SPECS[request.param]
    named = EagleDraftWorker(args_for(spec), HEAD)
    named.capture_graphs("trace")
    return named, EagleDraftWorker(args_for(spec), PackedHead(HEAD))


@pytest.mark.parametrize("b", [1, 3, 4, 6])  # exact, padded, exact, above the largest graph (eager)
def test_named_rows_equal_packed_rows_eager_and_replayed(workers, b):
    named, packed = workers
    inp = draft_input(b, named.spec.topk, seed=b)
    ref = packed.draft_forward(DraftInput(inp.topk_p, inp.topk_index, pack(inp.hidden_states)))
    eager = named.drafting.step(named.state, inp.topk_p, inp.topk_index, inp.hidden_states, count=False)
    got = named.draft_forward(inp)
    assert (got.replayed_at is not None) == (b <= max(SIZES))
    for j in range(3):
        assert_same(eager[j], ref[j], f"eager output {j}")
        assert_same(got[j], ref[j], f"served output {j}")


def test_head_rows_are_integer_tensors():
    rows = draft_input(3, 1, seed=0).hidden_states
    assert isinstance(rows, DraftRows)
    for name in ("slot", "position", "base"):
        assert getattr(rows, name).dtype is torch.int64 and getattr(rows, name).shape == (3,)
    assert rows.feature.dtype is torch.float32 and rows.ancestors.shape == (3, *ANC)
    _, out = HEAD(torch.tensor([5, 6, 7]), rows)
    assert isinstance(out, DraftRows)
    assert out.position.dtype is torch.int64 and torch.equal(out.position, rows.position + 1)
    assert torch.equal(out.slot, rows.slot) and torch.equal(out.base, rows.base)


def test_worker_static_inputs_hold_the_integers_as_int64():
    w = EagleDraftWorker(args_for(SPECS["chain"]), HEAD)
    w.capture_graphs("trace")
    static = w.state.graphs.static_inputs
    assert list(static) == ["topk_p", "topk_index", "hidden_states_feature", "hidden_states_slot",
                            "hidden_states_position", "hidden_states_base", "hidden_states_ancestors"]
    for name in ("slot", "position", "base"):
        t = static[f"hidden_states_{name}"]
        assert t.dtype is torch.int64 and t.shape == (max(SIZES),)
    assert static["hidden_states_ancestors"].shape == (max(SIZES), *ANC)
    assert w.drafting.hidden_size is None
    # the memory estimate per row sums the leaves: feature and ancestors float32, three int64
    assert w.drafting.row_layout.row_bytes() == D * 4 + 3 * 8 + ANC_SIZE * 4


def _with(rows: DraftRows, **fields) -> DraftRows:
    return rows._replace(**fields)


@pytest.mark.parametrize("change,error,match", [
    (lambda r: _with(r, slot=r.slot.float()), TypeError, r"hidden_states\.slot has dtype torch\.float32"),
    (lambda r: _with(r, position=r.position.int()), TypeError, r"hidden_states\.position has dtype torch\.int32"),
    (lambda r: _with(r, feature=r.feature.double()), TypeError, r"hidden_states\.feature has dtype torch\.float64"),
    (lambda r: _with(r, ancestors=r.ancestors[:, :-1]), ValueError, r"hidden_states\.ancestors=\(2, 3, 1, 2, 2, 16\)"),
    (lambda r: _with(r, base=r.base[:1]), ValueError, r"hidden_states\.base=\(1,\)"),
    (lambda r: _with(r, slot=r.slot.tolist()), ValueError, r"hidden_states\.slot=list"),
    (lambda r: _with(r, position=r.position.to("meta")), ValueError, r"hidden_states\.position is on meta"),
    (lambda r: pack(r), ValueError, rf"hidden_states=\(2, {D + 3 + ANC_SIZE}\): must be a tuple of 5 tensors"),
    (lambda r: tuple(r)[:4], ValueError, r"must be a tuple of 5 tensors"),
    (lambda r: None, ValueError, r"hidden_states=NoneType"),
])
def test_a_wrong_leaf_is_named(change, error, match):
    w = EagleDraftWorker(args_for(SPECS["dynamic_tree"]), HEAD)
    inp = draft_input(2, 2, seed=1)
    with pytest.raises(error, match=match):
        w.draft_forward(DraftInput(inp.topk_p, inp.topk_index, change(inp.hidden_states)))


def test_a_plain_tuple_is_rebuilt_as_the_models_rows():
    w = EagleDraftWorker(args_for(SPECS["chain"]), HEAD)
    inp = draft_input(2, 1, seed=2)
    want = w.draft_forward(inp)
    got = w.draft_forward(DraftInput(inp.topk_p, inp.topk_index, tuple(inp.hidden_states)))
    for j in range(3):
        assert_same(got[j], want[j], f"output {j}")


def test_row_ops_on_both_forms():
    t = torch.arange(12.0).view(6, 2)
    rows = DraftRows(t, torch.arange(6), torch.arange(6) + 10, torch.zeros(6, dtype=torch.long),
                     torch.zeros(6, 1, 2, 1))
    assert map_rows(lambda x: x[[0, 0]], t).tolist() == [[0.0, 1.0], [0.0, 1.0]]
    picked = map_rows(lambda x: x[[5, 1]], rows)
    assert isinstance(picked, DraftRows) and picked.position.tolist() == [15, 11]
    assert row_count(picked) == 2 and row_count(t) == 6
    assert leaves(t) == (t,) and len(leaves(rows)) == 5
    assert RowLayout.tensor(32, torch.float16).row_bytes() == 64
    with pytest.raises(TypeError, match=r"row_template\(\)\.slot=int"):
        RowLayout.from_template(rows._replace(slot=3))
