"""``gpuwarden mixin``: the rules, routes and dashboards a site's Prometheus, Alertmanager and Grafana need, written
from the package with the site's runbook and Grafana addresses (tools/wheel-smoke.sh runs it from the installed wheel,
and checks its files with promtool and amtool)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import REPO

from gpuwarden import mixin
from gpuwarden.cli import main


def _alerts(text: str) -> list[dict]:
    return [r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "alert" in r]


def test_mixin_writes_every_file_with_the_sites_addresses(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "site"
    rc = main(["mixin", "--out", str(out), "--runbook-url", "https://wiki.example/gpu",
               "--grafana-url", "https://grafana.example/"])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr()
    assert printed.err == ""  # a Grafana address given: nothing to warn of
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == sorted(printed.out.replace(str(out) + "/", "").split())
    assert written == sorted([mixin.RULES, mixin.ALERTMANAGER, *(
        f"{mixin.DASHBOARDS}/gpuwarden-{b}.json" for b in ("fleet", "job", "node"))])  # fmt: skip  # no dcgm-compat
    alerts = _alerts((out / mixin.RULES).read_text())
    assert alerts
    for rule in alerts:
        ann = rule["annotations"]
        assert ann["runbook_url"] == f"https://wiki.example/gpu#{rule['alert'].lower()}", rule["alert"]
        if "dashboard_url" in ann:
            assert ann["dashboard_url"].startswith("https://grafana.example/d/gpuwarden-"), rule["alert"]
    assert any("dashboard_url" in r["annotations"] for r in alerts)
    # the dashboards and routes as the repository generates them; the dashboards are Grafana's JSON
    for name in ("fleet", "job", "node"):
        shipped = REPO / "gpuwarden" / "mixin" / "dashboards" / f"gpuwarden-{name}.json"
        assert (out / mixin.DASHBOARDS / shipped.name).read_text() == shipped.read_text()
        assert json.loads(shipped.read_text())["uid"] == f"gpuwarden-{name}"
    assert yaml.safe_load((out / mixin.ALERTMANAGER).read_text())["route"]["receiver"]


def test_the_default_rules_are_the_repositorys(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main(["mixin", "--out", str(tmp_path)]) == 0
    assert (tmp_path / mixin.RULES).read_text() == (REPO / "alerts" / "gpuwarden.rules.yml").read_text()
    assert "grafana_url is not set" in capsys.readouterr().err  # the alerts carry no dashboard link, said


def test_defaults_prints_the_parameters_a_site_copies(capsys) -> None:  # noqa: ANN001
    assert main(["mixin", "--defaults"]) == 0
    params = yaml.safe_load(capsys.readouterr().out)
    assert params == yaml.safe_load((REPO / "gpuwarden" / "mixin" / "params.yml").read_text())
    assert {"runbook_url", "grafana_url", "selector", "memory_full_ratio"} <= set(params)


@pytest.mark.parametrize(
    ("args", "params", "message"),
    [
        (["--runbook-url", "wiki/runbook"], None, "runbook_url must be an absolute http(s) URL"),
        (["--grafana-url", "grafana:3000"], None, "grafana_url must be an absolute http(s) URL"),
        ([], "memory_full_ratio: 0.95\nno_such_key: 1\n", "unknown parameters no_such_key"),
        ([], "- a list\n", "expected a mapping of parameters"),
        ([], "selector: [unclosed\n", "while parsing"),
        ([], "memory_warmup: 7s\n", "whole multiples of memory_interval"),
    ],
)
def test_bad_parameters_are_one_line_and_exit_2_and_write_nothing(
    tmp_path: Path,
    capsys,
    args: list[str],
    params: str | None,
    message: str,  # noqa: ANN001
) -> None:
    extra = []
    if params is not None:
        (tmp_path / "params.yml").write_text(params)
        extra = ["--params", str(tmp_path / "params.yml")]
    out = tmp_path / "site"
    assert main(["mixin", "--out", str(out), *args, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuwarden: ") and err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_a_params_file_that_cannot_be_read_is_one_line(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main(["mixin", "--out", str(tmp_path / "o"), "--params", str(tmp_path / "missing.yml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuwarden: ") and "missing.yml" in err and err.count("\n") == 1


def test_out_or_defaults_is_required(capsys) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit) as exc:
        main(["mixin"])
    assert exc.value.code == 2
    assert "one of the arguments --out --defaults is required" in capsys.readouterr().err


@pytest.mark.parametrize(("version", "names", "records"), [
    ("both", "", None),
    ("4.8", "", 29),
    ("4.9", "DCGM_FI_DEV_GPU_UTIL_RATIO,DCGM_FI_DEV_GPU_TEMP_CELSIUS", 2),
])  # fmt: skip
def test_the_dcgm_compat_rules_are_written_only_as_asked(tmp_path: Path, version: str, names: str,
                                                         records: int | None) -> None:  # fmt: skip
    """--dcgm-compat writes the compatibility rules of a version (both: the shipped file as it is), and
    --dcgm-compat-names only those series, each group with its labels rule: a site pays for the names it reads."""
    args = ["mixin", "--out", str(tmp_path), "--dcgm-compat", version]
    assert main([*args, "--dcgm-compat-names", names] if names else args) == 0
    text = (tmp_path / mixin.COMPAT).read_text()
    shipped = (REPO / "gpuwarden" / "mixin" / "dcgm-compat.rules.yml").read_text()
    if records is None:
        assert text == shipped
        return
    groups = yaml.safe_load(text)["groups"]
    assert [g["name"] for g in groups] == list(mixin.COMPAT_GROUPS[version])
    [group] = groups
    assert group["rules"][0]["record"].startswith("instance_gpu:dcgm_exporter_labels")
    assert len(group["rules"]) - 1 == records
    if names:
        assert {r["record"] for r in group["rules"][1:]} == set(names.split(","))
    whole = {r["record"]: r for g in yaml.safe_load(shipped)["groups"] for r in g["rules"]}
    assert all(whole[r["record"]] == r for r in group["rules"])  # each rule as shipped


def test_dcgm_compat_names_that_no_group_records_are_refused(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main(["mixin", "--out", str(tmp_path), "--dcgm-compat", "4.8", "--dcgm-compat-names",
                 "DCGM_FI_DEV_GPU_UTIL,DCGM_FI_DEV_GPU_UTIL_RATIO"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "not a dcgm-exporter series the 4.8 compatibility rules record: DCGM_FI_DEV_GPU_UTIL_RATIO" in err
    assert not (tmp_path / mixin.COMPAT).exists() and not (tmp_path / mixin.RULES).exists()  # nothing written
    assert main(["mixin", "--out", str(tmp_path), "--dcgm-compat-names", "DCGM_FI_DEV_GPU_UTIL"]) == 2
    assert "--dcgm-compat-names needs --dcgm-compat" in capsys.readouterr().err
