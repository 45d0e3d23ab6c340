"""``load_config_apart``: the configuration loaded by a child interpreter gives the Config that ``load_config`` gives in
the process, the same one-line errors, a one-line error when the child cannot do its work, and a serving daemon that
never imports pydantic-settings or PyYAML (gpuwarden.config_load)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.config import ConfigError, load_config, load_config_apart


def _same(path: Path | None, overrides: dict) -> None:  # type: ignore[type-arg]
    here, apart = load_config(path, overrides), load_config_apart(path, overrides)
    assert apart == here
    assert apart.model_fields_set == here.model_fields_set
    assert apart.processes.model_fields_set == here.processes.model_fields_set


def test_file_environment_and_flags_give_the_same_config_in_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "gpuwarden.yml"
    cfg.write_text("poll_interval_seconds: 2\nprocesses:\n  max_per_gpu: 4\nkubelet_socket: /tmp/k.sock\n")
    monkeypatch.setenv("GPUWARDEN_GPUS", "0,2")
    monkeypatch.setenv("GPUWARDEN_INSIGHT__WINDOW_SECONDS", "120")
    _same(cfg, {"listen_address": "127.0.0.1:9999", "collectors": {"enable": [], "disable": ["xid"]}})
    got = load_config_apart(cfg, {"log_level": "debug"})
    assert (got.poll_interval_seconds, got.processes.max_per_gpu, got.gpus) == (2.0, 4, [0, 2])
    assert got.insight.window_seconds == 120.0 and got.kubelet_socket == Path("/tmp/k.sock")
    assert got.log_level == "debug"


def test_the_demo_default_address_is_set_in_the_child() -> None:
    _same(None, {"demo": True})
    assert load_config_apart(None, {"demo": True}).listen_address == "127.0.0.1:10400"


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("poll_interval_seconds: 0\n", {}, "poll_interval_seconds: Input should be greater than or equal to 0.05"),
        ("pol_interval: 1\n", {}, "unknown key 'pol_interval'"),
        ("a: [\n", {}, "invalid YAML at line 2"),
        ("", {"GPUWARDEN_POLL_INTERVALL": "1"}, "unknown environment variable GPUWARDEN_POLL_INTERVALL"),
        ("", {"GPUWARDEN_GPUS": "0,x"}, "environment variable GPUWARDEN_GPUS: gpus"),
    ],
)
def test_a_bad_configuration_is_the_same_one_line_from_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, env: dict[str, str], expected: str
) -> None:
    cfg = tmp_path / "gpuwarden.yml"
    cfg.write_text(text)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as here:
        load_config(cfg)
    with pytest.raises(ConfigError) as apart:
        load_config_apart(cfg)
    assert str(apart.value) == str(here.value)
    assert expected in str(apart.value) and "\n" not in str(apart.value)


def _child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, script: str) -> None:
    """Make the shell ``script`` the interpreter ``load_config_apart`` starts (sys.executable)."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sys, "executable", str(path))


def test_a_child_that_fails_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _child(tmp_path, monkeypatch, "broken",
           "echo 'Traceback (most recent call last):' >&2\necho 'ImportError: no pydantic' >&2\nexit 1\n")  # fmt: skip
    with pytest.raises(ConfigError, match=r"^the configuration loader failed: ImportError: no pydantic$"):
        load_config_apart(None, {})
    _child(tmp_path, monkeypatch, "garbage", 'cat >/dev/null\necho \'{"poll_interval_seconds": "soon"}\'\n')
    with pytest.raises(ConfigError, match=r"^the configuration loader wrote no configuration: "):
        load_config_apart(None, {})
    monkeypatch.setattr(sys, "executable", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"^the configuration loader did not run: "):
        load_config_apart(None, {})


