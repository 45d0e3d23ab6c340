"""Reload semantics of security (basic auth on, changed and off by SIGHUP; TLS changes refused whole), SIGHUP at
any moment after start, stricter web config checks, and authentication that cannot be timed or crowded out."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import bcrypt
import httpx
import pytest
from helpers import free_port as _free_port

from gpuwarden.config import ConfigError
from gpuwarden.web.auth import BasicAuthMiddleware
from gpuwarden.web.config import MAX_BCRYPT_COST, load_web_config

HASH4 = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()


def _start(args: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "serve", "--demo", "--web.listen-address", f"127.0.0.1:{port}", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, f"http://127.0.0.1:{port}"


def _wait(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the daemon exited"
        try:
            httpx.get(url + "/healthz", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    pytest.fail("the daemon did not start")


def _status(url: str, auth: tuple[str, str] | None = None) -> int:
    return httpx.get(url + "/metrics", auth=auth, timeout=5).status_code


def _eventually(url: str, text: str, auth: tuple[str, str] | None = None) -> None:
    """Scrape until ``text`` shows (a value changes with the next poll's snapshot), at most 5 s."""
    deadline = time.monotonic() + 5
    while text not in httpx.get(url + "/metrics", auth=auth, timeout=5).text:
        assert time.monotonic() < deadline, f"{text!r} never showed"
        time.sleep(0.2)


def _reload(proc: subprocess.Popen[bytes], log: Path, n: int) -> None:
    """SIGHUP, then wait for the n-th reload's log line (applied or refused)."""
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = log.read_text()
        if text.count("configuration reloaded") + text.count("reload refused") >= n:
            return
        time.sleep(0.05)
    pytest.fail("no reload line: " + log.read_text()[-2000:])


@pytest.mark.e2e
def test_basic_auth_turns_on_changes_and_off_by_sighup_and_tls_changes_are_refused(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("")  # no users: open
    cfg = tmp_path / "c.yml"
    cfg.write_text(f"web_config_file: {web}\nlog_level: info\n")
    log = tmp_path / "serve.log"
    proc, url = _start(["--config.file", str(cfg)], log)
    try:
        _wait(url, proc)
        assert _status(url) == 200
        web.write_text(f"basic_auth_users:\n  prometheus: '{HASH4}'\n")
        _reload(proc, log, 1)
        assert _status(url) == 401 and _status(url, ("prometheus", "pw")) == 200  # on at the next request
        other = bcrypt.hashpw(b"new", bcrypt.gensalt(4)).decode()
        web.write_text(f"basic_auth_users:\n  prometheus: '{other}'\n")
        _reload(proc, log, 2)
        assert _status(url, ("prometheus", "pw")) == 401 and _status(url, ("prometheus", "new")) == 200
        web.write_text("tls_server_config:\n  cert_file: /nonexistent.pem\n  key_file: /nonexistent.key\n")
        _reload(proc, log, 3)
        assert "reload refused" in log.read_text()
        assert _status(url, ("prometheus", "new")) == 200 and _status(url) == 401  # the running config kept whole
        _eventually(url, "gpuwarden_config_last_reload_successful 0.0", ("prometheus", "new"))  # from the next poll
        web.write_text("")
        _reload(proc, log, 4)
        assert _status(url) == 200  # every user removed: auth off, as at start-up
        _eventually(url, "gpuwarden_config_last_reload_successful 1.0")
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.e2e
def test_sighup_at_any_moment_after_start_is_survived(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    proc, url = _start([], log)
    time.sleep(0.5)  # the interpreter itself starting: no program can take a signal before it runs
    try:
        deadline = time.monotonic() + 30
        served = False
        while time.monotonic() < deadline and not served:
            time.sleep(0.02)
            assert proc.poll() is None, "killed by a SIGHUP: " + log.read_text()[-2000:]
            proc.send_signal(signal.SIGHUP)
            try:
                served = httpx.get(url + "/metrics", timeout=1).status_code == 200
            except httpx.HTTPError:
                pass
        assert served
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert proc.poll() is None and _status(url) == 200
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('http_server_config:\n  headers:\n    X-Frame-Options: "deny\\r\\nX-Evil: 1"\n', "control character"),
        ("http_server_config:\n  headers:\n    X-Frame-Options: allowall\n", "must be one of deny, sameorigin"),
        ("basic_auth_users:\n  a: '$2$10$" + "a" * 53 + "'\n", "not a bcrypt hash"),
        ("basic_auth_users:\n  a: x\nbasic_auth_users:\n  b: y\n", "duplicate key 'basic_auth_users'"),
        (
            f"basic_auth_users:\n  a: '$2b$15${'a' * 53}'\n",
            f"bcrypt cost 15, above the {MAX_BCRYPT_COST} accepted",
        ),
    ],
)
@pytest.mark.e2e
def test_web_config_checks_as_strict_as_promtool(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("$", r"\$")) as info:
        load_web_config(path)
    assert "\n" not in str(info.value)
    res = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "serve", "--demo", "--web.config.file", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ},
    )
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_unknown_and_low_cost_users_do_the_highest_costs_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user whose hash has cost 4, and an unknown user, are checked with the work of the highest cost in use (10)
    too, so that a guesser cannot tell them from a real, costly user by the time an answer takes. The bcrypt costs
    checked are counted (what each answer's time is made of), not the time itself: a loaded machine's clock says
    nothing."""
    import base64

    from gpuwarden.web import auth

    slow = bcrypt.hashpw(b"other", bcrypt.gensalt(10))
    mw = BasicAuthMiddleware(None, {"fast": HASH4.encode(), "slow": slow})  # type: ignore[arg-type]
    real = auth._checkpw  # noqa: SLF001 - counted, then called
    costs: list[int] = []

    def counted(password: bytes, hashed: bytes) -> bool:
        costs.append(int(hashed[4:6]))
        return real(password, hashed)

    monkeypatch.setattr(auth, "_checkpw", counted)

    def checked(user: str) -> list[int]:
        costs.clear()
        header = b"Basic " + base64.b64encode(f"{user}:wrong".encode())
        assert asyncio.run(mw.authorized(header)) is False
        return sorted(costs)

    assert checked("fast") == [4, 10]  # its own hash, then the highest cost's work
    assert checked("ghost") == [10]  # the dummy hash, at the highest cost
    assert checked("slow") == [10]


def test_guessers_cannot_queue_without_bound() -> None:
    """Past ``max_waiting`` checks in line behind the one in progress, a request is refused at once."""
    import base64

    slow = bcrypt.hashpw(b"pw", bcrypt.gensalt(10))
    mw = BasicAuthMiddleware(None, {"u": slow}, max_waiting=2)  # type: ignore[arg-type]
    header = b"Basic " + base64.b64encode(b"u:wrong")

    async def crowd() -> list[float]:
        async def one() -> float:
            t0 = time.perf_counter()
            await mw.authorized(header)
            return time.perf_counter() - t0

        return list(await asyncio.gather(*(one() for _ in range(6))))

    times = sorted(asyncio.run(crowd()))
    assert times[0] < 0.02  # refused at once
    assert sum(t > 0.02 for t in times) == 3  # only the one in progress and the two in line were checked


def bcrypt_order(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The passwords in the order bcrypt begins checking them, from now on (gpuwarden.web.auth's check, wrapped)."""
    from gpuwarden.web import auth

    started: list[bytes] = []
    real = auth._checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        started.append(password)
        return real(password, hashed)

    monkeypatch.setattr(auth, "_checkpw", counting)
    return started


def test_a_right_password_is_checked_next_whatever_the_guessers_on_failed_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Twenty guessers on keep-alive connections (each failed a check already) fill their lane; each of 12 right
    logins, on a new connection and not yet cached, is checked next: no guess starts between its arrival and its
    own check, but one already handed the turn (counted in bcrypt's order, not in seconds: a loaded machine)."""
    import base64

    started = bcrypt_order(monkeypatch)
    users = {f"u{i}": bcrypt.hashpw(f"pw{i}".encode(), bcrypt.gensalt(8)) for i in range(12)}
    mw = BasicAuthMiddleware(None, users)  # type: ignore[arg-type]

    async def attack() -> tuple[list[bool], list[int], int]:
        stop = asyncio.Event()
        guesses = [0]
        checked: set[int] = set()

        async def guesser(port: int) -> None:
            mine = f"wrong-{port}".encode()
            header = b"Basic " + base64.b64encode(b"u0:" + mine)
            while not stop.is_set():
                await mw.authorized(header, ("10.0.0.9", port))
                if mine in started:  # this connection has failed a check (its call has returned)
                    checked.add(port)
                guesses[0] += 1
                await asyncio.sleep(0.001)  # a round trip, then the next request on the same connection

        crowd = [asyncio.create_task(guesser(40000 + i)) for i in range(20)]
        deadline = time.monotonic() + 30
        while len(checked) < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        results, ahead = [], []
        for i in range(12):
            header = b"Basic " + base64.b64encode(f"u{i}:pw{i}".encode())
            mark = len(started)
            results.append(await mw.authorized(header, ("10.0.0.9", 50000 + i)))
            own = started.index(f"pw{i}".encode(), mark) if f"pw{i}".encode() in started[mark:] else len(started)
            ahead.append(sum(p.startswith(b"wrong") for p in started[mark:own]))
        stop.set()
        await asyncio.gather(*crowd)
        return results, ahead, guesses[0]

    results, ahead, guesses = asyncio.run(attack())
    assert results == [True] * 12
    assert max(ahead) <= 1, ahead  # guesses begun between a right login's arrival and its own check
    assert guesses > 20  # the guessers kept going meanwhile


def test_a_crowd_of_guessers_from_one_address_waits_behind_its_own_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fifty fresh keep-alive guessers from one address and a scraper from another, all arriving at once (nothing
    cached: a restart): the scraper's first request is checked after at most the check in progress and one guess,
    not refused (before: the fifty filled the first lane, the scraper got 401 at once and its next scrape waited
    behind every guesser's check, past Prometheus's 10 s timeout at bcrypt cost 12)."""
    import base64

    started = bcrypt_order(monkeypatch)
    mw = BasicAuthMiddleware(None, {"u1": bcrypt.hashpw(b"pw1", bcrypt.gensalt(4))})  # type: ignore[arg-type]

    async def attack() -> tuple[bool, int]:
        stop = asyncio.Event()

        async def guesser(port: int) -> None:
            header = b"Basic " + base64.b64encode(f"u1:wrong-{port}".encode())
            while not stop.is_set():
                await mw.authorized(header, ("10.0.0.9", port))
                await asyncio.sleep(0)

        crowd = [asyncio.create_task(guesser(40000 + i)) for i in range(50)]
        await asyncio.sleep(0)  # every guesser has asked: one checking, the rest in line or refused
        first = await mw.authorized(b"Basic " + base64.b64encode(b"u1:pw1"), ("10.0.0.2", 9999))
        stop.set()
        await asyncio.gather(*crowd)
        return first, started.index(b"pw1") if b"pw1" in started else len(started)

    first, ahead = asyncio.run(attack())
    assert first
    assert ahead <= 2, ahead  # the guess in progress, and one of the crowd's address in its turn


@pytest.mark.e2e
def test_keep_alive_guessers_do_not_lock_out_a_right_login_on_a_live_daemon(tmp_path: Path) -> None:
    """Fifty keep-alive password guessers against a daemon just started (nothing cached, no connection failed yet),
    a scraper's keep-alive connection among them; then 12 users log in right for the first time, each on a new
    connection: every login gets 200, and so do the scraper's scrapes once its first check came (before: with 5
    guessers all 12 logins got 401; with 50, every login and every scrape did)."""
    users = {f"u{i}": bcrypt.hashpw(f"pw{i}".encode(), bcrypt.gensalt(10)).decode() for i in range(12)}
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n" + "".join(f"  {u}: '{h}'\n" for u, h in users.items()))
    cfg = tmp_path / "c.yml"
    cfg.write_text(f"web_config_file: {web}\n")
    log = tmp_path / "serve.log"
    proc, url = _start(["--config.file", str(cfg)], log)
    stop = threading.Event()
    guesses = [0]
    scrapes: list[int] = []

    def guess() -> None:
        with httpx.Client(timeout=30) as c:  # one keep-alive connection
            while not stop.is_set():
                assert c.get(url + "/metrics", auth=("u0", "wrong")).status_code == 401
                guesses[0] += 1

    def scrape() -> None:
        with httpx.Client(timeout=30) as c:  # Prometheus's keep-alive connection
            while not stop.is_set():
                scrapes.append(c.get(url + "/metrics", auth=("u1", "pw1")).status_code)
                stop.wait(0.5)

    try:
        _wait(url, proc)
        crowd = [threading.Thread(target=guess) for _ in range(50)] + [threading.Thread(target=scrape)]
        for t in crowd:
            t.start()
        while guesses[0] < 100:
            time.sleep(0.05)
        answers, waits = [], []
        for i in range(12):
            t0 = time.monotonic()
            answers.append(httpx.get(url + "/metrics", auth=(f"u{i}", f"pw{i}"), timeout=30).status_code)
            waits.append(time.monotonic() - t0)
        deadline = time.monotonic() + 60
        while scrapes.count(200) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        for t in crowd:
            t.join()
    finally:
        stop.set()
        proc.terminate()
        proc.wait(10)
    assert answers == [200] * 12, (answers, waits)
    assert max(waits) < 5.0, waits  # a check or two (bcrypt cost 10)
    first = scrapes.index(200)
    assert scrapes.count(200) >= 3 and set(scrapes[first:]) == {200}, scrapes  # once in, cached: never refused again


def test_fifty_fresh_guessers_after_a_restart_lock_out_neither_first_logins_nor_a_scraper() -> None:
    """After a restart nothing is cached and no connection has failed: fifty keep-alive guessers all start in the
    first lane, with a scraper's keep-alive connection among them. A guesser refused because that lane is full now
    counts as checked and waits in the second lane, one check in line per connection: each of 12 first logins on a
    new connection gets in, and so does the scraper, whose connection the crowd pushed into the second lane (before:
    the refused guessers stayed in the first lane, kept it full, and every right password was refused)."""
    import base64

    users = {f"u{i}": bcrypt.hashpw(f"pw{i}".encode(), bcrypt.gensalt(4)) for i in range(12)}
    mw = BasicAuthMiddleware(None, users)  # type: ignore[arg-type]

    async def attack() -> tuple[list[bool], list[bool]]:
        stop = asyncio.Event()

        async def guesser(port: int) -> None:
            header = b"Basic " + base64.b64encode(f"u0:wrong-{port}".encode())
            while not stop.is_set():
                await mw.authorized(header, ("10.0.0.9", port))
                await asyncio.sleep(0)  # the next request on the same connection at once

        scrapes: list[bool] = []

        async def scraper() -> None:
            header = b"Basic " + base64.b64encode(b"u1:pw1")
            while not stop.is_set() and scrapes.count(True) < 3:
                scrapes.append(await mw.authorized(header, ("10.0.0.2", 9999)))
                await asyncio.sleep(0.01)

        crowd = [asyncio.create_task(guesser(40000 + i)) for i in range(50)]
        scraping = asyncio.create_task(scraper())
        await asyncio.sleep(0.2)
        logins = [await mw.authorized(b"Basic " + base64.b64encode(f"u{i}:pw{i}".encode()), ("10.0.0.7", 50000 + i))
                  for i in range(12)]  # fmt: skip
        await asyncio.wait_for(scraping, 30)
        stop.set()
        await asyncio.gather(*crowd)
        return logins, scrapes

    logins, scrapes = asyncio.run(attack())
    assert logins == [True] * 12
    assert scrapes.count(True) == 3, scrapes[:20]
