"""The reclaim ladder's parts without Prometheus: the policy file (bad ones are one line and exit 2), the ladder's
climb, gaps and resets on ticks of facts, and the actions' bounds (a command that fails, hangs or floods, a hostile
value, a webhook that never answers)."""

from __future__ import annotations

import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpuwarden.cli import main
from gpuwarden.cluster.usage import IdleFacts, JobKey
from gpuwarden.reclaim.actions import MAX_QUEUED, OUTPUT_BYTES, ActionRunner, fill, post_webhook, run_command, values
from gpuwarden.reclaim.ladder import RESET, Decision, Ladder
from gpuwarden.reclaim.policy import Policy, PolicyError, load_policy

POLICY = {
    "interval": "1m",
    "steps": [
        {"name": "notify", "after": "10m"},
        {"name": "warn", "after": "20m"},
        {"name": "reclaim", "after": "30m"},
    ],
}
JOB = JobKey("4242", None, ("c1",))


def _facts(
    held: float = 60.0, idle: float = 60.0, reasons: tuple[str, ...] = ("held_idle",), gpus: int = 1
) -> IdleFacts:
    f = IdleFacts(held_seconds=held * gpus, reclaimable_seconds=idle * gpus, kind="slurm")
    f.gpus = {(f"n{i}:10400", "0") for i in range(gpus)}
    f.reasons = set(reasons)
    return f


def _run(ladder: Ladder, minutes: range, facts: IdleFacts) -> list[tuple[int, str]]:
    out = []
    for m in minutes:
        out += [(m, d.step) for d in ladder.tick(m * 60.0, 60.0, {JOB: facts})]
    return out


# --- the policy file -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("steps: []\n", "steps: List should have at least 1 item"),
        ("interval: 1m\nsteps:\n  - {name: a, after: 10m}\n  - {name: b, after: 5m}\n", "longer than the one before"),
        ("steps:\n  - {name: a, after: soon}\n", "steps.0.after: not a duration"),
        ("steps:\n  - {name: a, after: 1m, command: [echo, '{password}']}\n", "unknown placeholder {password}"),
        ("steps:\n  - {name: a, after: 1m, command: [echo, '{job_id']}\n", "malformed template"),
        ("steps:\n  - {name: a, after: 1m, command: [x], webhook: {url: 'http://h'}}\n", "a command or a webhook"),
        ("reclaimable_causes: [free]\nsteps:\n  - {name: a, after: 1m}\n", "not an idle cause a job can be reclaimed"),
        ("climbing_verdicts: [sleepy]\nsteps:\n  - {name: a, after: 1m}\n", "'sleepy' is not a verdict"),
        ("exempt_jobs: ['(']\nsteps:\n  - {name: a, after: 1m}\n", "not a regular expression"),
        ("steps:\n  - {name: a, after: 1m}\nreclaim_everything: true\n", "unknown key 'reclaim_everything'"),
        ("steps:\n  - {name: a, after: 1m, webhook: {url: 'ftp://h'}}\n", "steps.0.webhook.url"),
        ("steps: [\n", "invalid YAML"),
        ("interval: 5m\nsteps:\n  - {name: a, after: 1m}\n", "shorter than interval"),
    ],
)
def test_a_bad_policy_is_one_line_and_exit_2(
    tmp_path: Path, text: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=None) as err:
        load_policy(path)
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert main(["reclaim", "--policy", str(path), "--prometheus", "http://127.0.0.1:9", "--report"]) == 2
    _, stderr = capsys.readouterr()
    assert stderr.count("\n") == 1 and expected in stderr


def test_a_missing_policy_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reclaim", "--policy", str(tmp_path / "none.yml"), "--prometheus", "http://127.0.0.1:9"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_defaults_are_safe() -> None:
    policy = Policy.model_validate(POLICY)
    assert policy.dry_run is True
    # paused (idle within seconds of GPU work) is how a server waiting for requests reads: not climbed by default;
    # held idle (memory held, nothing works) and allocated and never opened are
    assert policy.reclaimable_causes == ["held_idle", "allocated_idle"]
    assert policy.climbing_verdicts == ["held_idle", "allocated_idle"]
    assert "paused" not in policy.reclaimable_causes
    assert "job_paused" in policy.blocking_verdicts()
    assert {"input_starved", "launch_bound", "waiting_on_peers", "checkpoint_bound", "starting"} <= (
        policy.blocking_verdicts()
    )


