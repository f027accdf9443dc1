"""transformers as the oracle: targets of each supported family (Llama, Qwen2, Mistral, Qwen3; GQA)
and published EAGLE-1/2 and EAGLE-3 heads, tiny and random, saved to folders and loaded through
the user's path (`load_models`), served by the engine at batch > 1, chain and static tree, eager
and trace (verify and extend graphs too; compile in the slow tier): the engine's tokens equal
transformers' ``generate(do_sample=False)`` token for token. A random head accepts little; the
check is losslessness. Also what is refused at load, naming the architecture and the feature,
or the file and the key.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_support import FAMILIES, head_tensors, oracle, save_head, save_target

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models.greedy import greedy_generate
from draftgraph.runtime.models.hf_load import load_target
from draftgraph.runtime.models.hf_models import load_models

PROMPTS = ((1, 2, 3, 4, 5), (7, 8, 9), (11, 250, 3, 3, 3, 3, 9, 40, 41))
MAX_NEW = 14
MAX_LEN = 96  # one KV tier: the verify / extend graphs are one per batch size
CHAIN = SpeculativeConfig(3, 1)
TREE = SpeculativeConfig(3, 2, tree_choices=((0,), (1,), (0, 0), (1, 0), (0, 0, 0)))
SPECS = {"chain": CHAIN, "tree": TREE}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every family's target (3 layers, an EAGLE-1 head beside it) and a 4-layer Llama with an
    EAGLE-3 head (draft vocabulary 200 < 300)."""
    root = tmp_path_factory.mktemp("hf")
    out: dict[str, Path] = {}
    for family in FAMILIES:
        out[family] = save_target(root / family, family)
    out["eagle1"] = save_head(root / "eagle1", "eagle1")
    out["llama4"] = save_target(root / "llama4", "llama", layers=4, seed=3)
    out["eagle3"] = save_head(root / "eagle3", "eagle3", draft_vocab=200)
    return out


@pytest.fixture(scope="module")
def expected(folders: dict[str, Path]) -> dict[str, list[list[int]]]:
    """transformers' greedy tokens for every target folder (computed once)."""
    return {name: oracle(folders[name], PROMPTS, MAX_NEW) for name in (*FAMILIES, "llama4")}


def _serve(target, draft, spec: SpeculativeConfig, backend: str) -> list[list[int]]:
    args = RuntimeArgs(spec, CudaGraphConfig(PhaseGraphConfig(bs=(4,))), max_running_requests=4)
    phases = ("verify", "extend") if backend != "eager" else None
    engine = SpecDecodeEngine(args, target, draft, backend=backend, capture="blocking", graph_phases=phases)
    try:
        out = engine.generate([list(p) for p in PROMPTS], MAX_NEW)
        if backend != "eager":  # every step ran the captured graphs: draft, verify and extend
            stats = engine.stats()
            assert stats["eager_steps"] == 0, stats["eager_steps_by_reason"]
            assert stats["phases"]["verify"]["replays"] > 0 and stats["phases"]["extend"]["replays"] > 0
        return out
    finally:
        engine.close()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_target_alone_is_generate(folders, expected, family):
    """The target through the draftgraph attention, decoding greedily at batch 3, is generate."""
    target = load_target(folders[family], "float64", max_len=MAX_LEN)
    assert greedy_generate(target, [list(p) for p in PROMPTS], MAX_NEW) == expected[family]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("shape", list(SPECS))
def test_eagle1_engine_is_generate_eager(folders, expected, family, shape):
    target, head = load_models(folders[family], folders["eagle1"], "float64", max_len=MAX_LEN)
    assert head.cfg.fmt == "eagle1"
    assert _serve(target, head, SPECS[shape], "eager") == expected[family]


