//! WebSocket parts: [`WsEchoServer`], a real RFC 6455 echo server (std threads), and
//! [`WsClient`], a minimal client that opens a tunnel through the proxy.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::*;

const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// `Sec-WebSocket-Accept` for a key.
pub fn ws_accept(key: &str) -> String {
    let digest = openssl::sha::sha1(format!("{key}{GUID}").as_bytes());
    openssl::base64::encode_block(&digest)
}

/// Reads an HTTP head (up to and including the blank line).
fn read_head(s: &mut TcpStream) -> io::Result<String> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "eof in head"));
        }
        head.push(b[0]);
        if head.len() > 64 * 1024 {
            return Err(io::Error::other("head too large"));
        }
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

fn head_header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// One frame: (fin+opcode byte, payload). Unmasks a masked frame.
fn read_frame(s: &mut TcpStream) -> io::Result<(u8, Vec<u8>)> {
    let mut h = [0u8; 2];
    s.read_exact(&mut h)?;
    let masked = h[1] & 0x80 != 0;
    let mut len = u64::from(h[1] & 0x7f);
    if len == 126 {
        let mut l = [0u8; 2];
        s.read_exact(&mut l)?;
        len = u64::from(u16::from_be_bytes(l));
    } else if len == 127 {
        let mut l = [0u8; 8];
        s.read_exact(&mut l)?;
        len = u64::from_be_bytes(l);
    }
    let mut mask = [0u8; 4];
    if masked {
        s.read_exact(&mut mask)?;
    }
    let mut payload = vec![0u8; usize::try_from(len).map_err(io::Error::other)?];
    s.read_exact(&mut payload)?;
    if masked {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
    }
    Ok((h[0] & 0x0f, payload))
}

fn write_frame(
    s: &mut TcpStream,
    opcode: u8,
    payload: &[u8],
    mask: Option<[u8; 4]>,
) -> io::Result<()> {
    let mut f = vec![0x80 | opcode];
    let m = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => f.push(m | n as u8),
        n if n <= 0xffff => {
            f.push(m | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(m | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(k) => {
            f.extend_from_slice(&k);
            f.extend(payload.iter().enumerate().map(|(i, b)| b ^ k[i % 4]));
        }
        None => f.extend_from_slice(payload),
    }
    s.write_all(&f)
}

struct EchoState {
    upgrades: AtomicU64,
    open: AtomicU64,
    stopped: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
}

/// A WebSocket echo server: answers the upgrade with `101` and a correct
/// `Sec-WebSocket-Accept`, echoes text and binary frames, answers close with close;
/// a request without `Upgrade` gets `200 plain`. Two paths talk one way only: on
/// `/push…` the server sends a `tick` frame every 300 ms for 4 s and reads nothing, then
/// stays silent; on `/sink…` it reads frames and answers none (but close).
pub struct WsEchoServer {
    port: u16,
    st: Arc<EchoState>,
}

impl WsEchoServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let st = Arc::new(EchoState {
            upgrades: AtomicU64::new(0),
            open: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
        });
        let st2 = Arc::clone(&st);
        thread::spawn(move || {
            for conn in listener.incoming() {
                if st2.stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                if let Ok(c) = conn.try_clone() {
                    lock(&st2.conns).push(c);
                }
                let st3 = Arc::clone(&st2);
                thread::spawn(move || {
                    let _ = serve(conn, &st3);
                });
            }
        });
        Self { port, st }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Upgrade requests answered with 101 so far.
    pub fn upgrades(&self) -> u64 {
        self.st.upgrades.load(Ordering::SeqCst)
    }

    /// WebSocket connections open on the server side.
    pub fn open(&self) -> u64 {
        self.st.open.load(Ordering::SeqCst)
    }
}

impl Drop for WsEchoServer {
    fn drop(&mut self) {
        self.st.stopped.store(true, Ordering::SeqCst);
        for c in lock(&self.st.conns).drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        let _ = TcpStream::connect(self.addr());
    }
}

struct OpenGuard<'a>(&'a EchoState);
impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

