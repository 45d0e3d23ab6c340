"""Hostile input: random configuration and corrupted traces fail with the module's own error, never another.

hypothesis generates YAML documents, mappings over the real keys with values of every type, raw text,
and corruptions of a real recorded trace (changed characters, cut lines, fields replaced by random JSON,
truncated or damaged gzip). ``load_config`` must return a Config or raise ConfigError; ``read_trace`` must
return polls or raise TraceError - with one line, never a traceback of another exception.

The tests named after a non-UTF-8 file, a control character and a damaged gzip pin defects these properties
found (since fixed in gpuwarden/config.py and gpuwarden/trace.py).
"""

from __future__ import annotations

import gzip
import json
import tempfile
import zlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.config import Config, ConfigError, load_config
from gpuwarden.trace import TraceError, read_trace

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = [*Config.model_fields, "pol_interval", ""]
SUBKEYS = ["enabled", "max_per_gpu", "enable", "disable", "window_seconds", "bogus"]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=15,
)
config_values = st.recursive(
    scalars | st.sampled_from(["127.0.0.1:0", "[::1]:10400", ":99999", "power", "exporter", "nope", "/dev/null"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(SUBKEYS) | st.text(max_size=5), inner),
    max_leaves=10,
)
config_mappings = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=12), config_values, max_size=6)


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for k in [k for k in os.environ if k.startswith("GPUWARDEN_")]:
        monkeypatch.delenv(k)


