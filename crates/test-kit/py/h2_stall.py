"""HTTP/2 streams whose request body stalls, spoken by Debian's python3-h2.

  h2_stall.py ADDR PATH N SECONDS

Opens one h2c connection (prior knowledge) to ADDR and starts N POST streams of PATH at
once, each announcing `content-length: 100` and sending 10 bytes of it, then nothing
more. Prints `ready` when every stream is sent, then reads what the server answers for
at most SECONDS, and prints one JSON line per stream:
  {"stream": id, "status": 408 | null, "reset": <RST_STREAM code> | null, "ms": <ms from
   the send to the stream's end, or null>}
and a last line {"goaway": <code> | null, "closed": bool}.
"""
import json
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events


def main():
    addr, path, n, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    streams = {}
    for _ in range(n):
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"),
                                (":authority", addr), (":path", path),
                                ("content-length", "100")])
        conn.send_data(sid, b"0123456789")
        streams[sid] = {"stream": sid, "status": None, "reset": None, "ms": None}
    start = time.monotonic()
    sock.sendall(conn.data_to_send())
    print("ready", flush=True)
    goaway, closed = None, False
    deadline = start + seconds

    def done():
        return all(s["ms"] is not None for s in streams.values())

    while not done() and not closed:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except socket.timeout:
            break
        except OSError:
            closed = True
            break
        if not data:
            closed = True
            break
        for ev in conn.receive_data(data):
            s = streams.get(getattr(ev, "stream_id", None))
            ms = round((time.monotonic() - start) * 1000)
            if isinstance(ev, h2.events.ResponseReceived) and s:
                for k, v in ev.headers:
                    if k in (b":status", ":status"):
                        s["status"] = int(v)
            elif isinstance(ev, h2.events.DataReceived):
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded) and s and s["ms"] is None:
                s["ms"] = ms
            elif isinstance(ev, h2.events.StreamReset) and s:
                s["reset"] = int(ev.error_code)
                if s["ms"] is None:
                    s["ms"] = ms
            elif isinstance(ev, h2.events.ConnectionTerminated):
                goaway = int(ev.error_code)
        out = conn.data_to_send()
        if out:
            try:
                sock.sendall(out)
            except OSError:
                closed = True
    for s in streams.values():
        print(json.dumps(s), flush=True)
    print(json.dumps({"goaway": goaway, "closed": closed}), flush=True)
    sock.close()


if __name__ == "__main__":
    main()
