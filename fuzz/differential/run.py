#!/usr/bin/env python3
"""Differential target: random raw HTTP/1.1 requests through portcullis and HAProxy.

Each generated request (a seed request, mutated) is sent as the same bytes on a fresh
connection to each proxy. Both proxies forward to one recording backend (one process,
one listening port per proxy, so that what each proxy forwarded is told apart). A request
is *forwarded* by a proxy when the backend received a request head carrying the request's
unique marker (`x-diff-id: zqNqz`; it is searched for anywhere in the head, so a mutation
that folds or renames the field does not hide it).

A disagreement: one proxy forwarded and the other refused (its own 4xx/5xx, or closed or
timed out without forwarding), or both forwarded but the backend saw a different method,
target or body. Disagreements are grouped by the mutation kinds that produced them, with
the shortest example kept per group, and written to a markdown report for a person to
judge. Exit 0 whatever was found; 1 when the harness fails (a proxy or the backend dies,
a proxy cannot be started); 2 on bad arguments.

Python 3.11, standard library only. Run through scripts/fuzz-differential.sh.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARK_RE = re.compile(rb"zq(\d+)qz")
CLIENT_TIMEOUT = 0.8  # seconds a client waits for a response
SETTLE = 0.05  # after a refusal or a timeout: time for a late forward to reach the backend


# ---------------------------------------------------------------------------------------
# Recording backend
# ---------------------------------------------------------------------------------------


@dataclass
class Record:
    port_tag: str
    head: bytes
    method: bytes = b""
    target: bytes = b""
    version: bytes = b""
    headers: list = field(default_factory=list)
    body: bytes = b""
    complete: bool = False
    marker: int | None = None
    framing: str = ""


class Backend:
    """Raw-socket HTTP/1.1 server recording every request; answers 200 with a length.

    One listening socket per tag. Reads a head, then a body framed by Content-Length or
    chunked (what a proxy sends upstream), records, answers, keeps the connection open.
    """

    def __init__(self, tags: list[str]):
        self.lock = threading.Lock()
        self.records: list[Record] = []
        self.errors: list[str] = []
        self.socks: dict[str, socket.socket] = {}
        self.threads: list[threading.Thread] = []
        for tag in tags:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
            s.listen(128)
            self.socks[tag] = s
        for tag, s in self.socks.items():
            t = threading.Thread(target=self._accept, args=(tag, s), daemon=True)
            t.start()
            self.threads.append(t)

    def port(self, tag: str) -> int:
        return self.socks[tag].getsockname()[1]

    def alive(self) -> bool:
        return all(t.is_alive() for t in self.threads)

    def snapshot(self) -> int:
        with self.lock:
            return len(self.records)

    def since(self, n: int) -> list[Record]:
        with self.lock:
            return list(self.records[n:])

    def _accept(self, tag: str, s: socket.socket) -> None:
        while True:
            conn, _ = s.accept()
            threading.Thread(target=self._serve, args=(tag, conn), daemon=True).start()

    def _serve(self, tag: str, conn: socket.socket) -> None:
        conn.settimeout(10)
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf and b"\n\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                    if len(buf) > 4 << 20:
                        return
                end, sep = _head_end(buf)
                head, buf = buf[:end], buf[end + sep :]
                rec = Record(port_tag=tag, head=head)
                m = MARK_RE.search(head)
                rec.marker = int(m.group(1)) if m else None
                lines = re.split(rb"\r?\n", head)
                parts = lines[0].split(b" ")
                rec.method = parts[0]
                rec.target = parts[1] if len(parts) > 1 else b""
                rec.version = parts[2] if len(parts) > 2 else b""
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    rec.headers.append((name.strip().lower(), value.strip()))
                with self.lock:
                    self.records.append(rec)
                hdr = {}
                for n, v in rec.headers:
                    hdr.setdefault(n, []).append(v)
                te = b",".join(hdr.get(b"transfer-encoding", [])).lower()
                if b"chunked" in te:
                    rec.framing = "chunked"
                    body, buf = _read_chunked(conn, buf)
                elif b"content-length" in hdr:
                    rec.framing = "length"
                    n = int(hdr[b"content-length"][0].split(b",")[0].strip() or b"0")
                    while len(buf) < n:
                        chunk = conn.recv(65536)
                        if not chunk:
                            raise ConnectionError("eof in body")
                        buf += chunk
                    body, buf = buf[:n], buf[n:]
                else:
                    rec.framing = "none"
                    body = b""
                rec.body = body
                rec.complete = True
                keep = not (
                    rec.version == b"HTTP/1.0" or b"close" in b",".join(hdr.get(b"connection", [])).lower()
                )
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n"
                    + (b"" if keep else b"Connection: close\r\n")
                    + b"\r\nok"
                )
                if not keep:
                    return
        except (OSError, ValueError, ConnectionError):
            return
        finally:
            conn.close()


def _head_end(buf: bytes) -> tuple[int, int]:
    a = buf.find(b"\r\n\r\n")
    b = buf.find(b"\n\n")
    if a >= 0 and (b < 0 or a <= b):
        return a, 4
    return b, 2


def _recv_more(conn: socket.socket, buf: bytes) -> bytes:
    chunk = conn.recv(65536)
    if not chunk:
        raise ConnectionError("eof in chunked body")
    return buf + chunk


def _read_chunked(conn: socket.socket, buf: bytes) -> tuple[bytes, bytes]:
    body = b""
    while True:
        while b"\n" not in buf:
            buf = _recv_more(conn, buf)
        line, _, buf = buf.partition(b"\n")
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while True:  # trailers until an empty line
                while b"\n" not in buf:
                    buf = _recv_more(conn, buf)
                line, _, buf = buf.partition(b"\n")
                if line.strip() == b"":
                    return body, buf
        while len(buf) < size + 1:
            buf = _recv_more(conn, buf)
        body += buf[:size]
        buf = buf[size:]
        while b"\n" not in buf:
            buf = _recv_more(conn, buf)
        buf = buf.partition(b"\n")[2]


# ---------------------------------------------------------------------------------------
# Generator
# ---------------------------------------------------------------------------------------


@dataclass
class Req:
    method: bytes = b"GET"
    target: bytes = b"/"
    version: bytes = b"HTTP/1.1"
    headers: list = field(default_factory=list)  # raw lines (bytes), without EOL
    body: bytes = b""
    eol: bytes = b"\r\n"
    prefix: bytes = b""  # before the request line
    suffix: bytes = b""  # after the body (pipelined bytes)
    line_sep: bytes = b" "
    line_override: bytes | None = None
    kinds: list = field(default_factory=list)
    variants: list = field(default_factory=list)

    def set_header(self, name: bytes, value: bytes) -> None:
        self.headers = [h for h in self.headers if h.split(b":")[0].strip().lower() != name.lower()]
        self.headers.append(name + b": " + value)

    def has(self, name: bytes) -> bool:
        return any(h.split(b":")[0].strip().lower() == name.lower() for h in self.headers)

    def drop(self, name: bytes) -> None:
        self.headers = [h for h in self.headers if h.split(b":")[0].strip().lower() != name.lower()]

    def render(self, marker: int) -> bytes:
        line = self.line_override
        if line is None:
            line = self.line_sep.join([self.method, self.target, self.version])
        mark = b"x-diff-id: zq%dqz" % marker
        out = self.prefix + line + self.eol + mark + self.eol
        for h in self.headers:
            out += h + self.eol
        return out + self.eol + self.body + self.suffix


def chunk_body(data: bytes, rng: random.Random) -> bytes:
    out = b""
    i = 0
    while i < len(data):
        n = rng.randint(1, max(1, len(data) - i))
        out += b"%x\r\n" % n + data[i : i + n] + b"\r\n"
        i += n
    return out + b"0\r\n\r\n"


def parse_seed(raw: bytes) -> Req | None:
    """A corpus file as a Req (header lines kept as written); None if it has no head."""
    raw = raw.lstrip(b"\r\n")
    end, sep = _head_end(raw)
    if end < 0:
        head, body = raw, b""
    else:
        head, body = raw[:end], raw[end + sep :]
    lines = re.split(rb"\r?\n", head)
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        return Req(line_override=lines[0], headers=lines[1:], body=body, kinds=[])
    return Req(method=parts[0], target=parts[1], version=parts[2], headers=lines[1:], body=body)


def base_requests() -> list[Req]:
    reqs = [
        Req(headers=[b"Host: example.test"]),
        Req(target=b"/a/b?key=v&x=1", headers=[b"Host: example.test", b"User-Agent: diff", b"Accept: */*"]),
        Req(method=b"POST", target=b"/up", headers=[b"Host: example.test", b"Content-Length: 5"], body=b"hello"),
        Req(
            method=b"POST",
            target=b"/up",
            headers=[b"Host: example.test", b"Transfer-Encoding: chunked"],
            body=b"5\r\nhello\r\n0\r\n\r\n",
        ),
        Req(method=b"PUT", target=b"/put", headers=[b"Host: example.test", b"Content-Length: 0"]),
        Req(method=b"HEAD", target=b"/h", headers=[b"Host: example.test"]),
        Req(method=b"OPTIONS", target=b"*", headers=[b"Host: example.test"]),
        Req(method=b"DELETE", target=b"/d/1", headers=[b"Host: example.test"]),
        Req(version=b"HTTP/1.0", target=b"/old"),
    ]
    corpus = REPO / "fuzz" / "corpus" / "http1"
    if corpus.is_dir():
        for p in sorted(corpus.iterdir()):
            r = parse_seed(p.read_bytes())
            if r is not None:
                r.kinds.append("seed:" + p.name)
                reqs.append(r)
    return reqs


def _cl(r: Req) -> None:
    r.drop(b"content-length")
    r.drop(b"transfer-encoding")


def m_cl_dup_same(r, g):
    if not r.body:
        r.body = b"hello"
    _cl(r)
    r.headers += [b"Content-Length: %d" % len(r.body)] * 2


def m_cl_dup_diff(r, g):
    if not r.body:
        r.body = b"hello"
    _cl(r)
    r.headers += [b"Content-Length: %d" % len(r.body), b"Content-Length: %d" % (len(r.body) + g.randint(1, 9))]


def m_cl_list(r, g):
    if not r.body:
        r.body = b"hello"
    _cl(r)
    n = len(r.body)
    r.headers.append(g.choice([b"Content-Length: %d, %d" % (n, n), b"Content-Length: %d,%d" % (n, n + 1), b"Content-Length: %d," % n, b"Content-Length: ,%d" % n]))


def m_cl_odd_value(r, g):
    if not r.body:
        r.body = b"hello"
    _cl(r)
    n = len(r.body)
    v = g.choice([b"+%d" % n, b"-%d" % n, b"0%d" % n, b"0x%x" % n, b"%d " % n, b" %d" % n, b"%d.0" % n, b"%d %d" % (n, n), b"", b"99999999999999999999", b"%da" % n, b"\t%d" % n])
    r.headers.append(b"Content-Length: " + v)


def m_cl_and_te(r, g):
    data = r.body if r.body and not r.has(b"transfer-encoding") else b"hello"
    _cl(r)
    r.body = chunk_body(data, g)
    hs = [b"Content-Length: %d" % g.choice([len(data), len(r.body), 0]), b"Transfer-Encoding: chunked"]
    g.shuffle(hs)
    r.headers += hs


def m_te_value(r, g):
    data = b"hello"
    _cl(r)
    r.body = chunk_body(data, g)
    v = g.choice([b"gzip, chunked", b"chunked, chunked", b"Chunked", b"CHUNKED", b" chunked ", b"chunked\t", b"xchunked", b"identity", b"chunked, identity", b"identity, chunked", b"", b"chunked;q=1", b"\"chunked\"", b"chunk", b"chunked\x0b"])
    r.headers.append(b"Transfer-Encoding: " + v)


def m_te_dup(r, g):
    _cl(r)
    r.body = chunk_body(b"hello", g)
    r.headers += [b"Transfer-Encoding: chunked", g.choice([b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip", b"Transfer-Encoding: identity"])]


def m_te_http10(r, g):
    _cl(r)
    r.version = b"HTTP/1.0"
    r.body = chunk_body(b"hello", g)
    r.headers.append(b"Transfer-Encoding: chunked")


def m_chunk_odd(r, g):
    _cl(r)
    r.headers.append(b"Transfer-Encoding: chunked")
    r.body = g.choice(
        [
            b"5;ext=1\r\nhello\r\n0\r\n\r\n",
            b'5;ext="a b"\r\nhello\r\n0\r\n\r\n',
            b"5 ;x\r\nhello\r\n0\r\n\r\n",
            b"5 \r\nhello\r\n0\r\n\r\n",
            b"05\r\nhello\r\n0\r\n\r\n",
            b"000000000000000000005\r\nhello\r\n0\r\n\r\n",
            b"A\r\nhellohello\r\n0\r\n\r\n",
            b"a\r\nhellohello\r\n0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"+5\r\nhello\r\n0\r\n\r\n",
            b"5\nhello\n0\n\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhellox\r\n0\r\n\r\n",
            b"5\r\nhell\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n",
            b"5\r\nhello\r\n0\r\nContent-Length: 9\r\n\r\n",
            b"5\r\nhello\r\n0\r\n",
            b"ffffffffffffffff1\r\nhello\r\n0\r\n\r\n",
            b"10000000000000005\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0;e\r\n\r\n",
            b"\r\n5\r\nhello\r\n0\r\n\r\n",
            b"5\x00\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\r\n0\r\n\r\n",
            b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
        ]
    )


def m_obs_fold(r, g):
    if not r.headers:
        r.headers.append(b"Host: example.test")
    i = g.randrange(len(r.headers) + 1)
    r.headers.insert(i, g.choice([b" folded", b"\tfolded", b" ", b" Content-Length: 5"]))
    if g.random() < 0.3:
        r.headers.insert(0, b"X-Fold: a")
        r.headers.insert(1, b" b")


def m_bare_lf(r, g):
    if g.random() < 0.5:
        r.eol = b"\n"
    elif r.headers:
        i = g.randrange(len(r.headers))
        r.headers[i] = r.headers[i] + b"\n" + b"X-After-Lf: 1"


def m_bare_cr(r, g):
    i = g.randrange(len(r.headers)) if r.headers else None
    if i is None:
        r.headers.append(b"X-Cr: a\rb")
    else:
        r.headers[i] += g.choice([b"\rX-Cr: 1", b"\r", b"a\rb"])


def m_space_before_colon(r, g):
    name = g.choice([b"Host", b"Content-Length", b"Transfer-Encoding", b"X-Api-Key", b"X-Plain"])
    sep = g.choice([b" :", b"\t:", b"  :"])
    if name == b"Content-Length":
        if not r.body:
            r.body = b"hello"
        _cl(r)
        r.headers.append(name + sep + b" %d" % len(r.body))
    elif name == b"Transfer-Encoding":
        _cl(r)
        r.body = chunk_body(b"hello", g)
        r.headers.append(name + sep + b" chunked")
    elif name == b"Host":
        r.drop(b"host")
        r.headers.append(name + sep + b" example.test")
    else:
        r.headers.append(name + sep + b" v")


def m_bad_name(r, g):
    name = g.choice([b"X(y)", b"X@y", b"X y", b"X\x00y", b"X\x01y", b"X\x7fy", b"X\xc3\xa9", b"", b"X\"y", b"X/y", b"X[y]", b"X{y}", b"X=y", b"X,y", b"X;y", b"X?y", b"X\\y"])
    r.headers.append(name + b": v")


def m_no_colon(r, g):
    r.headers.append(g.choice([b"NoColonHere", b"X-Thing", b"  ", b"X-A b"]))


def m_bad_value(r, g):
    v = g.choice([b"a\x00b", b"a\x01b", b"a\x7fb", b"a\x0bb", b"a\x0cb", b"\xff\xfe", b"caf\xc3\xa9", b"a\tb", b"trailing  ", b"\x1b[31m"])
    r.headers.append(b"X-Value: " + v)


def m_absolute(r, g):
    path = r.target if r.target.startswith(b"/") else b"/"
    host = g.choice([b"example.test", b"other.test", b"example.test:80", b"[::1]", b"user@example.test", b"example.test:99999", b""])
    scheme = g.choice([b"http://", b"https://", b"HTTP://", b"ftp://", b"http:/", b"//"])
    r.target = scheme + host + path
    if g.random() < 0.3:
        r.drop(b"host")


def m_target_bytes(r, g):
    t = r.target if r.target.startswith(b"/") else b"/t"
    bad = g.choice([b"#frag", b"#", b" x", b"\x01", b"\x7f", b"\t", b"\xff", b"\xc3\xa9", b'"', b"<", b">", b"\\", b"{", b"|", b"^", b"`", b"%", b"%zz", b"%00", b"%2f", b"..", b"/../..", b"//", b"?", b"??a", b"[", b"]"])
    i = g.randrange(len(t) + 1)
    r.target = t[:i] + bad + t[i:]


def m_target_form(r, g):
    r.target = g.choice([b"", b"*", b"x", b"example.test:443", b"/" * 3, b"?q", b"/a" * 600, b"/" + b"a" * 9000, b"/%2e%2e/", b"*/x"])


def m_method(r, g):
    r.method = g.choice([b"get", b"Get", b"FOO", b"GE T", b"G(E)T", b"CONNECT", b"TRACE", b"PATCH", b"PROPFIND", b"M" * 100, b"", b"GET\x00", b"G\xc3\xa9T", b"PRI"])
    if r.method == b"CONNECT":
        r.target = g.choice([b"example.test:443", r.target])


def m_method_body(r, g):
    r.method = g.choice([b"GET", b"HEAD", b"DELETE", b"OPTIONS", b"TRACE"])
    _cl(r)
    r.body = b"hello"
    if g.random() < 0.5:
        r.headers.append(b"Content-Length: 5")
    else:
        r.headers.append(b"Transfer-Encoding: chunked")
        r.body = chunk_body(b"hello", g)


def m_version(r, g):
    r.version = g.choice([b"HTTP/1.0", b"HTTP/1.2", b"HTTP/2.0", b"HTTP/0.9", b"http/1.1", b"HTTP/1.10", b"HTTP/01.1", b"HTTP/1", b"HTTP/11", b"HTTP/1.1 ", b"", b"HTTP/3.0", b"HTTPS/1.1", b"HTTP/1.1\x00"])


def m_line_ws(r, g):
    c = g.choice(["double", "tab", "trailing", "leading", "noversion"])
    if c == "double":
        r.line_sep = b"  "
    elif c == "tab":
        r.line_sep = b"\t"
    elif c == "trailing":
        r.version += b" "
    elif c == "leading":
        r.method = b" " + r.method
    else:
        r.line_override = r.method + b" " + r.target


def m_host(r, g):
    c = g.choice(["missing", "two_same", "two_diff", "empty", "port", "bad", "list", "upper", "long"])
    r.drop(b"host")
    if c == "two_same":
        r.headers += [b"Host: example.test"] * 2
    elif c == "two_diff":
        r.headers += [b"Host: example.test", b"Host: other.test"]
    elif c == "empty":
        r.headers.append(b"Host:")
    elif c == "port":
        r.headers.append(g.choice([b"Host: example.test:8080", b"Host: example.test:", b"Host: example.test:x", b"Host: [::1]:80"]))
    elif c == "bad":
        r.headers.append(g.choice([b"Host: a b", b"Host: a@b", b"Host: a/b", b"Host: a\\b", b"Host: a?b", b"Host: a#b", b"Host: a%20b", b"Host: \xc3\xa9"]))
    elif c == "list":
        r.headers.append(b"Host: example.test, other.test")
    elif c == "upper":
        r.headers.append(b"HOST: Example.TEST")
    elif c == "long":
        r.headers.append(b"Host: " + b"h" * 3000)
    r.kinds[-1] = "host:" + c


def m_huge(r, g):
    c = g.choice(["value16k", "value70k", "many", "target", "name"])
    if c == "value16k":
        r.headers.append(b"X-Big: " + b"v" * 16000)
    elif c == "value70k":
        r.headers.append(b"X-Big: " + b"v" * 70000)
    elif c == "many":
        r.headers += [b"X-N%d: v" % i for i in range(g.choice([100, 101, 150, 300]))]
    elif c == "target":
        r.target = b"/" + b"t" * g.choice([8000, 16000, 70000])
    else:
        r.headers.append(b"X-" + b"n" * 9000 + b": v")
    r.kinds[-1] = "huge:" + c


def m_expect(r, g):
    r.headers.append(g.choice([b"Expect: 100-continue", b"Expect: 100-Continue", b"Expect: foo", b"Expect: 100-continue, foo", b"Expect:"]))
    if g.random() < 0.5:
        _cl(r)
        r.method = b"POST"
        r.headers.append(b"Content-Length: 5")
        r.body = b"hello"


def m_upgrade(r, g):
    c = g.choice(["ws", "h2c", "nocon", "bogus"])
    if c == "ws":
        r.headers += [b"Connection: Upgrade", b"Upgrade: websocket", b"Sec-WebSocket-Version: 13", b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]
    elif c == "h2c":
        r.headers += [b"Connection: Upgrade, HTTP2-Settings", b"Upgrade: h2c", b"HTTP2-Settings: AAMAAABkAAQAAP__"]
    elif c == "nocon":
        r.headers.append(b"Upgrade: websocket")
    else:
        r.headers += [b"Connection: Upgrade", b"Upgrade: \x01bogus"]
    r.kinds[-1] = "upgrade:" + c


def m_connection(r, g):
    r.headers.append(g.choice([b"Connection: close", b"Connection: keep-alive", b"Connection: content-length", b"Connection: host", b"Connection: x-diff-id", b"Connection: transfer-encoding", b"Connection: close, keep-alive", b"Proxy-Connection: keep-alive", b"Keep-Alive: timeout=5", b"TE: trailers", b"TE: gzip", b"Trailer: X-T"]))


def m_leading_crlf(r, g):
    r.prefix = g.choice([b"\r\n", b"\n", b"\r\n\r\n", b" ", b"\t", b"\x00"])


def m_pipelined(r, g):
    r.suffix = g.choice([b"GET /second HTTP/1.1\r\nHost: x\r\n\r\n", b"garbage", b"\r\n", b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"])


def m_body_unframed(r, g):
    _cl(r)
    r.body = b"unframed body bytes"


def m_header_case(r, g):
    if r.body and not r.has(b"transfer-encoding"):
        _cl(r)
        r.headers.append(g.choice([b"content-LENGTH", b"CONTENT-LENGTH", b"cOnTeNt-LeNgTh"]) + b": %d" % len(r.body))
    else:
        r.headers.append(b"x-CaSe: 1")


def m_cl_short_body(r, g):
    """Content-Length larger than the body: both proxies wait (a timeout either way)."""
    _cl(r)
    r.body = b"hello"
    r.headers.append(b"Content-Length: %d" % g.choice([6, 50]))


MUTATIONS = [
    (m_cl_dup_same, "cl_dup_same", 3),
    (m_cl_dup_diff, "cl_dup_diff", 3),
    (m_cl_list, "cl_list", 3),
    (m_cl_odd_value, "cl_odd_value", 4),
    (m_cl_and_te, "cl_and_te", 3),
    (m_te_value, "te_value", 4),
    (m_te_dup, "te_dup", 2),
    (m_te_http10, "te_http10", 2),
    (m_chunk_odd, "chunk_odd", 5),
    (m_obs_fold, "obs_fold", 3),
    (m_bare_lf, "bare_lf", 3),
    (m_bare_cr, "bare_cr", 2),
    (m_space_before_colon, "space_before_colon", 3),
    (m_bad_name, "bad_name", 4),
    (m_no_colon, "no_colon", 2),
    (m_bad_value, "bad_value", 3),
    (m_absolute, "absolute", 4),
    (m_target_bytes, "target_bytes", 5),
    (m_target_form, "target_form", 3),
    (m_method, "method", 3),
    (m_method_body, "method_body", 3),
    (m_version, "version", 3),
    (m_line_ws, "line_ws", 2),
    (m_host, "host", 4),
    (m_huge, "huge", 1),
    (m_expect, "expect", 2),
    (m_upgrade, "upgrade", 2),
    (m_connection, "connection", 3),
    (m_leading_crlf, "leading_crlf", 2),
    (m_pipelined, "pipelined", 2),
    (m_body_unframed, "body_unframed", 1),
    (m_header_case, "header_case", 1),
    (m_cl_short_body, "cl_short_body", 1),
]


Plan = tuple  # (seed index, ((mutation index, rng seed), ...))


def plan(g: random.Random, seeds: list[Req]) -> Plan:
    """What to generate: a seed request and the mutations applied to it, each with its
    own random seed, so that any subset of them can be rebuilt exactly (minimising)."""
    n = g.choices([0, 1, 2, 3], weights=[1, 10, 5, 2])[0]
    weights = [w for _, _, w in MUTATIONS]
    muts = tuple((g.choices(range(len(MUTATIONS)), weights=weights)[0], g.getrandbits(32)) for _ in range(n))
    return (g.randrange(len(seeds)), muts)


def build(p: Plan, seeds: list[Req]) -> Req:
    base = seeds[p[0]]
    r = Req(
        method=base.method,
        target=base.target,
        version=base.version,
        headers=list(base.headers),
        body=base.body,
        line_override=base.line_override,
        kinds=list(base.kinds),
    )
    for i, seed in p[1]:
        fn, name, _ = MUTATIONS[i]
        r.kinds.append(name)
        g = ChoiceLog(seed)
        fn(r, g)
        if g.picked:
            r.variants.append(r.kinds[-1] + "=" + ",".join(g.picked))
    return r


class ChoiceLog(random.Random):
    """A Random that notes what `choice` picked (the variant of a mutation, for the report)."""

    def __init__(self, seed: int):
        super().__init__(seed)
        self.picked: list[str] = []

    def choice(self, seq):
        x = super().choice(seq)
        if isinstance(x, (bytes, str, int)) and not isinstance(x, bool):
            t = _esc(x) if isinstance(x, bytes) else str(x)
            self.picked.append(t if len(t) <= 40 else t[:37] + "...")
        return x


# ---------------------------------------------------------------------------------------
# Client
# ---------------------------------------------------------------------------------------


def exchange(port: int, data: bytes) -> str:
    """Sends `data` on a fresh connection; the outcome: a status code, 'close', 'reset' or
    'timeout' (no complete status line within CLIENT_TIMEOUT)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(CLIENT_TIMEOUT)
    deadline = time.monotonic() + CLIENT_TIMEOUT
    try:
        s.connect(("127.0.0.1", port))
        try:
            s.sendall(data)
        except OSError:
            pass  # the proxy may answer and close before reading everything
        buf = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            r, _, _ = select.select([s], [], [], left)
            if not r:
                return "timeout"
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return _status(buf) or "reset"
            if not chunk:
                return _status(buf) or "close"
            buf += chunk
            st = _status(buf)
            if st:
                if st.startswith("1"):  # 100 Continue: the final status follows
                    i = buf.find(b"\r\n\r\n")
                    if i >= 0:
                        buf = buf[i + 4 :]
                        continue
                    continue
                return st
    except OSError:
        return "close"
    finally:
        s.close()


