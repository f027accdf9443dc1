"""runtime_args_from_sglang against SGLang 0.5.23's own resolution, context and worker sizing.

Expected values come from SGLang: ``resolution_result`` on a resolved ServerArgs, the published
runtime context, SGLang's ``_rebuild_topk1_chain_buffers`` (capacity) and
``get_batch_sizes_to_capture`` (capture sizes). The plain-object tests need no SGLang.
"""

from __future__ import annotations

import enum
import types

import pytest
from sglang_support import import_sglang, published, resolved_server_args, write_tiny_model

from draftgraph.graphs import capture_batch_sizes
from draftgraph.runtime.config import SpeculativeConfig, chain_capacity
from draftgraph.runtime.sglang.config import runtime_args_from_sglang, sglang_chain_capacity
from draftgraph.runtime.validation import ConfigTypeError

CASES = {
    "max_bs_only": dict(cuda_graph_config={"decode": {"max_bs": 32}}),
    "explicit_bs": dict(cuda_graph_config={"decode": {"bs": [1, 2, 8]}}),
    "backend_disabled": dict(cuda_graph_config={"decode": {"max_bs": 16, "backend": "disabled"}}),
    "requests_above_max_bs": dict(cuda_graph_config={"decode": {"max_bs": 32}}, max_running_requests=48),
    "requests_below_max_bs": dict(cuda_graph_config={"decode": {"max_bs": 32}}, max_running_requests=8),
    "disable_cuda_graph_flag": dict(disable_cuda_graph=True),
}


@pytest.fixture(scope="module")
def sg():
    return import_sglang("sglang.srt.server_args", "sglang.srt.arg_groups.overrides",
                         "sglang.srt.speculative.base_spec_worker",
                         "sglang.srt.model_executor.runner.base_cuda_graph_runner")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny_llama"))


def sglang_capacity(sg, server_args) -> int:
    """Rows SGLang's own _rebuild_topk1_chain_buffers allocates (needs the published context)."""

    class Worker(sg.base_spec_worker.EagleDraftWorkerBase):  # concrete: the two abstract methods
        def draft(self):
            pass

        def draft_extend(self):
            pass

    w = Worker.__new__(Worker)
    w.topk, w.speculative_num_steps, w.speculative_num_draft_tokens = 1, 3, 4
    w.server_args, w.device = server_args, "cpu"
    w._rebuild_topk1_chain_buffers()
    return w._topk1_parents_prealloc.shape[0]


def sglang_capture_sizes(sg, server_args, decode, pool_size) -> list[int]:
    """SGLang's decode capture sizes for a request pool of ``pool_size`` ([] when decode is off)."""
    if decode.backend == "disabled":
        return []  # SGLang builds no decode graph runner at all
    runner = types.SimpleNamespace(req_to_token_pool=types.SimpleNamespace(size=pool_size),
                                   server_args=server_args)
    return sg.base_cuda_graph_runner.get_batch_sizes_to_capture(runner)[0]


@pytest.mark.parametrize("case", list(CASES))
def test_resolved_server_args_and_context_match_sglang(sg, model_dir, case):
    sa = resolved_server_args(model_dir, **CASES[case])
    resolved = sg.overrides.resolution_result
    decode = resolved(sa, "cuda_graph_config").decode
    requests = resolved(sa, "max_running_requests")
    args = runtime_args_from_sglang(sa)
    assert args.speculative == SpeculativeConfig(3, 1, 4)
    assert args.decode.max_bs == decode.max_bs
    assert args.decode.bs == tuple(decode.bs)
    assert args.decode.disabled == (decode.backend == "disabled")
    assert args.max_running_requests == requests
    with published(sa) as rc:
        assert rc.get_exec().graph.cuda_graph_config.decode.max_bs == decode.max_bs
        assert runtime_args_from_sglang() == args  # no argument: the published context
        capacity = sglang_capacity(sg, sa)
        assert chain_capacity(args) == capacity == sglang_chain_capacity()
        # SGLang's pool holds max_running_requests requests; its runner clamps the sizes to it
        expected = sglang_capture_sizes(sg, sa, decode, requests)
    assert capture_batch_sizes(args.decode, limit=args.max_running_requests) == expected


def test_unresolved_server_args_reads_the_dict_form(sg, model_dir):
    # the reported case: the raw attribute is still the CLI dict, which used to give max_bs=None
    sa = resolved_server_args(model_dir, resolve=False, cuda_graph_config={"decode": {"max_bs": 32}},
                              max_running_requests=48)
    assert sa.cuda_graph_config == {"decode": {"max_bs": 32}}
    args = runtime_args_from_sglang(sa)
    assert args.decode.max_bs == 32 and args.decode.bs is None and not args.decode.disabled
    assert chain_capacity(args) == 48


