"""The commands' numeric flags share one converter (gpuwarden.commands._prometheus.bounded): the number of its kind,
finite, above 0 and at most its bound, else argparse's one-line error naming the flag (exit 2)."""

from __future__ import annotations

import argparse
import re

import pytest

from gpuwarden.commands import drain, top
from gpuwarden.commands._prometheus import bounded, positive_seconds


@pytest.mark.parametrize(
    ("convert", "good", "bad"),
    [
        (positive_seconds, {"0.5": 0.5, "60": 60.0}, ["0", "-1", "nan", "inf", "ten", ""]),
        (drain._ratio, {"0.1": 0.1, "1": 1.0}, ["0", "1.01", "nan", "-0.5", "x"]),
        (top._positive_int, {"1": 1, "3": 3}, ["0", "-2", "1.5", "x", "1e3"]),
    ],
)
def test_each_flag_reads_its_numbers_and_refuses_the_rest(convert, good: dict, bad: list[str]) -> None:  # noqa: ANN001
    assert {text: convert(text) for text in good} == good
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^must be .*: {re.escape(repr(text))}$"):
            convert(text)


def test_the_error_names_the_flag_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser(prog="gpuwarden top")
    p.add_argument("--suspects.min-jobs", type=bounded(int, "a whole number of 1 or more"))
    with pytest.raises(SystemExit) as exc:
        p.parse_args(["--suspects.min-jobs", "0"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and err == (
        "gpuwarden top: error: argument --suspects.min-jobs: must be a whole number of 1 or more: '0'"
    )
