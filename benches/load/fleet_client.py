#!/usr/bin/env python3
"""Paced load for benches/load/fleet.sh (stdlib only, loopback only).

  fleet_client.py RATE SECONDS WINDOW_MS KEY PORT...

Sends RATE requests/s in total, spread evenly over the proxies on PORT... (one keep-alive
connection each, a fixed schedule, round robin), all with `x-api-key: KEY`, for SECONDS
seconds. A request whose turn came while its connection was still busy waits for it (the
schedule does not pile up). Prints one JSON object: per epoch-aligned window of WINDOW_MS
(by the time each response arrived) the counts of 200, 429 and anything else, and the
totals.
"""
import asyncio
import json
import sys
import time


async def run(rate, seconds, window_ms, key, ports):
    per_window = {}
    conns = []
    for p in ports:
        r, w = await asyncio.open_connection("127.0.0.1", p)
        conns.append((r, w, asyncio.Lock()))
    req = (
        "GET / HTTP/1.1\r\nHost: fleet\r\nx-api-key: %s\r\n\r\n" % key
    ).encode()

    async def one(i):
        r, w, lock = conns[i % len(conns)]
        async with lock:
            w.write(req)
            await w.drain()
            status_line = await r.readline()
            length = 0
            while True:
                line = await r.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                k, _, v = line.decode("latin-1").partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            if length:
                await r.readexactly(length)
        parts = status_line.split()
        status = int(parts[1]) if len(parts) > 1 else 0
        win = int(time.time() * 1000) // window_ms
        c = per_window.setdefault(win, [0, 0, 0])
        c[0 if status == 200 else 1 if status == 429 else 2] += 1

    start = time.monotonic()
    total = int(rate * seconds)
    tasks = []
    for i in range(total):
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
    for _, w, _ in conns:
        w.close()
    out = {
        "sent": total,
        "seconds": round(time.monotonic() - start, 3),
        "windows": {str(k): v for k, v in sorted(per_window.items())},
    }
    print(json.dumps(out))


def main():
    rate, seconds, window_ms, key = (
        float(sys.argv[1]),
        float(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4],
    )
    ports = [int(p) for p in sys.argv[5:]]
    asyncio.run(run(rate, seconds, window_ms, key, ports))


if __name__ == "__main__":
    main()