def _status(buf: bytes) -> str | None:
    m = re.match(rb"HTTP/1\.[01] (\d{3})[ \r\n]", buf)
    return m.group(1).decode() if m else None


# ---------------------------------------------------------------------------------------
# Proxies
# ---------------------------------------------------------------------------------------


def free_port() -> int:
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        if p != 6379:
            return p


PORTCULLIS_CONF = """[server]
listen = ["127.0.0.1:{port}"]
admin_listen = "127.0.0.1:{admin}"
threads = 1
drain_seconds = 0
shutdown_timeout_seconds = 1
upgrade_sock = "{tmp}/upgrade.sock"
client_header_timeout_ms = 5000

[[upstreams]]
name = "app"
backends = ["127.0.0.1:{backend}"]
read_timeout_ms = 5000
retries = 0

[shedding]
max_concurrency = 0

[rate_limit]
enabled = false
missing_key = "allow"

[culling]
enabled = false

[access_log]
enabled = false
"""

HAPROXY_CONF = """global
    maxconn 1000
    nbthread 1

defaults
    mode http
    timeout connect 2s
    timeout client 5s
    timeout server 5s
    timeout http-request 5s

frontend fe
    bind 127.0.0.1:{port}
    default_backend be

backend be
    server s1 127.0.0.1:{backend}
"""