def test_eagle1_head_with_qkv_bias(folders, expected, tmp_path):
    """A head for a Qwen2 target carries q/k/v biases (and a bias-free fc): the weights say so."""
    sd = head_tensors("eagle1", layers=2)
    del sd["fc.bias"]
    for name in ("q_proj", "k_proj", "v_proj"):
        for i in range(2):
            sd[f"layers.{i}.self_attn.{name}.bias"] = torch.full((sd[f"layers.{i}.self_attn.{name}.weight"].shape[0],),
                                                                 0.05)
    folder = save_head(tmp_path / "h", "eagle1", layers=2, tensors=sd, bias=False)
    target, head = load_models(folders["qwen2"], folder, "float64", max_len=MAX_LEN)
    attn = head.layers[1].self_attn
    assert head.fc.bias is None and attn.q_proj.bias is not None and attn.o_proj.bias is None
    assert _serve(target, head, TREE, "eager") == expected["qwen2"]


# llama's chain on trace is in the fast tier through the refit / reload test below
@pytest.mark.parametrize("family, shape", [pytest.param("llama", "chain", marks=pytest.mark.slow), ("qwen3", "tree")])
def test_eagle1_engine_is_generate_trace(folders, expected, family, shape):
    """The trace backend: the draft step, the verify and the extend all replayed as graphs."""
    target, head = load_models(folders[family], folders["eagle1"], "float64", max_len=MAX_LEN)
    assert _serve(target, head, SPECS[shape], "trace") == expected[family]


@pytest.mark.parametrize("backend", ["eager", "trace"])
def test_eagle3_engine_is_generate(folders, expected, backend):
    """EAGLE-3 over the streams entering layers 2, L//2, L-3 of a 4-layer target, with a draft
    vocabulary of 200 mapped through d2t inside the step."""
    target, head = load_models(folders["llama4"], folders["eagle3"], "float64", max_len=MAX_LEN)
    assert head.cfg.fmt == "eagle3" and head.cfg.draft_vocab_size == 200
    assert target.cfg.feature_layers == (2, 2, 1) and target.hidden_size == 3 * target.cfg.dim
    assert _serve(target, head, TREE, backend) == expected["llama4"]


def test_eagle3_drafts_only_mapped_ids(folders):
    """The head's logits are over the target's vocabulary, finite exactly at the ids d2t maps to."""
    target, head = load_models(folders["llama4"], folders["eagle3"], "float64", max_len=MAX_LEN)
    d2t = head_tensors("eagle3", draft_vocab=200)["d2t"]
    mapped = torch.zeros(300, dtype=torch.bool)
    mapped[torch.arange(200) + d2t] = True
    head.allocate_cache(2)
    rows = head.row_template(3, "cpu")
    logits, _ = head(torch.tensor([1, 2, 3]), rows)
    assert logits.shape == (3, 300) and logits.dtype == torch.float32
    assert torch.equal(torch.isfinite(logits), mapped.expand(3, 300))


def test_eagle3_layers_from_config(tmp_path, folders):
    """eagle_aux_hidden_state_layer_ids name layer outputs: the streams entering id + 1."""
    head = save_head(tmp_path / "h", "eagle3", eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 3]})
    target, _ = load_models(folders["llama4"], head, "float64", max_len=MAX_LEN)
    assert target.cfg.feature_layers == (1, 2, 4)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["eagle1", "eagle3"])
def test_compile_backend_is_generate(folders, expected, fmt):
    name = "llama" if fmt == "eagle1" else "llama4"
    target, head = load_models(folders[name], folders[fmt], "float64", max_len=MAX_LEN)
    assert _serve(target, head, CHAIN, "compile") == expected[name]


# ---- refused at load --------------------------------------------------------------------------
def _edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_sliding_window_in_use_is_refused(tmp_path):
    folder = save_target(tmp_path / "m", "mistral", sliding_window=32)
    with pytest.raises(ValueError, match=r"MistralForCausalLM.*sliding_window=32"):
        load_target(folder, "float64", max_len=MAX_LEN)
    assert load_target(folder, "float64", max_len=32).cfg.max_len == 32  # a window that never cuts


