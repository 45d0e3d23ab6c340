"""What a site's Prometheus, Alertmanager and Grafana need from gpuwarden, shipped in the package (a monitoring
mixin): the alerting and recording rules (rendered from rules.template.yml for the site's parameters:
gpuwarden.mixin.rules), the optional dcgm-exporter compatibility rules, the Alertmanager routes example and the Grafana
dashboards. ``write()`` puts them in a directory; ``gpuwarden mixin`` is its command.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from gpuwarden.mixin import rules

#: The package's files, as they ship (generated in the repository: alerts/dcgm_compat.py, dashboards/generate.py).
_DATA = resources.files("gpuwarden.mixin")
#: Where each file goes under the output directory: the layout of a Prometheus rule directory, an Alertmanager
#: configuration and a Grafana dashboard provider's folder (deploy/grafana/provisioning).
RULES = "prometheus/gpuwarden.rules.yml"
COMPAT = "prometheus/dcgm-compat.rules.yml"
ALERTMANAGER = "alertmanager/alertmanager.yml"
DASHBOARDS = "grafana/dashboards"


def dashboards() -> dict[str, str]:
    """Each shipped Grafana dashboard: file name (``gpuwarden-fleet.json``, ``-node``, ``-job``) -> its JSON text."""
    folder = _DATA / "dashboards"
    return {f.name: f.read_text() for f in sorted(folder.iterdir(), key=lambda f: f.name) if f.name.endswith(".json")}


def defaults() -> str:
    """The default parameters of the rules, with what each means (params.yml, YAML text)."""
    return rules.DEFAULTS.read_text()


def files(params: Path | None = None, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every file of the mixin for the parameters of ``params`` and ``overrides`` (gpuwarden.mixin.rules.params):
    relative path (RULES, COMPAT, ALERTMANAGER, DASHBOARDS/NAME) -> text. ValueError for bad parameters, OSError and
    yaml.YAMLError from reading ``params``."""
    out = {RULES: rules.render(params, overrides)}
    out[COMPAT] = (_DATA / "dcgm-compat.rules.yml").read_text()
    out[ALERTMANAGER] = (_DATA / "alertmanager.yml").read_text()
    out.update({f"{DASHBOARDS}/{name}": text for name, text in dashboards().items()})
    return out


def write(out: Path, params: Path | None = None, overrides: Mapping[str, str] | None = None) -> list[Path]:
    """Write ``files(params, overrides)`` under ``out`` (made, with its folders, where missing; a file there is
    replaced) and return their paths, in the order written. The same errors as ``files()``, all raised before
    anything is written; OSError where a file cannot be written."""
    texts = files(params, overrides)
    written = []
    for rel, text in texts.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
