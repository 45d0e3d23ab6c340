"""The example configuration file (``deploy/gpuwarden.example.yml``), written from ``Config`` itself: every key with
its default and description, so that the example cannot fall behind the settings."""

from __future__ import annotations

import textwrap
from typing import Any

import yaml
from pydantic import BaseModel

from gpuwarden.config.model import Config

HEADER = """\
# gpuwarden configuration: every key with its default (written from gpuwarden.config.Config by
# `python3 -m gpuwarden.config.example`). Validate with: gpuwarden check-config FILE
# Environment variables GPUWARDEN_<KEY> (nested: GPUWARDEN_PROCESSES__MAX_PER_GPU) override this file;
# command-line flags override both. SIGHUP re-reads it. A key without a default is shown commented out.
"""


def example(model: type[BaseModel] = Config, indent: str = "") -> str:
    """Return the YAML text of ``model``'s keys: each key's description as a comment line, then ``key: default``
    (``# key:`` for a key whose default is None; a nested model as a mapping). Raises nothing."""
    lines: list[str] = []
    for name, field in model.model_fields.items():
        if field.description:
            lines += textwrap.wrap(
                field.description, 116, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# "
            )
        nested = field.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            lines.append(f"{indent}{name}:")
            lines.append(example(nested, indent + "  ").rstrip("\n"))
            continue
        default: Any = field.get_default(call_default_factory=True)
        if default is None:
            lines.append(f"{indent}# {name}:")
            continue
        text = yaml.safe_dump({name: default}, default_flow_style=True, width=1000).strip()
        lines.append(f"{indent}{text.removeprefix('{').removesuffix('}')}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(HEADER + example(), end="")
