"""A real webhook receiver for tests: an HTTP server on 127.0.0.1, on a thread, that records every
JSON body POSTed to it (tests/test_notify.py, tests/test_elastic.py)."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A real HTTP server on 127.0.0.1 that records each POSTed JSON body; `fail` answers 500 first."""

    def __init__(self, fail: int = 0) -> None:
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        self.fail = fail
        self.got = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                data = self.rfile.read(int(self.headers["Content-Length"]))
                with outer.got:
                    if outer.fail > 0:
                        outer.fail -= 1
                        self.send_response(500)
                    else:
                        outer.bodies.append(json.loads(data))
                        outer.paths.append(self.path)
                        self.send_response(200)
                    outer.got.notify_all()
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.token = f"hook-secret-{os.urandom(8).hex()}"  # unique: tests running beside this one post elsewhere
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/{self.token}"

    def events(self) -> list[str]:
        return [b["event"] for b in self.bodies]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
