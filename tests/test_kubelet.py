"""The kubelet pod-resources client against a fake kubelet: a real gRPC server speaking the pod-resources ``List`` on a
unix socket, with GPUs shared by time-slicing, MIG devices, other resources, and a kubelet restart. Then the names
through attribution to ``gpu_process_job_info``, ``gpu_job_info`` and ``gpu_pod_info``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from gpuwarden.kubelet import podresources_pb2 as pb
from gpuwarden.kubelet.client import PodResources
from gpuwarden.model import GpuReading, MigReading, PodAssignment, ProcessReading

GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
GPU_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
MIG_B = "MIG-cccccccc-1111-2222-3333-444444444444"
POD_UID = "1b2c3d4e-aaaa-bbbb-cccc-0123456789ab"


def _pod(ns: str, name: str, containers: dict[str, list[tuple[str, list[str]]]]) -> pb.PodResources:
    return pb.PodResources(
        namespace=ns,
        name=name,
        containers=[
            pb.ContainerResources(name=c, devices=[pb.ContainerDevices(resource_name=r, device_ids=i) for r, i in d])
            for c, d in containers.items()
        ],
    )


#: GPU A time-sliced between two pods; GPU B's MIG device in a third; an SR-IOV NIC and CPU-only pod ignored.
SHARED = [
    _pod("train", "trainer-0", {"main": [("nvidia.com/gpu", [f"{GPU_A}::0"])]}),
    _pod("notebooks", "alice-nb", {"jupyter": [("nvidia.com/gpu", [f"{GPU_A}::3"])]}),
    _pod("infer", "llm-0", {"server": [("nvidia.com/mig-1g.10gb", [MIG_B])], "sidecar": []}),
    _pod("net", "router", {"r": [("intel.com/sriov", ["0000:3b:00.1"])]}),
]


class FakeKubelet:
    """A gRPC server answering v1.PodResourcesLister/List with ``self.pods``."""

    def __init__(self, socket: Path, pods: list[pb.PodResources]) -> None:
        self.pods = pods
        self.calls = 0
        self.hold: threading.Event | None = None  # set: List waits for it (a kubelet that does not answer)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.unary_unary_rpc_method_handler(
            self._list,
            request_deserializer=pb.ListPodResourcesRequest.FromString,
            response_serializer=pb.ListPodResourcesResponse.SerializeToString,
        )
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister",
                                                                                   {"List": handler}),))  # fmt: skip
        assert self.server.add_insecure_port(f"unix://{socket}")
        self.server.start()

    def _list(self, request: pb.ListPodResourcesRequest, context: object) -> pb.ListPodResourcesResponse:
        self.calls += 1
        if self.hold is not None:
            self.hold.wait(30)
        return pb.ListPodResourcesResponse(pod_resources=self.pods)

    def stop(self) -> None:
        self.server.stop(grace=None).wait()


@contextmanager
def kubelet(socket: Path, pods: list[pb.PodResources]) -> Iterator[FakeKubelet]:
    k = FakeKubelet(socket, pods)
    try:
        yield k
    finally:
        k.stop()


def _gpus() -> list[GpuReading]:
    return [
        GpuReading(index=0, uuid=GPU_A, timestamp=1.0),
        GpuReading(index=1, uuid=GPU_B, timestamp=1.0, mig=[MigReading(uuid=MIG_B, gpu_instance_id=1)]),
        GpuReading(index=2, uuid="GPU-dddddddd-1111-2222-3333-444444444444", timestamp=1.0),
    ]


def test_a_time_sliced_gpu_names_both_pods_and_a_mig_device_names_its_gpu(tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"
    with kubelet(sock, SHARED):
        client = PodResources(sock, refresh_seconds=0)
        a, b, c = client.assign(_gpus())
        client.close()
    assert {(p.namespace, p.pod, p.container, p.device_id) for p in a.pods} == {
        ("train", "trainer-0", "main", f"{GPU_A}::0"),
        ("notebooks", "alice-nb", "jupyter", f"{GPU_A}::3"),
    }
    assert [(p.pod, p.container, p.resource) for p in b.pods] == [("llm-0", "server", "nvidia.com/mig-1g.10gb")]
    assert c.pods == []  # nobody holds GPU 2; the NIC is not a GPU


def test_device_ids_by_index(tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"
    with kubelet(sock, [_pod("ml", "p", {"c": [("nvidia.com/gpu", ["2"])]})]):
        client = PodResources(sock, refresh_seconds=0)
        gpus = client.assign(_gpus())
        client.close()
    assert [len(g.pods) for g in gpus] == [0, 0, 1]


def test_a_kubelet_restart_keeps_the_last_answer_then_reads_the_new_kubelet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sock = tmp_path / "kubelet.sock"
    client = PodResources(sock, timeout=0.5, refresh_seconds=0, max_age_seconds=60)
    with kubelet(sock, SHARED) as k:
        assert len(client.assignments()) == 3 and k.calls == 1
    sock.unlink(missing_ok=True)  # the kubelet is gone (restarting): its socket with it
    with caplog.at_level(logging.WARNING, logger="gpuwarden.kubelet"):
        deadline = time.monotonic() + 10
        while not any("unavailable" in r.getMessage() for r in caplog.records):  # List fails in the background
            assert len(client.assignments()) == 3  # the last answer, while it is recent
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for _ in range(5):
            assert len(client.assignments()) == 3
            time.sleep(0.05)
    assert len([r for r in caplog.records if "unavailable" in r.getMessage()]) == 1  # once per outage
    moved = [_pod("train", "trainer-1", {"main": [("nvidia.com/gpu", [GPU_B])]})]
    with kubelet(sock, moved):  # the new kubelet, on a new socket at the same path
        for _ in range(50):  # gRPC reconnects by itself; allow it its backoff
            found = client.assignments()
            if [a.pod for a in found] == ["trainer-1"]:
                break
            time.sleep(0.2)
        assert [(a.pod, a.device_id) for a in found] == [("trainer-1", GPU_B)]
    client.close()


def test_no_kubelet_at_all_leaves_pods_unknown_and_does_not_raise(tmp_path: Path) -> None:
    client = PodResources(tmp_path / "missing.sock", timeout=0.2, refresh_seconds=0, max_age_seconds=0)
    gpus = _gpus()
    assert client.assign(gpus) == gpus and client.assignments() == []
    client.close()


def _proc(pid: int, host: str | None) -> ProcessReading:
    cg = f"/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{'0' * 64}.scope"
    return ProcessReading(pid=pid, cgroup=cg, hostname_env=host, username="root", name="python3", gpu_memory_bytes=1)


@pytest.mark.parametrize(
    ("host", "pods", "expected"),
    [
        ("trainer-0", ["trainer-0"], ("train", "trainer-0", "main")),
        (None, ["trainer-0"], ("train", "trainer-0", "main")),  # environment unreadable, one pod: it
        ("gpuwarden-x1", ["trainer-0"], None),  # a pod that sees every GPU without asking for one
        ("alice-nb", ["trainer-0", "alice-nb"], ("notebooks", "alice-nb", "jupyter")),  # time-sliced: by hostname
        (None, ["trainer-0", "alice-nb"], None),  # time-sliced, hostname unknown: not guessed
    ],
)
def test_pod_of_a_process(host: str | None, pods: list[str], expected: tuple[str, str, str] | None) -> None:
    from gpuwarden.insight.attribution import attribute, pod_of

    assigned = {"trainer-0": ("train", "main"), "alice-nb": ("notebooks", "jupyter")}
    on_gpu = [PodAssignment(namespace=assigned[p][0], pod=p, container=assigned[p][1], device_id=GPU_A,
                            resource="nvidia.com/gpu") for p in pods]  # fmt: skip
    proc = _proc(7, host)
    names = pod_of(attribute(proc), proc, on_gpu)
    assert (None if names is None else (names.namespace, names.pod, names.container)) == expected


def test_pod_names_reach_the_job_series(tmp_path: Path) -> None:
    """The held-idle H100 recording with its GPU time-sliced between two pods, each with one process (a trace derived
    here, marked modified): each process's job info names its pod; gpu_job_info has one series per GPU and job;
    gpu_pod_info lists both containers."""
    from conftest import TRACES, replay_poller
    from test_collectors import families

    from gpuwarden.trace import TraceWriter, read_trace

    header, polls = read_trace(TRACES / "h100-held_idle.jsonl.gz")
    uuid = header.node.gpus[0].uuid
    shared = [_pod("train", "trainer-0", {"main": [("nvidia.com/gpu", [f"{uuid}::0"])]}),
              _pod("notebooks", "alice-nb", {"jupyter": [("nvidia.com/gpu", [f"{uuid}::1"])]})]  # fmt: skip
    other = POD_UID.replace("1b2c", "9f9f")
    sock = tmp_path / "kubelet.sock"
    out = tmp_path / "shared.jsonl.gz"
    with kubelet(sock, shared):
        client = PodResources(sock, refresh_seconds=0)
        meta = {**header.metadata, "modified": "two pods' processes on GPU 0, pods from a fake kubelet"}
        with TraceWriter(out, header.model_copy(update={"metadata": meta})) as w:
            for poll in polls[:8]:
                g = poll.gpus[0]
                real = (g.processes or [])[0]
                mine = _proc(real.pid, "trainer-0").model_copy(update={"cpu_seconds_total": real.cpu_seconds_total})
                theirs = _proc(real.pid + 1, "alice-nb")
                theirs = theirs.model_copy(update={"cgroup": (theirs.cgroup or "").replace(
                    POD_UID.replace("-", "_"), other.replace("-", "_"))})  # fmt: skip
                [g] = client.assign([g.model_copy(update={"processes": [mine, theirs]})])
                w.write(poll.model_copy(update={"gpus": [g]}))
        client.close()
    from gpuwarden.insight.analyzer import InsightAnalyzer

    poller = replay_poller(out, 8, analyzers={"insight": InsightAnalyzer().prepare})
    text = render_of(poller.snapshot)
    fams = families(text)
    assert "gpu_process_job_info" in fams, sorted(fams)
    procs = {(s.labels["job_id"], s.labels["namespace"], s.labels["pod"], s.labels["container"])
             for s in fams["gpu_process_job_info"]}  # fmt: skip
    assert procs == {(POD_UID, "train", "trainer-0", "main"), (other, "notebooks", "alice-nb", "jupyter")}
    jobs = {(s.labels["job_id"], s.labels["pod"]) for s in fams["gpu_job_info"]}
    assert jobs == {(POD_UID, "trainer-0"), (other, "alice-nb")}
    assert {s.labels["pod"] for s in fams["gpu_pod_info"]} == {"trainer-0", "alice-nb"}


def render_of(snap: object) -> str:
    from conftest import render

    return render(snap)  # type: ignore[arg-type]


def test_a_kubelet_that_never_answers_costs_the_caller_its_timeout_once(tmp_path: Path) -> None:
    """A kubelet socket that accepts and never answers: the first call waits at most ``timeout`` for the first
    answer; every later call (the poll thread's) returns at once while List waits in the background."""
    sock = tmp_path / "kubelet.sock"
    with kubelet(sock, SHARED) as k:
        release = k.hold = threading.Event()
        client = PodResources(sock, timeout=1.0, refresh_seconds=0)
        t0 = time.monotonic()
        assert client.assignments() == []
        first = time.monotonic() - t0
        waits = []
        for _ in range(20):
            t0 = time.monotonic()
            assert client.assignments() == []
            waits.append(time.monotonic() - t0)
            time.sleep(0.05)
        release.set()
        client.close()
    assert 0.5 <= first < 3.0, first
    assert max(waits) < 0.5, waits  # never the 1 s deadline: List waits in the background


def _claim_pod(ns: str, name: str, container: str, claim: str, devices: list[tuple[str, str]]) -> pb.PodResources:
    """A pod whose container holds GPUs through a ResourceClaim (DRA): (driver, device name) pairs."""
    res = [pb.ClaimResource(driver_name=d, pool_name="node-1", device_name=n) for d, n in devices]
    dyn = pb.DynamicResource(claim_name=claim, claim_namespace=ns, claim_resources=res)
    holder = pb.ContainerResources(name=container, dynamic_resources=[dyn])
    return pb.PodResources(namespace=ns, name=name, containers=[holder])


def test_gpus_allocated_through_dynamic_resource_allocation_name_their_pods(tmp_path: Path) -> None:
    """Kubernetes DRA: the kubelet lists a container's ResourceClaims with the driver's device names (gpu-N, and
    gpu-N-mig-... for a MIG device); those from NVIDIA's GPU driver name the GPU, others (a NIC's driver) do not."""
    sock = tmp_path / "kubelet.sock"
    pods = [
        _claim_pod("train", "ddp-0", "main", "ddp-0-gpus", [("gpu.nvidia.com", "gpu-0"), ("gpu.nvidia.com", "gpu-2")]),
        _claim_pod("infer", "small", "srv", "small-mig", [("gpu.nvidia.com", "gpu-1-mig-1g10gb-0-0")]),
        _claim_pod("net", "router", "r", "nic", [("sriov.example.com", "gpu-1")]),
        _pod("legacy", "plugin", {"c": [("nvidia.com/gpu", [GPU_A])]}),
    ]
    with kubelet(sock, pods):
        client = PodResources(sock, refresh_seconds=0)
        a, b, c = client.assign(_gpus())
        client.close()
    assert {(p.namespace, p.pod, p.container) for p in a.pods} == {
        ("train", "ddp-0", "main"),
        ("legacy", "plugin", "c"),
    }
    assert [(p.pod, p.resource) for p in b.pods] == [("small", "gpu.nvidia.com/infer/small-mig")]
    assert [(p.pod, p.device_id) for p in c.pods] == [("ddp-0", "gpu-2")]


GPU_D = "GPU-dddddddd-1111-2222-3333-444444444444"


class FakeApiServer:
    """A real HTTP server answering the ResourceSlice list as the Kubernetes API does: ``versions`` it serves (404
    for the others), the bearer token checked (401), each version's shape (attributes under ``basic`` in
    v1beta1)."""

    def __init__(self, slices: dict[str, dict[str, str]], versions: tuple[str, ...], token: str) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.slices, self.versions, self.token = slices, versions, token
        self.paths: list[str] = []
        self.status: int | None = None  # set: answer every request with it (a failing API server)
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                api.paths.append(self.path)
                version = self.path.split("/")[3]
                if api.status is not None:
                    return self._send(api.status, {"kind": "Status"})
                if self.headers.get("Authorization") != f"Bearer {api.token}":
                    return self._send(401, {"kind": "Status", "reason": "Unauthorized"})
                if version not in api.versions:
                    return self._send(404, {"kind": "Status", "reason": "NotFound"})
                self._send(200, api.document(version))

            def _send(self, code: int, doc: dict) -> None:
                import json

                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def document(self, version: str) -> dict:
        """A ResourceSliceList: one slice per node of ``slices`` (node -> device name -> UUID)."""

        def device(name: str, uuid: str) -> dict:
            attrs = {"uuid": {"string": uuid}, "type": {"string": "mig" if "mig" in name else "gpu"}}
            return {"name": name, "basic": {"attributes": attrs}} if version == "v1beta1" else {
                "name": name, "attributes": attrs}  # fmt: skip

        items = [{"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceSlice",
                  "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node, "generation": 1},
                           "devices": [device(n, u) for n, u in devices.items()]}}
                 for node, devices in self.slices.items()]  # fmt: skip
        return {"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceSliceList", "items": items}

    def close(self) -> None:
        self.server.shutdown()


