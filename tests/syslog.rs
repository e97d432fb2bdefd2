//! `[access_log] syslog`: access-log lines reach a real rsyslog intact, as RFC 5424
//! messages over a Unix datagram socket, UDP and TCP (octet counting), each started by
//! the test with its own config on a socket and ports it owns, writing what it parsed
//! to a file the test reads. A receiver that is down costs no request: its lines are
//! dropped and counted, and the sender reconnects when it is back.

use portcullis_test_kit as support;

use serde_json::Value;
use std::fs;
use std::net::{TcpStream, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use support::*;

/// rsyslogd (Debian's rsyslog package; scripts/setup.sh installs it).
fn rsyslogd() -> &'static str {
    for p in ["/usr/sbin/rsyslogd", "/sbin/rsyslogd"] {
        if Path::new(p).exists() {
            return p;
        }
    }
    panic!("rsyslogd is missing: apt-get install rsyslog (scripts/setup.sh does)");
}

/// Fields rsyslog parsed, one message per line of `out.log`.
const TEMPLATE: &str = "%inputname%|%pri%|%timereported:::date-rfc3339%|%hostname%|\
                        %app-name%|%procid%|%msgid%|%structured-data%|%msg%\\n";

/// A running rsyslogd with a Unix socket, a UDP and a TCP input (each only when asked).
struct Rsyslog {
    child: Child,
    dir: PathBuf,
    sock: PathBuf,
    udp: u16,
    tcp: u16,
}

