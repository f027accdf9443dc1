"""A streamed answer costs the same per token however long it grows (issue 50): the stepping
thread hands a stream only its new tokens, and the text cursor decodes only the tokens since
its last clean point. Work is counted (ids decoded, tokens copied), never timed."""

from __future__ import annotations

import asyncio
import random

import pytest

from draftgraph.runtime.serve.bridge import EngineBridge
from draftgraph.runtime.serve.text import TextCursor


class CountingBytes:
    """A byte tokenizer (UTF-8, a partial character shown as U+FFFD) that counts decoded ids."""

    def __init__(self) -> None:
        self.decoded = 0

    def decode(self, ids, skip_special_tokens=True):
        self.decoded += len(ids)
        return bytes(ids).decode("utf-8", errors="replace")


def _stream(tokenizer, ids: list[int], stop=(), step: int = 1) -> str:
    cursor, out, tokens = TextCursor(tokenizer, stop), "", []
    for end in range(step, len(ids) + step, step):
        tokens.extend(ids[len(tokens):end])  # one list, grown in place (as a Stream's)
        out += cursor.advance(tokens, end >= len(ids))
        if cursor.stopped:
            break
    return out


@pytest.mark.parametrize("stop", [(), ("zz",)])
def test_ids_decoded_per_streamed_token_do_not_grow_with_the_length(stop):
    per_token = {}
    for length in (100, 1000, 4000):
        tok = CountingBytes()
        text = "".join(random.Random(length).choice("ab é€") for _ in range(length))
        ids = list(text.encode())
        assert _stream(tok, ids, stop) == text
        per_token[length] = tok.decoded / len(ids)
    assert per_token[4000] <= 8.0, per_token  # a whole decode per token would be ~2000 here
    assert per_token[4000] <= per_token[1000] * 1.2, per_token  # flat: four times longer, no dearer


def _reader_cut(text: str, stop: tuple[str, ...]) -> str:
    """The oracle: a reader given one character at a time cuts before the first stop string
    to end (the longest of those ending at the same place)."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stop if text[:end].endswith(s)]
        if ending:
            return text[:end - max(map(len, ending))]
    return text


@pytest.mark.parametrize("seed", range(12))
def test_the_incremental_text_is_the_whole_decode_cut_at_the_first_stop(seed):
    rng = random.Random(seed)
    text = "".join(rng.choice(["a", "b", "é", "€", "𝄞", " ", "ab"]) for _ in range(rng.randint(1, 80)))
    stop = tuple(rng.choice(["ab", "b é", "€€", "a", "𝄞a", "zzz"]) for _ in range(rng.randint(0, 3)))
    ids = list(text.encode())
    for step in (1, 2, 3, 7, len(ids)):
        assert _stream(CountingBytes(), ids, stop, step) == _reader_cut(text, stop), (step, stop)


class OneTokenASteps:
    """An engine stand-in: each step adds one token to every live request; counts the tokens
    its `result` hands out (what the stepping thread copies)."""

    max_slots = 4

    def __init__(self) -> None:
        self.out: dict[int, list[int]] = {}
        self.limit: dict[int, int] = {}
        self.copied = 0
        self.running: list[int] = []

    def add_request(self, ids, max_tokens, sampling=None) -> int:
        rid = len(self.limit)
        self.out[rid], self.limit[rid] = [], max_tokens
        self.running.append(rid)
        return rid

    def has_work(self) -> bool:
        return bool(self.running)

    def step(self) -> list[int]:
        ended = []
        for rid in list(self.running):
            self.out[rid].append(65)
            if len(self.out[rid]) == self.limit[rid]:
                self.running.remove(rid)
                ended.append(rid)
        return ended

    def result(self, rid: int, start: int = 0) -> list[int]:
        new = self.out[rid][start:]
        self.copied += len(new)
        return new

    def pop_result(self, rid: int) -> list[int]:
        return self.out.pop(rid)

    def abort_request(self, rid: int) -> bool:
        return False


def test_the_stepping_thread_copies_each_token_once():
    engine = OneTokenASteps()
    bridge = EngineBridge(engine, max_waiting=4).start()
    length = 600

    async def run() -> list[int]:
        stream = bridge.submit([1, 2, 3], length)
        while not stream.done:
            await stream.changed(1.0)
        return stream.tokens

    try:
        tokens = asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        assert bridge.stop(10.0)
    assert tokens == [65] * length
    assert engine.copied < length, engine.copied  # the whole list each step: ~length**2 / 2


def test_the_engines_result_hands_out_the_tokens_from_start_and_refuses_a_bad_start():
    from draftgraph.runtime.engine.request_table import RequestTable
    from draftgraph.runtime.engine.stats import EngineStats

    table = RequestTable(2, 100, 64, 4, EngineStats())
    rid = table.add([1, 2], 8)
    table.begin_step()
    req = next(table.admissions())
    req.emit([5, 6, 7], None)
    table.admitted(req)
    assert table.result(rid) == [5, 6, 7] and table.result(rid, 2) == [7] and table.result(rid, 3) == []
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match="start="):
            table.result(rid, bad)
