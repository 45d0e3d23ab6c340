"""A release is one version everywhere it is written: ``gpuwarden.__version__``, the newest version heading of
CHANGELOG.md, and the image tag the Kubernetes base deploys; and the changelog's headings are versions, newest first."""

from __future__ import annotations

import re

import yaml
from helpers import REPO
from packaging.version import Version

from gpuwarden import __version__


def _headings() -> list[str]:
    return re.findall(r"^## (.+)$", (REPO / "CHANGELOG.md").read_text(), flags=re.M)


def test_the_newest_release_in_the_changelog_is_the_packages_version() -> None:
    headings = _headings()
    assert headings[0] == "Unreleased"
    released = [re.fullmatch(r"(\d+\.\d+\.\d+) \((\d{4}-\d{2}-\d{2})\)", h) for h in headings[1:]]
    assert all(released), headings
    versions = [Version(m.group(1)) for m in released if m]
    assert str(versions[0]) == __version__
    assert versions == sorted(versions, reverse=True)


def test_the_kubernetes_base_deploys_the_image_of_this_version() -> None:
    kustomization = yaml.safe_load((REPO / "deploy" / "kubernetes" / "kustomization.yaml").read_text())
    assert [i["newTag"] for i in kustomization["images"]] == [__version__]