@pytest.mark.parametrize("key, value, feature", [
    ("attn_logit_softcapping", 30.0, "soft-capping"),
    ("auto_map", {"AutoModelForCausalLM": "m.M"}, "remote code"),
    ("model_type", "gpt2", "not supported"),
])
def test_unimplemented_features_are_refused(folders, tmp_path, key, value, feature):
    folder = save_target(tmp_path / "m", "llama")
    _edit_config(folder, **{key: value})
    with pytest.raises(ValueError, match=feature) as err:
        load_target(folder, "float64", max_len=MAX_LEN)
    assert key in str(err.value)


def test_dynamic_rope_is_refused_under_graphs(tmp_path):
    folder = save_target(tmp_path / "m", "llama",
                         rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    target, head = load_models(folder, save_head(tmp_path / "h", "eagle1"), "float64", max_len=MAX_LEN)
    args = RuntimeArgs(CHAIN, CudaGraphConfig(PhaseGraphConfig(bs=(4,))), max_running_requests=4)
    with pytest.raises(ValueError, match=r"LlamaForCausalLM.*rope_type='dynamic'.*backend='trace'"):
        SpecDecodeEngine(args, target, head, backend="trace", capture="blocking")
    SpecDecodeEngine(args, target, head, backend="eager").close()


def test_damaged_target_names_file_and_key(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = save_target(tmp_path / "m", "llama")
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(weights))
    with pytest.raises(ValueError, match=r"model\.safetensors.*missing keys: 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_target(folder, "float64", max_len=MAX_LEN)
    weights.write_bytes(weights.read_bytes()[:1000])  # cut short
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        load_target(folder, "float64", max_len=MAX_LEN)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json: not readable JSON"):
        load_target(folder, "float64", max_len=MAX_LEN)


@pytest.mark.parametrize("edit, message", [
    (lambda sd: sd.pop("layers.0.mlp.up_proj.weight"), r"key 'layers\.0\.mlp\.up_proj\.weight' missing"),
    (lambda sd: sd.update({"layers.0.input_layernorm.weight": torch.ones(64)}),
     r"unexpected key 'layers\.0\.input_layernorm\.weight'"),
    (lambda sd: sd.update({"fc.weight": torch.zeros(64, 100)}), r"key 'fc\.weight' has input width 100"),
    (lambda sd: sd.update({"layers.0.self_attn.k_proj.weight": torch.zeros(64, 64)}),
     r"key 'layers\.0\.self_attn\.k_proj\.weight' has shape \[64, 64\]"),
])
def test_damaged_eagle1_head_names_file_and_key(folders, tmp_path, edit, message):
    sd = head_tensors("eagle1")
    edit(sd)
    head = save_head(tmp_path / "h", "eagle1", tensors=sd)
    with pytest.raises(ValueError, match=r"model\.safetensors: " + message):
        load_models(folders["llama"], head, "float64", max_len=MAX_LEN)


def test_eagle3_head_that_does_not_fit_is_refused(folders, tmp_path):
    sd = head_tensors("eagle3")
    sd["d2t"] = sd["d2t"] + 200  # ids past the target's vocabulary
    with pytest.raises(ValueError, match=r"key 'd2t' maps draft ids outside"):
        load_models(folders["llama4"], save_head(tmp_path / "a", "eagle3", tensors=sd), "float64", max_len=MAX_LEN)
    far = save_head(tmp_path / "b", "eagle3", eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 9]})
    with pytest.raises(ValueError, match=r"config\.json: EAGLE-3 layers \[2, 3, 10\].*4 layers"):
        load_models(folders["llama4"], far, "float64", max_len=MAX_LEN)


