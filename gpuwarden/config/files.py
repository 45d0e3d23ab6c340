"""gpuwarden's small files (the configuration, the web config, the reclaim policy) read safely: a regular file of
bounded size in UTF-8, YAML through PyYAML's safe loader refusing a key named twice and a key that is not text, every
error one line (``ConfigError``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.config.model import ConfigError


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


#: A configuration or web config file larger than this is refused (they are a few hundred bytes).
MAX_CONFIG_BYTES = 1 << 20


def open_regular(path: Path | str) -> int | None:
    """Open ``path`` for reading without blocking and return its descriptor, or None (closed) when it is not a
    regular file: a FIFO would block a plain open until a writer comes, and a read for ever; a device such as
    /dev/zero never ends. Raises OSError when it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    return None


def read_small_file(path: Path, limit: int, error: type[Exception]) -> str:
    """Return the UTF-8 text of the regular file ``path`` of at most ``limit`` bytes.

    Raises ``error`` (one line) for a file that cannot be read, is not a regular file (``open_regular``), is larger
    than ``limit`` or is not UTF-8.
    """
    try:
        fd = open_regular(path)
        if fd is None:
            raise error(f"{path}: not a regular file")
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise error(f"{path}: larger than {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start})") from exc


def read_yaml(path: Path) -> dict[str, Any]:
    """Return the mapping in the YAML file ``path``. Raises ConfigError (unreadable, invalid, not a mapping)."""
    data = parse_yaml(read_small_file(path, MAX_CONFIG_BYTES, ConfigError), path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    _check_keys(path, data)
    return data


def _check_keys(path: Path, data: Any) -> None:
    """Raise ConfigError when a mapping in ``data`` has a key that is not text (YAML allows ``1:`` or ``null:``).

    Walks iteratively and visits each container once: YAML anchors can make ``data`` refer to itself.
    """
    seen: set[int] = set()
    stack = [data]
    while stack:
        item = stack.pop()
        if not isinstance(item, dict | list) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            for key, value in item.items():
                if not isinstance(key, str):
                    raise ConfigError(f"{path}: every key must be text, found {key!r}")
                stack.append(value)
        else:
            stack.extend(item)