def _load_file(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.yml"
        path.write_bytes(content)
        try:
            cfg = load_config(path)
        except ConfigError as exc:
            assert str(exc) and "\n" not in str(exc), repr(str(exc))
        else:
            assert isinstance(cfg, Config)


def _refused(content: bytes, match: str) -> None:
    """``content`` as a config file must be refused with one line matching ``match``."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.yml"
        path.write_bytes(content)
        with pytest.raises(ConfigError, match=match) as info:
            load_config(path)
        assert "\n" not in str(info.value)


@SETTINGS
@given(config_mappings)
def test_config_mappings_give_a_config_or_config_error(data: dict[str, Any]) -> None:
    _load_file(yaml.safe_dump(data, allow_unicode=True).encode())


@SETTINGS
@given(config_mappings)
def test_config_overrides_give_a_config_or_config_error(data: dict[str, Any]) -> None:
    try:
        load_config(None, data)
    except ConfigError as exc:
        assert str(exc) and "\n" not in str(exc)


yaml_fragments = st.sampled_from(
    [
        "poll_interval_seconds: ",
        "&a [*a]",
        "!!python/object/apply:os.system ['true']",
        "? [a, b]\n: 1",
        "{",
        "- ",
        "collectors:\n  disable: ",
        "processes: {max_per_gpu: ",
        "\t",
        ": :",
        "1e999",
        ".nan",
        "~",
        "%YAML 1.1\n---\n",
        "!!binary AAAA",
        "\n",
    ]
)


# Characters YAML accepts in a stream (the YAML reader refuses C0 controls other than tab and newlines).
printable = st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from("\t\n\r")


@SETTINGS
@given(st.lists(yaml_fragments | st.text(printable, max_size=20), max_size=8).map("".join))
def test_yaml_text_gives_a_config_or_config_error(text: str) -> None:
    _load_file(text.encode())


def test_a_config_file_that_is_not_utf8_is_a_config_error() -> None:
    _refused(b"poll_interval_seconds: \x80\n", "not UTF-8 text")


def test_a_config_file_with_a_control_character_is_one_line() -> None:
    _refused(b"\x1f", "invalid YAML")


# -- traces ---------------------------------------------------------------------------------------------

REAL = trace("h100-idle")
LINES = gzip.decompress(REAL.read_bytes()).decode().splitlines()[:8]  # header, then host + gpu records


def _read(content: bytes, suffix: str = ".jsonl") -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"t{suffix}"
        path.write_bytes(content)
        try:
            header, polls = read_trace(path)
        except TraceError as exc:
            assert str(exc).startswith(str(path)) and "\n" not in str(exc), repr(str(exc))
        else:
            assert polls and header.node is not None


def _refused_trace(content: bytes, suffix: str = ".jsonl") -> None:
    """``content`` as a trace must be refused with one line that names the file."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"t{suffix}"
        path.write_bytes(content)
        with pytest.raises(TraceError) as info:
            read_trace(path)
        assert str(info.value).startswith(str(path)) and "\n" not in str(info.value), repr(str(info.value))


def _prefix_or_refused(content: bytes) -> None:
    """``content`` as a compressed trace reads as a prefix of the whole trace's polls, or is refused in one line."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.jsonl.gz"
        path.write_bytes(content)
        whole = Path(d) / "whole.jsonl.gz"
        whole.write_bytes(COMPRESSED)
        try:
            header, polls = read_trace(path)
        except TraceError as exc:
            assert str(exc).startswith(str(path)) and "\n" not in str(exc), repr(str(exc))
            return
        full_header, full = read_trace(whole)
        assert header == full_header and polls == full[: len(polls)], "damage read as data"


def test_the_real_lines_parse() -> None:
    _read(("\n".join(LINES) + "\n").encode())


@SETTINGS
@given(st.data())
def test_corrupted_lines_give_polls_or_trace_error(data: st.DataObject) -> None:
    lines = list(LINES)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(lines) - 1))
        how = data.draw(st.sampled_from(["cut", "flip", "json", "field", "drop", "dup", "garbage"]))
        if how == "cut":
            lines[i] = lines[i][: data.draw(st.integers(0, len(lines[i])))]
        elif how == "flip" and lines[i]:
            pos = data.draw(st.integers(0, len(lines[i]) - 1))
            lines[i] = lines[i][:pos] + data.draw(st.characters(exclude_categories=["Cs"])) + lines[i][pos + 1 :]
        elif how == "json":
            lines[i] = json.dumps(data.draw(json_values))
        elif how == "field":
            try:  # an earlier "flip" may already have broken this line's JSON
                obj = json.loads(lines[i])
            except json.JSONDecodeError:
                obj = {}
            if isinstance(obj, dict) and obj:
                key = data.draw(st.sampled_from(sorted(obj)))
                obj[key] = data.draw(json_values)
                lines[i] = json.dumps(obj)
        elif how == "drop":
            del lines[i]
            if not lines:
                lines = [""]
        elif how == "dup":
            lines.insert(i, lines[i])
        else:
            lines[i] = data.draw(st.text(max_size=40))
    _read("\n".join(lines).encode())


@SETTINGS
@given(st.text(st.characters(exclude_categories=["Cs"]), max_size=300))
def test_random_text_gives_trace_error(text: str) -> None:
    _refused_trace(text.encode())


def test_a_trace_that_is_not_utf8_gives_trace_error() -> None:
    _refused_trace(LINES[0].encode() + b"\n\x80\n")


COMPRESSED = gzip.compress(("\n".join(LINES) + "\n").encode(), mtime=0)


@SETTINGS
@given(st.integers(0, len(COMPRESSED) - 1))
def test_truncated_gzip_gives_its_complete_polls_or_trace_error(pos: int) -> None:
    """A cut-off compressed trace reads up to its last complete poll (a prefix of the whole), else one line."""
    _prefix_or_refused(COMPRESSED[:pos])


@settings(max_examples=150, deadline=None)
@given(st.integers(10, len(COMPRESSED) - 9), st.integers(0, 255))
def test_damaged_gzip_gives_trace_error(pos: int, byte: int) -> None:
    raw = bytearray(COMPRESSED)
    raw[pos] ^= byte or 1
    try:
        same = gzip.decompress(bytes(raw)) == gzip.decompress(COMPRESSED)
    except (OSError, EOFError, zlib.error):
        same = False
    if same:  # a flip in the padding bits after the last deflate block changes nothing: it must still read
        _read(bytes(raw), suffix=".jsonl.gz")
    else:  # refused, or (where the damage ends the stream early) its complete polls before the damage
        _prefix_or_refused(bytes(raw))


@pytest.mark.parametrize("text", ["1: x\n", "null: 3\n", "processes:\n  2: true\n", "gpus:\n  - {1: 2}\n"])
def test_yaml_keys_that_are_not_text_are_a_config_error(tmp_path: Path, text: str) -> None:
    # found by hypothesis: a non-text key reached pydantic-settings as a keyword argument (TypeError)
    path = tmp_path / "c.yml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="every key must be text"):
        load_config(path)


@pytest.mark.parametrize("gpus", [[-1], ["-1"], [-1.0], [0, "-2"]])
def test_a_negative_gpu_index_given_in_any_form_is_a_config_error(gpus: list[object]) -> None:
    # found by hypothesis under load: "-1" and -1.0 passed the check made before coercion, and the configuration's
    # second validation raised pydantic's own error (a traceback)
    with pytest.raises(ConfigError, match="GPU indices are 0 or more"):
        load_config(None, {"gpus": gpus})


def test_self_referencing_yaml_is_a_config_error(tmp_path: Path) -> None:
    # found by hypothesis: a YAML alias inside its own anchor makes a structure that contains itself
    path = tmp_path / "c.yml"
    path.write_text("gpus: &a [*a]\n")
    with pytest.raises(ConfigError):
        load_config(path)
