"""`draftgraph train-head` on a tiny transformers target: the head it writes is in the published
EAGLE-3 layout, loads with `load_models` (``--draft DIR``), accepts more than a random head on
held-out prompts, resumes from its checkpoint and keeps to its time budget; the training unroll
is the engine's draft geometry (its first two passes equal `HFEagleHead.train_forward`)."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
import torch
from hf_support import save_target

from draftgraph.runtime.commands.cli import main
from draftgraph.runtime.models.head_data import read_prompts
from draftgraph.runtime.models.head_eval import accept_length
from draftgraph.runtime.models.head_recipe import HeadTrainConfig, cached_samples
from draftgraph.runtime.models.hf_models import load_models

pytestmark = pytest.mark.filterwarnings("ignore")

WORDS = ["sun", "tree", "river", "stone", "bird", "cloud", "road", "lamp", "book", "ship", "rain", "wind"]


def _prompts(path: Path, n: int = 60) -> Path:
    lines = []
    for i in range(n):
        text = f"Tell me about the {WORDS[i % 12]} and the {WORDS[(i * 5 + 1) % 12]}, number {i}."
        item = {"prompt": text} if i % 2 else {"messages": [{"role": "user", "content": text}]}
        lines.append(json.dumps(item))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny Llama target and a head trained for it by the command (about 25 s of budget)."""
    root = tmp_path_factory.mktemp("train_head")
    target = save_target(root / "target", "llama", layers=4)
    prompts = _prompts(root / "prompts.jsonl")
    argv = ["train-head", "--target", str(target), "--out", str(root / "head"), "--minutes", "0.4",
            "--prompts", str(prompts), "--draft-vocab", "128", "--steps-unroll", "4", "--max-new", "40",
            "--held-out", "6", "--max-steps", "120", "--threads", "1"]
    threads = torch.get_num_threads()
    t0 = time.monotonic()
    try:
        rc = main(argv)
    finally:
        torch.set_num_threads(threads)
    return root, argv, rc, time.monotonic() - t0


def _held_out(head_dir: Path):
    return cached_samples(head_dir)[1]


def test_the_head_is_published_eagle3_and_loads_with_draft_dir(trained):
    from safetensors import safe_open

    root, _, rc, _ = trained
    assert rc == 0
    with safe_open(str(root / "head" / "model.safetensors"), framework="pt") as fh:
        keys = set(fh.keys())
        assert fh.get_tensor("fc.weight").dtype == torch.bfloat16
        assert fh.get_tensor("d2t").dtype == torch.int64 and fh.get_tensor("t2d").dtype == torch.bool
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
            "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight"} <= keys
    config = json.loads((root / "head" / "config.json").read_text())
    assert config["draft_vocab_size"] == 128 and config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 1, 0]  # streams 2, 4 // 2, 4 - 3
    target, head = load_models(root / "target", root / "head", dtype="float32", max_len=256)
    assert head.cfg.fmt == "eagle3" and target.cfg.feature_layers == (2, 2, 1)


def test_the_trained_head_accepts_more_than_a_random_one(trained, capsys):
    root, *_ = trained
    _, head = load_models(root / "target", root / "head", dtype="float32", max_len=256)
    held = _held_out(root / "head")
    rand = copy.deepcopy(head)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in rand.named_parameters():
            if name.startswith(("fc.", "midlayer.")) and p.dim() == 2:
                p.normal_(0, 0.05)
    got, base = accept_length(head, held, (1, 3)), accept_length(rand, held, (1, 3))
    assert got[3] > base[3] + 0.05, (got, base)
    assert got[1] > base[1], (got, base)


def test_the_command_prints_the_acceptance_and_resumes(trained, capsys):
    root, argv, _, _ = trained
    data = root / "head" / ".train" / "data.pt"
    before = json.loads((root / "head" / ".train" / "report.json").read_text())["state"]
    stamp = data.stat().st_mtime_ns
    threads = torch.get_num_threads()
    try:
        assert main(argv[:6] + ["0.15"] + argv[7:-3] + ["150", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "resumed" in out and "held-out acceptance length (greedy chain): S=3:" in out
    after = json.loads((root / "head" / ".train" / "report.json").read_text())["state"]
    assert data.stat().st_mtime_ns == stamp  # the answers were reused, not generated again
    assert after["steps"] > before["steps"] and after["seconds"] > before["seconds"]


def test_the_time_budget_holds(trained):
    *_, elapsed = trained
    assert elapsed < 0.4 * 60 + 30  # the budget, plus loading and the held-out measurement


def test_the_unroll_is_the_engines_draft_geometry(trained):
    root, *_ = trained
    _, head = load_models(root / "target", root / "head", dtype="float32", max_len=256)
    s = _held_out(root / "head")[0]
    feats, toks = s.features[None, :, :head.cfg.feature_width].float(), s.tokens[None, 1:]
    with torch.no_grad():
        l0, l1 = head.train_forward(feats, toks)
        outs = head.unroll(feats, toks, 3)
    ids = torch.arange(head.cfg.draft_vocab_size) + head.d2t
    for logits, out in ((l0, outs[0]), (l1, outs[1])):
        mine = head.lm_head(head.norm(out)).float()
        torch.testing.assert_close(logits[..., ids], mine, rtol=1e-4, atol=1e-4)
    assert outs[2].shape[1] == feats.shape[1] - 2


def test_the_simulated_chain_is_the_engines(trained):
    """head_eval's walk against the real engine (eager, chain S=3) on the held-out answers: the
    same tokens, and the same acceptance up to the last step (the engine may accept drafts past
    the answer's end, which the walk does not count)."""
    from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
    from draftgraph.runtime.engine.engine import SpecDecodeEngine

    root, *_ = trained
    target, head = load_models(root / "target", root / "head", dtype="float32", max_len=256)
    args = RuntimeArgs(SpeculativeConfig(3, 1, 4), CudaGraphConfig(PhaseGraphConfig(max_bs=2)),
                       max_running_requests=2)
    for s in _held_out(root / "head")[:3]:
        want = s.tokens[s.answer:].tolist()
        engine = SpecDecodeEngine(args, target, head, backend="eager")
        try:
            out = engine.generate([s.tokens[:s.answer].tolist()], len(want))[0]
            eng = engine.stats()["accept_length_mean"]
        finally:
            engine.close()
        sim = accept_length(head, [s], (3,))[3]
        assert out[:len(want)] == want
        assert sim - 1e-9 <= eng <= sim * (1 + 3 / (len(want) - 1)) + 1e-9, (sim, eng)


def test_bad_prompt_files_and_settings_name_the_field(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "hi"}\n{"messages": []}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: must be"):
        read_prompts(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match=r"p.jsonl:1: not JSON"):
        read_prompts(bad)
    with pytest.raises(ValueError, match=r"steps_unroll=0"):
        HeadTrainConfig(steps_unroll=0)
    with pytest.raises(ValueError, match=r"eval_steps="):
        HeadTrainConfig(steps_unroll=2, eval_steps=(3,))
