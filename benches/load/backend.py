#!/usr/bin/env python3
"""Test backends for benches/load/run.sh (loopback only, stdlib only).

  backend.py slow PORT SLOTS SERVICE_MS LIFETIME_S
      HTTP/1.1 keep-alive server with a fixed service time and a fixed
      capacity: at most SLOTS requests are served at once (the rest wait in
      FIFO order), each takes SERVICE_MS. Capacity = SLOTS * 1000 / SERVICE_MS rps.
      A request's `x-seq` header is echoed in its 200 (overload.lua times the
      2xx by it).
  backend.py hang PORT LIFETIME_S
      Listens but never accepts: connects succeed (kernel backlog), requests
      are never answered. Used to hold a load-shedding slot open.

Both exit by themselves after LIFETIME_S seconds.
"""
import asyncio
import socket
import sys
import time

RESP = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n"
    b"Connection: keep-alive\r\n\r\nok\n"
)
RESP_SEQ = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n"
    b"X-Seq: %s\r\nConnection: keep-alive\r\n\r\nok\n"
)


async def slow(port: int, slots: int, service_ms: float, lifetime: float) -> None:
    sem = asyncio.Semaphore(slots)
    delay = service_ms / 1000.0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                # GET/HEAD only in the benchmarks; skip a body if one is declared
                seq = None
                for line in head.split(b"\r\n"):
                    name = line[:15].lower()
                    if name == b"content-length:":
                        n = int(line[15:].strip() or 0)
                        if n:
                            await reader.readexactly(n)
                    elif name[:6] == b"x-seq:":
                        seq = line[6:].strip()
                async with sem:
                    await asyncio.sleep(delay)
                writer.write(RESP if seq is None else RESP_SEQ % seq)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    print(f"listening on 127.0.0.1:{port}", flush=True)
    async with server:
        await asyncio.sleep(lifetime)


def hang(port: int, lifetime: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(128)
    print(f"listening on 127.0.0.1:{port}", flush=True)
    time.sleep(lifetime)


def main() -> None:
    mode = sys.argv[1]
    if mode == "slow":
        port, slots, service_ms, lifetime = sys.argv[2:6]
        asyncio.run(slow(int(port), int(slots), float(service_ms), float(lifetime)))
    elif mode == "hang":
        port, lifetime = sys.argv[2:4]
        hang(int(port), float(lifetime))
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
