"""The command table: each command's module is imported only when chosen; serve's flags come from one table whose
rows each set the configuration key they name."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwarden.cli import build_parser
from gpuwarden.commands import COMMANDS
from gpuwarden.commands.serve import FLAGS, load, overrides
from gpuwarden.config import Config

#: Each serve flag, a value, and the configuration it must give (an independent list: a row dropped from FLAGS or a
#: row that sets the wrong key fails here).
EXPECTED = [
    (["--web.listen-address", "127.0.0.1:9"], lambda c: c.listen_address == "127.0.0.1:9"),
    (["--web.telemetry-path", "/m"], lambda c: c.telemetry_path == "/m"),
    (["--poll.interval", "2.5"], lambda c: c.poll_interval_seconds == 2.5),
    (["--poll.slow-interval", "7"], lambda c: c.slow_interval_seconds == 7),
    (["--poll.gpm-interval", "3"], lambda c: c.gpm_interval_seconds == 3),
    (["--gpus", "0,2"], lambda c: c.gpus == [0, 2]),
    (["--no-processes"], lambda c: c.processes.enabled is False),
    (["--demo"], lambda c: c.demo == "workloads"),
    (["--demo", "faults"], lambda c: c.demo == "faults"),
    (["--log.level", "debug"], lambda c: c.log_level == "debug"),
    (["--log.level", "error"], lambda c: c.log_level == "error"),
    (["--log.format", "json"], lambda c: c.log_format == "json"),
    (["--nvml.wait"], lambda c: c.wait_for_nvml is True),
]


@pytest.mark.parametrize(("argv", "check"), EXPECTED, ids=[" ".join(a) for a, _ in EXPECTED])
def test_each_serve_flag_sets_its_configuration_key(argv: list[str], check: object) -> None:
    args = build_parser("serve").parse_args(["serve", *argv])
    assert check(load(args)), (argv, overrides(args))  # type: ignore[operator]


def test_every_flag_row_names_a_config_key_and_is_listed_above() -> None:
    for flag in FLAGS:
        assert flag.key in Config.model_fields, flag
    listed = {argv[0] for argv, _ in EXPECTED} | {"--web.config.file", "--replay"}  # these two need a file
    assert {flag.names[0] for flag in FLAGS} == listed


def test_flags_not_given_leave_the_file_alone(tmp_path: Path) -> None:
    conf = tmp_path / "c.yml"
    conf.write_text("telemetry_path: /from-file\npoll_interval_seconds: 4\n")
    args = build_parser("serve").parse_args(["serve", "--config.file", str(conf), "--poll.interval", "2"])
    cfg = load(args)
    assert (cfg.telemetry_path, cfg.poll_interval_seconds) == ("/from-file", 2.0)


def test_a_bad_gpus_value_is_a_one_line_error() -> None:
    args = build_parser("serve").parse_args(["serve", "--gpus", "0,x"])
    with pytest.raises(ValueError, match="--gpus expects comma-separated indices"):
        overrides(args)


@pytest.mark.e2e
def test_only_the_chosen_command_is_imported() -> None:
    code = (
        "import sys; from gpuwarden.cli import build_parser; build_parser('collectors'); "
        "print(sorted(m for m in sys.modules if m.startswith('gpuwarden.commands.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['gpuwarden.commands.collectors']"


def test_the_full_parser_and_the_lazy_one_show_each_command_with_the_table_help() -> None:
    def helps(parser: object) -> dict[str, str | None]:
        sub = next(a for a in parser._actions if a.dest == "command")  # type: ignore[attr-defined]
        return {a.dest: a.help for a in sub._choices_actions}

    table = {name: command.help for name, command in COMMANDS.items()}
    assert helps(build_parser()) == table
    for name in COMMANDS:
        assert helps(build_parser(name)) == table


def test_a_readiness_deadline_shorter_than_two_polls_is_refused(tmp_path: Path) -> None:
    from gpuwarden.config import ConfigError, load_config

    conf = tmp_path / "c.yml"
    conf.write_text("stale_after_seconds: 0.5\npoll_interval_seconds: 1\n")
    with pytest.raises(ConfigError, match="stale_after_seconds \\(0.5\\) must be at least 2 poll intervals"):
        load_config(conf)
    conf.write_text("stale_after_seconds: 2\npoll_interval_seconds: 1\n")
    assert load_config(conf).stale_after == 2.0


OLD_NAMES = [
    (["--config", "{conf}"], lambda c: c.telemetry_path == "/from-file"),
    (["--poll-interval", "2.5"], lambda c: c.poll_interval_seconds == 2.5),
    (["--slow-interval", "7"], lambda c: c.slow_interval_seconds == 7),
    (["--gpm-interval", "3"], lambda c: c.gpm_interval_seconds == 3),
    (["--log-level", "error"], lambda c: c.log_level == "error"),
    (["--wait-for-nvml"], lambda c: c.wait_for_nvml is True),
]


@pytest.mark.parametrize(("argv", "check"), OLD_NAMES)
def test_older_flag_names_still_work(tmp_path: Path, argv: list[str], check: Callable[[Config], bool]) -> None:
    """Each flag renamed to Prometheus's ``namespace.name`` style keeps its older name as a hidden alias."""
    conf = tmp_path / "c.yml"
    conf.write_text("telemetry_path: /from-file\n")
    assert check(load(build_parser("serve").parse_args(["serve", *(a.format(conf=conf) for a in argv)])))


@pytest.mark.parametrize("command", ["serve", "record", "diagnose", "top", "report", "check-config"])
def test_help_shows_flags_in_one_style(command: str) -> None:
    """Every flag ``--help`` shows is one word (``--demo``), its negation (``--no-processes``), or
    ``namespace.name`` with words joined by ``-`` (``--web.listen-address``, ``--poll.slow-interval``); the older
    spellings (``--poll-interval``) are accepted but not shown."""
    import re

    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    shown = [s for a in sub._actions if a.help != argparse.SUPPRESS for s in a.option_strings if s.startswith("--")]
    assert shown
    style = re.compile(r"--(no-)?[a-z0-9]+(\.[a-z0-9]+([-_][a-z0-9]+)*)*")
    assert [s for s in shown if not style.fullmatch(s)] == []
    hidden = [s for a in sub._actions if a.help == argparse.SUPPRESS for s in a.option_strings]
    if command == "serve":
        assert {"--poll-interval", "--config", "--wait-for-nvml"} <= set(hidden)
