"""Serving a built site on localhost (read-only files, no other routes)."""

from __future__ import annotations

import functools
import http.server
from collections.abc import Callable
from pathlib import Path

from specpilot_mem.errors import SpecPilotError


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:
        pass


def make_server(root: Path, port: int) -> http.server.ThreadingHTTPServer:
    """A server for ``root`` bound to 127.0.0.1 (``port`` 0 picks a free one); the caller runs and closes it."""
    handler = functools.partial(_Quiet, directory=str(root))
    try:
        return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as err:
        raise SpecPilotError(
            f"cannot listen on 127.0.0.1:{port}: {err.strerror}",
            where="--port",
            fix="pick another port, or --port 0 for a free one",
        ) from None


def serve(root: Path, port: int, announce: Callable[[str], None]) -> None:
    server = make_server(root, port)
    announce(f"http://127.0.0.1:{server.server_address[1]}/index.html")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
