"""The PrometheusRule in deploy/kubernetes is the rules of alerts/, generated, and loads in promtool."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).parent.parent
SCRIPT = REPO / "deploy" / "kubernetes" / "generate.py"
MANIFEST = REPO / "deploy" / "kubernetes" / "prometheusrule.yaml"


def _module():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("generate", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_prometheusrule_groups_equal_the_rule_file() -> None:
    rule = yaml.safe_load(MANIFEST.read_text())
    assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == yaml.safe_load((REPO / "alerts" / "gpuwarden.rules.yml").read_text())["groups"]
    assert "prometheusrule.yaml" in (REPO / "deploy" / "kubernetes" / "kustomization.yaml").read_text()


@pytest.mark.e2e
def test_prometheusrule_spec_passes_promtool(promtool: str, tmp_path: Path) -> None:
    spec = yaml.safe_load(MANIFEST.read_text())["spec"]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(spec))
    res = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_dashboards_configmap_is_generated_from_the_dashboards() -> None:
    path = REPO / "deploy" / "kubernetes" / "components" / "grafana-dashboards" / "dashboards.yaml"
    data = yaml.safe_load(path.read_text())["data"]
    assert sorted(data) == ["gpuwarden-fleet.json", "gpuwarden-job.json", "gpuwarden-node.json"]
