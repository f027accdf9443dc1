"""Sampling through the server with the real `openai` client: a seeded request gives the same
text every time, and that text is the plain sampled run's (`sampled_generate` of the same target
with the same seed, cut after EOS as the server stops there), not the server's own output;
``n`` gives n choices (seeds seed, seed + 1, ...); left-out fields take the model's
generation_config.json; unsupported fields are a 400 naming them."""

from __future__ import annotations

import json
import math

import openai
import pytest
from serve_support import MODEL, ServerProcess

from draftgraph.runtime import SamplingParams
from draftgraph.runtime.serve.sampling_fields import RequestSampling, generation_defaults, parse_sampling

pytestmark = pytest.mark.usefixtures("trained_models")


def sampled_text(text: str, max_tokens: int, params: SamplingParams) -> str:
    """The oracle: the plain sampled continuation of ``text`` (no speculation), cut after EOS."""
    from draftgraph.runtime.models import default_models, default_tokenizer, sampled_generate
    from draftgraph.runtime.models.tokenizer import EOS_ID

    tok = default_tokenizer()
    target, _ = default_models(seed=0, draft="eagle")
    out = sampled_generate(target, [tok.encode(text)], max_tokens, params)[0]
    return tok.decode(out[:out.index(EOS_ID) + 1] if EOS_ID in out else out)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    srv = ServerProcess("--backend", "eager", "--max-running", "8", "--max-tokens-limit", "64",
                        log_dir=str(tmp_path_factory.mktemp("serve_sampling")))
    try:
        srv.wait_serving()
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        rc = srv.stop()
    assert rc == 0, f"the server exited {rc} on SIGTERM:\n{srv.log()}"


def test_a_seeded_request_is_the_plain_sampled_run_every_time(client):
    want = sampled_text("Once upon a time", 40, SamplingParams(0.8, seed=7))
    got = [client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=40, temperature=0.8,
                                     seed=7).choices[0].text for _ in range(2)]
    assert got == [want, want]
    other = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=40, temperature=0.8,
                                      seed=8).choices[0].text
    assert other == sampled_text("Once upon a time", 40, SamplingParams(0.8, seed=8)) and other != want


def test_filters_and_chat_are_the_plain_sampled_run(client):
    params = SamplingParams(1.0, top_p=0.9, top_k=20, min_p=0.05, seed=3)
    r = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=32, temperature=1.0,
                                  top_p=0.9, seed=3, extra_body={"top_k": 20, "min_p": 0.05})
    assert r.choices[0].text == sampled_text("The quick brown fox", 32, params)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi!"}],
                                          max_tokens=24, temperature=0.8, seed=11)
    assert chat.choices[0].message.content == sampled_text("user: Hi!\nassistant:", 24, SamplingParams(0.8, seed=11))


def test_n_gives_n_choices_with_consecutive_seeds(client):
    r = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=24, temperature=1.0, seed=20, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [sampled_text("Hello there", 24, SamplingParams(1.0, seed=s))
                                           for s in (20, 21, 22)]
    assert r.usage.completion_tokens == 3 * 24 or any(len(c.text.encode()) < 24 for c in r.choices)


@pytest.mark.parametrize("field,value", [("logit_bias", {"5": 1}), ("response_format", {"type": "json_object"}),
                                         ("frequency_penalty", 0.5), ("logprobs", 9), ("temperature", 3)])
def test_unsupported_or_bad_fields_are_400_naming_them(client, field, value):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", max_tokens=4, extra_body={field: value})
    assert info.value.body["param"] == field


def _oracle_logprobs(text: str, output: str, temperature: float) -> list[list[float]]:
    """log_softmax(logits / T) at every output position, from the target's own forward here."""
    import torch

    from draftgraph.runtime.models import default_models, default_tokenizer

    tok = default_tokenizer()
    target, _ = default_models(seed=0, draft="eagle")
    p, o = tok.encode(text), tok.encode(output)
    seq = torch.tensor([p + o[:-1]])
    pos = torch.arange(seq.shape[1])[None]
    mask = torch.ones(seq.shape[1], seq.shape[1], dtype=torch.bool).tril()[None]
    with torch.no_grad():
        logits, _ = target(seq, pos, pos, torch.tensor([1]), mask, target.new_cache(2))
    return torch.log_softmax(logits[0, len(p) - 1:].double() / temperature, -1).tolist()


def test_logprobs_are_the_targets_after_temperature(client):
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0.8,
                                  seed=7, logprobs=2)
    choice = r.choices[0]
    assert choice.text == sampled_text("Once upon a time", 16, SamplingParams(0.8, seed=7))
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text and len(lp.token_logprobs) == 16
    oracle = _oracle_logprobs("Once upon a time", choice.text, 0.8)
    from draftgraph.runtime.models import default_tokenizer

    ids = default_tokenizer().encode(choice.text)
    for i, (value, top) in enumerate(zip(lp.token_logprobs, lp.top_logprobs)):
        assert value == pytest.approx(oracle[i][ids[i]], abs=1e-9)
        assert len(top) == 2 and max(top.values()) == pytest.approx(max(oracle[i]), abs=1e-9)
        assert max(top.values()) >= value - 1e-12
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-9
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi!"}],
                                          max_tokens=8, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == 8 and all(len(c.top_logprobs) == 3 for c in content)
    # greedy: the emitted token is the most likely one
    assert all(c.logprob == pytest.approx(c.top_logprobs[0].logprob) for c in content)


def test_streamed_logprobs_are_the_targets_chunk_by_chunk(client):
    """stream=true with logprobs: each chunk carries its new tokens' log-probabilities (the
    tokens left behind no text come with the finish); together they are the target's own,
    token for token, with offsets into the whole text."""
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16,
                                            temperature=0.8, seed=7, logprobs=2, stream=True))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == sampled_text("Once upon a time", 16, SamplingParams(0.8, seed=7))
    values, tokens, offsets = [], [], []
    for c in chunks:
        lp = c.choices[0].logprobs if c.choices else None
        if lp is not None:
            values, tokens, offsets = values + lp.token_logprobs, tokens + lp.tokens, offsets + lp.text_offset
            assert all(len(top) == 2 for top in lp.top_logprobs)
    assert "".join(tokens) == text and len(values) == 16
    assert offsets == [len("".join(tokens[:i])) for i in range(len(tokens))]
    oracle = _oracle_logprobs("Once upon a time", text, 0.8)
    from draftgraph.runtime.models import default_tokenizer

    ids = default_tokenizer().encode(text)
    assert all(v == pytest.approx(oracle[i][ids[i]], abs=1e-9) for i, v in enumerate(values))
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi!"}],
                                          max_tokens=8, logprobs=True, top_logprobs=3, stream=True)
    content = [e for c in chat if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(content) == 8 and all(len(e.top_logprobs) == 3 for e in content)
    # greedy: the emitted token is the most likely one
    assert all(e.logprob == pytest.approx(e.top_logprobs[0].logprob) for e in content)


def test_left_out_fields_take_the_generation_config(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6,
                                                                 "top_p": 0.95, "top_k": 50}))
    defaults = generation_defaults(str(tmp_path))
    assert defaults == {"temperature": 0.6, "top_p": 0.95, "top_k": 50}
    params = parse_sampling({"top_p": 0.5, "seed": 4}).params(defaults)
    assert params == [SamplingParams(0.6, top_p=0.5, top_k=50, seed=4)]
    assert RequestSampling().params({}) == [None]  # no config, no field: greedy
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.6}))
    assert RequestSampling().params(generation_defaults(str(tmp_path))) == [None]
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": -1}))
    assert generation_defaults(str(tmp_path)) == {}