@pytest.mark.parametrize("versions", [("v1", "v1beta2", "v1beta1"), ("v1beta1",)])
def test_dra_devices_are_mapped_to_gpus_by_the_uuids_of_the_nodes_resourceslices(
    tmp_path: Path, versions: tuple[str, ...]
) -> None:
    """NVIDIA's DRA driver names devices gpu-N, but N need not be NVML's index: this node's ResourceSlice says gpu-0
    is GPU B (NVML index 1) and gpu-1 GPU A (index 0), and its MIG device is GPU B's. The pods go to the GPUs whose
    UUIDs the slice gives, on a server of Kubernetes 1.34 (v1) and of 1.32 (v1beta1 only, attributes under basic);
    another node's slice is not read."""
    from gpuwarden.kubelet.resourceslices import DraDevices

    (tmp_path / "token").write_text("s3cret\n")
    api = FakeApiServer({"node-1": {"gpu-0": GPU_B, "gpu-1": GPU_A, "gpu-1-mig-1g10gb-0-0": MIG_B, "gpu-2": GPU_D},
                         "node-2": {"gpu-0": GPU_A}}, versions, "s3cret")  # fmt: skip
    sock = tmp_path / "kubelet.sock"
    pods = [
        _claim_pod("train", "ddp-0", "main", "ddp-0-gpus", [("gpu.nvidia.com", "gpu-0")]),
        _claim_pod("infer", "small", "srv", "small-mig", [("gpu.nvidia.com", "gpu-1-mig-1g10gb-0-0")]),
    ]
    try:
        with kubelet(sock, pods):
            dra = DraDevices("node-1", api=api.url, token_file=tmp_path / "token", ca_file=None)
            client = PodResources(sock, refresh_seconds=0, dra=dra)
            a, b, c = client.assign(_gpus())
            client.close()
    finally:
        api.close()
    assert a.pods is None or a.pods == []
    assert sorted(p.pod for p in b.pods) == ["ddp-0", "small"]
    assert c.pods is None or c.pods == []
    assert all("fieldSelector=spec.nodeName%3Dnode-1%2Cspec.driver%3Dgpu.nvidia.com" in p for p in api.paths)
    assert api.paths[-1].startswith(f"/apis/resource.k8s.io/{versions[0]}/")


