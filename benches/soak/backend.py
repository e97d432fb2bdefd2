#!/usr/bin/env python3
"""A soak backend (benches/soak.sh): HTTP/1.1 keep-alive, a WebSocket echo on any
request with `Upgrade: websocket`, and a fault mode read from a control file on every
request: `ok`, `fail` (500 to everything, the health check too), `hang` (reads the
request, never answers while the mode stays `hang`, then closes), `slow` (answers after
SLOW_MS). Every answer names the backend in `x-backend`. A gap of more than 1 s in its
own 100 ms tick is logged as `stall START END` (epoch seconds).

    backend.py PORT NAME CTL_FILE [SLOW_MS]
Python stdlib only; loopback only.
"""
import base64
import hashlib
import http.server
import os
import socketserver
import sys
import threading
import time

PORT, NAME, CTL = int(sys.argv[1]), sys.argv[2], sys.argv[3]
SLOW_MS = int(sys.argv[4]) if len(sys.argv) > 4 else 300
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def mode():
    try:
        with open(CTL) as f:
            return f.read().strip() or "ok"
    except OSError:
        return "ok"


def read_exact(f, n):
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body):
        self.send_response(status)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.send_header("x-backend", NAME)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        n = int(self.headers.get("content-length") or 0)
        if n:
            self.rfile.read(n)
        m = mode()
        if m == "hang":
            t0 = time.monotonic()
            while mode() == "hang" and time.monotonic() - t0 < 120:
                time.sleep(0.1)
            self.close_connection = True
            return
        if m == "fail":
            self.answer(500, b"injected failure\n")
            return
        if m == "slow":
            time.sleep(SLOW_MS / 1000)
        if (self.headers.get("upgrade") or "").lower() == "websocket":
            self.websocket()
            return
        self.answer(200, f"{NAME} {self.path}\n".encode())

    do_POST = do_GET

    def websocket(self):
        key = self.headers.get("sec-websocket-key", "")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("upgrade", "websocket")
        self.send_header("connection", "Upgrade")
        self.send_header("sec-websocket-accept", accept)
        self.send_header("x-backend", NAME)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        f = self.rfile
        try:
            while True:
                b0, b1 = read_exact(f, 2)
                op, ln = b0 & 0x0F, b1 & 0x7F
                if ln == 126:
                    ln = int.from_bytes(read_exact(f, 2), "big")
                elif ln == 127:
                    ln = int.from_bytes(read_exact(f, 8), "big")
                mask = read_exact(f, 4) if b1 & 0x80 else b"\0\0\0\0"
                data = bytes(c ^ mask[i % 4] for i, c in enumerate(read_exact(f, ln)))
                hdr = bytes([0x80 | op])
                hdr += bytes([len(data)]) if len(data) < 126 else bytes([126]) + len(data).to_bytes(2, "big")
                self.wfile.write(hdr + data)
                self.wfile.flush()
                if op == 8:
                    return
        except (EOFError, OSError, ValueError):
            return


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


def stall_watch():
    """Logs every gap of more than 1 s in a 100 ms tick: this process was not scheduled
    (a loaded machine), so what timed out through it then was not the proxy's doing."""
    last = time.time()
    while True:
        time.sleep(0.1)
        t = time.time()
        if t - last > 1.0:
            print(f"stall {last:.3f} {t:.3f}", flush=True)
        last = t


if __name__ == "__main__":
    threading.Thread(target=stall_watch, daemon=True).start()
    srv = Server(("127.0.0.1", PORT), Handler)
    print(f"backend {NAME} on {PORT} (pid {os.getpid()})", flush=True)
    srv.serve_forever()
