#!/usr/bin/env python3
"""A chaos backend (benches/chaos/run.sh): HTTP/1.1 keep-alive; answers 200 naming itself in
`x-backend`, or 500 to everything (health checks too) while its control file says `fail`.
Every request is logged as one JSON line {"t": epoch seconds, "id": x-chaos-id or null,
"path": ..., "status": n} to LOG (appended; a restarted backend appends to the same file).

    backend.py PORT NAME CTL_FILE LOG
Python stdlib only; loopback only.
"""
import http.server
import json
import os
import socketserver
import sys
import threading
import time

PORT, NAME, CTL, LOG = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
LOG_F = open(LOG, "a", buffering=1)
LOG_LOCK = threading.Lock()


def mode():
    try:
        with open(CTL) as f:
            return f.read().strip() or "ok"
    except OSError:
        return "ok"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        n = int(self.headers.get("content-length") or 0)
        if n:
            self.rfile.read(n)
        status = 500 if mode() == "fail" else 200
        body = f"{NAME} {self.path}\n".encode()
        rec = {"t": time.time(), "id": self.headers.get("x-chaos-id"), "path": self.path, "status": status}
        with LOG_LOCK:
            LOG_F.write(json.dumps(rec) + "\n")
        self.send_response(status)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.send_header("x-backend", NAME)
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET
    do_HEAD = do_GET


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


if __name__ == "__main__":
    srv = Server(("127.0.0.1", PORT), Handler)
    print(f"backend {NAME} on {PORT} (pid {os.getpid()})", flush=True)
    srv.serve_forever()