fn serve(mut s: TcpStream, st: &EchoState) -> io::Result<()> {
    loop {
        let head = read_head(&mut s)?;
        let upgrade =
            head_header(&head, "upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        let Some(key) = head_header(&head, "sec-websocket-key").filter(|_| upgrade) else {
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nplain")?;
            continue;
        };
        let accept = ws_accept(key);
        // Counted before the 101 goes out: a client that has seen it may ask at once.
        st.upgrades.fetch_add(1, Ordering::SeqCst);
        s.write_all(
            format!(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
            )
            .as_bytes(),
        )?;
        st.open.fetch_add(1, Ordering::SeqCst);
        let _open = OpenGuard(st);
        let path = head.split(' ').nth(1).unwrap_or("/");
        if path.starts_with("/push") {
            let until = std::time::Instant::now() + Duration::from_secs(4);
            while std::time::Instant::now() < until {
                write_frame(&mut s, 0x1, b"tick", None)?;
                // pacing of the pushes
                thread::sleep(Duration::from_millis(300));
            }
            // silent from now on, until the connection ends
            let mut b = [0u8; 1024];
            while s.read(&mut b)? > 0 {}
            return Ok(());
        }
        let sink = path.starts_with("/sink");
        loop {
            let (op, payload) = read_frame(&mut s)?;
            match op {
                0x8 => {
                    write_frame(&mut s, 0x8, &payload, None)?;
                    return Ok(());
                }
                _ if sink => {}
                0x9 => write_frame(&mut s, 0xA, &payload, None)?,
                _ => write_frame(&mut s, op, &payload, None)?,
            }
        }
    }
}

/// A WebSocket client connection (through the proxy).
pub struct WsClient {
    s: TcpStream,
}

/// What an upgrade attempt got.
pub enum WsOpen {
    Open(WsClient),
    /// Not upgraded: the status and the response head.
    Refused(u16, String),
}

impl WsClient {
    /// Sends the upgrade request for `path` to `addr`.
    pub fn connect(addr: &str, path: &str) -> WsOpen {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(CLIENT_TIMEOUT)).expect("timeout");
        let key = "dGhlIHNhbXBsZSBub25jZQ==";
        s.write_all(
            format!(
                "GET {path} HTTP/1.1\r\nHost: ws.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            .as_bytes(),
        )
        .expect("send upgrade");
        let head = read_head(&mut s).expect("response head");
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        if status != 101 {
            return WsOpen::Refused(status, head);
        }
        assert_eq!(
            head_header(&head, "sec-websocket-accept"),
            Some(ws_accept(key).as_str()),
            "{head}"
        );
        WsOpen::Open(WsClient { s })
    }

    /// Like [`WsClient::connect`] but panics unless upgraded.
    pub fn open(addr: &str, path: &str) -> WsClient {
        match Self::connect(addr, path) {
            WsOpen::Open(c) => c,
            WsOpen::Refused(st, head) => panic!("upgrade refused with {st}: {head}"),
        }
    }

    /// Sends a masked text frame and returns the echoed payload.
    pub fn echo(&mut self, text: &str) -> String {
        write_frame(&mut self.s, 0x1, text.as_bytes(), Some([1, 2, 3, 4])).expect("send frame");
        let (op, payload) = read_frame(&mut self.s).expect("echo frame");
        assert_eq!(op, 0x1);
        String::from_utf8_lossy(&payload).into_owned()
    }

    /// Sends a masked text frame and reads nothing.
    pub fn send(&mut self, text: &str) {
        write_frame(&mut self.s, 0x1, text.as_bytes(), Some([1, 2, 3, 4])).expect("send frame");
    }

    /// Sends close and waits for the close frame back.
    pub fn close(mut self) {
        write_frame(&mut self.s, 0x8, &[3, 232], Some([9, 8, 7, 6])).expect("send close");
        let (op, _) = read_frame(&mut self.s).expect("close frame");
        assert_eq!(op, 0x8);
    }

    /// True when the connection is closed from the other side within `timeout`
    /// (EOF or reset; frames received meanwhile are skipped).
    pub fn is_closed_within(&mut self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut b = [0u8; 1024];
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ = self.s.set_read_timeout(Some(left));
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return false
                }
                Err(_) => return true,
            }
        }
    }
}