def test_published_context_overrides_are_followed(sg, model_dir):
    sa = resolved_server_args(model_dir, cuda_graph_config={"decode": {"max_bs": 16}})
    other = resolved_server_args(model_dir, steps=2, cuda_graph_config={"decode": {"max_bs": 16}})
    with published(sa) as rc:
        rc.get_context().override("draftgraph.test", speculative_num_steps=5, speculative_num_draft_tokens=6)
        assert rc.get_spec().speculative_num_steps == 5
        assert runtime_args_from_sglang().speculative == SpeculativeConfig(5, 1, 6)
        assert runtime_args_from_sglang(sa).speculative == SpeculativeConfig(5, 1, 6)  # sa is published
        assert runtime_args_from_sglang(other).speculative == SpeculativeConfig(2, 1, 3)  # not published


# ---- plain objects (no SGLang needed) -------------------------------------------------------------
def ns(**kw):
    base = dict(speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    return types.SimpleNamespace(**{**base, **kw})


class Backend(enum.Enum):
    FULL = "full"
    DISABLED = "disabled"


@pytest.mark.parametrize("cfg,max_bs,bs,disabled", [
    ({"decode": {"max_bs": 32}}, 32, None, False),
    ({"decode": {"max_bs": 8, "backend": "disabled"}}, 8, None, True),
    ({"decode": {"bs": [1, 2, 4], "backend": "breakable"}, "prefill": {"max_bs": 4096}}, 4, (1, 2, 4), False),
    ({"decode": None}, None, None, False),
    (types.SimpleNamespace(decode=types.SimpleNamespace(backend="full", max_bs=4, bs=[1, 2, 4])), 4, (1, 2, 4), False),
    (types.SimpleNamespace(decode=types.SimpleNamespace(backend=Backend.DISABLED, max_bs=4, bs=None)), 4, None, True),
    (types.SimpleNamespace(decode=types.SimpleNamespace(max_bs=24, bs=None)), 24, None, False),
])
def test_cuda_graph_config_forms(cfg, max_bs, bs, disabled):
    decode = runtime_args_from_sglang(ns(cuda_graph_config=cfg)).decode
    assert (decode.max_bs, decode.bs, decode.disabled) == (max_bs, bs, disabled)
    if disabled:
        assert capture_batch_sizes(decode) == []


def test_flat_layout_and_disable_flag():
    a = runtime_args_from_sglang(ns(cuda_graph_max_bs=16, cuda_graph_bs=None, max_running_requests=4))
    assert a.decode.max_bs == 16 and chain_capacity(a) == 16
    b = runtime_args_from_sglang(ns(disable_cuda_graph=True))
    assert b.decode.disabled and b.decode.max_bs is None
    c = runtime_args_from_sglang(ns(cuda_graph_config={"decode": {"max_bs": 8}}, disable_cuda_graph=True))
    assert c.decode.disabled and c.decode.max_bs == 8
    assert runtime_args_from_sglang(ns()).cuda_graph_config is None


@pytest.mark.parametrize("kw,match", [
    (dict(cuda_graph_config=32), r"cuda_graph_config=32 \(int\)"),
    (dict(cuda_graph_config=[1, 2]), r"cuda_graph_config=\[1, 2\]"),
    (dict(cuda_graph_config={"decode": 5}), r"cuda_graph_config.decode=5"),
    (dict(cuda_graph_config={"decode": {"backend": "none"}}), r"decode.backend='none'"),
    (dict(cuda_graph_config={"decode": {"bs": "1,2"}}), r"decode.bs='1,2'"),
    (dict(cuda_graph_config={"decode": {"disabled": "yes"}}), r"decode.disabled='yes'"),
    (dict(disable_cuda_graph="yes"), r"disable_cuda_graph='yes'"),
    (dict(speculative_num_steps=None), r"speculative_num_steps=None"),
    (dict(speculative_eagle_topk=None), r"speculative_eagle_topk=None"),
])
def test_uninterpretable_values_are_config_type_errors(kw, match):
    with pytest.raises(ConfigTypeError, match=match):
        runtime_args_from_sglang(ns(**kw))


def test_no_argument_without_a_published_context():
    import sys

    rc = sys.modules.get("sglang.srt.runtime_context")
    if rc is not None:
        rc.reset_context()
    with pytest.raises(ValueError, match="no SGLang runtime context is published"):
        runtime_args_from_sglang()
