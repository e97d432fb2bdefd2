//! A tiny HTTP/1.1 backend for trying portcullis out: `scripts/run.sh` starts
//! two of these when nothing listens on the default config's backends, and
//! `scripts/demo.sh` drives them through the tour. It is never part of the
//! proxied path in production; point `[[upstreams]] backends` at your own
//! services instead.
//!
//! ```text
//! demo_backend 127.0.0.1:9001
//! ```
//!
//! * any path: `200` with `hello from demo backend 127.0.0.1:9001`;
//! * `/slow…?ms=N`: the same after N ms (at most 60 000), for the shedding demo;
//! * `/_demo/fail` switches this backend to answering every other request `500`,
//!   `/_demo/recover` switches it back, `/_demo/state` says which (any method;
//!   call them on the backend's own port, not through the proxy).
//!
//! Keep-alive, `Content-Length` request bodies (read and dropped), std + tokio only.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Largest request header block accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Longest `/slow` delay.
const MAX_SLOW_MS: u64 = 60_000;

struct State {
    addr: SocketAddr,
    failing: AtomicBool,
}

struct Request {
    path: String,
    query: String,
    close: bool,
    body_len: usize,
    chunked: bool,
}

fn main() {
    let Some(arg) = std::env::args().nth(1) else {
        eprintln!("usage: demo_backend HOST:PORT");
        std::process::exit(2);
    };
    let addr: SocketAddr = match arg.parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("demo_backend: bad address {arg:?}: {e}");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("demo_backend: cannot start a runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(serve(addr)) {
        eprintln!("demo_backend {addr}: {e}");
        std::process::exit(1);
    }
}

async fn serve(addr: SocketAddr) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    let state = Arc::new(State {
        addr: listener.local_addr()?,
        failing: AtomicBool::new(false),
    });
    eprintln!("demo backend listening on {}", state.addr);
    loop {
        let (stream, _) = listener.accept().await?;
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            // A broken client connection only ends that connection.
            let _ = connection(stream, state).await;
        });
    }
}

async fn connection(mut stream: TcpStream, state: Arc<State>) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        let Some(head_end) = read_head(&mut stream, &mut buf).await? else {
            return Ok(());
        };
        let Some(req) = parse_head(&buf[..head_end]) else {
            respond(&mut stream, 400, "bad request\n", true).await?;
            return Ok(());
        };
        buf.drain(..head_end);
        // Drop the request body (Content-Length only; chunked bodies end the connection).
        let mut left = req.body_len;
        while left > 0 {
            if buf.is_empty() && stream.read_buf(&mut buf).await? == 0 {
                return Ok(());
            }
            let n = left.min(buf.len());
            buf.drain(..n);
            left -= n;
        }
        let close = req.close || req.chunked;
        let (status, body) = handle(&req, &state).await;
        respond(&mut stream, status, &body, close).await?;
        if close {
            return Ok(());
        }
    }
}

/// Reads until the end of a header block; returns its length, or `None` on EOF.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<usize>> {
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(Some(i + 4));
        }
        if buf.len() > MAX_HEAD {
            return Ok(None);
        }
        if stream.read_buf(buf).await? == 0 {
            return Ok(None);
        }
    }
}

fn parse_head(head: &[u8]) -> Option<Request> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let mut parts = lines.next()?.split(' ');
    let _method = parts.next()?;
    let target = parts.next()?;
    let version = parts.next()?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut req = Request {
        path: path.to_string(),
        query: query.to_string(),
        close: version == "HTTP/1.0",
        body_len: 0,
        chunked: false,
    };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => req.body_len = value.parse().ok()?,
            "transfer-encoding" => req.chunked = true,
            "connection" if value.eq_ignore_ascii_case("close") => req.close = true,
            "connection" if value.eq_ignore_ascii_case("keep-alive") => req.close = false,
            _ => {}
        }
    }
    Some(req)
}

async fn handle(req: &Request, state: &State) -> (u16, String) {
    let me = state.addr;
    match req.path.as_str() {
        "/_demo/fail" => {
            state.failing.store(true, Ordering::Relaxed);
            eprintln!("demo backend {me}: now failing (500)");
            return (200, format!("demo backend {me}: failing\n"));
        }
        "/_demo/recover" => {
            state.failing.store(false, Ordering::Relaxed);
            eprintln!("demo backend {me}: recovered");
            return (200, format!("demo backend {me}: ok\n"));
        }
        "/_demo/state" => {
            let s = if state.failing.load(Ordering::Relaxed) {
                "failing"
            } else {
                "ok"
            };
            return (200, format!("demo backend {me}: {s}\n"));
        }
        _ => {}
    }
    if req.path.starts_with("/slow") {
        let ms = req
            .query
            .split('&')
            .find_map(|kv| kv.strip_prefix("ms="))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1000)
            .min(MAX_SLOW_MS);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if state.failing.load(Ordering::Relaxed) {
        (500, format!("demo backend {me}: failing on purpose\n"))
    } else {
        (200, format!("hello from demo backend {me}\n"))
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: u16,
    body: &str,
    close: bool,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        _ => "Internal Server Error",
    };
    let conn = if close { "close" } else { "keep-alive" };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: {conn}\r\n\r\n",
        body.len()
    );
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    stream.write_all(&out).await?;
    stream.flush().await
}
