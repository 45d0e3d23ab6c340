"""``gpuwarden collectors``: list the collectors, their default state and what they export."""

from __future__ import annotations

import argparse

from gpuwarden.commands import COMMANDS, Subparsers


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``collectors`` on ``subparsers`` and return its parser."""
    return subparsers.add_parser("collectors", help=COMMANDS["collectors"].help,
                                 description="List every collector (a metric family group), whether it is on by "
                                 "default, and what it exports: serve's --collector.NAME / --no-collector.NAME "
                                 "turn one on or off.")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Print one line per collector of gpuwarden.catalog.COLLECTORS (name, on/off by default, help); returns 0."""
    from gpuwarden.catalog import COLLECTORS

    for name, spec in sorted(COLLECTORS.items()):
        print(f"{name:14s} {'on ' if spec.enabled_by_default else 'off'}  {spec.help}")
    return 0
