"""One way in for a user's checkpoints: ``draftgraph generate|simulate --target DIR --draft DIR``
(its own tokenizer when the folder has one) and `load_models` in Python; a wrong or damaged folder
exits 2 with a message naming the file and the key. Expected tokens come from transformers'
``generate``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hf_support import VOCAB, head_tensors, oracle, save_head, save_target

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.commands import cli
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import load_models

MAX_NEW = 10


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A Qwen3 target with a word-level tokenizer ("w0" .. "w299"), a Llama target without one,
    and an EAGLE-1 head."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("hfcli")
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    target = save_target(root / "qwen3", "qwen3")
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0").save_pretrained(target)
    return {"qwen3": target, "llama": save_target(root / "llama", "llama"),
            "head": save_head(root / "head", "eagle1")}


def test_generate_text_with_the_checkpoints_tokenizer(folders, capsys):
    want = oracle(folders["qwen3"], [[1, 5, 9]], MAX_NEW)[0]
    code = cli.main(["generate", "w1 w5 w9", "--target", str(folders["qwen3"]), "--draft", str(folders["head"]),
                     "--backend", "eager", "--max-new-tokens", str(MAX_NEW)])
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[0] == "w1 w5 w9" + " ".join(f"w{i}" for i in want)
    assert "identical to greedy: True" in out


def test_generate_ids_without_a_tokenizer(folders, capsys):
    want = oracle(folders["llama"], [[4, 8, 15]], MAX_NEW)[0]
    assert cli.main(["generate", "4 8 15", "--target", str(folders["llama"]), "--draft", str(folders["head"]),
                     "--backend", "eager", "--max-new-tokens", str(MAX_NEW)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "4 8 15 " + " ".join(map(str, want))


def test_simulate_serves_the_checkpoints_losslessly(folders, capsys):
    code = cli.main(["simulate", "--target", str(folders["qwen3"]), "--draft", str(folders["head"]), "--backend",
                     "eager", "--requests", "3", "--adaptive", "", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["lossless"] is True and report["greedy_compared"] == 3


def test_python_way_in_and_stats(folders):
    target, head = load_models(folders["llama"], folders["head"], "float64", max_len=64)
    args = RuntimeArgs(SpeculativeConfig(2, 1), CudaGraphConfig(PhaseGraphConfig(bs=(2,))), max_running_requests=2)
    engine = SpecDecodeEngine(args, target, head, backend="eager")
    try:
        assert engine.generate([[4, 8, 15], [16, 23, 42]], MAX_NEW) == oracle(folders["llama"], [[4, 8, 15],
                                                                                           [16, 23, 42]], MAX_NEW)
        models = engine.stats()["models"]
        assert models["target"]["architecture"] == "LlamaForCausalLM" and models["target"]["max_len"] == 64
        assert models["draft"]["fmt"] == "eagle1" and models["draft"]["feature_layers"] == (-1,)
        served = engine.drafter.head  # the engine's copy of the head shares the target's tensors
        assert served is not head and served.embed_w.data_ptr() == target.embed.weight.data_ptr()
        assert served.lm_w.data_ptr() == target.model.get_output_embeddings().weight.data_ptr()
    finally:
        engine.close()


def test_damaged_folders_exit_2_naming_file_and_key(folders, tmp_path, capsys):
    sd = head_tensors("eagle1")
    del sd["layers.0.self_attn.o_proj.weight"]
    broken = save_head(tmp_path / "broken", "eagle1", tensors=sd)
    base = ["generate", "w1", "--target", str(folders["qwen3"]), "--backend", "eager"]
    assert cli.main([*base, "--draft", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors" in err and "'layers.0.self_attn.o_proj.weight' missing" in err
    assert cli.main([*base, "--draft", str(tmp_path)]) == 2  # no config.json there
    assert f"{tmp_path / 'config.json'}: missing" in capsys.readouterr().err
    assert cli.main([*base]) == 2  # --target without a head's folder
    assert "needs --draft DIR" in capsys.readouterr().err
    # a head's folder for the toy target (the tests' DRAFTGRAPH_TARGET) is refused by name
    assert cli.main(["generate", "x", "--draft", str(folders["head"])]) == 2
    assert "with the toy target it must be one of" in capsys.readouterr().err
