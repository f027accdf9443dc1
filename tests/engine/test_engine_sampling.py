"""Sampling is lossless, exactly: a seeded speculative run emits the seeded plain run's tokens.

The plain reference is `sampled_generate` (one token per forward, no speculation, the token at
position t drawn with uniforms keyed by (seed, t)); the engine must equal it token for token for
chains, dynamic and static trees, eager and trace (compile in the slow tier), the verify / extend
graphs, speculation off (S = 0), a batch mixing greedy and sampled requests with every filter (temperature 0.5 / 1.0,
top-p 0.9, top-k 20, min-p 0.05), an adaptive switch and reloads mid-run. Seeds: the same seed
gives the same tokens alone and in a batch of 8; different seeds differ.
"""

from __future__ import annotations

import functools
import logging

import pytest
from engine_support import MAX_NEW, engine_args, models, prompts, reference

from draftgraph.runtime import SamplingParams, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import sampled_generate
from draftgraph.runtime.sampling import GREEDY

_args = functools.partial(engine_args, running=6)  # graphs up to 4, six request slots
N_PROMPTS = 8
# one parameter set per prompt: both temperatures, every filter, and greedy rows in the batch
MIXED = (SamplingParams(1.0, top_p=0.9, seed=11), SamplingParams(0.5, top_k=20, seed=12),
         SamplingParams(1.0, min_p=0.05, seed=13), GREEDY,
         SamplingParams(0.5, top_p=0.9, top_k=20, min_p=0.05, seed=14), SamplingParams(1.0, seed=15),
         GREEDY, SamplingParams(0.5, top_p=0.9, seed=16))
