"""Progress of long commands on a terminal: one rich status line naming the phase running and
the time spent so far. Nothing at all when stderr is not a terminal (a pipe, CI logs) or the
output is machine-readable (``--format json``): the drivers report phases through a plain
callback (``api.Progress``) and only this module knows about rich."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO


def model_output_to_stderr() -> contextlib.AbstractContextManager[TextIO]:
    """While a command imports and runs the user's model, what the model's code prints goes
    to stderr: stdout holds the command's own output only (a JSON or SARIF document must
    parse)."""
    return contextlib.redirect_stdout(sys.stderr)


@contextlib.contextmanager
def phases(enabled: bool, stream: TextIO | None = None, *,
           force_terminal: bool | None = None) -> Iterator[Callable[[str], None]]:
    """Yield the callback a driver calls with each phase's name; shown as a rich status on
    ``stream`` (stderr) when ``enabled`` and the stream is a terminal. The phases are the
    command's work: what the model prints meanwhile goes to stderr."""
    stream = stream or sys.stderr
    terminal = force_terminal if force_terminal is not None else stream.isatty()
    with model_output_to_stderr():
        yield from _phases(enabled and terminal, stream)


def _phases(shown: bool, stream: TextIO) -> Iterator[Callable[[str], None]]:
    if not shown:
        yield _ignore
        return
    from rich.console import Console

    console = Console(file=stream, force_terminal=True, stderr=stream is sys.stderr)
    start = time.perf_counter()
    with console.status(_Line("starting", start)) as status:
        def show(phase: str) -> None:
            status.update(_Line(phase, start))
        yield show


class _Line:
    """The status text, rendered again at every refresh of the spinner: the seconds count
    up while a phase runs (a long layout pass must not look stuck)."""

    def __init__(self, phase: str, start: float) -> None:
        self.phase, self.start = phase, start

    def __rich__(self) -> str:
        return f"{self.phase} [dim]({time.perf_counter() - self.start:.0f} s)[/dim]"


def _ignore(phase: str) -> None:
    del phase


__all__ = ["model_output_to_stderr", "phases"]
