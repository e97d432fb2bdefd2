//! [`OtlpReceiver`]: a real OTLP/HTTP trace receiver on a free port. It accepts
//! `POST /v1/traces` with a protobuf `ExportTraceServiceRequest` body (HTTP/1.1,
//! keep-alive), decodes it with `opentelemetry-proto` and keeps every span and
//! every raw body (so a test can look for secrets in the bytes on the wire).

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// One exported span, ids in lower-case hex.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    /// `SpanKind` as its protobuf number (2 = server).
    pub kind: i32,
    /// The resource's `service.name`.
    pub service: String,
    /// Attribute values rendered as strings.
    pub attributes: Vec<(String, String)>,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Seen {
    spans: Vec<ReceivedSpan>,
    bodies: Vec<Vec<u8>>,
    /// Requests that were not a decodable `POST /v1/traces`.
    bad: Vec<String>,
}

pub struct OtlpReceiver {
    port: u16,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn render(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn decode(body: &[u8]) -> Result<Vec<ReceivedSpan>, String> {
    let req = ExportTraceServiceRequest::decode(body).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
            .map(|kv| render(&kv.value))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(ReceivedSpan {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    name: s.name,
                    kind: s.kind,
                    service: service.clone(),
                    attributes: s
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), render(&kv.value)))
                        .collect(),
                });
            }
        }
    }
    Ok(out)
}

/// Serve one keep-alive connection until the peer closes it.
fn serve(stream: TcpStream, seen: &Mutex<Seen>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut r = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        match r.read_line(&mut request_line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut len = 0usize;
        let mut content_type = String::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                match k.trim().to_ascii_lowercase().as_str() {
                    "content-length" => len = v.trim().parse().unwrap_or(0),
                    "content-type" => content_type = v.trim().to_string(),
                    _ => {}
                }
            }
        }
        let mut body = vec![0u8; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let ok = request_line.starts_with("POST /v1/traces ")
            && content_type == "application/x-protobuf";
        let decoded = if ok {
            decode(&body)
        } else {
            Err(format!("{} ({content_type})", request_line.trim_end()))
        };
        let status = {
            let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
            s.bodies.push(body);
            match decoded {
                Ok(spans) => {
                    s.spans.extend(spans);
                    "200 OK"
                }
                Err(e) => {
                    s.bad.push(e);
                    "400 Bad Request"
                }
            }
        };
        // An empty ExportTraceServiceResponse is an empty protobuf body.
        let resp = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
        );
        if out.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

impl OtlpReceiver {
    pub fn start() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind OTLP receiver");
        let port = listener.local_addr().expect("addr").port();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (Arc::clone(&seen), Arc::clone(&stop));
        thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let seen = Arc::clone(&seen2);
                thread::spawn(move || serve(conn, &seen));
            }
        });
        OtlpReceiver { port, seen, stop }
    }

    /// The `[tracing] otlp_endpoint` value for this receiver.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .spans
            .clone()
    }

    /// Every request body received, concatenated.
    pub fn raw(&self) -> Vec<u8> {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .bodies
            .concat()
    }

    /// Requests that were not a decodable `POST /v1/traces` (should stay empty).
    pub fn bad_requests(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .bad
            .clone()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // wake the accept loop so it sees `stop`
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
