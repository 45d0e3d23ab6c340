"""``gpuwarden.web.server.limits.release_free_heap``: the C heap's free pages handed back after start-up and after a
connection flood (glibc malloc_trim)."""

from __future__ import annotations

import ctypes
import platform
import subprocess
import sys

import pytest
from helpers import REPO

from gpuwarden.web.server import limits

#: Run in a fresh interpreter: in a test worker's heap, fragmented by the tests before, the blocks fill earlier holes
#: and free() alone hands back part of them, so what the trim returns depended on the tests that ran before it.
_FLOOD = """
import ctypes
from gpuwarden.web.server import limits

def rss_anon_kib():
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))

blocks = [ctypes.create_string_buffer(4096) for _ in range(8192)]
for b in blocks:
    b.raw = b"\\x01" * 4096  # touch every page
last = blocks[-1]
del blocks
before = rss_anon_kib()
released = limits.release_free_heap()
print(released, before, rss_anon_kib(), last.raw[:1] == b"\\x01")
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_pages_go_back_to_the_system() -> None:
    """32 MiB of 4 KiB blocks (above pymalloc's 512 bytes, so glibc's heap) freed but the last, which holds the heap's
    top where free() alone would shrink it: the pages stay resident until the trim, which returns them (RssAnon of
    /proc/self/status before and after), and the block still held keeps its contents."""
    ran = subprocess.run([sys.executable, "-c", _FLOOD], cwd=REPO, capture_output=True, text=True, check=False)
    assert ran.returncode == 0, ran.stderr
    released, before, after, kept = ran.stdout.split()
    assert released == "True" and kept == "True", ran.stdout
    assert int(before) - int(after) > 16 * 1024, (before, after)


def test_without_malloc_trim_nothing_is_released(monkeypatch: pytest.MonkeyPatch) -> None:
    """A C library without malloc_trim (musl) or none loadable: False, no error."""

    def no_library(name: object) -> object:
        raise OSError("no C library")

    monkeypatch.setattr(ctypes, "CDLL", no_library)
    assert limits.release_free_heap() is False
