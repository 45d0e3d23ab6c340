"""``gpuwarden mixin``: write the rules, the Alertmanager routes example and the Grafana dashboards for a site
(gpuwarden.mixin), with its runbook and Grafana addresses applied."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuwarden.commands import COMMANDS, EXIT_USAGE, Subparsers, die


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``mixin`` on ``subparsers`` and return its parser."""
    p = subparsers.add_parser(
        "mixin",
        help=COMMANDS["mixin"].help,
        description="Write gpuwarden's Prometheus rules (for this site's parameters), the dcgm-exporter compatibility "
        "rules, the Alertmanager routes example and the Grafana dashboards under a directory: prometheus/, "
        "alertmanager/, grafana/dashboards/.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", type=Path, metavar="DIR", help="the directory to write into (made where missing)")
    what.add_argument("--defaults", action="store_true", help="print the default parameters, with what each means")
    p.add_argument("--params", type=Path, metavar="FILE", help="a YAML file of the parameters to change")
    p.add_argument("--runbook-url", metavar="URL", help="where your team hosts docs/runbook.md (absolute http(s))")
    p.add_argument("--grafana-url", metavar="URL", help="your Grafana's address: the alerts link its dashboards")
    return p


def run(args: argparse.Namespace) -> int:
    """Print the defaults, or write the files and name each on stdout; returns 0, or 2 with one line on stderr for
    bad parameters or a file that cannot be read or written."""
    import yaml

    from gpuwarden import mixin
    from gpuwarden.terminal import brief, visible

    if args.defaults:
        sys.stdout.write(mixin.defaults())
        return 0
    overrides = {k: v for k, v in (("runbook_url", args.runbook_url), ("grafana_url", args.grafana_url)) if v}
    try:
        written = mixin.write(args.out, args.params, overrides)
    except (ValueError, OSError, yaml.YAMLError) as exc:
        return die(brief(exc, 300), EXIT_USAGE)
    for path in written:
        print(visible(path))
    if not mixin.rules.params(args.params, overrides)["grafana_url"]:
        print(f"gpuwarden: {mixin.rules.NO_GRAFANA}", file=sys.stderr)
    return 0
