//! TLS and HTTP/2 test parts: certificates made with the `openssl` CLI, and the real
//! clients `openssl s_client` (SNI, protocol versions) and `curl` (HTTP/2, ALPN, h2c).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A certificate and key on disk.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Self-signed EC certificate with subject CN `cn` and these SAN DNS names, written to
/// `dir/<file>.pem` and `dir/<file>.key` (overwriting: a reload test rewrites files).
pub fn make_cert(dir: &Path, file: &str, cn: &str, dns: &[&str]) -> CertFiles {
    let cert = dir.join(format!("{file}.pem"));
    let key = dir.join(format!("{file}.key"));
    let tmp_cert = dir.join(format!("{file}.pem.tmp"));
    let tmp_key = dir.join(format!("{file}.key.tmp"));
    let san: Vec<String> = dns.iter().map(|d| format!("DNS:{d}")).collect();
    let mut cmd = Command::new("openssl");
    cmd.args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .arg("ec_paramgen_curve:prime256v1")
        .args(["-nodes", "-days", "2", "-subj"])
        .arg(format!("/CN={cn}"))
        .arg("-keyout")
        .arg(&tmp_key)
        .arg("-out")
        .arg(&tmp_cert);
    if !san.is_empty() {
        cmd.arg("-addext")
            .arg(format!("subjectAltName={}", san.join(",")));
    }
    let out = cmd.stdin(Stdio::null()).output().expect("run openssl req");
    assert!(
        out.status.success(),
        "openssl req failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::rename(&tmp_key, &key).expect("rename key");
    fs::rename(&tmp_cert, &cert).expect("rename cert");
    CertFiles { cert, key }
}

/// A `[tls]` table listening on `listen` with these certificates (first = default).
pub fn tls_table(listen: &str, min_version: &str, certs: &[&CertFiles]) -> String {
    let mut s = format!("[tls]\nlisten = [\"{listen}\"]\nmin_version = \"{min_version}\"\n");
    for c in certs {
        s.push_str(&format!(
            "[[tls.certificates]]\ncert = \"{}\"\nkey = \"{}\"\n",
            c.cert.display(),
            c.key.display()
        ));
    }
    s
}

/// `openssl s_client` against `addr` with SNI `servername` (`None`: no SNI) and extra
/// arguments; returns (handshake succeeded, subject CN of the served certificate, output).
pub fn s_client(
    addr: &str,
    servername: Option<&str>,
    extra: &[&str],
) -> (bool, Option<String>, String) {
    let mut cmd = Command::new("timeout");
    cmd.args(["10", "openssl", "s_client", "-connect", addr]);
    match servername {
        Some(n) => cmd.args(["-servername", n]),
        None => cmd.arg("-noservername"),
    };
    let out = cmd
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl s_client");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // OpenSSL 3: "subject=CN = name" (older: "subject=/CN=name").
    let cn = text.lines().find_map(|l| {
        let rest = l.strip_prefix("subject=")?;
        let cn = rest.split("CN").nth(1)?;
        Some(
            cn.trim_start_matches([' ', '=', '/'])
                .split([',', '/'])
                .next()?
                .trim()
                .to_string(),
        )
    });
    let ok =
        out.status.success() && text.contains("Cipher is") && !text.contains("Cipher is (NONE)");
    (ok, cn, text)
}

/// Sends `request` as is over TLS (`openssl s_client -quiet`, SNI `servername`) and
/// returns what the server wrote back until it closed the connection (10 s cap). The raw
/// bytes are what a client like curl refuses to send (a space in the target, say).
pub fn tls_exchange(addr: &str, servername: &str, request: &[u8]) -> String {
    use std::io::Write;
    let mut child = Command::new("timeout")
        .args(["10", "openssl", "s_client", "-quiet", "-connect", addr])
        .args(["-servername", servername])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run openssl s_client");
    // -quiet implies -ign_eof: stdin may close; s_client waits for the server to close.
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(request)
        .expect("write the request");
    let out = child.wait_with_output().expect("wait for openssl s_client");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `curl` with these arguments (silent, with a 20 s cap); returns its output.
pub fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "20"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run curl")
}

/// `--resolve host:port:127.0.0.1` for a `127.0.0.1:port` address.
pub fn resolve(host: &str, addr: &str) -> String {
    let port = addr.rsplit(':').next().expect("port");
    format!("{host}:{port}:127.0.0.1")
}

/// One HTTP/2 stream as `nghttp -v` reports it: the response status and headers.
#[derive(Debug, Clone)]
pub struct H2Stream {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl H2Stream {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// All `urls` as concurrent streams on ONE HTTP/2 connection with `nghttp` (from
/// nghttp2-client; cleartext URLs use prior knowledge), each with `headers`. Returns the
/// streams in request order. (curl 7.88.1 fails multiplexed transfers over h2c prior
/// knowledge with "Error in the HTTP2 framing layer" before sending them, against any
/// server; over TLS it multiplexes fine.)
pub fn nghttp(urls: &[String], headers: &[(&str, &str)]) -> Vec<H2Stream> {
    let mut cmd = Command::new("timeout");
    cmd.args(["30", "nghttp", "-nv"]);
    for (k, v) in headers {
        cmd.arg("-H").arg(format!("{k}: {v}"));
    }
    let out = cmd
        .args(urls)
        .stdin(Stdio::null())
        .output()
        .expect("run nghttp");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut streams: std::collections::BTreeMap<u32, H2Stream> = Default::default();
    for line in text.lines() {
        let Some(rest) = line.split("] recv (stream_id=").nth(1) else {
            continue;
        };
        let Some((id, field)) = rest.split_once(") ") else {
            continue;
        };
        let Ok(id) = id.parse::<u32>() else { continue };
        let s = streams.entry(id).or_insert(H2Stream {
            status: 0,
            headers: Vec::new(),
        });
        if let Some(st) = field.strip_prefix(":status: ") {
            s.status = st.trim().parse().unwrap_or(0);
        } else if let Some((k, v)) = field.split_once(": ") {
            s.headers.push((k.to_string(), v.to_string()));
        }
    }
    let streams: Vec<H2Stream> = streams.into_values().collect();
    assert_eq!(
        streams.len(),
        urls.len(),
        "nghttp answered {} of {} streams:\n{text}\n{}",
        streams.len(),
        urls.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    streams
}

/// A CA certificate and key (`dir/<file>.pem`, `.key`) for [`make_signed_cert`].
pub fn make_ca(dir: &Path, file: &str, cn: &str) -> CertFiles {
    let cert = dir.join(format!("{file}.pem"));
    let key = dir.join(format!("{file}.key"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-subj"])
        .arg(format!("/CN={cn}"))
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl req");
    assert!(
        out.status.success(),
        "openssl req (CA) failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    CertFiles { cert, key }
}

/// A server certificate signed by `ca` (not itself a CA, as strict verifiers such as
/// rustls require), with SAN DNS names `dns` and IP addresses `ips`; usable as a client
/// certificate too (Redis Cluster nodes present it to each other on the TLS bus).
pub fn make_signed_cert(
    dir: &Path,
    file: &str,
    ca: &CertFiles,
    cn: &str,
    dns: &[&str],
    ips: &[&str],
) -> CertFiles {
    let cert = dir.join(format!("{file}.pem"));
    let key = dir.join(format!("{file}.key"));
    let csr = dir.join(format!("{file}.csr"));
    let ext = dir.join(format!("{file}.ext"));
    let san: Vec<String> = dns
        .iter()
        .map(|d| format!("DNS:{d}"))
        .chain(ips.iter().map(|i| format!("IP:{i}")))
        .collect();
    fs::write(
        &ext,
        format!(
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName={}\n",
            san.join(",")
        ),
    )
    .expect("write ext file");
    let run = |args: &[&std::ffi::OsStr]| {
        let out = Command::new("openssl")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let subj = format!("/CN={cn}");
    run(&[
        "req".as_ref(),
        "-newkey".as_ref(),
        "ec".as_ref(),
        "-pkeyopt".as_ref(),
        "ec_paramgen_curve:prime256v1".as_ref(),
        "-nodes".as_ref(),
        "-subj".as_ref(),
        subj.as_ref(),
        "-keyout".as_ref(),
        key.as_os_str(),
        "-out".as_ref(),
        csr.as_os_str(),
    ]);
    run(&[
        "x509".as_ref(),
        "-req".as_ref(),
        "-in".as_ref(),
        csr.as_os_str(),
        "-CA".as_ref(),
        ca.cert.as_os_str(),
        "-CAkey".as_ref(),
        ca.key.as_os_str(),
        "-CAcreateserial".as_ref(),
        "-days".as_ref(),
        "2".as_ref(),
        "-extfile".as_ref(),
        ext.as_os_str(),
        "-out".as_ref(),
        cert.as_os_str(),
    ]);
    CertFiles { cert, key }
}