# --- the ladder ----------------------------------------------------------------------------------------------------


def test_an_idle_job_climbs_one_step_at_a_time() -> None:
    ladder = Ladder(Policy.model_validate(POLICY))
    assert _run(ladder, range(1, 40), _facts()) == [(10, "notify"), (20, "warn"), (30, "reclaim")]
    assert ladder.position(JOB) == "reclaim"


def test_an_idle_server_gets_the_notice_alone_and_only_where_the_policy_lets_it_climb() -> None:
    """A server that says nobody asks it (serving_idle) is live: by default its verdict stops the climb; a policy that
    lists it gets its first step (the notice) and never the steps after, however long it stays idle."""
    server = _facts(reasons=("serving_idle",))
    assert _run(Ladder(Policy.model_validate(POLICY)), range(1, 40), server) == []
    lets = {**POLICY, "climbing_verdicts": ["held_idle", "serving_idle"], "reclaimable_causes": ["serving_idle"]}
    ladder = Ladder(Policy.model_validate(lets))
    assert _run(ladder, range(1, 60), server) == [(10, "notify")]
    assert ladder.position(JOB) == "notify"
    # a job with a held idle GPU beside it climbs as any other
    assert _run(Ladder(Policy.model_validate(lets)), range(1, 40), _facts()) == [(10, "notify"), (20, "warn"),
                                                                                  (30, "reclaim")]  # fmt: skip


def test_a_ladder_started_late_still_gives_each_step_its_gap() -> None:
    """Warmed up on an hour of history (no step taken), the job gets notify at once and each next step a gap later,
    not all three at the first tick."""
    ladder = Ladder(Policy.model_validate(POLICY))
    for m in range(1, 61):
        assert ladder.tick(m * 60.0, 60.0, {JOB: _facts()}, climb=False) == []
    assert _run(ladder, range(61, 90), _facts()) == [(61, "notify"), (71, "warn"), (81, "reclaim")]


@pytest.mark.parametrize(
    ("facts", "why"),
    [
        (_facts(idle=30.0), "idle below 95%"),  # half its held time starved, launching, checkpointing ...
        (_facts(reasons=("held_idle", "input_starved")), "input_starved (a working job never climbs)"),
        (_facts(reasons=("launch_bound",)), "launch_bound"),
        (_facts(reasons=("waiting_on_peers",)), "waiting_on_peers"),
        (_facts(reasons=("checkpoint_bound",)), "checkpoint_bound"),
        (_facts(reasons=("starting",)), "starting"),
        (_facts(held=30.0, idle=30.0), "held less than 90% of the tick"),  # a job that just came
    ],
)
def test_a_working_or_new_job_never_climbs(facts: IdleFacts, why: str) -> None:
    ladder = Ladder(Policy.model_validate(POLICY))
    assert _run(ladder, range(1, 60), facts) == []
    idle, evidence = ladder.idle(facts, 60.0)
    assert not idle and why in evidence


def test_one_working_tick_sends_the_job_back_to_the_bottom() -> None:
    ladder = Ladder(Policy.model_validate(POLICY))
    got = _run(ladder, range(1, 16), _facts())
    got += [(16, d.step) for d in ladder.tick(16 * 60.0, 60.0, {JOB: _facts(idle=10.0)})]
    got += _run(ladder, range(17, 30), _facts())
    assert got == [(10, "notify"), (16, RESET), (26, "notify")]


def test_a_job_that_ends_leaves_the_ladder_and_an_exempt_one_never_climbs() -> None:
    ladder = Ladder(Policy.model_validate({**POLICY, "exempt_jobs": ["42.*"]}))
    assert _run(ladder, range(1, 40), _facts()) == []
    ladder = Ladder(Policy.model_validate(POLICY))
    _run(ladder, range(1, 12), _facts())
    ladder.tick(12 * 60.0, 60.0, {})
    assert JOB not in ladder.jobs


