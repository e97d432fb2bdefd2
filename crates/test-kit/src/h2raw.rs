//! [`H2Raw`]: a raw HTTP/2 client over cleartext (prior knowledge) that writes frames by
//! hand, for the attacks no well-behaved client sends: rapid reset floods, more
//! concurrent streams than the server allows, oversized header blocks. It records what
//! the server sends back per frame type, without decoding HPACK.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const RST_STREAM: u8 = 0x3;
pub const GOAWAY: u8 = 0x7;
pub const HEADERS: u8 = 0x1;
pub const REFUSED_STREAM: u32 = 0x7;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// What the server sent.
#[derive(Debug, Default)]
pub struct H2Seen {
    /// Streams that got a response HEADERS frame.
    pub responses: Vec<u32>,
    /// RST_STREAM per stream: the error code.
    pub resets: BTreeMap<u32, u32>,
    /// GOAWAY error code, if any.
    pub goaway: Option<u32>,
    /// The connection ended (EOF or reset).
    pub closed: bool,
}

pub struct H2Raw {
    s: TcpStream,
}

fn hpack_int(out: &mut Vec<u8>, first: u8, prefix_bits: u8, mut v: usize) {
    let max = (1usize << prefix_bits) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// An HPACK block of literal fields without indexing (no Huffman).
pub fn hpack_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in fields {
        out.push(0x00);
        hpack_int(&mut out, 0, 7, k.len());
        out.extend_from_slice(k.as_bytes());
        hpack_int(&mut out, 0, 7, v.len());
        out.extend_from_slice(v.as_bytes());
    }
    out
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

impl H2Raw {
    /// Connects, sends the preface and an empty SETTINGS frame.
    pub fn connect(addr: &str) -> H2Raw {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        s.write_all(PREFACE).expect("preface");
        s.write_all(&frame(0x4, 0, 0, &[])).expect("settings");
        H2Raw { s }
    }

    /// Connects from the local address `source` (e.g. a balancer on 127.0.0.2), writes
    /// `prefix` (a PROXY header), then the preface and an empty SETTINGS frame.
    pub fn connect_from(addr: &str, source: &str, prefix: &[u8]) -> H2Raw {
        let mut s = super::Conn::open_from(addr, source)
            .expect("connect")
            .into_stream();
        s.set_read_timeout(None).expect("blocking reads");
        s.write_all(prefix).expect("prefix");
        s.write_all(PREFACE).expect("preface");
        s.write_all(&frame(0x4, 0, 0, &[])).expect("settings");
        H2Raw { s }
    }

    /// The request header block for a GET of `path` plus `extra` fields.
    pub fn request_block(authority: &str, path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
        let mut fields = vec![
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", authority),
            (":path", path),
        ];
        fields.extend_from_slice(extra);
        hpack_block(&fields)
    }

    /// HEADERS (+ CONTINUATION frames when the block exceeds 16 KiB), END_STREAM set.
    pub fn headers(&mut self, stream: u32, block: &[u8]) -> io::Result<()> {
        let mut chunks = block.chunks(16_384).peekable();
        let first = chunks.next().unwrap_or(&[]);
        let end_headers = if chunks.peek().is_none() { 0x4 } else { 0 };
        let mut out = frame(HEADERS, 0x1 | end_headers, stream, first);
        while let Some(c) = chunks.next() {
            let end = if chunks.peek().is_none() { 0x4 } else { 0 };
            out.extend(frame(0x9, end, stream, c));
        }
        self.s.write_all(&out)
    }

    pub fn rst(&mut self, stream: u32, code: u32) -> io::Result<()> {
        self.s
            .write_all(&frame(RST_STREAM, 0, stream, &code.to_be_bytes()))
    }

    /// Writes many frames at once (for floods).
    pub fn write_frames(&mut self, frames: &[Vec<u8>]) -> io::Result<()> {
        let all: Vec<u8> = frames.concat();
        self.s.write_all(&all)
    }

    pub fn headers_frame(stream: u32, block: &[u8]) -> Vec<u8> {
        frame(HEADERS, 0x5, stream, block)
    }

    pub fn rst_frame(stream: u32, code: u32) -> Vec<u8> {
        frame(RST_STREAM, 0, stream, &code.to_be_bytes())
    }

    /// Reads frames until `done(seen)` or `timeout`, acking SETTINGS and PINGs.
    pub fn read_until(&mut self, timeout: Duration, done: impl Fn(&H2Seen) -> bool) -> H2Seen {
        let mut seen = H2Seen::default();
        let deadline = Instant::now() + timeout;
        let mut buf: Vec<u8> = Vec::new();
        let mut tmp = [0u8; 16 * 1024];
        while !done(&seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let _ = self.s.set_read_timeout(Some(left));
            match self.s.read(&mut tmp) {
                Ok(0) => {
                    seen.closed = true;
                    break;
                }
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    break
                }
                Err(_) => {
                    seen.closed = true;
                    break;
                }
            }
            while buf.len() >= 9 {
                let len =
                    (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
                if buf.len() < 9 + len {
                    break;
                }
                let (kind, flags) = (buf[3], buf[4]);
                let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
                let payload: Vec<u8> = buf[9..9 + len].to_vec();
                buf.drain(..9 + len);
                match kind {
                    HEADERS => seen.responses.push(stream),
                    RST_STREAM if payload.len() == 4 => {
                        let code =
                            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                        seen.resets.insert(stream, code);
                    }
                    GOAWAY if payload.len() >= 8 => {
                        seen.goaway = Some(u32::from_be_bytes([
                            payload[4], payload[5], payload[6], payload[7],
                        ]));
                    }
                    0x4 if flags & 1 == 0 => {
                        let _ = self.s.write_all(&frame(0x4, 1, 0, &[]));
                    }
                    0x6 if flags & 1 == 0 => {
                        let _ = self.s.write_all(&frame(0x6, 1, 0, &payload));
                    }
                    _ => {}
                }
            }
        }
        seen
    }
}
