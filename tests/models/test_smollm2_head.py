"""Slow tier: the EAGLE-3 head shipped for SmolLM2-135M-Instruct (runtime/models/data/smollm2_eagle3/)
is what `draftgraph train-head` makes. The folder is small, in the published layout and loads with
`load_models`; measured again on the held-out chat prompts it accepts what its recipe.json says; and
the recipe's own commands (a run, then the same command resumed with more
minutes), run again, make a head of the same acceptance within noise (the budget is
wall time: another machine trains more or fewer steps)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from draftgraph.runtime.commands.cli import main
from draftgraph.runtime.models.head_data import encode_prompts, generate_samples, register_gen_attention, shipped_split
from draftgraph.runtime.models.head_eval import accept_length
from draftgraph.runtime.models.hf_models import load_models

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

HEAD = Path(__file__).resolve().parents[2] / "runtime" / "models" / "data" / "smollm2_eagle3"
RECIPE = json.loads((HEAD / "recipe.json").read_text())
NOISE = 0.3  # acceptance length, between two runs of the same command on different machines


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """The converted model in the model cache (the product's own conversion, shared with
    tests/models/test_smollm2.py); skips when the wheel or its readers are missing."""
    pytest.importorskip("gguf", reason="the GGUF reader (make install) converts the wheel's model")
    pytest.importorskip("accelerate", reason="transformers reads a GGUF only with accelerate (make install)")
    from draftgraph.runtime.models.smollm2 import smollm2_dir

    return smollm2_dir()


def test_the_shipped_head_is_small_and_published():
    from safetensors import safe_open

    assert (HEAD / "model.safetensors").stat().st_size <= 25 * 2 ** 20
    with safe_open(str(HEAD / "model.safetensors"), framework="pt") as fh:
        assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(fh.keys())
    config = json.loads((HEAD / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 8192


def test_the_shipped_head_accepts_what_its_recipe_says(smollm2):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    _, head = load_models(smollm2, HEAD, dtype="float32", max_len=1024)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32,
                                                 attn_implementation=register_gen_attention()).eval()
    held = encode_prompts(shipped_split()[1], AutoTokenizer.from_pretrained(smollm2), head.vocab_size)
    samples = generate_samples(model, head.cfg.feature_layers, held, RECIPE["max_new"], [2], 32)
    got = accept_length(head, samples, (3, 4))
    for s in (3, 4):
        assert abs(got[s] - RECIPE["accept"][str(s)]) < 0.05, (got, RECIPE["accept"])


@pytest.mark.skipif(os.environ.get("DRAFTGRAPH_HEAD_RECIPE") != "1",
                    reason="the recipe trains for its whole budget (about 90 minutes on 2 cores, more than CI's "
                           "share): DRAFTGRAPH_HEAD_RECIPE=1 runs it")
def test_the_recipe_command_makes_a_head_of_the_same_acceptance(smollm2, tmp_path):
    root = HEAD.parents[3]  # the repository: the recipe names its prompt file from there
    for flags in RECIPE["runs"]:  # the command, then each resumed run of it
        flags = [str(root / f) if f.startswith("runtime/") else f for f in flags]
        assert main(["train-head", "--target", str(smollm2), "--out", str(tmp_path / "head"), *flags]) == 0
    got = json.loads((tmp_path / "head" / ".train" / "report.json").read_text())["accept"]
    for s in ("3", "4"):
        assert abs(got[s] - RECIPE["accept"][s]) <= NOISE, (got, RECIPE["accept"])
