"""``gpuwarden.web.server.limits.release_free_heap``: the C heap's free pages handed back after start-up and after a
connection flood (glibc malloc_trim)."""

from __future__ import annotations

import ctypes
import platform

import pytest

from gpuwarden.web.server import limits


def _rss_anon_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_pages_go_back_to_the_system() -> None:
    """32 MiB of 4 KiB blocks (above pymalloc's 512 bytes, so glibc's heap) freed but the last, which holds the heap's
    top where free() alone would shrink it: the pages stay resident until the trim, which returns them."""
    blocks = [ctypes.create_string_buffer(4096) for _ in range(8192)]
    for b in blocks:
        b.raw = b"\x01" * 4096  # touch every page
    last = blocks[-1]
    del blocks
    before = _rss_anon_kib()
    assert limits.release_free_heap() is True
    after = _rss_anon_kib()
    assert before - after > 16 * 1024, (before, after)
    assert last.raw[:1] == b"\x01"


def test_without_malloc_trim_nothing_is_released(monkeypatch: pytest.MonkeyPatch) -> None:
    """A C library without malloc_trim (musl) or none loadable: False, no error."""

    def no_library(name: object) -> object:
        raise OSError("no C library")

    monkeypatch.setattr(ctypes, "CDLL", no_library)
    assert limits.release_free_heap() is False