def test_a_multi_node_job_is_weighed_whole() -> None:
    """Four GPUs on four nodes, one of them idle and three working: 25% idle, no climb."""
    facts = _facts(gpus=4)
    facts.reclaimable_seconds = 60.0
    assert _run(Ladder(Policy.model_validate(POLICY)), range(1, 40), facts) == []


# --- the actions ---------------------------------------------------------------------------------------------------


def _decision(**names: str) -> Decision:
    f = _facts()
    f.names.update(names)
    return Decision(600.0, JOB, "notify", 0, 600.0, f, "evidence")


def test_templates_take_the_jobs_names_and_refuse_hostile_or_missing_ones() -> None:
    given = values(_decision(namespace="ml", pod="train-0"))
    assert fill("--job={slurm_job_id}", given) == "--job=4242"  # a Slurm job's id is its number
    assert fill("{namespace}/{pod}", given) == "ml/train-0"
    hostile = values(_decision(pod="-rf", namespace="a\x1b[2Jb"))
    for template, why in (("{pod}", "begin with '-'"), ("{namespace}", "control characters"),
                          ("{job_id}x{pod}", "begin")):  # fmt: skip
        if why == "begin":
            assert fill(template, hostile) == "4242x-rf"  # not at the start: an argument, not an option
            continue
        with pytest.raises(Exception, match=why):
            fill(template, hostile)
    with pytest.raises(Exception, match="not known"):
        fill("{pod}", values(_decision()))


@pytest.mark.parametrize("named", ["9999", "4243,4244,4245", "4242"])
def test_a_slurm_number_from_a_process_environment_is_never_acted_on(named: str) -> None:
    """A SLUID-keyed job's Slurm number comes from its processes' environment (SLURM_JOB_ID), which the tenant sets:
    a step that needs {slurm_job_id} is refused for it, whatever the number (another user's job, a list of jobs, even
    one that looks right); {job_id} gives the SLUID."""
    f = _facts()
    f.names["slurm_job_id"] = named
    given = values(Decision(600.0, JobKey("sEKNKTV3WPV500", None, ("c1",)), "notify", 0, 600.0, f, "evidence"))
    with pytest.raises(Exception, match="not known"):
        fill("{slurm_job_id}", given)
    assert fill("{job_id}", given) == "sEKNKTV3WPV500"


def test_only_ascii_digits_are_a_slurm_number() -> None:
    f = _facts()
    given = values(Decision(600.0, JobKey("٤٢٤٢", None, ("c1",)), "notify", 0, 600.0, f, "evidence"))  # Arabic-Indic
    with pytest.raises(Exception, match="not known"):
        fill("{slurm_job_id}", given)


def test_a_command_that_fails_hangs_or_floods_is_bounded() -> None:
    assert run_command([sys.executable, "-c", "print('ok')"], 10) == ("ran", "ok")
    outcome, detail = run_command([sys.executable, "-c", "import sys; print('no'); sys.exit(3)"], 10)
    assert outcome == "failed" and "exit status 3" in detail
    t0 = time.monotonic()
    outcome, detail = run_command([sys.executable, "-c", "import time; time.sleep(60)"], 0.5)
    assert outcome == "timed_out" and time.monotonic() - t0 < 10
    flood = "import sys\nfor _ in range(20000): sys.stdout.write('x' * 8192)"
    outcome, detail = run_command([sys.executable, "-c", flood], 30)
    assert outcome == "ran" and len(detail) <= OUTPUT_BYTES  # 160 MB of output read and dropped
    assert run_command(["/nonexistent/scancel"], 5)[0] == "failed"


