"""The artifact store's HTTP server, run in its pod as ``python -c <this file> PORT PREFIX
DELAY``: the files under ``/artifacts``, and below ``PREFIX/`` each answer waits ``DELAY``
seconds first (a model store far away, or a large model). Standard library only: it runs in
the ranker image with nothing of the tests installed."""

from __future__ import annotations

import functools
import http.server
import sys
import time


def serve(port: int, slow_prefix: str, delay_s: float) -> None:
    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith(f"{slow_prefix}/"):
                time.sleep(delay_s)
                self.path = self.path[len(slow_prefix) :]
            super().do_GET()

    handler = functools.partial(Handler, directory="/artifacts")
    http.server.ThreadingHTTPServer(("", port), handler).serve_forever()


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]))