def wait_ready(port: int, proc: subprocess.Popen, name: str, backend: Backend, tag: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} while starting")
        n = backend.snapshot()
        st = exchange(port, b"GET /ready HTTP/1.1\r\nHost: ready\r\nx-diff-id: zq0qz\r\n\r\n")
        if st == "200" and any(r.port_tag == tag for r in backend.since(n)):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{name} not ready on port {port}")


# ---------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------


@dataclass
class Side:
    status: str
    records: list
    stripped: bool = False

    @property
    def forwarded(self) -> bool:
        return bool(self.records)

    @property
    def head_only(self) -> bool:
        """Forwarded the head, then refused the body itself (a 4xx/5xx or a close while
        the backend still waited for the body): streaming, not buffering."""
        return (
            self.forwarded
            and not self.records[0].complete
            and (self.status in ("close", "reset") or self.status[0] in "45")
        )

    def seen(self) -> str:
        if not self.records:
            return "-"
        r = self.records[0]
        return "%s %s %s, body %d bytes%s, framed %s" % (
            _esc(r.method),
            _esc(r.target[:120]) + ("…" if len(r.target) > 120 else ""),
            _esc(r.version),
            len(r.body),
            "" if r.complete else " (incomplete)",
            r.framing or "?",
        )

    def describe(self) -> str:
        if self.head_only:
            return "forwarded the head, then refused the body: " + self.status
        return ("forwarded, answered " if self.forwarded else "refused: ") + self.status + (
            " (the marker field removed)" if self.stripped else ""
        )


