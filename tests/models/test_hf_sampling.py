"""Sampling on a transformers target (tiny, random, float64, loaded through the user's path):
the seeded speculative run equals the seeded plain run (`sampled_generate`) token for token,
chain and static tree, eager and trace with the verify / extend graphs, in a batch mixing
greedy and sampled requests."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_support import save_head, save_target

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SamplingParams, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models.greedy import sampled_generate
from draftgraph.runtime.models.hf_models import load_models

PROMPTS = ((1, 2, 3, 4, 5), (7, 8, 9), (11, 250, 3, 3, 3, 3, 9, 40, 41), (5, 6))
MAX_NEW = 14
MAX_LEN = 96
PARAMS = (SamplingParams(1.0, top_p=0.9, seed=3), SamplingParams(0.0), SamplingParams(0.5, top_k=20, seed=4),
          SamplingParams(0.5, min_p=0.05, seed=5))
SPECS = {"chain": SpeculativeConfig(3, 1),
         "tree": SpeculativeConfig(3, 2, tree_choices=((0,), (1,), (0, 0), (1, 0), (0, 0, 0)))}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_sampling")
    return {"target": save_target(root / "llama", "llama", layers=4, seed=3),
            "head": save_head(root / "eagle3", "eagle3", draft_vocab=200)}


@pytest.mark.parametrize("backend", ["eager", "trace"])
@pytest.mark.parametrize("shape", list(SPECS))
def test_transformers_target_sampled_speculative_is_plain(folders, shape, backend):
    target, head = load_models(folders["target"], folders["head"], "float64", max_len=MAX_LEN)
    plain = sampled_generate(target, [list(p) for p in PROMPTS], MAX_NEW, list(PARAMS))
    args = RuntimeArgs(SPECS[shape], CudaGraphConfig(PhaseGraphConfig(bs=(4,))), max_running_requests=4)
    phases = ("verify", "extend") if backend != "eager" else None
    engine = SpecDecodeEngine(args, target, head, backend=backend, capture="blocking", graph_phases=phases)
    try:
        assert engine.generate([list(p) for p in PROMPTS], MAX_NEW, list(PARAMS)) == plain
        if backend != "eager":
            assert engine.stats()["phases"]["verify"]["replays"] > 0
    finally:
        engine.close()