impl Rsyslog {
    fn start(dir: &Path, tcp: u16) -> Rsyslog {
        let udp = free_udp_port();
        let work = dir.join("rsyslog");
        fs::create_dir_all(&work).expect("rsyslog dir");
        let sock = work.join("log.sock");
        let out = work.join("out.log");
        let conf = work.join("rsyslog.conf");
        fs::write(
            &conf,
            format!(
                "global(workDirectory=\"{w}\" maxMessageSize=\"64k\")\n\
                 module(load=\"imuxsock\" SysSock.Use=\"off\")\n\
                 module(load=\"imudp\")\n\
                 module(load=\"imtcp\")\n\
                 input(type=\"imuxsock\" Socket=\"{s}\" UseSpecialParser=\"off\" ParseHostname=\"on\" IgnoreTimestamp=\"off\")\n\
                 input(type=\"imudp\" address=\"127.0.0.1\" port=\"{udp}\")\n\
                 input(type=\"imtcp\" address=\"127.0.0.1\" port=\"{tcp}\")\n\
                 template(name=\"fields\" type=\"string\" string=\"{TEMPLATE}\")\n\
                 if $app-name == \"portcullis\" then action(type=\"omfile\" file=\"{o}\" template=\"fields\" flushOnTXEnd=\"on\" asyncWriting=\"off\")\n",
                w = work.display(),
                s = sock.display(),
                o = out.display(),
            ),
        )
        .expect("rsyslog.conf");
        let log = fs::File::create(work.join("rsyslogd.stderr")).expect("log");
        let child = Command::new(rsyslogd())
            .args(["-n", "-f"])
            .arg(&conf)
            .arg("-i")
            .arg(work.join("rsyslogd.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn rsyslogd");
        let r = Rsyslog {
            child,
            dir: work,
            sock,
            udp,
            tcp,
        };
        // Ready when a probe sent on each input has come out.
        let probe =
            |via: &str| format!("<134>1 2026-01-01T00:00:00.000Z probe portcullis 1 probe - {via}");
        let ok = wait_until(DEADLINE, || {
            let _ =
                UnixDatagram::unbound().and_then(|u| u.send_to(probe("unix").as_bytes(), &r.sock));
            let _ = UdpSocket::bind("127.0.0.1:0")
                .and_then(|u| u.send_to(probe("udp").as_bytes(), ("127.0.0.1", udp)));
            if let Ok(mut t) = TcpStream::connect(("127.0.0.1", tcp)) {
                let m = probe("tcp");
                let _ = std::io::Write::write_all(&mut t, format!("{} {m}", m.len()).as_bytes());
            }
            let seen = r.lines();
            ["unix", "udp", "tcp"]
                .iter()
                .all(|via| seen.iter().any(|l| l.ends_with(&format!("probe|-|{via}"))))
        });
        assert!(
            ok,
            "rsyslogd did not receive the probes: {}",
            r.diagnostics()
        );
        r
    }

    fn lines(&self) -> Vec<String> {
        fs::read_to_string(self.dir.join("out.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The access lines (msgid `access`) rsyslog received with `path` in their message.
    fn access(&self, path: &str) -> Vec<Msg> {
        self.lines()
            .iter()
            .filter_map(|l| Msg::parse(l))
            .filter(|m| m.msgid == "access" && m.json["path"] == path)
            .collect()
    }

    fn diagnostics(&self) -> String {
        format!(
            "rsyslogd stderr:\n{}\nout.log:\n{}",
            fs::read_to_string(self.dir.join("rsyslogd.stderr")).unwrap_or_default(),
            self.lines().join("\n")
        )
    }
}

impl Drop for Rsyslog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("a free UDP port")
}

/// One message as rsyslog parsed it.
#[derive(Debug)]
struct Msg {
    input: String,
    pri: String,
    timestamp: String,
    hostname: String,
    app: String,
    procid: String,
    msgid: String,
    sd: String,
    json: Value,
}

impl Msg {
    fn parse(line: &str) -> Option<Msg> {
        let f: Vec<&str> = line.splitn(9, '|').collect();
        if f.len() != 9 {
            return None;
        }
        Some(Msg {
            input: f[0].into(),
            pri: f[1].into(),
            timestamp: f[2].into(),
            hostname: f[3].into(),
            app: f[4].into(),
            procid: f[5].into(),
            msgid: f[6].into(),
            sd: f[7].into(),
            json: serde_json::from_str(f[8]).unwrap_or(Value::Null),
        })
    }
}

fn access_log_config(b: &Backend, syslog: &str) -> String {
    format!(
        "{}[rate_limit]\nenabled = false\n[culling]\nenabled = false\n\
         [access_log]\nsyslog = \"{syslog}\"\n",
        one_upstream(b)
    )
}

fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
fn access_lines_reach_rsyslog_intact_over_unix_udp_and_tcp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = Rsyslog::start(dir.path(), free_port());
    let b = Backend::start("b");
    let targets = [
        ("imuxsock", format!("unix://{}", r.sock.display())),
        ("imudp", format!("udp://127.0.0.1:{}", r.udp)),
        ("imtcp", format!("tcp://127.0.0.1:{}", r.tcp)),
    ];
    for (input, target) in &targets {
        let p = Proxy::start(&access_log_config(&b, target));
        let paths: Vec<String> = (0..5).map(|i| format!("/{input}/{i}/a\"b")).collect();
        for path in &paths {
            let r = p.get(&path.replace('"', "%22"), &[("x-api-key", "never-logged")]);
            assert_eq!(r.status, 200);
        }
        for path in &paths {
            let logged = path.replace('"', "%22");
            eventually(
                DEADLINE,
                || format!("{logged} via {input}: {}", r.diagnostics()),
                || !r.access(&logged).is_empty(),
            );
            let got = r.access(&logged);
            assert_eq!(got.len(), 1, "{got:?}");
            let m = &got[0];
            assert_eq!(m.input, *input, "{m:?}");
            assert_eq!(m.pri, "134", "local0.info: {m:?}");
            assert_eq!(m.app, "portcullis");
            assert_eq!(m.procid, p.pid().to_string());
            assert_eq!(m.sd, "-");
            assert_eq!(m.hostname, hostname(), "{m:?}");
            // the line as the file would have it: every field, the header's timestamp its ts
            for field in [
                "ts",
                "request_id",
                "trace_id",
                "client_ip",
                "method",
                "status",
                "outcome",
                "duration_ms",
            ] {
                assert!(!m.json[field].is_null(), "{field} missing: {m:?}");
            }
            assert_eq!(m.json["status"], 200);
            assert_eq!(m.json["outcome"], "proxied");
            let ts = m.json["ts"].as_str().unwrap_or_default();
            // (rsyslog may write UTC as +00:00)
            assert_eq!(
                m.timestamp.replace("+00:00", "Z"),
                ts,
                "the header's timestamp is the line's: {m:?}"
            );
            let raw = r.lines().join("\n");
            assert!(!raw.contains("never-logged"), "the API key reached syslog");
        }
        assert_eq!(p.metric("portcullis_access_log_dropped_total"), Some(0.0));
    }
}

#[test]
fn a_receiver_that_is_down_costs_no_request_and_is_reconnected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = Backend::start("b");
    let tcp = free_port();
    let p = Proxy::start(&access_log_config(&b, &format!("tcp://127.0.0.1:{tcp}")));
    // nothing listens: every request is served, its line dropped and counted
    let t0 = std::time::Instant::now();
    for i in 0..50 {
        assert_eq!(p.get(&format!("/down/{i}"), &[]).status, 200);
    }
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(10),
        "50 requests took {:?} with the receiver down",
        t0.elapsed()
    );
    eventually(
        DEADLINE,
        || {
            format!(
                "dropped: {:?}",
                p.metric("portcullis_access_log_dropped_total")
            )
        },
        || p.metric("portcullis_access_log_dropped_total") == Some(50.0),
    );
    // the receiver comes up on that port: lines arrive again (after the retry pause)
    let r = Rsyslog::start(dir.path(), tcp);
    let mut i = 0;
    eventually(
        DEADLINE,
        || r.diagnostics(),
        || {
            i += 1;
            p.get(&format!("/up/{i}"), &[]);
            (1..=i).any(|j| !r.access(&format!("/up/{j}")).is_empty())
        },
    );
    assert!(r.access("/down/0").is_empty());
}
