"""YAML text to data for gpuwarden's files (the configuration, the web config, the reclaim policy): PyYAML's safe
loader, refusing a key named twice, every error one line (``ConfigError``). Imported only where a file is read, so
a daemon without such a file never loads PyYAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpuwarden.config import ConfigError


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader refusing a mapping that names a key twice (it would keep the last one silently: a
    second ``basic_auth_users`` would replace the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Return the mapping of ``node``; raises ``yaml.constructor.ConstructorError`` for a key named twice."""
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the text-key check refuses it later
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, path: Path) -> Any:
    """Return the data of the YAML ``text`` read from ``path`` (None for an empty document).

    Raises ConfigError with one line naming ``path``, the line and the problem (invalid YAML, a key named twice,
    nesting too deep for the parser).
    """
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError as exc:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        detail = str(getattr(exc, "problem", None) or exc).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{where}: {detail}") from exc
