//! A real gRPC server and client: `grpc_peer.py` on Debian's `python3-grpcio` (the
//! gRPC C core), generic handlers over raw bytes so no code is generated.
//! [`GrpcServer`] serves h2c on a free port; [`grpc_call`] makes one unary call.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use super::*;

/// Debian's interpreter: `python3-grpcio` is installed for it (not for a pyenv one).
const PYTHON: &str = "/usr/bin/python3";

fn script() -> String {
    py_helper("grpc_peer.py")
}

pub struct GrpcServer {
    child: Child,
    pub addr: String,
}

impl GrpcServer {
    /// Starts the server and waits until it listens. Payload prefixes choose the
    /// answer: `unavailable:` (UNAVAILABLE), `invalid:` (INVALID_ARGUMENT), else OK.
    pub fn start() -> GrpcServer {
        let port = free_port();
        let mut child = Command::new(PYTHON)
            .arg(script())
            .args(["serve", &port.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start grpc_peer.py serve (needs python3-grpcio)");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read grpc server ready line");
        assert_eq!(line.trim(), "ready", "grpc server did not start: {line:?}");
        GrpcServer {
            child,
            addr: format!("127.0.0.1:{port}"),
        }
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The outcome of one unary call as the gRPC client saw it.
#[derive(Debug, serde::Deserialize)]
pub struct GrpcReply {
    /// The status code name: `OK`, `UNAVAILABLE`, ...
    pub code: String,
    pub details: String,
    pub reply: String,
    pub trailers: std::collections::BTreeMap<String, String>,
}

/// One unary call to `addr` (h2c) carrying `payload`.
pub fn grpc_call(addr: &str, payload: &str) -> GrpcReply {
    let out = Command::new(PYTHON)
        .arg(script())
        .args(["call", addr, payload])
        .output()
        .expect("run grpc_peer.py call");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "grpc client output {text:?} ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
