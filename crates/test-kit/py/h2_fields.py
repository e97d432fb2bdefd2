"""How a server encodes its HTTP/2 response fields (HPACK), read by Debian's python3-h2
stack (hyperframe for the frames, hpack for the header blocks).

  h2_fields.py ADDR PATH N [NAME:VALUE...]

Opens one h2c connection (prior knowledge) to ADDR, sends N GETs of PATH one after the
other with the given request fields, and prints one JSON line per response:
  {"block_len": <bytes of the HEADERS block>, "fields": [[name, value, never_indexed], ...]}
never_indexed is true for a field sent as an HPACK literal "never indexed".
"""
import json
import socket
import sys

from hpack import Decoder, Encoder, NeverIndexedHeaderTuple
from hyperframe.frame import (ContinuationFrame, DataFrame, Frame, HeadersFrame,
                              SettingsFrame, WindowUpdateFrame)


def main():
    addr, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    extra = [tuple(a.split(":", 1)) for a in sys.argv[4:]]
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SettingsFrame(0).serialize())
    enc, dec = Encoder(), Decoder()
    buf = b""

    def frames():
        nonlocal buf
        while True:
            while len(buf) >= 9:
                f, length = Frame.parse_frame_header(memoryview(buf[:9]))
                if len(buf) < 9 + length:
                    break
                f.parse_body(memoryview(buf[9:9 + length]))
                buf = buf[9 + length:]
                yield f
            chunk = sock.recv(65536)
            if not chunk:
                raise SystemExit("connection closed")
            buf += chunk

    it = frames()
    for i in range(n):
        stream = 2 * i + 1
        fields = [(":method", "GET"), (":scheme", "http"), (":authority", addr),
                  (":path", path)] + extra
        h = HeadersFrame(stream, enc.encode(fields), flags=["END_HEADERS", "END_STREAM"])
        sock.sendall(h.serialize())
        block, done = b"", False
        while not done:
            f = next(it)
            if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
                sock.sendall(SettingsFrame(0, flags=["ACK"]).serialize())
            elif isinstance(f, (HeadersFrame, ContinuationFrame)) and f.stream_id == stream:
                block += f.data
                if "END_HEADERS" in f.flags:
                    decoded = dec.decode(block)
                    print(json.dumps({
                        "block_len": len(block),
                        "fields": [[k, v, isinstance(t, NeverIndexedHeaderTuple)]
                                   for t in decoded for k, v in [t]],
                    }), flush=True)
                    if "END_STREAM" in f.flags:
                        done = True
            elif isinstance(f, DataFrame) and f.stream_id == stream:
                if "END_STREAM" in f.flags:
                    done = True
                if f.flow_controlled_length:
                    update = WindowUpdateFrame(0, f.flow_controlled_length).serialize()
                    if not done:
                        update += WindowUpdateFrame(stream, f.flow_controlled_length).serialize()
                    sock.sendall(update)
    sock.close()


if __name__ == "__main__":
    main()
