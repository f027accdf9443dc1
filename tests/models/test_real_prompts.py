"""Real prompts everywhere (issue 47 item 4): JSONL prompt files, the model's own chat template in
`generate` and `simulate`, requests that stop at the model's eos, and the named targets
(``--target toy|smollm2|DIR``). Expected tokens come from transformers' ``generate`` on the ids the
template gives by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hf_support import VOCAB, oracle, save_head, save_target

from draftgraph.runtime.commands import cli
from draftgraph.runtime.engine.loading import resolve_models
from draftgraph.runtime.models import default_models, greedy_generate
from draftgraph.runtime.models.prompt_file import ChatPrompt, demo_prompts, encode_prompt, read_prompt_file

MAX_NEW = 12
# a chat template in the word vocabulary: "w1 <content> w2" per message, "w3" opens the answer
TEMPLATE = ("{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}"
            "{% if add_generation_prompt %}w3{% endif %}")


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A Llama target whose word-level tokenizer has a chat template and eos "w7", and a head."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("chat")
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    target = save_target(root / "llama", "llama")
    tok = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0", eos_token="w7")
    tok.chat_template = TEMPLATE
    tok.save_pretrained(target)
    return {"target": target, "head": save_head(root / "head", "eagle1"), "tok": tok}


def test_prompt_file_reads_both_shapes_and_names_bad_lines(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "hi"}\n\n{"messages": [{"role": "system", "content": "s"}, '
                    '{"role": "user", "content": "u"}]}\n')
    assert read_prompt_file(good) == [ChatPrompt((("user", "hi"),)), ChatPrompt((("system", "s"), ("user", "u")))]
    for body, frag in (('{"prompt": ""}', "p.jsonl:1"), ("not json", "p.jsonl:1: not JSON"),
                       ('{"messages": [{"role": "robot", "content": "x"}]}', "messages[0]"), ("", "no prompts")):
        good.write_text(body + "\n")
        with pytest.raises(ValueError, match=frag.replace("[", r"\[").replace("]", r"\]")):
            read_prompt_file(good)


def test_demo_prompts_ship_and_repeat():
    items = demo_prompts()
    assert len(items) >= 24 and all(p.text for p in items)
    assert demo_prompts(len(items) + 2)[-1] == items[1]


def test_chat_template_and_raw_encoding(chat_folder):
    tok = chat_folder["tok"]
    assert encode_prompt(tok, "w5 w9") == [1, 5, 9, 2, 3]
    assert encode_prompt(tok, "w5 w9", raw=True) == [5, 9]
    assert encode_prompt(tok, ChatPrompt((("system", "w4"), ("user", "w5")))) == [1, 4, 2, 1, 5, 2, 3]


def _cut(ids: list[int], eos: int) -> list[int]:
    return ids[:ids.index(eos) + 1] if eos in ids else ids


def test_generate_applies_the_template_and_stops_at_eos(chat_folder, capsys):
    want = _cut(oracle(chat_folder["target"], [[1, 5, 9, 2, 3]], MAX_NEW)[0], 7)
    code = cli.main(["generate", "w5 w9", "--target", str(chat_folder["target"]), "--draft",
                     str(chat_folder["head"]), "--backend", "eager", "--max-new-tokens", str(MAX_NEW)])
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[0] == " ".join(f"w{i}" for i in want if i != 7)
    assert "identical to greedy: True" in out and "(chat template)" in out


def test_generate_raw_continues_the_text(chat_folder, capsys):
    want = _cut(oracle(chat_folder["target"], [[5, 9]], MAX_NEW)[0], 7)
    assert cli.main(["generate", "w5 w9", "--raw", "--target", str(chat_folder["target"]), "--draft",
                     str(chat_folder["head"]), "--backend", "eager", "--max-new-tokens", str(MAX_NEW)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "w5 w9" + " ".join(f"w{i}" for i in want if i != 7)


def test_simulate_serves_a_prompt_file_through_the_template(chat_folder, tmp_path, capsys):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"w{10 + i} w{20 + i}"}) + "\n" for i in range(3)))
    code = cli.main(["simulate", "--target", str(chat_folder["target"]), "--draft", str(chat_folder["head"]),
                     "--backend", "eager", "--prompts", str(prompts), "--requests", "3", "--adaptive", "",
                     "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["lossless"] is True and report["greedy_compared"] == 3
    assert [a["prompt"] for a in report["answers"]] == ["w10 w20", "w11 w21"]
    first = _cut(oracle(chat_folder["target"], [[1, 10, 20, 2, 3]], 96)[0], 7)
    answer = report["answers"][0]["answer"]
    assert answer == " ".join(f"w{i}" for i in first if i != 7)[:len(answer)] and answer


def test_greedy_generate_stops_each_row_at_eos():
    target, _ = default_models()
    prompts = [[3, 4, 5], [10, 11]]
    plain = greedy_generate(target, prompts, 12)
    eos = plain[0][3]
    got = greedy_generate(target, prompts, 12, eos_id=eos)
    assert got == [_cut(p, eos) for p in plain]


def test_named_targets_and_bad_pairings(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTGRAPH_TARGET", "toy")
    toy = resolve_models(None, None)
    assert (toy.target, toy.draft, toy.dtype, toy.name) == (None, "eagle", "float64", "draftgraph-toy")
    assert resolve_models("toy", "multi_layer").draft == "multi_layer"
    with pytest.raises(ValueError, match="--draft='/x'"):
        resolve_models("toy", "/x")
    with pytest.raises(ValueError, match="needs --draft DIR"):
        resolve_models(str(tmp_path), None)
    with pytest.raises(ValueError, match="--draft='eagle'"):
        resolve_models("smollm2", "eagle")
    mine = resolve_models(str(tmp_path / "ckpt"), str(tmp_path / "head"), "float32")
    assert (mine.target, mine.dtype, mine.name) == (str(tmp_path / "ckpt"), "float32", "ckpt")


def test_info_names_the_model_without_loading_it(monkeypatch, capsys):
    monkeypatch.delenv("DRAFTGRAPH_TARGET")
    assert cli.main(["info"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "SmolLM2-135M-Instruct"
    assert cli.main(["info", "--target", "toy"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "draftgraph-toy"
