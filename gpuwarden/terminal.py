"""Text from the machine (process, job, pod and host names, a remote daemon's answers) as a terminal or a log may
show it: control characters made visible, never interpreted as Rich markup, long values cut, and credentials in a URL
(``http://user:password@host``) hidden."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit


def visible(text: object) -> str:
    """Return ``str(text)`` with every non-printable character (escape sequences, carriage returns, bells, ...)
    written as its Python escape (``\\x1b``), so that nothing printed moves the cursor, retitles the window or
    clears the screen. Printable non-ASCII text (a name in any script) is kept."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


def brief(text: object, limit: int = 120) -> str:
    """``visible(text)`` cut to ``limit`` characters, the cut said (``…(+N)``): a value from the machine in a one-line
    message never runs to kilobytes."""
    s = visible(text)
    return s if len(s) <= limit else f"{s[:limit]}…(+{len(s) - limit})"


def why(exc: BaseException) -> str:
    """Why a file could not be read, in words for a one-line message: an OSError's own text (``No such file or
    directory``, ``Permission denied``) without its errno or the path (the message names the file), ``not UTF-8
    text`` for a decoding error (never the bytes: a token file's content stays out), else the error's text or, where
    it has none, its class name."""
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, OSError) and exc.strerror:
        return visible(exc.strerror)
    return visible(exc) or type(exc).__name__


def listed(values: Iterable[object], most: int = 5, limit: int = 80) -> str:
    """Up to ``most`` of ``values``, each ``brief`` to ``limit``, comma-separated, then ``and N more``."""
    shown = [brief(v, limit) for v in values]
    more = f" and {len(shown) - most} more" if len(shown) > most else ""
    return ", ".join(shown[:most]) + more


#: The most characters of one value a table shows (``plain``): every real job id, cgroup path or host name whole,
#: ready to paste; a hostile 100 kB one cut, the cut said (``brief``). JSON output keeps values whole.
SHOWN_CHARS = 512


def plain(text: object, style: str = "") -> Any:
    """A ``rich.text.Text`` of ``brief(text, SHOWN_CHARS)`` in ``style``: printed as it is, never read as markup (a
    process named ``[/]`` or ``[link=...]`` is shown, not obeyed), and never kilobytes of one value."""
    from rich.text import Text

    return Text(brief(text, SHOWN_CHARS), style=style)


def redacted(url: str) -> str:
    """Return ``url`` with its password replaced by ``***`` (``http://user:***@host:port/path``); a URL without a
    password, or one that does not parse, is returned as it is (it holds no password to hide)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


@contextmanager
def progress(description: str) -> Iterator[Callable[[int, int | None], None]]:
    """A progress display on standard error while the block runs, when standard error is a terminal (rich's
    Progress, removed when the block ends: what the command prints stays as it was); nothing elsewhere (a pipe, a log,
    a CronJob). Yields ``advance(done, total)``: ``done`` of ``total`` parts (None: a count without an end)."""
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda done, total: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:  # fmt: skip
        task = bar.add_task(visible(description), total=None)

        def advance(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        yield advance