CHAIN = SpeculativeConfig(3, 1)
DYNAMIC = SpeculativeConfig(3, 2, 6)
STATIC = SpeculativeConfig(3, 2, tree_choices=((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))


def _prompts() -> list[list[int]]:
    return [list(p) for p in prompts()[:N_PROMPTS]]


@functools.lru_cache(maxsize=4)
def _plain(params: tuple[SamplingParams, ...]) -> list[list[int]]:
    target, _ = models("eagle")
    return sampled_generate(target, _prompts(), MAX_NEW, list(params))


def _engine(spec: SpeculativeConfig, backend: str, draft: str = "eagle", **kw) -> SpecDecodeEngine:
    target, head = models(draft)
    return SpecDecodeEngine(_args(spec), target, head, backend=backend, capture="blocking", **kw)


CASES = [
    (CHAIN, "eager"), (CHAIN, "trace"), (DYNAMIC, "eager"), (DYNAMIC, "trace"), (STATIC, "eager"),
    (STATIC, "trace"),
    pytest.param(SpeculativeConfig(5, 1), "eager", marks=pytest.mark.slow),
    pytest.param(SpeculativeConfig(3, 4, 10), "trace", marks=pytest.mark.slow),
    # the compile backend (inductor, a compile per graph size: minutes on a CPU) in the slow tier
    pytest.param(CHAIN, "compile", marks=pytest.mark.slow),
    pytest.param(STATIC, "compile", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("spec,backend", CASES, ids=lambda v: str(getattr(v, "key", v)))
def test_seeded_speculative_run_is_the_seeded_plain_run(spec, backend):
    engine = _engine(spec, backend)
    assert engine.generate(_prompts(), MAX_NEW, list(MIXED)) == _plain(MIXED)
    st = engine.stats()
    assert st["accept_length_mean"] > 1.0  # drafts were accepted: the walk moved past the root
    if backend != "eager":
        assert st["graph_replays"] > 0


def test_greedy_rows_of_a_mixed_batch_are_greedy_decoding():
    """The plain reference's greedy rows are greedy decoding (the reference is not circular)."""
    plain = _plain(MIXED)
    greedy = reference()
    assert [plain[i] for i, p in enumerate(MIXED) if p.greedy] == [greedy[i] for i, p in enumerate(MIXED) if p.greedy]
    # and the sampled ones are not: at T = 1 they leave the argmax (not necessarily every one of them:
    # a toy trained on another machine can be sure enough of a whole answer to repeat it at T = 1)
    assert any(plain[i] != greedy[i] for i, p in enumerate(MIXED) if p.temperature == 1.0)


def test_phase_graphs_draw_the_plain_tokens():
    """Verify and extend captured (trace): the verify graph draws from per-slot parameters; a
    mixed batch and an all-greedy batch run the same graphs (no new key, no recapture)."""
    engine = _engine(DYNAMIC, "trace", graph_phases=("verify", "extend"))
    assert engine.generate(_prompts(), MAX_NEW, list(MIXED)) == _plain(MIXED)
    st = engine.stats()
    assert st["phases"]["verify"]["replays"] > 0
    captured = (st["capture_s"], st["states"])
    assert engine.generate(_prompts(), MAX_NEW) == reference()[:N_PROMPTS]
    st = engine.stats()
    assert (st["capture_s"], st["states"]) == captured


def test_multi_layer_draft_draws_the_plain_tokens():
    engine = _engine(CHAIN, "eager", draft="multi_layer")
    assert engine.generate(_prompts(), MAX_NEW, list(MIXED)) == _plain(MIXED)


def test_speculation_off_is_the_plain_run():
    """S = 0 for every batch size (``schedule="1:0"``): the engine's plain target step."""
    engine = _engine(CHAIN, "eager", schedule="1:0")
    assert engine.generate(_prompts(), MAX_NEW, list(MIXED)) == _plain(MIXED)
    st = engine.stats()
    assert st["draft_tokens"] == 0 and st["verify_steps"] > 0  # plain target steps only


def test_schedule_switching_between_speculation_and_plain_steps():
    engine = _engine(CHAIN, "trace", schedule="1:3,4:0")
    assert engine.generate(_prompts(), MAX_NEW, list(MIXED)) == _plain(MIXED)


def test_adaptive_switch_and_reloads_mid_run():
    target, head = models("eagle")
    engine = SpecDecodeEngine(_args(SpeculativeConfig(4, 1)), target, head, backend="trace",
                              adaptive_steps=(1, 2, 3), capture="blocking")
    ids = [engine.add_request(p, MAX_NEW, s) for p, s in zip(_prompts(), MIXED)]
    for _ in range(5):
        engine.step()
    engine.request_reload(_args(SpeculativeConfig(3, 2, 5)))
    for _ in range(4):
        engine.step()
    engine.request_reload(_args(SpeculativeConfig(2, 2, tree_choices=((0,), (1,), (0, 0)))))
    while engine.has_work():
        engine.step()
    assert [engine.result(i) for i in ids] == _plain(MIXED)
    assert engine.stats()["reloads"]["applied"] == 2


# ---- seeds -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["eager", "trace", pytest.param("compile", marks=pytest.mark.slow)])
def test_same_seed_same_tokens_alone_and_in_a_batch_of_8(backend):
    engine = _engine(DYNAMIC, backend)
    mine = SamplingParams(0.8, top_p=0.95, seed=7)
    alone = engine.generate(_prompts()[:1], MAX_NEW, mine)[0]
    others = [SamplingParams(1.0, seed=100 + i) for i in range(7)]
    batch = engine.generate(_prompts()[1:] + _prompts()[:1], MAX_NEW, others + [mine])
    assert batch[-1] == alone
    assert engine.generate(_prompts()[:1], MAX_NEW, mine)[0] == alone
    assert alone == sampled_generate(models("eagle")[0], _prompts()[:1], MAX_NEW, mine)[0]


def test_choices_of_one_prompt_share_its_prefill():
    """n samples of one prompt admitted together (the server's ``n``): one target prefill, the
    others copy its K/V; each is still its own seed's plain sampled run (a wrong copy would
    leave them attending to another slot's cache), and the greedy twin greedy decoding."""
    engine = _engine(CHAIN, "eager")
    prompt = _prompts()[0]
    params = [SamplingParams(1.0, seed=s) for s in (21, 22, 23)] + [GREEDY]
    out = engine.generate([prompt] * 4, MAX_NEW, params)
    assert out == sampled_generate(models("eagle")[0], [prompt] * 4, MAX_NEW, params)
    assert out[3] == reference()[0]
    assert engine.stats()["prefills_shared"] == 3
    engine.generate(_prompts()[:4], MAX_NEW, params)  # four prompts: nothing to share
    assert engine.stats()["prefills_shared"] == 3


def test_different_seeds_differ():
    engine = _engine(CHAIN, "eager")
    outs = [engine.generate(_prompts()[:1], MAX_NEW, SamplingParams(1.0, seed=s))[0] for s in (1, 2, 3)]
    assert len({tuple(o) for o in outs}) == 3


def test_a_request_without_a_seed_gets_one_logged_and_replayable(caplog):
    params = [SamplingParams(1.0)] * 3
    runs = []
    for _ in range(2):
        engine = _engine(CHAIN, "eager", sampling_seed=5)
        with caplog.at_level(logging.INFO, logger="draftgraph.runtime.engine.seeding"):
            runs.append(engine.generate(_prompts()[:3], MAX_NEW, params))
    assert runs[0] == runs[1]
    logged = [r.getMessage() for r in caplog.records if "sampling seed" in r.getMessage()]
    seeds = [int(m.split("seed ")[1].split()[0]) for m in logged]
    assert len(seeds) == 6 and seeds[:3] == seeds[3:] and len(set(seeds[:3])) == 3
    given = [p.with_seed(s) for p, s in zip(params, seeds)]
    replay = sampled_generate(models("eagle")[0], _prompts()[:3], MAX_NEW, given)
    assert runs[0] == replay


def test_sampling_argument_is_checked():
    engine = _engine(CHAIN, "eager")
    with pytest.raises(TypeError, match="sampling="):
        engine.add_request([1, 2, 3], 4, {"temperature": 0.5})
    with pytest.raises(ValueError, match="2 entries for 3 prompts"):
        engine.generate(_prompts()[:3], 4, [GREEDY, GREEDY])
