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
        description="Write gpuwarden's Prometheus rules (for this site's parameters), the Alertmanager routes "
        "example and the Grafana dashboards under a directory: prometheus/, alertmanager/, grafana/dashboards/; and "
        "the dcgm-exporter compatibility rules where --dcgm-compat asks for them.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", type=Path, metavar="DIR", help="the directory to write into (made where missing)")
    what.add_argument("--defaults", action="store_true", help="print the default parameters, with what each means")
    p.add_argument("--params", type=Path, metavar="FILE", help="a YAML file of the parameters to change")
    p.add_argument("--runbook-url", metavar="URL", help="where your team hosts docs/runbook.md (absolute http(s))")
    p.add_argument("--grafana-url", metavar="URL", help="your Grafana's address: the alerts link its dashboards")
    p.add_argument("--dcgm-compat", choices=("4.8", "4.9", "both"), default=None,
                   help="also write prometheus/dcgm-compat.rules.yml: dcgm-exporter's series under its 4.8 names, "
                        "its 4.9 names, or both, for consumers written for dcgm-exporter (each series one more "
                        "series a GPU and one join over every GPU a rule evaluation: docs/prometheus.md)")  # fmt: skip
    p.add_argument("--dcgm-compat-names", metavar="NAME[,NAME...]", default="",
                   help="with --dcgm-compat: only these dcgm-exporter series (e.g. "
                        "DCGM_FI_DEV_GPU_UTIL,DCGM_FI_DEV_FB_USED)")  # fmt: skip
    return p


def run(args: argparse.Namespace) -> int:
    """Print the defaults, or write the files and name each on stdout; returns 0, or 2 with one line on stderr for
    bad parameters or a file that cannot be read or written."""
    import yaml

    from gpuwarden import mixin
    from gpuwarden.terminal import brief, visible, why

    if args.defaults:
        sys.stdout.write(mixin.defaults())
        return 0
    overrides = {k: v for k, v in (("runbook_url", args.runbook_url), ("grafana_url", args.grafana_url)) if v}
    names = [n.strip() for n in args.dcgm_compat_names.split(",") if n.strip()]
    if names and args.dcgm_compat is None:
        return die("--dcgm-compat-names needs --dcgm-compat 4.8, 4.9 or both", EXIT_USAGE)
    try:
        written = mixin.write(args.out, args.params, overrides, args.dcgm_compat, names)
    except OSError as exc:
        return die(f"{visible(exc.filename) if exc.filename else 'a file'}: {why(exc)}", EXIT_USAGE)
    except (ValueError, yaml.YAMLError) as exc:
        return die(brief(exc, 300), EXIT_USAGE)
    for path in written:
        print(visible(path))
    if not mixin.rules.params(args.params, overrides)["grafana_url"]:
        print(f"gpuwarden: {mixin.rules.NO_GRAFANA}", file=sys.stderr)
    return 0
