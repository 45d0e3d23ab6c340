"""Writes deploy/kubernetes/prometheusrule.yaml: the Prometheus Operator's PrometheusRule holding alerts/.

Run ``python3 deploy/kubernetes/make_prometheusrule.py`` after editing alerts/gpuwarden.rules.yml;
tests/test_deploy_prometheusrule.py fails when the two differ.
"""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).parent.parent.parent
RULES = REPO / "alerts" / "gpuwarden.rules.yml"
OUT = Path(__file__).parent / "prometheusrule.yaml"


def render() -> str:
    """Return the PrometheusRule manifest (YAML) whose spec.groups are the groups of alerts/gpuwarden.rules.yml."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "gpuwarden",
            "labels": {"app.kubernetes.io/name": "gpuwarden", "app.kubernetes.io/component": "rules"},
        },
        "spec": {"groups": groups},
    }
    header = "# Generated from alerts/gpuwarden.rules.yml by deploy/kubernetes/make_prometheusrule.py: do not edit.\n"
    return header + yaml.safe_dump(manifest, sort_keys=False, width=120, allow_unicode=True)


if __name__ == "__main__":
    OUT.write_text(render())
