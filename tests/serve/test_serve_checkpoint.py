"""``draftgraph serve --target DIR --draft DIR``: a user's checkpoint folders (written here with
``save_pretrained``: a Llama target with its own tokenizer, an EAGLE-3 head), served over HTTP
through the real ``openai`` client, each answer equal to transformers' greedy ``generate``."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from hf_support import VOCAB, oracle, save_head, save_target
from serve_support import ServerProcess

MAX_NEW = 12
PROMPTS = [[1, 5, 9], [42, 7, 7, 300 % VOCAB], [3]]


def _words(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """The server over a Llama target whose folder holds a word-level tokenizer ("w0" .. "w<V-1>")
    and an EAGLE-3 head reading its layers 0, 1 and 2; the oracle's tokens for every prompt."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("serve-ckpt")
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    target: Path = save_target(root / "llama", "llama")
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0").save_pretrained(target)
    head = save_head(root / "eagle3", "eagle3")
    want = oracle(target, PROMPTS, MAX_NEW)
    srv = ServerProcess("--target", str(target), "--draft", str(head), "--backend", "trace", "--max-running", "2",
                        "--max-tokens-limit", "64", "--drain-s", "10", log_dir=str(root))
    try:
        srv.wait_serving()
        yield srv, want
    finally:
        rc = srv.stop()
    assert rc == 0, f"the server exited {rc} on SIGTERM:\n{srv.log()}"


def test_the_folders_are_served_and_each_answer_is_greedy(served):
    srv, want = served
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    (model,) = [m.id for m in client.models.list().data]
    for prompt, ids in zip(PROMPTS, want):
        done = client.completions.create(model=model, prompt=_words(prompt), max_tokens=MAX_NEW, temperature=0)
        assert done.choices[0].text.split() == _words(ids).split(), prompt
        assert done.usage.completion_tokens == MAX_NEW
    health = srv.health()
    assert health["graphs_ready"] is True


def test_a_streamed_answer_from_the_folders_is_greedy_too(served):
    srv, want = served
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    parts = [c.choices[0].text for c in client.completions.create(model=model, prompt=_words(PROMPTS[1]),
                                                                   max_tokens=MAX_NEW, stream=True)]
    assert len(parts) > 1  # streamed, not one chunk
    assert "".join(parts).split() == _words(want[1]).split()
