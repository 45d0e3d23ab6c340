"""Writes the generated manifests of deploy/kubernetes: prometheusrule.yaml, the Prometheus Operator's PrometheusRule
holding alerts/gpuwarden.rules.yml, and components/grafana-dashboards/dashboards.yaml, a ConfigMap of the Grafana
dashboards (gpuwarden/mixin/dashboards) labelled for the Grafana chart's dashboard sidecar.

Run ``python3 deploy/kubernetes/generate.py`` after editing the rules or the dashboards;
tests/test_deploy_prometheusrule.py fails when a manifest differs from what this writes.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuwarden.mixin import dashboards

REPO = Path(__file__).parent.parent.parent
RULES = REPO / "alerts" / "gpuwarden.rules.yml"
OUT = Path(__file__).parent / "prometheusrule.yaml"
DASHBOARDS = Path(__file__).parent / "components" / "grafana-dashboards" / "dashboards.yaml"


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
    header = "# Generated from alerts/gpuwarden.rules.yml by deploy/kubernetes/generate.py: do not edit.\n"
    return header + yaml.safe_dump(manifest, sort_keys=False, width=120, allow_unicode=True)


def render_dashboards() -> str:
    """Return the ConfigMap manifest (YAML) of the shipped Grafana dashboards, one key a dashboard file, labelled
    ``grafana_dashboard: "1"`` (the label the Grafana Helm chart's sidecar looks for by default)."""
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "gpuwarden-dashboards",
            "labels": {"app.kubernetes.io/name": "gpuwarden", "grafana_dashboard": "1"},
        },
        "data": dashboards(),
    }
    header = "# Generated from gpuwarden/mixin/dashboards by deploy/kubernetes/generate.py: do not edit.\n"
    return header + yaml.safe_dump(manifest, sort_keys=False, width=120, allow_unicode=True)


if __name__ == "__main__":
    OUT.write_text(render())
    DASHBOARDS.write_text(render_dashboards())