def test_a_hook_that_hangs_never_holds_up_the_ladder() -> None:
    """Actions run in workers: submitting returns at once, past MAX_QUEUED waiting ones are dropped, and each
    outcome is reported."""
    policy = Policy.model_validate(
        {
            **POLICY,
            "max_concurrent_actions": 1,
            "steps": [
                {
                    "name": "notify",
                    "after": "10m",
                    "command": [sys.executable, "-c", "import time; time.sleep(2)"],
                    "timeout_seconds": 1,
                }
            ],
        }  # fmt: skip
    )
    outcomes: list[str] = []
    done = threading.Event()

    def outcome(d: Decision, what: str, detail: str) -> None:
        outcomes.append(what)
        if what == "timed_out":
            done.set()

    runner = ActionRunner(False, outcome, max_concurrent=1)
    t0 = time.monotonic()
    for _ in range(MAX_QUEUED + 5):
        runner.submit(_decision(), policy.steps[0])
    assert time.monotonic() - t0 < 1.0
    assert outcomes.count("dropped") >= 4
    assert done.wait(10)
    runner.close(wait=False)


def test_dry_run_runs_nothing() -> None:
    outcomes: list[tuple[str, str]] = []
    step = Policy.model_validate({**POLICY, "steps": [{"name": "n", "after": "10m", "command": ["false"]}]}).steps[0]
    ActionRunner(True, lambda d, o, detail: outcomes.append((o, detail))).submit(_decision(), step)
    assert outcomes == [("dry_run", "dry run: nothing was run")]


