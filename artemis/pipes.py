"""Output streams of long-running commands."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any


class QuietOnClosedPipe:
    """A text stream that stops writing once its reader has gone (a closed pipe) instead
    of raising: a long-running command (`artemis dev`, `worker`, `api`) keeps serving when
    whatever read its output exits."""

    def __init__(self, stream: Any) -> None:
        """``stream``: a text stream, or the name of one of ``sys``'s ("stdout",
        "stderr"), looked up at each use: the output then follows a redirection made
        after start-up (``contextlib.redirect_stdout``, click's test runner)."""
        self._source = stream
        self.closed_pipe = False

    @property
    def _stream(self) -> Any:
        return getattr(sys, self._source) if isinstance(self._source, str) else self._source

    def write(self, text: str) -> int:
        if not self.closed_pipe:
            try:
                return int(self._stream.write(text))
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.closed_pipe:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone()

    def _gone(self) -> None:
        self.closed_pipe = True
        # Python flushes stdout at exit: point it at nothing, so that flush is quiet too.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())

    def isatty(self) -> bool:
        return bool(self._stream.isatty())

    def fileno(self) -> int:
        return int(self._stream.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