def _esc(b: bytes, limit: int = 0) -> str:
    s = repr(bytes(b))[2:-1]
    return s


def judge(pc: Side, ha: Side) -> str | None:
    """The kind of disagreement, or None when the proxies agree."""
    if pc.forwarded != ha.forwarded:
        if pc.head_only or ha.head_only:
            return "pc_streams_head_ha_refuses" if pc.forwarded else "ha_streams_head_pc_refuses"
        return "pc_forwards_ha_refuses" if pc.forwarded else "ha_forwards_pc_refuses"
    if not pc.forwarded:
        return None
    a, b = pc.records[0], ha.records[0]
    if a.complete and b.complete and hashlib.sha1(a.body).digest() != hashlib.sha1(b.body).digest():
        return "body_differs"
    if a.method != b.method:
        return "method_differs"
    if a.target != b.target:
        return "target_differs"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--max-requests", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--portcullis", default=os.environ.get("PORTCULLIS_BIN", str(REPO / "target/debug/portcullis")))
    ap.add_argument("--haproxy", default=os.environ.get("HAPROXY_BIN", "haproxy"))
    ap.add_argument("--report", default="differential-report.md")
    args = ap.parse_args()

    haproxy = shutil.which(args.haproxy)
    if not haproxy or not os.access(args.portcullis, os.X_OK):
        print(f"differential: need haproxy ({args.haproxy}) and portcullis ({args.portcullis})", file=sys.stderr)
        return 2
    ha_version = subprocess.run([haproxy, "-v"], capture_output=True, text=True).stdout.splitlines()[0]

    tmp = tempfile.mkdtemp(prefix="pc-diff-")
    backend = Backend(["portcullis", "haproxy"])
    procs: list[subprocess.Popen] = []

    def stop(*_):
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    signal.signal(signal.SIGTERM, lambda *_: (stop(), sys.exit(1)))
    try:
        pc_port, pc_admin, ha_port = free_port(), free_port(), free_port()
        Path(tmp, "portcullis.toml").write_text(
            PORTCULLIS_CONF.format(port=pc_port, admin=pc_admin, tmp=tmp, backend=backend.port("portcullis"))
        )
        Path(tmp, "haproxy.cfg").write_text(HAPROXY_CONF.format(port=ha_port, backend=backend.port("haproxy")))
        pc_log = open(Path(tmp, "portcullis.log"), "wb")
        ha_log = open(Path(tmp, "haproxy.log"), "wb")
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn"))
        pc = subprocess.Popen([args.portcullis, "-c", str(Path(tmp, "portcullis.toml"))], stdout=pc_log, stderr=subprocess.STDOUT, env=env)
        procs.append(pc)
        ha = subprocess.Popen([haproxy, "-f", str(Path(tmp, "haproxy.cfg")), "-db"], stdout=ha_log, stderr=subprocess.STDOUT)
        procs.append(ha)
        wait_ready(pc_port, pc, "portcullis", backend, "portcullis")
        wait_ready(ha_port, ha, "haproxy", backend, "haproxy")

        g = random.Random(args.seed)
        seeds = base_requests()
        groups: dict[str, dict] = {}
        extras: dict[str, dict] = {}
        n = agree = disagree = 0
        counter = [0]

        def run(req: Req) -> tuple[bytes, dict]:
            counter[0] += 1
            marker = counter[0]
            data = req.render(marker)
            before = backend.snapshot()
            out: dict[str, str] = {}
            ts = [
                threading.Thread(target=lambda t=tag, pt=port: out.__setitem__(t, exchange(pt, data)))
                for tag, port in (("portcullis", pc_port), ("haproxy", ha_port))
            ]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            if out["portcullis"] != "200" or out["haproxy"] != "200":
                time.sleep(SETTLE)
            recs = backend.since(before)
            sides = {}
            for tag in ("portcullis", "haproxy"):
                mine = [r for r in recs if r.port_tag == tag and r.marker == marker]
                unmarked = [r for r in recs if r.port_tag == tag and r.marker is None]
                stripped = False
                if not mine and len(unmarked) == 1 and (unmarked[0].method, unmarked[0].target) == (req.method, req.target):
                    # the proxy removed the marker field (`Connection: x-diff-id`): the
                    # one unmarked request of this window is this request
                    mine, unmarked, stripped = unmarked, [], True
                sides[tag] = Side(out[tag], mine, stripped)
                if len(mine) > 1 or unmarked:
                    sig = tag + ": " + "+".join(sorted(set(req.kinds)))
                    e = extras.setdefault(sig, {"count": 0, "data": data})
                    e["count"] += 1
                    if len(data) < len(e["data"]):
                        e["data"] = data
            return data, sides

        def check_alive() -> str | None:
            for name, p in (("portcullis", pc), ("haproxy", ha)):
                if p.poll() is not None:
                    return f"{name} exited ({p.returncode})"
            if not backend.alive():
                return "the recording backend died"
            return None

        start = time.monotonic()
        failure = None
        while n < args.max_requests and time.monotonic() - start < args.seconds:
            n += 1
            pl = plan(g, seeds)
            req = build(pl, seeds)
            data, sides = run(req)
            failure = check_alive()
            if failure:
                failure += f" after request {n}: `{_esc(data[:2000])}`"
                break
            kind = judge(sides["portcullis"], sides["haproxy"])
            if kind is None:
                agree += 1
                continue
            disagree += 1
            # Minimise: the seed alone, then each mutation alone; the first that shows the
            # same kind of disagreement names the group.
            if pl[1]:
                for sub in [(pl[0], ())] + [(pl[0], (m,)) for m in pl[1]] if len(pl[1]) > 1 else [(pl[0], ())]:
                    r2 = build(sub, seeds)
                    d2, s2 = run(r2)
                    if judge(s2["portcullis"], s2["haproxy"]) == kind:
                        req, data, sides = r2, d2, s2
                        break
                failure = check_alive()
                if failure:
                    failure += f" while minimising request {n}"
                    break
            # the seed names the group only when it disagrees unmutated
            muts = [k for k in req.kinds if not k.startswith("seed:")]
            kinds = sorted(set(muts)) if muts else [k for k in req.kinds if k.startswith("seed:")] or ["seed"]
            seed_name = ([k for k in req.kinds if k.startswith("seed:")] or ["seed:builtin"])[0]
            sig = kind + " | " + "+".join(kinds)
            grp = groups.setdefault(sig, {"kind": kind, "kinds": kinds, "count": 0, "variants": {}})
            grp["count"] += 1
            var = "; ".join([seed_name] + req.variants)
            v = grp["variants"].get(var)
            if v is None or len(data) < len(v["data"]):
                grp["variants"][var] = {"data": data, "pc": sides["portcullis"], "ha": sides["haproxy"], "count": (v["count"] if v else 0)}
            grp["variants"][var]["count"] += 1
        elapsed = time.monotonic() - start
        write_report(args, ha_version, n, agree, disagree, groups, extras, elapsed, failure)
        print(f"differential: requests={n} agree={agree} disagree={disagree} groups={len(groups)}")
        print(f"differential: report in {args.report}")
        if failure:
            print(f"differential: harness failure: {failure}", file=sys.stderr)
            for name in ("portcullis.log", "haproxy.log"):
                try:
                    print(f"--- {name} (tail)\n" + Path(tmp, name).read_text(errors="replace")[-3000:], file=sys.stderr)
                except OSError:
                    pass
            return 1
        return 0
    except RuntimeError as e:
        print(f"differential: {e}", file=sys.stderr)
        return 1
    finally:
        stop()


