"""Range answers (``/api/v1/query_range``'s matrix) as the answer parser reads them, and the instant questions of
many ticks answered from them (gpuwarden.cluster.stepped.SteppedQueries): from one range query a window, an instant
query where an engine moves the times off the ticks, smaller windows where an answer is too large."""

from __future__ import annotations

import json

import pytest

from gpuwarden.cluster import promapi
from gpuwarden.cluster.promapi import AnswerParser, PrometheusError, Sample, TooManySamples
from gpuwarden.cluster.stepped import SteppedQueries


def _parsed(answer: object, chunk: int = 5) -> promapi.Answer:
    text = json.dumps(answer).encode()
    parser = AnswerParser()
    for i in range(0, len(text), chunk):
        parser.feed(text[i : i + chunk])
    return parser.close()


def _matrix(*items: object) -> dict:
    return {"status": "success", "data": {"resultType": "matrix", "result": list(items)}}


def test_a_matrix_fed_in_small_chunks_is_its_finite_points_with_their_times_in_milliseconds() -> None:
    answer = _parsed(_matrix({"metric": {"gpu": "0"}, "values": [[1795676400, "1"], [1795676460.5, "NaN"],
                                                                [1795676520.25, "+Inf"], [1795676580, "2.5"]]},
                             {"values": [[1795676400, "7"]], "metric": {"gpu": "1"}}))  # fmt: skip
    assert not answer.invalid and not answer.malformed and answer.kind == "matrix"
    assert [(ms, s.labels, s.value) for ms, s in answer.points] == [
        (1795676400000, {"gpu": "0"}, 1.0),
        (1795676580000, {"gpu": "0"}, 2.5),
        (1795676400000, {"gpu": "1"}, 7.0),
    ]


@pytest.mark.parametrize(
    "item",
    [
        {"metric": {}, "values": [[1, 2]]},  # a value that is not text
        {"metric": {}, "values": [[1, "2", "3"]]},  # a pair of three
        {"metric": {}, "values": [1, "2"]},  # not pairs
        {"metric": {}, "values": [["x", "2"]]},  # a time that is not a number
        {"metric": {}, "values": [[1, "2"]], "value": [1, "2"]},  # both
        {"metric": {}, "values": {"a": 1}},
    ],
    ids=["number-value", "triple", "flat", "text-time", "both", "object"],
)
def test_a_malformed_matrix_item_is_malformed(item: dict) -> None:
    assert _parsed(_matrix(item)).malformed


def test_points_past_the_bound_stop_the_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(promapi, "MAX_SAMPLES", 50)
    text = json.dumps(_matrix({"metric": {}, "values": [[t, "1"] for t in range(60)]})).encode()
    parser = AnswerParser()
    assert not all(parser.feed(text[i : i + 64]) for i in range(0, len(text), 64))


class FakeEngine:
    """An engine that answers ``value(promql, ms)`` at each time it is asked, instant or range, and can move its range
    answers' times (``shift_ms``) or refuse ranges of more than ``most`` steps as too many samples."""

    def __init__(self, shift_ms: int = 0, most: int = 10**9) -> None:
        self.shift_ms, self.most = shift_ms, most
        self.instant: list[tuple[str, int]] = []
        self.ranges: list[tuple[str, int, int]] = []

    @staticmethod
    def value(promql: str, ms: int) -> list[Sample]:
        return [] if ms % 180_000 == 0 else [Sample({"q": promql}, float(ms // 1000 + len(promql)))]

    def query(self, promql: str, time: float | None = None) -> list[Sample]:
        assert time is not None
        self.instant.append((promql, round(time * 1000)))
        return self.value(promql, round(time * 1000))

    def query_range(self, promql: str, start: float, end: float, step: float) -> dict[int, list[Sample]]:
        first, last, step_ms = round(start * 1000), round(end * 1000), round(step * 1000)
        self.ranges.append((promql, first, last))
        if (last - first) // step_ms + 1 > self.most:
            raise TooManySamples("too many")
        out = {}
        for ms in range(first, last + 1, step_ms):
            if self.value(promql, ms):
                out[ms + self.shift_ms] = self.value(promql, ms)
        return out


TICKS = [1795676400 + 60 * i for i in range(100)]


def test_each_question_is_one_range_query_a_window_and_its_answers_are_the_instant_ones() -> None:
    engine = FakeEngine()
    stepped = SteppedQueries(engine, TICKS, 60, window=40)  # type: ignore[arg-type]
    for at in TICKS:
        for q in ("a", "bb"):
            assert stepped.query(q, at) == FakeEngine.value(q, at * 1000), at
    assert engine.instant == []
    assert [(q, (f - TICKS[0] * 1000) // 60000) for q, f, _ in engine.ranges] == [
        ("a", 0), ("bb", 0), ("a", 40), ("bb", 40), ("a", 80), ("bb", 80)]  # fmt: skip
    assert stepped.requests == 6


def test_a_time_that_is_not_a_tick_is_asked_as_an_instant_query() -> None:
    engine = FakeEngine()
    stepped = SteppedQueries(engine, TICKS, 60)  # type: ignore[arg-type]
    assert stepped.query("a", TICKS[3] + 30) == FakeEngine.value("a", (TICKS[3] + 30) * 1000)
    assert engine.instant == [("a", (TICKS[3] + 30) * 1000)] and engine.ranges == []


def test_an_engine_that_moves_the_times_off_the_ticks_is_asked_instant_queries_from_then_on() -> None:
    engine = FakeEngine(shift_ms=20_000)  # a query front end aligning the range to its own step
    stepped = SteppedQueries(engine, TICKS, 60)  # type: ignore[arg-type]
    got = [stepped.query("a", at) for at in TICKS]
    assert got == [FakeEngine.value("a", at * 1000) for at in TICKS]
    assert len(engine.ranges) == 1 and len(engine.instant) == len(TICKS)


def test_a_window_too_large_for_the_bound_is_halved_until_it_fits() -> None:
    engine = FakeEngine(most=30)
    stepped = SteppedQueries(engine, TICKS, 60, window=100)  # type: ignore[arg-type]
    assert [stepped.query("a", at) for at in TICKS] == [FakeEngine.value("a", at * 1000) for at in TICKS]
    assert stepped.window == 25 and engine.instant == []
    steps = [(last - first) // 60000 + 1 for _, first, last in engine.ranges]
    assert steps[:3] == [100, 50, 25] and all(n <= 25 for n in steps[3:])


def test_a_single_tick_too_large_is_the_error() -> None:
    stepped = SteppedQueries(FakeEngine(most=0), TICKS, 60, window=4)  # type: ignore[arg-type]
    with pytest.raises(PrometheusError, match="too many"):
        stepped.query("a", TICKS[0])


def test_ticks_that_are_not_the_step_apart_are_refused() -> None:
    with pytest.raises(ValueError, match="not 60 s apart"):
        SteppedQueries(FakeEngine(), [*TICKS[:3], TICKS[3] + 1], 60)  # type: ignore[arg-type]