def test_dra_devices_fall_back_to_their_names_while_the_api_server_refuses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A wrong token (401) or a failing API server: one warning, and DRA devices are taken by their gpu-N names (N the
    NVML index) until the slices answer; never an exception in the poll."""
    from gpuwarden.kubelet.resourceslices import DraDevices

    (tmp_path / "token").write_text("wrong")
    api = FakeApiServer({"node-1": {"gpu-0": GPU_B}}, ("v1",), "s3cret")
    sock = tmp_path / "kubelet.sock"
    try:
        with kubelet(sock, [_claim_pod("train", "ddp-0", "main", "c", [("gpu.nvidia.com", "gpu-0")])]):
            dra = DraDevices("node-1", api=api.url, token_file=tmp_path / "token", ca_file=None, refresh_seconds=0)
            client = PodResources(sock, refresh_seconds=0, dra=dra)
            with caplog.at_level(logging.WARNING, logger="gpuwarden.kubelet"):
                for status in (None, None, 500, 500):  # refused, then failing: every poll asks again
                    api.status = status
                    a, b, _c = client.assign(_gpus())
                    assert [p.pod for p in a.pods] == ["ddp-0"] and not b.pods
            client.close()
    finally:
        api.close()
    warnings = [r for r in caplog.records if "ResourceSlices unavailable" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]


def test_dra_resource_slices_outside_a_pod_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuwarden.kubelet.resourceslices import DraDevices

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ValueError, match="not in a Kubernetes pod"):
        DraDevices("node-1")


def test_a_gpu_the_kubelet_assigned_and_nobody_opened_is_allocated_idle(tmp_path: Path) -> None:
    """The idle H100 recording (no process) with the kubelet's pod-resources server (real gRPC over a unix socket)
    assigning its GPU to a notebook pod, through the replay, the analyzer and the collectors as the daemon wires
    them: the GPU is allocated_idle, not free, and gpu_job_info names the pod (namespace/name: the API gives no
    UID)."""
    from conftest import TRACES, render
    from test_collectors import families

    from gpuwarden.insight.analyzer import InsightAnalyzer
    from gpuwarden.poller import Poller
    from gpuwarden.replay import ReplaySource
    from gpuwarden.trace import read_trace

    idle = TRACES / "h100-idle.jsonl.gz"
    uuid = read_trace(idle)[0].node.gpus[0].uuid
    sock = tmp_path / "kubelet.sock"
    with kubelet(sock, [_pod("ml", "notebook-0", {"lab": [("nvidia.com/gpu", [uuid])]})]):
        client = PodResources(sock, refresh_seconds=0)
        poller = Poller(ReplaySource(idle, timing="recorded", annotate=client.assign), 1.0,
                        analyzers={"insight": InsightAnalyzer().prepare})  # fmt: skip
        poller.start(thread=False)
        for _ in range(20):
            poller.poll_once()
        client.close()
    assert poller.snapshot is not None
    fams = families(render(poller.snapshot))
    states = {s.labels["state"]: s.value for s in fams["gpu_state_seconds"]}
    assert states.get("allocated_idle", 0) > 10 and "free" not in states
    assert {s.labels["reason"] for s in fams["gpu_diagnosis"] if s.value == 1} == {"allocated_idle"}
    [job] = [s.labels for s in fams["gpu_job_info"]]
    assert (job["job_id"], job["job_kind"], job["pod"], job["container"]) == ("ml/notebook-0", "kubernetes",
                                                                             "notebook-0", "lab")  # fmt: skip


def test_a_kubelet_socket_without_the_extra_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """grpcio and protobuf are the ``kubelet`` extra (a Slurm node never talks to a kubelet): a configured socket on
    an install without them is a configuration error naming the extra, before the daemon starts anything."""
    import sys

    from gpuwarden.config import ConfigError, load_config
    from gpuwarden.daemon import _annotator

    cfg = load_config(None, {"kubelet_socket": str(tmp_path / "kubelet.sock")})
    monkeypatch.setitem(sys.modules, "grpc", None)  # as if not installed: importing it raises ImportError
    needs = r"kubelet_socket needs grpcio and protobuf: pip install 'gpuwarden\[kubelet\]'"
    with pytest.raises(ConfigError, match=needs):
        _annotator(cfg)
