"""The embedded target as a transformers checkpoint, served with the trained embedded EAGLE head:
real acceptance (accepted tree nodes, so the K/V commit moves them) through the transformers
target path. Expected tokens: transformers' ``generate`` on the saved checkpoint, loaded apart."""

from __future__ import annotations

import pytest
from engine_support import models, prompts
from hf_support import oracle

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models.hf_convert import save_transformers
from draftgraph.runtime.models.hf_load import load_target

MAX_NEW = 24
TREE = SpeculativeConfig(3, 2, tree_choices=((0,), (1,), (0, 0), (1, 0), (0, 0, 0)))


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory):
    """(the checkpoint folder, generate's tokens for 6 held-out prompts)."""
    target, _ = models()
    folder = save_transformers(target, tmp_path_factory.mktemp("embedded") / "llama")
    picked = [list(p) for p in prompts()[:6]]
    return folder, picked, oracle(folder, picked, MAX_NEW)


@pytest.mark.parametrize("spec, backend", [(SpeculativeConfig(3, 1), "eager"), (TREE, "eager"), (TREE, "trace")])
def test_embedded_head_drafts_for_the_converted_target(converted, spec, backend):
    folder, picked, want = converted
    target = load_target(folder, "float64", max_len=models()[0].cfg.max_len)
    _, head = models()
    args = RuntimeArgs(spec, CudaGraphConfig(PhaseGraphConfig(bs=(4,))), max_running_requests=4)
    phases = ("verify", "extend") if backend != "eager" else None
    engine = SpecDecodeEngine(args, target, head, backend=backend, capture="blocking", graph_phases=phases)
    try:
        assert engine.generate(picked, MAX_NEW) == want
        stats = engine.stats()
        assert stats["accept_length_mean"] > 2.0  # the trained head drafts well: real accepted paths committed
    finally:
        engine.close()