def write_report(args, ha_version, n, agree, disagree, groups, extras, elapsed, failure) -> None:
    out = []
    out.append("# Differential run: portcullis vs HAProxy\n")
    out.append(f"- seed {args.seed}, {n} requests in {elapsed:.0f} s; {ha_version}; portcullis `{args.portcullis}`")
    out.append(f"- `differential: requests={n} agree={agree} disagree={disagree} groups={len(groups)}`")
    if failure:
        out.append(f"- **harness failure**: {failure}")
    out.append("")
    by_kind: dict[str, list] = {}
    for sig, grp in groups.items():
        by_kind.setdefault(grp["kind"], []).append((sig, grp))
    for kind in sorted(by_kind):
        out.append(f"## {kind} ({sum(g['count'] for _, g in by_kind[kind])} requests, {len(by_kind[kind])} groups)\n")
        for sig, grp in sorted(by_kind[kind], key=lambda x: -x[1]["count"]):
            out.append(f"### `{'+'.join(grp['kinds']) or 'seed'}` ×{grp['count']}\n")
            variants = sorted(grp["variants"].items(), key=lambda x: -x[1]["count"])
            for var, v in variants[:30]:
                out.append(f"- variant `{var}` ×{v['count']}:")
                out.append("  ```")
                out.append("  " + _esc(v["data"][:1200]) + (" …" if len(v["data"]) > 1200 else ""))
                out.append("  ```")
                out.append(f"  portcullis: {v['pc'].describe()}; backend saw {v['pc'].seen()}  ")
                out.append(f"  HAProxy: {v['ha'].describe()}; backend saw {v['ha'].seen()}")
            if len(variants) > 30:
                out.append(f"- … {len(variants) - 30} more variants")
            out.append("")
    if extras:
        out.append("## Requests after which the backend saw another request (pipelining, smuggling?)\n")
        for sig, e in sorted(extras.items(), key=lambda x: -x[1]["count"]):
            out.append(f"- {sig} ×{e['count']}: `{_esc(e['data'][:400])}`")
        out.append("")
    Path(args.report).write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    sys.exit(main())
