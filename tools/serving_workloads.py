"""Workloads of tools/workloads.py for inference and suspended jobs: servers of several shapes and their clients, a
job stopped in cycles, device-to-host copies. Each keeps the workload's own clock (``Split``: ``gpu`` while its
kernels run, ``sleep`` while a server waits for requests, ``stopped`` while the job is stopped, ``copy`` while a
result is copied to the host).

Servers (``serve``): the GPU work runs in the server's process (``engine="inproc"``) or in a child process behind it
(``engine="child"``: the front end listens and holds no GPU, as vLLM's V1 API server and EngineCore, TorchServe's
frontend and workers, Triton and its Python backend stubs); over HTTP (http.server, with ``GET /metrics`` giving the
requests running and waiting under vLLM's gauge names) or gRPC (grpcio, a generic bytes-in bytes-out method, no
generated code); a client process sends requests every ``pause`` seconds (``fixed``:
periods that divide the poll's alias util.gpu) or ``pause`` apart on average (``poisson``).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any

#: The gRPC method the server answers and the client calls.
GRPC_METHOD = "/gpuwarden.workload.Engine/Infer"


def _engine_loop(gpu: int, busy: float, size: int, conn: Any) -> None:
    """An engine process: holds ``size`` MiB on GPU ``gpu`` and answers each message on ``conn`` with ``busy`` seconds
    of bf16 products (synchronised), then its reply."""
    import torch

    dev = torch.device(f"cuda:{gpu}")
    torch.cuda.set_device(dev)
    cache = torch.empty(size * 1024 * 1024, dtype=torch.uint8, device=dev)  # noqa: F841 - held, as a KV cache is
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) / 90.0
    conn.send("ready")
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        until, x = time.time() + busy, a
        while time.time() < until:
            x = (x @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
        conn.send("done")


class _Engine:
    """Runs a request's GPU work: in this process, or in a child (``_engine_loop``) over a pipe. ``run()`` is called
    one request at a time; the clock says ``gpu`` while it runs."""

    def __init__(self, gpu: int, busy: float, size: int, child: bool, clock: Any) -> None:
        self.clock, self.lock = clock, threading.Lock()
        self.served = 0
        self.inflight = 0  # requests received and not yet answered (running or waiting for the engine)
        if child:
            ctx = multiprocessing.get_context("spawn")
            self.conn, theirs = ctx.Pipe()
            self.proc = ctx.Process(target=_engine_loop, args=(gpu, busy, size, theirs), daemon=True)
            self.proc.start()
            assert self.conn.recv() == "ready"
        else:
            self.conn, self.proc = None, None
            import torch

            dev = torch.device(f"cuda:{gpu}")
            torch.cuda.set_device(dev)
            self.cache = torch.empty(size * 1024 * 1024, dtype=torch.uint8, device=dev)
            self.a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) / 90.0
            self.busy = busy

    def run(self) -> None:
        """One request's work."""
        self.inflight += 1
        try:
            self._run()
        finally:
            self.inflight -= 1

    def _run(self) -> None:
        with self.lock:
            self.clock.to("gpu")
            if self.conn is not None:
                self.conn.send("go")
                self.conn.recv()
            else:
                import torch

                until, x = time.time() + self.busy, self.a
                while time.time() < until:
                    x = (x @ self.a).clamp_(-1, 1)
                    torch.cuda.synchronize()
            self.served += 1
            self.clock.to("sleep")

    def close(self) -> None:
        """Stop the engine's child."""
        if self.conn is not None:
            self.conn.send(None)
            self.proc.join(5)


def _http_server(engine: _Engine, host: str, port: int, end: float) -> None:
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            """/metrics: the requests running and waiting under vLLM's gauge names, as a vLLM server exports them."""
            if self.path != "/metrics":
                self.send_error(404)
                return
            running = 1 if engine.lock.locked() else 0
            body = (
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="workload"}} {running}\n'
                "# TYPE vllm:num_requests_waiting gauge\n"
                f'vllm:num_requests_waiting{{model_name="workload"}} {max(0, engine.inflight - running)}\n'
                "# TYPE vllm:request_success counter\n"
                f'vllm:request_success_total{{model_name="workload",finished_reason="stop"}} {engine.served}\n'
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            engine.run()
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer((host, port), Handler)
    srv.timeout = 0.5
    while time.time() < end:
        srv.handle_request()


