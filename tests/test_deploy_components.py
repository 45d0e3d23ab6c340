"""The kustomize components of deploy/kubernetes/components (the usual choices of a site: TLS, basic auth, the
kubelet's pod-resources socket, DRA, the Grafana dashboards, no Prometheus Operator, a NetworkPolicy, the port
behind kube-rbac-proxy), built with ``kubectl kustomize``
over the base as a site's kustomization lists them, each result valid for the Kubernetes versions of test_deploy, and
each component doing what its comment says."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_deploy import K8S, K8S_VERSIONS

from gpuwarden.config import Config

COMPONENTS = K8S / "components"
KUBECTL = shutil.which("kubectl")


@pytest.fixture(scope="module")
def kustomize(tmp_path_factory: pytest.TempPathFactory) -> str:
    """kubectl, where its kustomize knows components (kustomize v4+, kubectl 1.21+)."""
    if KUBECTL is None:
        pytest.skip("kubectl not installed")
    probe = tmp_path_factory.mktemp("probe")
    (probe / "c").mkdir()
    component = "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nnamePrefix: probe-\n"
    (probe / "c" / "kustomization.yaml").write_text(component)
    (probe / "kustomization.yaml").write_text("components: [c]\n")
    res = subprocess.run([KUBECTL, "kustomize", str(probe)], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        pytest.skip(f"kubectl's kustomize has no components (kubectl 1.21+): {res.stderr.strip()[:200]}")
    return KUBECTL


@pytest.fixture(scope="module")
def kv():  # noqa: ANN201 - the module
    return pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")


def build(kubectl: str, site: Path, components: list[str]) -> list[dict[str, Any]]:
    """The objects of a site's kustomization over the base with ``components``, as kubectl kustomize builds them."""
    site.mkdir(parents=True, exist_ok=True)
    kust = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(K8S, site)],
        "components": [os.path.relpath(COMPONENTS / c, site) for c in components],
    }
    (site / "kustomization.yaml").write_text(yaml.safe_dump(kust))
    res = subprocess.run([kubectl, "kustomize", str(site)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def named(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [ds] = named(docs, "DaemonSet")
    return ds["spec"]["template"]["spec"]["containers"][0]


def env(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(docs)["env"]}


ALL = ["tls", "basic-auth", "pod-resources", "dra", "grafana-dashboards"]
SETS = [[], ["tls"], ["tls", "basic-auth"], ["pod-resources"], ["pod-resources", "dra"], ["grafana-dashboards"],
        ["without-prometheus-operator"], ALL, [*ALL, "without-prometheus-operator"], ["network-policy"],
        ["kube-rbac-proxy", "network-policy"], ["kube-rbac-proxy", "network-policy", "pod-resources", "dra",
                                                "grafana-dashboards"]]  # fmt: skip


def test_every_component_is_tested() -> None:
    assert {p.name for p in COMPONENTS.iterdir() if p.is_dir()} == {c for s in SETS for c in s}


@pytest.mark.parametrize("components", SETS, ids=lambda s: "+".join(s) or "base")
def test_each_choice_builds_and_validates(kustomize: str, kv, tmp_path: Path, components: list[str]) -> None:  # noqa: ANN001
    docs = build(kustomize, tmp_path / "site", components)
    for version in K8S_VERSIONS:
        for doc in docs:
            if not doc["apiVersion"].startswith("monitoring.coreos.com/"):  # CRDs: test_deploy's shape checks
                kv.validate(doc, version, strict=True)
    assert all(d["metadata"].get("namespace", "gpuwarden") == "gpuwarden" for d in docs)
    for name in env(docs):  # every variable the components add names a configuration key
        if name.startswith("GPUWARDEN_") and name != "GPUWARDEN_NODE_NAME":
            assert name.removeprefix("GPUWARDEN_").lower() in Config.model_fields, name
    crds = {d["kind"] for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")}
    assert crds == (set() if "without-prometheus-operator" in components else {"ServiceMonitor", "PrometheusRule"})


def test_tls_serves_the_secrets_web_config_and_probes_and_scrapes_over_https(kustomize: str, tmp_path: Path) -> None:
    base, docs = build(kustomize, tmp_path / "b", []), build(kustomize, tmp_path / "s", ["tls", "basic-auth"])
    path = Path(env(docs)["GPUWARDEN_WEB_CONFIG_FILE"])
    [ds] = named(docs, "DaemonSet")
    secrets = {v["name"]: v["secret"]["secretName"] for v in ds["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    mounts = {m["mountPath"]: m["name"] for m in container(docs)["volumeMounts"]}
    assert secrets[mounts[str(path.parent)]] == "gpuwarden-web"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container(docs)[probe]["httpGet"]["scheme"] == "HTTPS"
        assert "scheme" not in container(base)[probe]["httpGet"]  # HTTP without the component
    [sm] = named(docs, "ServiceMonitor")
    endpoint = sm["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["ca"]["secret"]["key"] == "ca.crt"
    assert {endpoint["basicAuth"][k]["name"] for k in ("username", "password")} == {"gpuwarden-scrape"}
    assert endpoint["port"] == "metrics" and endpoint["relabelings"]  # the base's endpoint, patched, not replaced


def test_pod_resources_runs_as_root_without_capabilities_and_dra_lists_resourceslices(
    kustomize: str, tmp_path: Path
) -> None:
    docs = build(kustomize, tmp_path / "s", ["pod-resources", "dra"])
    [ds] = named(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 0 and pod["securityContext"]["runAsNonRoot"] is False
    ctx = container(docs)["securityContext"]
    assert ctx["capabilities"]["drop"] == ["ALL"] and ctx["allowPrivilegeEscalation"] is False
    socket = Path(env(docs)["GPUWARDEN_KUBELET_SOCKET"])
    assert str(socket.parent) in {m["mountPath"] for m in container(docs)["volumeMounts"]}
    assert env(docs)["GPUWARDEN_DRA_RESOURCE_SLICES"] == "true" and pod["automountServiceAccountToken"] is True
    [role], [binding] = named(docs, "ClusterRole"), named(docs, "ClusterRoleBinding")
    assert role["rules"] == [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "gpuwarden"}
    ]


def test_the_dashboards_configmap_is_labelled_for_grafanas_sidecar(kustomize: str, tmp_path: Path) -> None:
    docs = build(kustomize, tmp_path / "s", ["grafana-dashboards"])
    [cm] = [d for d in named(docs, "ConfigMap") if d["metadata"]["name"] == "gpuwarden-dashboards"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert sorted(cm["data"]) == ["gpuwarden-fleet.json", "gpuwarden-job.json", "gpuwarden-node.json"]


def test_network_policy_admits_only_prometheus_to_the_metrics_port(kustomize: str, tmp_path: Path) -> None:
    docs = build(kustomize, tmp_path / "s", ["network-policy"])
    [policy] = named(docs, "NetworkPolicy")
    [ds] = named(docs, "DaemonSet")
    assert policy["metadata"]["namespace"] == "gpuwarden"
    assert policy["spec"]["podSelector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    # one peer with both selectors: Prometheus pods of the monitoring namespace, not every pod of it nor every
    # namespace's Prometheus
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]  # fmt: skip
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert [p["name"] for p in container(docs)["ports"]] == ["metrics"]  # the port the rule names


def test_kube_rbac_proxy_fronts_the_port_and_alone_holds_a_token(kustomize: str, tmp_path: Path) -> None:
    docs = build(kustomize, tmp_path / "s", ["kube-rbac-proxy", "network-policy"])
    [ds] = named(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    daemon, proxy = pod["containers"]
    assert proxy["name"] == "kube-rbac-proxy"
    # the daemon on loopback only, with no port, no probe and no token of its own
    listen = env(docs)["GPUWARDEN_LISTEN_ADDRESS"]
    assert listen == "127.0.0.1:10401" and "listen_address" in Config.model_fields
    assert "ports" not in daemon and not {"startupProbe", "livenessProbe", "readinessProbe"} & set(daemon)
    assert pod["automountServiceAccountToken"] is False
    assert all(m["name"] != "kube-rbac-proxy-token" for m in daemon.get("volumeMounts", []))
    # the proxy: TLS on the port the Service, the ServiceMonitor and the NetworkPolicy name, forwarding to the daemon
    args = dict(a.removeprefix("--").split("=", 1) for a in proxy["args"] if "=" in a)
    assert args["upstream"] == f"http://{listen}/" and args["secure-listen-address"] == ":10400"
    assert proxy["ports"] == [{"name": "metrics", "containerPort": 10400, "protocol": "TCP"}]
    [svc] = named(docs, "Service")
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    # the probes carry no token: only the paths it lets through unchecked, over HTTPS
    unchecked = set(args["ignore-paths"].split(","))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = proxy[probe]["httpGet"]
        assert get["scheme"] == "HTTPS" and get["port"] == "metrics" and get["path"] in unchecked
    assert unchecked == {"/healthz", "/readyz"}
    # its token: a projected one, in its container alone, where client-go's in-cluster config reads it
    [vol] = [v for v in pod["volumes"] if v["name"] == "kube-rbac-proxy-token"]
    sources = {next(iter(s)) for s in vol["projected"]["sources"]}
    assert sources == {"serviceAccountToken", "configMap", "downwardAPI"}
    assert {m["mountPath"] for m in proxy["volumeMounts"]} == {"/var/run/secrets/kubernetes.io/serviceaccount"}
    assert proxy["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # RBAC: the proxy may ask the two reviews; the scraper may GET /metrics
    roles = {r["metadata"]["name"]: r["rules"] for r in named(docs, "ClusterRole")}
    assert roles["gpuwarden-kube-rbac-proxy"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ]
    assert roles["gpuwarden-metrics-reader"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    bindings = {b["roleRef"]["name"]: b["subjects"] for b in named(docs, "ClusterRoleBinding")}
    assert bindings["gpuwarden-kube-rbac-proxy"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "gpuwarden"}
    ]
    # Prometheus scrapes over HTTPS with its token
    [sm] = named(docs, "ServiceMonitor")
    endpoint = sm["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https" and endpoint["bearerTokenFile"].endswith("/serviceaccount/token")
    assert endpoint["port"] == "metrics" and endpoint["relabelings"]