def test_a_serving_daemon_never_imports_pydantic_settings_or_pyyaml(tmp_path: Path) -> None:
    """``gpuwarden serve --demo`` loads its configuration in a child and serves: once /readyz answers 200 and a reload
    (SIGHUP) applied, neither pydantic-settings nor PyYAML is in the daemon's modules, and neither the configuration,
    the insight result nor the readiness answer has had a pydantic validator built (the replay's trace models do:
    a trace is input, validated)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import free_port

    port = free_port()
    script = f"""
import json, os, signal, sys, threading, time, urllib.request
from gpuwarden.cli import main

def loaded_at(url):
    body = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    name = "gpuwarden_config_last_reload_success_timestamp_seconds "
    return next(float(line.split()[1]) for line in body.splitlines() if line.startswith(name))

def watch():
    url = "http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            if urllib.request.urlopen(url + "/readyz", timeout=5).status == 200:
                break
        except OSError:
            time.sleep(0.1)
    first = loaded_at(url)
    time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGHUP)
    while loaded_at(url) == first:  # the reload applied: the configuration loaded again
        time.sleep(0.1)
    from gpuwarden.config import Config
    from gpuwarden.insight.result import GpuInsight, InsightResult
    from gpuwarden.web.app import Readiness
    seen = {{m: m in sys.modules for m in ("pydantic_settings", "yaml", "gpuwarden.config_load")}}
    seen.update({{c.__name__: c.__pydantic_complete__ for c in (Config, InsightResult, GpuInsight, Readiness)}})
    print(json.dumps(seen), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=watch, daemon=True).start()
sys.exit(main(["serve", "--demo", "--web.listen-address", "127.0.0.1:{port}"]))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, out.stderr[-2000:]
    assert json.loads(lines[-1]) == {
        "pydantic_settings": False,
        "yaml": False,
        "gpuwarden.config_load": False,
        "Config": False,
        "InsightResult": False,
        "GpuInsight": False,
        "Readiness": False,
    }


def test_the_child_is_the_first_to_go_when_memory_runs_out() -> None:
    """The loader asks for an OOM score adjustment of 1000 before its imports: under a container's memory limit a
    reload's child is killed (a one-line refused reload), not the daemon."""
    script = (
        "from gpuwarden.config_child import first_to_go; print(first_to_go(), open('/proc/self/oom_score_adj').read())"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "1000"]


def test_a_loader_killed_by_the_oom_killer_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _child(tmp_path, monkeypatch, "killed", "kill -9 $$\n")
    with pytest.raises(ConfigError, match=r"^the configuration loader failed: exit status -9$"):
        load_config_apart(None, {})


def test_the_pickled_configuration_keeps_its_keys_and_names_nothing_else(tmp_path: Path) -> None:
    """The child's pickle gives the Config the loader made, keys set included; bytes naming anything but the Config
    models and paths are refused before anything is made (no command runs), as is a pickle of anything else."""
    import pickle

    from gpuwarden.config import read_config_pickle

    cfg = load_config(None, {"kubelet_socket": str(tmp_path / "kubelet.sock"), "collectors": {"enable": ["nvlink"]}})
    back = read_config_pickle(pickle.dumps(cfg))
    assert back == cfg and back.model_fields_set == cfg.model_fields_set == {"kubelet_socket", "collectors"}
    assert back.kubelet_socket == tmp_path / "kubelet.sock"
    witness = tmp_path / "ran"

    class Evil:
        def __reduce__(self):  # noqa: ANN204
            return (os.system, (f"touch {witness}",))

    with pytest.raises(ConfigError, match=r"^the configuration loader wrote no configuration: .*system is no part"):
        read_config_pickle(pickle.dumps(Evil()))
    assert not witness.exists()
    with pytest.raises(ConfigError, match=r"^the configuration loader wrote no configuration: a list$"):
        read_config_pickle(pickle.dumps([1, 2]))
    with pytest.raises(ConfigError, match=r"^the configuration loader wrote no configuration: "):
        read_config_pickle(b"{}")