def _grpc_server(engine: _Engine, host: str, port: int, end: float) -> None:
    from concurrent import futures

    import grpc

    def infer(request: bytes, context: Any) -> bytes:
        engine.run()
        return b"ok"

    handler = grpc.method_handlers_generic_handler(
        "gpuwarden.workload.Engine", {"Infer": grpc.unary_unary_rpc_method_handler(infer)}
    )
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=(handler,))
    srv.add_insecure_port(f"[::]:{port}" if host in ("0.0.0.0", "::") else f"{host}:{port}")
    srv.start()
    time.sleep(max(0.0, end - time.time()))
    srv.stop(1)


def _client(proto: str, port: int, pause: float, arrivals: str, end: float) -> None:
    """Requests to the server on localhost ``port`` every ``pause`` seconds (``fixed``, on a steady schedule) or
    ``pause`` apart on average (``poisson``), until ``end``: a client of the service (a process of its own, over
    TCP)."""
    import http.client
    import random

    rng = random.Random(11)
    call = None
    if proto == "grpc":
        import grpc

        call = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary(GRPC_METHOD)
    nxt = time.time()
    while time.time() < end:
        nxt += pause if arrivals == "fixed" else rng.expovariate(1 / pause)
        time.sleep(max(0.0, nxt - time.time()))
        try:
            if call is not None:
                call(b"x", timeout=30)
            else:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("POST", "/v1/infer", body=b'{"prompt": "x"}', headers={"Content-Type": "application/json"})
                conn.getresponse().read()
                conn.close()
        except Exception:  # noqa: BLE001 - a client retries whatever failed
            time.sleep(0.1)


def serve(gpu: int, end: float, busy: float, pause: float, size: int, port: int, host: str, arrivals: str,
          engine: str, proto: str, clock: Any) -> int:  # fmt: skip
    """A model server on ``host``:``port`` (see the module doc) until ``end``; return the requests served."""
    eng = _Engine(gpu, busy, size, engine == "child", clock)
    clock.to("sleep")
    client = multiprocessing.get_context("spawn").Process(
        target=_client, args=(proto, port, pause, arrivals, end), daemon=True
    )
    client.start()
    try:
        (_grpc_server if proto == "grpc" else _http_server)(eng, host, port, end)
    finally:
        client.terminate()
        eng.close()
    return eng.served


def _train(gpu: int) -> None:
    """bf16 products until killed (the stopped job)."""
    import torch

    dev = torch.device(f"cuda:{gpu}")
    torch.cuda.set_device(dev)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) / 90.0
    x = a
    while True:
        for _ in range(10):
            x = (x @ a).clamp_(-1, 1)
        torch.cuda.synchronize()


def stopped_cycles(gpu: int, end: float, busy: float, pause: float, clock: Any) -> int:
    """A training child stopped (SIGSTOP) ``pause`` seconds after every ``busy`` seconds of work, then continued;
    return the cycles. Clock: ``gpu`` while it runs, ``stopped`` while it is stopped."""
    child = multiprocessing.get_context("spawn").Process(target=_train, args=(gpu,), daemon=True)
    child.start()
    time.sleep(8)  # CUDA context and first kernels
    cycles = 0
    try:
        while time.time() < end:
            clock.to("gpu")
            time.sleep(min(busy, max(0.0, end - time.time())))
            os.kill(child.pid, signal.SIGSTOP)
            clock.to("stopped")
            time.sleep(min(pause, max(0.0, end - time.time())))
            os.kill(child.pid, signal.SIGCONT)
            cycles += 1
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
    return cycles


def d2h_copy(dev: Any, end: float, busy: float, size: int, pinned: bool, clock: Any) -> int:
    """Each step ``busy`` seconds of bf16 products, then a ``size`` MiB result copied to host memory (pageable, or
    ``pinned``), blocking; return the steps. Clock: ``gpu``, ``copy``."""
    import torch

    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) / 90.0
    result = torch.empty(size * 1024 * 1024 // 2, dtype=torch.bfloat16, device=dev)
    host = torch.empty(result.shape, dtype=torch.bfloat16, pin_memory=pinned)
    steps = 0
    while time.time() < end:
        clock.to("gpu")
        until, x = time.time() + busy, a
        while time.time() < until:
            x = (x @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
        result.fill_(float(steps % 7))
        torch.cuda.synchronize()
        clock.to("copy")
        host.copy_(result)  # device to host, blocking
        steps += 1
    return steps