def test_refit_reload_and_adaptive_switches_stay_generate(folders, expected):
    """Mid-run on the trace backend: adaptive S switches, an in-place refit of the EAGLE-3 head's
    weights (d2t included in its state dict) and a reload to a static tree; still generate's tokens."""
    target, head = load_models(folders["llama4"], folders["eagle3"], "float64", max_len=MAX_LEN)
    graphs = CudaGraphConfig(PhaseGraphConfig(bs=(4,)))
    engine = SpecDecodeEngine(RuntimeArgs(CHAIN, graphs, max_running_requests=4), target, head, backend="trace",
                              capture="blocking", adaptive_steps=(1, 3))
    try:
        ids = [engine.add_request(list(p), MAX_NEW) for p in PROMPTS]
        refit = {k: v * 1.5 if v.is_floating_point() else v for k, v in head.state_dict().items()}
        steps = 0
        while engine.has_work():
            engine.step()
            steps += 1
            if steps == 2:
                engine.update_draft_weights(refit)
            if steps == 4:
                engine.request_reload(RuntimeArgs(TREE, graphs, max_running_requests=4))
        assert [engine.pop_result(i) for i in ids] == expected["llama4"]
        stats = engine.stats()
        assert stats["draft_weights"]["version"] == 1 and stats["reloads"]["applied"] == 1
    finally:
        engine.close()


def test_attention_refuses_what_it_does_not_implement(folders):
    """The registered function never ignores an attention keyword, and never runs without the
    engine's context (a model set to it is not usable by transformers' own generate)."""
    from draftgraph.runtime.models.hf_attention import CONTEXT_KEY, AttentionContext, draftgraph_attention

    target = load_target(folders["llama"], "float64", max_len=MAX_LEN)
    with pytest.raises(ValueError, match="called without draftgraph_context"):
        target.model(torch.tensor([[1, 2]]), use_cache=False)
    layer = target.model.base_model.layers[0].self_attn
    cache = target.new_cache(2)
    q, kv = torch.zeros(1, 4, 1, 16, dtype=torch.float64), torch.zeros(1, 2, 1, 16, dtype=torch.float64)
    zero = torch.zeros(1, 1, dtype=torch.long)
    ctx = AttentionContext(cache.k, cache.v, zero[0], zero, zero, torch.ones(1, 1, 1, dtype=torch.bool))
    out, _ = draftgraph_attention(layer, q, kv, kv, None, **{CONTEXT_KEY: ctx})
    assert out.shape == (1, 1, 4, 16)
    with pytest.raises(ValueError, match="attention keyword 's_aux' is not implemented"):
        draftgraph_attention(layer, q, kv, kv, None, s_aux=torch.zeros(4), **{CONTEXT_KEY: ctx})
    with pytest.raises(ValueError, match="attention keyword 'softcap' is not implemented"):
        draftgraph_attention(layer, q, kv, kv, None, softcap=30.0, **{CONTEXT_KEY: ctx})


def test_a_random_head_is_flagged_as_not_fitting(folders, caplog):
    """A head that accepts about nothing (random weights here; in the field a wrong format or
    wrong EAGLE-3 layers) trips the first-token alarm, counted in stats and metrics."""
    import logging

    from draftgraph.runtime.engine import AcceptanceWatch
    from draftgraph.runtime.engine.metrics import read_engine
    from draftgraph.runtime.prometheus import Samples

    target, head = load_models(folders["llama4"], folders["eagle3"], "float64", max_len=MAX_LEN)
    args = RuntimeArgs(CHAIN, CudaGraphConfig(PhaseGraphConfig(bs=(4,))), max_running_requests=4)
    engine = SpecDecodeEngine(args, target, head, backend="eager", acceptance_watch=AcceptanceWatch(window_steps=4))
    try:
        with caplog.at_level(logging.WARNING, logger="draftgraph.runtime.engine.acceptance"):
            engine.generate([list(p) for p in PROMPTS], MAX_NEW)
        watch = engine.stats()["acceptance_watch"]
        assert watch["misfit_warnings"] >= 1
        assert any("accepts about nothing" in r.getMessage() for r in caplog.records)
        samples = Samples()
        read_engine(engine, samples, {})
        family = next(f for f in samples.families() if f.name == "draftgraph_draft_misfit_warnings")
        assert family.type == "counter" and family.samples[0].value == watch["misfit_warnings"]
    finally:
        engine.close()
