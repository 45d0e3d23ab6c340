"""The answer parser of ``top`` and ``report`` (gpuwarden.cluster.promapi.AnswerParser): its prefixed events are
ijson.parse's, and an answer nested past MAX_DEPTH is refused in bounded memory, however it is cut into chunks."""

from __future__ import annotations

import io
import json
import tracemalloc

import ijson  # type: ignore[import-untyped]
import pytest

from gpuwarden.cluster.promapi import MAX_DEPTH, AnswerParser, _Prefixes

ANSWERS = [
    {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "gpu_up", "gpu": "0", "a.b": "dotted key"}, "value": [1795676409.7, "1"]},
        {"metric": {}, "value": [1795676409.7, "NaN"]},
    ]}},
    {"status": "success", "data": {"resultType": "scalar", "result": [1795676409.7, "3"]}},
    {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"},
    {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"x": "1"}, "values": [[1, "2"]]}]},
     "warnings": ["a", {"nested": [[], {}, [[{"k": None, "t": True, "f": 1.5e300}]]]}]},
    [1, [2, [3, {"": {"": []}}]]],
    "a string",
]  # fmt: skip


@pytest.mark.parametrize("answer", ANSWERS, ids=range(len(ANSWERS)))
def test_prefixed_events_are_ijsons(answer: object) -> None:
    text = json.dumps(answer).encode()
    expected = list(ijson.parse(io.BytesIO(text), use_float=True))
    ours = _Prefixes()
    for event, value in ijson.basic_parse(io.BytesIO(text), use_float=True):
        ours.add(event, value)
    assert ours.events == expected and not ours.too_deep


def test_the_parser_reads_a_vector_fed_in_small_chunks() -> None:
    text = json.dumps(ANSWERS[0]).encode()
    parser = AnswerParser()
    for i in range(0, len(text), 7):
        assert parser.feed(text[i : i + 7])
    answer = parser.close()
    assert not answer.invalid and not answer.malformed and answer.status == "success"
    assert [(s.labels, s.value) for s in answer.samples] == [
        ({"__name__": "gpu_up", "gpu": "0", "a.b": "dotted key"}, 1.0)
    ]


@pytest.mark.parametrize("chunk", [1 << 20, 4096], ids=["whole", "4KiB"])
def test_an_answer_nested_100000_deep_is_invalid_in_bounded_memory(chunk: int) -> None:
    """Before the bound, ijson's path of every event was built whatever the depth: one chunk of this answer made
    paths of tens of GB and the process was killed."""
    text = b"[" * 100_000 + b"]" * 100_000
    tracemalloc.start()
    try:
        parser = AnswerParser()
        for i in range(0, len(text), chunk):
            parser.feed(text[i : i + chunk])
        answer = parser.close()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert answer.invalid
    assert peak < 8 * 2**20, peak


def test_nesting_up_to_the_bound_is_read() -> None:
    depth = MAX_DEPTH - 1
    ours = _Prefixes()
    text = b"[" * depth + b"]" * depth
    for event, value in ijson.basic_parse(io.BytesIO(text)):
        ours.add(event, value)
    assert not ours.too_deep and ours.events == list(ijson.parse(io.BytesIO(text)))
    deep = _Prefixes()
    for _ in range(MAX_DEPTH):
        deep.add("start_array", None)
    assert not deep.too_deep
    deep.add("start_map", None)
    assert deep.too_deep
