"""Slow tier: the EAGLE-3 head shipped for SmolLM2-135M-Instruct (runtime/models/data/smollm2_eagle3/)
is what `draftgraph train-head` makes. The folder is small, in the published layout and loads with
`load_models`; measured again on the held-out chat prompts it accepts what its recipe.json says; and
the recipe's own commands (a run, then the same command resumed with more
minutes), run again, make a head of the same acceptance within noise (the budget is
wall time: another machine trains more or fewer steps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from smollm2_support import convert_smollm2

from draftgraph.runtime.engine.cli import main
from draftgraph.runtime.models.head_data import encode_prompts, generate_samples, register_gen_attention, shipped_split
from draftgraph.runtime.models.head_eval import accept_length
from draftgraph.runtime.models.hf_models import load_models

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

HEAD = Path(__file__).resolve().parents[2] / "runtime" / "models" / "data" / "smollm2_eagle3"
RECIPE = json.loads((HEAD / "recipe.json").read_text())
NOISE = 0.3  # acceptance length, between two runs of the same command on different machines


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    return convert_smollm2(tmp_path_factory.mktemp("smollm2"))


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


def test_the_recipe_command_makes_a_head_of_the_same_acceptance(smollm2, tmp_path):
    for flags in RECIPE["runs"]:  # the command, then each resumed run of it
        assert main(["train-head", "--target", str(smollm2), "--out", str(tmp_path / "head"), *flags]) == 0
    got = json.loads((tmp_path / "head" / ".train" / "report.json").read_text())["accept"]
    for s in ("3", "4"):
        assert abs(got[s] - RECIPE["accept"][s]) <= NOISE, (got, RECIPE["accept"])
