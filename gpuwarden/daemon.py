"""The daemon of ``gpuwarden serve``: build the source, the poller and the app from a Config, apply reloads, and
serve the app through gpuwarden.web.server.listener."""

from __future__ import annotations

import gc
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuwarden.catalog import select_collectors
from gpuwarden.collectors import CollectOptions
from gpuwarden.config import Config, ConfigError
from gpuwarden.exposition import Exposition
from gpuwarden.logs import setup as setup_logs
from gpuwarden.model import GpuReading
from gpuwarden.poller import Analyzer, Poller
from gpuwarden.source import Source
from gpuwarden.web.app import JsonRoute, create_app, diagnosis_route, idleness_route
from gpuwarden.web.gate import AuthGate
from gpuwarden.web.server import listener
from gpuwarden.web.server.limits import HttpLimits, connection_cap, release_free_heap

log = logging.getLogger(__name__)


def build_source(cfg: Config) -> tuple[Source, dict[str, str]]:
    """Return the source the config asks for (replay, demo or live NVML) and labels describing it. The scheduler's
    view (the kubelet's pods, the job mapping directory) annotates every source's polls where configured."""
    annotate = _annotator(cfg)
    if cfg.demo or cfg.replay is not None:
        from gpuwarden.replay import ReplaySource, demo_trace_path  # the trace reader only where a trace is read

        path = demo_trace_path(cfg.demo) if cfg.demo else cfg.replay
        assert path is not None
        return ReplaySource(path, annotate=annotate), {"trace": path.name}
    from gpuwarden.nvml import NvmlSource

    return (
        NvmlSource(
            slow_interval=cfg.slow_interval_seconds,
            gpm_interval=cfg.gpm_interval_seconds,
            processes=cfg.processes.enabled,
            server_requests=cfg.processes.server_requests,
            xid_events=cfg.xid_events,
            gpu_indices=cfg.gpus,
            wait=cfg.wait_for_nvml,
            annotate=annotate,
        ),
        {},
    )


def _annotator(cfg: Config) -> Callable[[list[GpuReading]], list[GpuReading]] | None:
    """What adds the scheduler's view to each poll's GPU readings: the kubelet's pods (``kubelet_socket``), then the
    jobs the job mapping directory allocates each GPU (``job_mapping_dir``: gpuwarden.allocation); None when neither
    is configured. ConfigError for DRA slices that cannot be asked."""
    pods = None
    if cfg.kubelet_socket is not None:
        try:
            import grpc  # noqa: F401 - the kubelet extra, asked before anything starts

            from gpuwarden.kubelet import podresources_pb2  # noqa: F401 - its messages: protobuf
        except ImportError:
            raise ConfigError("kubelet_socket needs grpcio and protobuf: pip install 'gpuwarden[kubelet]' (the image "
                              "has them)") from None  # fmt: skip
        from gpuwarden.kubelet.client import PodResources

        dra = None
        if cfg.dra_resource_slices:
            from gpuwarden.kubelet.resourceslices import DraDevices

            try:
                dra = DraDevices(cfg.node_name or socket.gethostname())
            except ValueError as exc:
                raise ConfigError(f"dra_resource_slices: {exc}") from None
        pods = PodResources(cfg.kubelet_socket, dra=dra).assign
    if cfg.job_mapping_dir is None:
        return pods
    from gpuwarden.allocation import JobMapping

    mapping = JobMapping(cfg.job_mapping_dir)
    if pods is None:
        return mapping.assign
    kubelet = pods
    return lambda gpus: mapping.assign(kubelet(gpus))


def build_analyzers(cfg: Config) -> dict[str, Analyzer]:
    """Return the analyzers run after every poll (scores and diagnosis)."""
    try:
        from gpuwarden.insight.analyzer import InsightAnalyzer
    except ImportError:  # the insight package is optional at this stage
        return {}
    window = cfg.insight.window_seconds
    if window / cfg.poll_interval_seconds > MAX_WINDOW_POLLS:
        bounded = MAX_WINDOW_POLLS * cfg.poll_interval_seconds
        log.warning(
            "insight.window_seconds %g at a %g s poll would hold %d polls per GPU in memory; the window is %g s",
            window,
            cfg.poll_interval_seconds,
            int(window / cfg.poll_interval_seconds),
            bounded,
        )
        window = bounded
    # prepare: the result of a poll is computed when a scrape or an API call first reads it (DeferredInsight)
    analyzer = InsightAnalyzer(window_seconds=window, serving_idle_seconds=cfg.insight.serving_idle_seconds)
    return {"insight": analyzer.prepare}


#: The insight window holds at most this many polls per GPU (an interval is a few hundred bytes in each of three
#: windows): 300 s at a 0.05 s poll; a longer window at a fast poll is shortened, with a warning.
MAX_WINDOW_POLLS = 6000


