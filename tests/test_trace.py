"""The trace format: real traces parse, round-trip, and malformed ones fail with one clear line."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from conftest import H100_SCENARIOS, trace

from gpuwarden.trace import TraceError, TraceHeader, TraceWriter, read_trace, read_trace_losses


@pytest.mark.parametrize("scenario", H100_SCENARIOS)
def test_real_h100_traces_parse_with_their_scenario(scenario: str) -> None:
    header, polls = read_trace(trace(f"h100-{scenario}"))
    assert header.metadata["scenario"] == scenario
    assert header.node.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert header.node.driver_version == "580.159.04"
    assert len(polls) >= 25
    # polls are in time order, one reading per GPU each
    times = [p.timestamp for p in polls]
    assert times == sorted(times)
    assert all(len(p.gpus) == 1 and p.host is not None for p in polls)


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    header, polls = read_trace(trace("h100-compute_bound"))
    out = tmp_path / "copy.jsonl"
    with TraceWriter(out, header) as w:
        for p in polls:
            w.write(p)
    header2, polls2 = read_trace(out)
    assert header2 == header
    assert [p.model_dump() for p in polls2] == [p.model_dump() for p in polls]


def _write(tmp_path: Path, lines: list[object]) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def _header() -> dict:
    header, _ = read_trace(trace("h100-idle"))
    return json.loads(header.model_dump_json())


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "empty trace"),
        (["{not json"], "line 1: invalid JSON"),
        ([{"type": "gpu", "poll": 1}], "line 1: the first record must be the header"),
        (["HEADER"], "no poll"),
        (
            [
                "HEADER",
                {"type": "host", "poll": 1, "timestamp": 1.0, "cpu_count": 1},
                {"type": "gpu", "poll": 1, "index": 0, "uuid": "u", "timestamp": "soon"},
            ],
            "line 3: timestamp",
        ),
        (["HEADER", {"type": "gpu", "poll": 1, "index": 0, "uuid": "u", "timestamp": 1.0}], "without its host record"),
        (["HEADER", {"type": "host", "poll": 1, "timestamp": 1.0, "cpu_count": 1, "bogus": 2}], "line 2: bogus"),
        (["HEADER", {"type": "weird", "poll": 1}], "unknown record type"),
    ],
)
def test_malformed_traces_fail_with_one_line_naming_the_problem(tmp_path: Path, lines: list, message: str) -> None:
    lines = [_header() if x == "HEADER" else x for x in lines]
    with pytest.raises(TraceError) as exc:
        read_trace(_write(tmp_path, lines))
    text = str(exc.value)
    assert message in text
    assert "\n" not in text
    assert str(tmp_path) in text


def test_missing_and_truncated_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "nope.jsonl")
    data = trace("h100-idle").read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[:200])  # inside the header
    with pytest.raises(TraceError, match="empty trace|no poll"):
        read_trace(cut)
    cut.write_bytes(data[: len(data) // 2])  # a compressed trace cut off: its complete polls, the loss said
    header, polls, losses = read_trace_losses(cut)
    full = read_trace(trace("h100-idle"))
    assert header == full[0] and 0 < len(polls) < len(full[1]) and polls == full[1][: len(polls)]
    assert losses is not None and "compressed stream ends early" in losses


def test_header_rejects_nonpositive_interval() -> None:
    h = _header()
    h["poll_interval_seconds"] = 0
    with pytest.raises(ValueError):
        TraceHeader.model_validate(h)


def test_gzip_and_plain_are_equivalent(tmp_path: Path) -> None:
    plain = tmp_path / "idle.jsonl"
    plain.write_bytes(gzip.decompress(trace("h100-idle").read_bytes()))
    assert read_trace(plain)[1] == read_trace(trace("h100-idle"))[1]


@pytest.mark.parametrize("field, value", [("duration_seconds", None), ("timestamp", "soon")])
def test_a_bad_last_host_record_is_a_trace_error_naming_its_line(tmp_path: Path, field: str, value: object) -> None:
    # found by hypothesis (tests/test_hostile_input.py): the last poll was validated outside the per-line checks
    lines = gzip.open(trace("h100-idle"), "rt").read().splitlines()
    n = max(i for i, line in enumerate(lines) if json.loads(line).get("type") == "host")
    obj = json.loads(lines[n])
    obj[field] = value
    lines[n] = json.dumps(obj)
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=rf"line {n + 1}: .*{field}"):
        read_trace(path)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_a_trace_reading_that_is_nan_or_infinite_is_a_trace_error(tmp_path: Path, token: str) -> None:
    """JSON parsers accept NaN and Infinity; a trace holding one is refused with the line named, never replayed
    (it would be exported as a reading)."""
    lines = gzip.decompress(trace("h100-idle").read_bytes()).decode().splitlines()
    i = next(i for i, line in enumerate(lines) if '"power_usage_watts"' in line)
    lines[i] = re.sub(r'"power_usage_watts": ?[0-9.eE+-]+', f'"power_usage_watts": {token}', lines[i], count=1)
    assert token in lines[i]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=f"line {i + 1}"):
        read_trace(path)