class _Slow(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == "/ok":
            self.send_response(204)
            self.end_headers()
            return
        self.wfile.write(b"HTTP/1.1 200 OK\r\n")  # then a header byte a second: no read waits long
        for _ in range(30):
            try:
                self.wfile.write(b"X")
                self.wfile.flush()
            except OSError:
                return
            time.sleep(1)


def test_a_webhook_gets_the_decision_and_one_that_drips_times_out() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        assert post_webhook(url + "/ok", {}, {"job_id": "4242"}, 5) == ("ran", "HTTP 204")
        t0 = time.monotonic()
        assert post_webhook(url + "/drip", {}, {"job_id": "4242"}, 1.0)[0] == "timed_out"
        assert time.monotonic() - t0 < 3
    finally:
        httpd.shutdown()


def test_the_example_policy_loads_and_runs_dry() -> None:
    policy = load_policy(Path(__file__).parent.parent / "deploy" / "reclaim-policy.example.yml")
    assert policy.dry_run and [s.name for s in policy.steps] == ["notify", "warn", "reclaim"]
    assert policy.steps[2].command == ["scontrol", "requeue", "{slurm_job_id}"]
    assert policy.selector == "" and policy.job_selector == 'job_kind="slurm"'


@pytest.mark.parametrize("selector", ['job_kind="slurm"', 'cluster="a",user=~"al.*"', 'namespace!="ml"'])
def test_a_job_label_in_the_selector_is_refused_with_where_it_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], selector: str
) -> None:
    """The selector matches every series the ladder reads; the GPU counters carry no job label, so a job label there
    would select no GPU time and nothing would ever climb: refused, in the file and on the command line."""
    policy = tmp_path / "p.yml"
    policy.write_text(f"selector: '{selector}'\nsteps: [{{name: notify, after: 5m}}]\n")
    assert main(["reclaim", "--policy", str(policy), "--prometheus", "http://127.0.0.1:9", "--report"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "put it in job_selector" in err
    policy.write_text("steps: [{name: notify, after: 5m}]\n")
    argv = ["reclaim", "--policy", str(policy), "--prometheus", "http://127.0.0.1:9", "--report"]
    assert main([*argv, "--selector", selector]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "put it in job_selector" in err and "selector" in err
    policy.write_text("selector: 'cluster=\"job_kind=x\"'\nsteps: [{name: notify, after: 5m}]\n")  # a value
    assert load_policy(policy).selector == 'cluster="job_kind=x"'


def test_the_controller_logs_counts_and_serves_each_decision(caplog: pytest.LogCaptureFixture) -> None:
    import httpx
    from helpers import free_port

    from gpuwarden.cluster.promapi import InstantQueries
    from gpuwarden.reclaim.controller import Controller, ReclaimMetrics

    policy = Policy.model_validate(POLICY)
    metrics = ReclaimMetrics(policy, True, ("cluster",))
    ticks = iter([_facts()] * 31 + [_facts(reasons=("input_starved",))])

    class Fed(Controller):
        def facts(self, at: float, queries: InstantQueries | None = None) -> dict[JobKey, IdleFacts]:
            return {JOB: next(ticks)}

    controller = Fed(policy, connect=lambda: None, dry_run=True, metrics=metrics)  # type: ignore[arg-type,return-value]
    port = free_port()
    metrics.serve(f"127.0.0.1:{port}")
    with caplog.at_level("INFO", logger="gpuwarden.reclaim"):
        for m in range(1, 32):
            controller.evaluate(m * 60.0)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert 'gpuwarden_reclaim_decisions_total{outcome="dry_run",step="reclaim"} 1.0' in text
        assert 'gpuwarden_reclaim_job_step{cluster="c1",instance="",job_id="4242",step="reclaim"} 1.0' in text
        assert "gpuwarden_reclaim_dry_run 1.0" in text and "gpuwarden_reclaim_evaluations_total 31.0" in text
        controller.evaluate(32 * 60.0)  # it works again
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert 'gpuwarden_reclaim_decisions_total{outcome="reset",step="reset"} 1.0' in text
    assert "gpuwarden_reclaim_job_step{" not in text
    lines = [r for r in caplog.records if r.name == "gpuwarden.reclaim"]
    assert [getattr(r, "step", None) for r in lines] == ["notify", "warn", "reclaim", "reset"]
    assert all(getattr(r, "evidence", "") for r in lines) and getattr(lines[-1], "outcome", "") == "reset"


class _EmptyProm(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        kind = b"matrix" if self.path.startswith("/api/v1/query_range") else b"vector"  # the warm-up's range queries
        body = b'{"status": "success", "data": {"resultType": "' + kind + b'", "result": []}}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_no_credential_in_the_prometheus_url_reaches_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The controller's queries to a Prometheus URL with user:password: httpx logs each request's URL at INFO, which
    would write the password (and a chat webhook's URL, its secret) into the log at every tick."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _EmptyProm)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    policy = tmp_path / "p.yml"
    policy.write_text("steps: [{name: notify, after: 5m}]\n")
    try:
        url = f"http://scraper:s3kr1t-pw@127.0.0.1:{httpd.server_address[1]}"
        assert main(["reclaim", "--policy", str(policy), "--prometheus", url, "--once"]) == 0
    finally:
        httpd.shutdown()
    out = capsys.readouterr()
    assert "s3kr1t-pw" not in out.err + out.out


def _alive(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(name) and t.is_alive()]


def test_no_child_or_reading_thread_outlives_a_command_for_long() -> None:
    """A command that leaves a child in the background holding its output: the child is killed with the group when
    the command ends, and the reading thread ends within the grace (before: both lived as long as the child, 30 s)."""
    before = set(_alive("gpuwarden-reclaim-output"))  # an earlier test's command on this worker is not this one's
    t0 = time.monotonic()
    outcome, detail = run_command(["sh", "-c", "sleep 30 & echo started"], 10)
    assert (outcome, detail) == ("ran", "started") and time.monotonic() - t0 < 5
    assert set(_alive("gpuwarden-reclaim-output")) - before == set()
    # a child that left the group (setsid) is its own, but its pipe is not read for ever
    outcome, _ = run_command(["sh", "-c", "setsid sleep 31.25 & echo started"], 10)
    assert outcome == "ran" and set(_alive("gpuwarden-reclaim-output")) - before == set()
    import psutil

    left = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "31.25"]]
    for p in left:
        p.kill()


def test_a_webhook_that_drips_its_headers_leaves_no_thread_behind() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        t0 = time.monotonic()
        url = f"http://127.0.0.1:{httpd.server_address[1]}/drip"
        assert post_webhook(url, {}, {"job_id": "4242"}, 1.0)[0] == "timed_out"
        deadline = time.monotonic() + 5
        while _alive("gpuwarden-reclaim-webhook") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive("gpuwarden-reclaim-webhook") == [], "the webhook's thread still reads the dripping answer"
        assert time.monotonic() - t0 < 6
    finally:
        httpd.shutdown()