def collect_options(cfg: Config, http_closed: Mapping[str, int] | None = None) -> CollectOptions:
    """The collectors' knobs from a configuration (process series bound, node name, GPU-hour price) and the HTTP
    server's live count of closed connections."""
    return CollectOptions(
        max_processes_per_gpu=cfg.processes.max_per_gpu if cfg.processes.enabled else 0,
        node_name=cfg.node_name,
        price_per_gpu_hour=cfg.price_per_gpu_hour,
        gpu_hour_prices=dict(cfg.gpu_hour_prices),
        currency=cfg.currency,
        http_closed=http_closed,
    )


WebConfigLike = Any  # gpuwarden.web.config.WebConfig, imported only where a web config is used


def _listener(web: Any) -> tuple[Any, ...]:
    """What of a web config the running listener holds: TLS settings (when on) and the response headers."""
    if web is None:
        return (None, {})
    tls = web.tls_server_config.model_dump() if web.tls_enabled else None
    return (tls, web.http_server_config.headers)


def listener_change(old: Any, new: Any) -> str | None:
    """What a reload of the web config would change that the running listener holds (TLS on or off, its settings,
    the response headers), in words, naming what changed; None when nothing does. ``old`` and ``new``: the web
    configs (None: no web config). A file caught half written reads as TLS turned off or settings gone, and says so."""
    (old_tls, old_headers), (new_tls, new_headers) = _listener(old), _listener(new)
    if old_tls is not None and new_tls is None:
        return ("the web config no longer turns TLS on (no tls_server_config: a file caught half written? write it "
                "whole, to a temporary file renamed over it); TLS on or off applies after a restart")  # fmt: skip
    if old_tls is None and new_tls is not None:
        return "the web config now turns TLS on; TLS on or off applies after a restart"
    if old_tls != new_tls:
        keys = sorted(k for k in {*old_tls, *new_tls} if old_tls.get(k) != new_tls.get(k))
        return f"the web config's TLS settings changed ({', '.join(keys)}); they apply after a restart"
    if old_headers != new_headers:
        return "the web config's response headers changed; they apply after a restart"
    return None


