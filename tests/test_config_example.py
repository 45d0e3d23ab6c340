"""deploy/gpuwarden.example.yml is what gpuwarden.config.example writes from Config: every key, with its default."""

from __future__ import annotations

import re

import yaml
from helpers import REPO

from gpuwarden.config import Config, load_config

EXAMPLE = REPO / "deploy" / "gpuwarden.example.yml"


def _keys(model: type, prefix: str = "") -> set[str]:
    out = set()
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        nested = field.annotation
        if isinstance(nested, type) and hasattr(nested, "model_fields"):
            out |= _keys(nested, f"{prefix}{name}.")
        else:
            out.add(prefix + name)
    return out


def test_the_example_names_every_key_and_loads_to_the_defaults() -> None:
    text = EXAMPLE.read_text()
    named = set()
    stack: list[str] = []
    for line in text.splitlines():
        m = re.match(r"^( *)(?:# )?([a-z_]+):", line)
        if not m:
            continue
        depth = len(m.group(1)) // 2
        stack = stack[:depth] + [m.group(2)]
        named.add(".".join(stack))
    assert _keys(Config) <= named, _keys(Config) - named
    data = yaml.safe_load(text)
    assert load_config(overrides=data) == load_config(overrides={})  # every value shown is the default