class Daemon:
    """The running daemon: poller + exposition + app. ``start()`` raises SourceError or StartupError."""

    def __init__(
        self,
        cfg: Config,
        extra_routes: Sequence[JsonRoute] | None = None,
        reload: Callable[[], Config] | None = None,
        hup_pending: threading.Event | None = None,
    ) -> None:
        self.cfg = cfg
        self._reload = reload
        self._reload_lock = threading.Lock()  # reloads one at a time
        self._reload_wanted = threading.Event()  # a reload was asked for and has not started yet
        # Raises WebConfigError (one line) for a bad web config file, before anything starts. Imported only when
        # used: bcrypt and ssl are not needed (nor loaded) by a daemon without a web config.
        self.web = None
        self.hup_pending = hup_pending if hup_pending is not None else threading.Event()
        if cfg.web_config_file is not None:
            from gpuwarden.web.config import load_web_config

            self.web = load_web_config(cfg.web_config_file)
        source, info = build_source(cfg)
        analyzers = build_analyzers(cfg)
        self.code_evidence = None
        evidence = cfg.insight.code_evidence
        if evidence.enabled and analyzers:  # live only (config: a replay's PIDs are another machine's)
            from gpuwarden.insight.code_evidence import CodeEvidenceSampler, targets_from

            self.code_evidence = CodeEvidenceSampler(
                lambda: targets_from(self.poller)(),
                evidence.seconds,
                evidence.rate_hertz,
                evidence.every_seconds,
                evidence.py_spy,
            )
            analyzers["code_evidence"] = self.code_evidence.analyzer
        self.poller = Poller(
            source,
            cfg.poll_interval_seconds,
            analyzers=analyzers,
            extra_info=info,
            deadline=cfg.stale_after,
        )
        collectors = select_collectors(cfg.collectors.enable, cfg.collectors.disable, cfg.collectors.disable_defaults)
        self.http_closed: Counter[str] = Counter()  # the HTTP server's, exported by the collectors
        options = collect_options(cfg, self.http_closed)
        self.exposition = Exposition(self.poller, collectors, options)
        self.poller.on_publish = self.exposition.prerender
        self.app = create_app(
            self.poller,
            self.exposition,
            cfg.stale_after,
            [diagnosis_route(self.poller), idleness_route(self.poller)] if extra_routes is None else extra_routes,
            telemetry_path=cfg.telemetry_path,
        )
        # the users' hashes are checked (and the dummy hash made) here, before the daemon says it is ready
        self.gate = AuthGate(self.app)
        self._gate_from(self.web)

    def start(self) -> None:
        """Open the source and take the first poll (raises SourceError).

        Then moves every object alive after start-up (modules, pydantic schemas, the app) out of the garbage
        collector's sight (``gc.freeze``): they live as long as the process, and a full collection would
        otherwise walk them all again and again over the daemon's life; and hands the memory freed by start-up
        (imports, the first poll) back to the system (``release_free_heap``).
        """
        self.poller.start(ready=False)  # a SIGHUP meanwhile sets hup_pending (gpuwarden.cli.main)
        if self.code_evidence is not None:
            self.code_evidence.start()
        gc.collect()
        gc.freeze()
        release_free_heap()

    def reload(self) -> bool:
        """Re-read the configuration (SIGHUP) and apply what can change while running; safe from any thread.

        Collectors, process limits, poll interval and log level apply at once; a change of address, source or
        web config needs a restart and is logged. A bad configuration is logged and the running one kept.
        Reloads run one at a time and the latest wins: a request that comes while one runs is folded into one
        more reload after it (a SIGHUP storm costs at most two), and its caller returns False at once.
        Returns True when this call applied a new configuration.
        """
        if self._reload is None:
            return False
        self._reload_wanted.set()
        applied = False
        while self._reload_wanted.is_set() and self._reload_lock.acquire(blocking=False):
            try:
                while self._reload_wanted.is_set():
                    self._reload_wanted.clear()
                    applied = self._reload_once()
            finally:
                self._reload_lock.release()
            # a request set between the last check and the release is picked up by the outer loop
        return applied

    def _reload_once(self) -> bool:
        assert self._reload is not None
        try:
            new = self._reload()
            web = self._reload_web(new)
            if self.web is not None:
                # the same files, rotated on disk: read before anything is applied, so that a pair caught half
                # written refuses the whole reload and the running configuration stays whole
                self.web.reload_certificates()
        except ConfigError as exc:
            log.error("reload refused, keeping the running configuration: %s", exc)
            self.poller.reload_successful = False
            return False
        collectors = select_collectors(new.collectors.enable, new.collectors.disable, new.collectors.disable_defaults)
        options = collect_options(new, self.http_closed)
        self.exposition.reconfigure(collectors, options)
        self.poller.interval = new.poll_interval_seconds
        self.poller.deadline = new.stale_after
        setup_logs(new.log_level, new.log_format)
        restart_keys = ("listen_address", "replay", "demo", "gpus", "xid_events", "wait_for_nvml")
        for key in (*restart_keys, "slow_interval_seconds", "gpm_interval_seconds"):
            if getattr(new, key) != getattr(self.cfg, key):
                log.warning("reload: %s changed; it takes effect after a restart", key)
        self.cfg = new
        self._gate_from(web)
        self.poller.reload_successful = True
        self.poller.reload_success_timestamp = time.time()
        log.info("configuration reloaded")
        return True

    def _gate_from(self, web: WebConfigLike | None) -> None:
        """Give the gate the users and the rate limit of ``web`` (None: no web config, neither)."""
        self.gate.set_users(web.users if web is not None else {})
        limit = web.rate_limit if web is not None else None
        self.gate.set_rate_limit(limit.interval_seconds if limit else 0.0, limit.burst if limit else 0)

    def _reload_web(self, new: Config) -> WebConfigLike | None:
        """Load the web config ``new`` names; raise ConfigError (the reload is refused whole) when it is invalid or
        changes what a running listener cannot change: TLS on or off, its settings, the response headers."""
        fresh = None
        if new.web_config_file is not None:
            from gpuwarden.web.config import load_web_config

            fresh = load_web_config(new.web_config_file)
        change = listener_change(self.web, fresh)
        if change is not None:
            raise ConfigError(f"{change} (users apply on reload)")
        return fresh

    @property
    def scheme(self) -> str:
        """``https`` when the web config enables TLS, else ``http``."""
        return "https" if self.web is not None and self.web.tls_enabled else "http"

    def serve(self, sock: socket.socket) -> None:
        """Serve HTTP on ``sock`` until SIGINT/SIGTERM; then stop the poller (nvmlShutdown). READY=1 is sent once
        the server listens with its signal handlers in place."""
        cap, backlog, warning = connection_cap(self.cfg.max_connections)
        if warning:
            log.warning(warning)
        self.http_limits = HttpLimits(
            max_connections=cap,
            backlog=backlog,
            head_timeout=self.cfg.request_head_timeout_seconds,
            keep_alive=self.cfg.keep_alive_timeout_seconds,
            max_head_bytes=self.cfg.max_request_head_bytes,
            max_unsent_bytes=self.cfg.max_unsent_bytes,
            send_timeout=self.cfg.send_timeout_seconds,
            counts=self.http_closed,
        )
        try:
            listener.serve(
                self.gate,
                sock,
                self.http_limits,
                on_hup=self.reload,
                on_ready=lambda: self.poller.notifier.ready(self.poller.ready_status()),
                hup_pending=self.hup_pending,
                tls=None if self.web is None else self.web.listener_context(),
                headers=() if self.web is None else self.web.response_headers(),
            )
        finally:
            self.poller.stop()


def bind(cfg: Config) -> socket.socket:
    """Return a listening socket on cfg's ``listen_address``. Raises StartupError with one line when it cannot."""
    return listener.bind(cfg.listen_address, cfg.host, cfg.port)
