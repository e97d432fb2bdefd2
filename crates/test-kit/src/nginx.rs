//! [`Nginx`]: Debian's nginx as a real TLS + HTTP/2 and h2c backend, in its own
//! directory on free ports (foreground, no master process, killed on drop).

use std::fs;
use std::process::{Child, Command, Stdio};

use super::*;

pub struct Nginx {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// TLS port: HTTP/2 and HTTP/1.1 by ALPN.
    pub tls_addr: String,
    /// Cleartext HTTP/2 only (prior knowledge).
    pub h2c_addr: String,
    /// Cleartext HTTP/1.x: answers `nginx <protocol> host=[<Host>]`.
    pub http_addr: String,
    pub cert: CertFiles,
}

impl Nginx {
    /// Serves a certificate for `backend.test` (also made here). Every response says
    /// `nginx <protocol> <sni>`; `/grpc-fail` answers like a gRPC server whose call
    /// failed with UNAVAILABLE: HTTP 200, `grpc-status: 14` in the trailers.
    pub fn start() -> Nginx {
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = make_cert(dir.path(), "backend", "backend.test", &["backend.test"]);
        let tls_addr = format!("127.0.0.1:{}", free_port());
        let h2c_addr = format!("127.0.0.1:{}", free_port());
        let http_addr = format!("127.0.0.1:{}", free_port());
        let conf = config(dir.path(), &cert, &tls_addr, &h2c_addr, &http_addr);
        let conf_path = dir.path().join("nginx.conf");
        fs::write(&conf_path, conf).expect("write nginx.conf");
        let child = spawn(dir.path(), &conf_path);
        let n = Nginx {
            child: Some(child),
            dir,
            tls_addr,
            h2c_addr,
            http_addr,
            cert,
        };
        eventually(
            DEADLINE,
            || format!("nginx did not listen; error.log:\n{}", n.error_log()),
            || {
                std::net::TcpStream::connect(&n.tls_addr).is_ok()
                    && std::net::TcpStream::connect(&n.h2c_addr).is_ok()
                    && std::net::TcpStream::connect(&n.http_addr).is_ok()
            },
        );
        n
    }

    /// Makes `/files/<name>` on `http_addr` a file of `len` bytes (sparse: zeros, no
    /// disk used), as fast a large download as a backend can send.
    pub fn add_file(&self, name: &str, len: u64) {
        let www = self.dir.path().join("www");
        fs::create_dir_all(&www).expect("create www");
        let f = fs::File::create(www.join(name)).expect("create file");
        f.set_len(len).expect("set_len");
    }

    pub fn error_log(&self) -> String {
        fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// Requests nginx answered (its access log).
    pub fn requests(&self) -> usize {
        fs::read_to_string(self.dir.path().join("access.log"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The configuration of an [`Nginx`] in `dir` (see [`Nginx::start`]).
fn config(
    dir: &std::path::Path,
    cert: &CertFiles,
    tls_addr: &str,
    h2c_addr: &str,
    http_addr: &str,
) -> String {
    let d = dir.display();
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 256; }}
http {{
  access_log {d}/access.log;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  server {{
    listen {tls_addr} ssl http2;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    location / {{ return 200 "nginx $server_protocol $ssl_server_name\n"; }}
  }}
  server {{
    listen {h2c_addr} http2;
    location /grpc-fail {{
      default_type application/grpc;
      add_trailer grpc-status 14;
      add_trailer grpc-message unavailable;
      return 200 "";
    }}
    location /grpc-ok {{
      default_type application/grpc;
      add_trailer grpc-status 0;
      return 200 "";
    }}
    location / {{ return 200 "nginx $server_protocol\n"; }}
  }}
  server {{
    listen {http_addr};
    location /files/ {{ alias {d}/www/; }}
    location / {{ return 200 "nginx $server_protocol host=[$http_host]\n"; }}
  }}
}}
"#,
        cert = cert.cert.display(),
        key = cert.key.display(),
    )
}

/// nginx in the foreground with `dir` as its prefix and `conf` as its configuration.
fn spawn(dir: &std::path::Path, conf: &std::path::Path) -> Child {
    let nginx = ["/usr/sbin/nginx", "nginx"]
        .into_iter()
        .find(|p| Command::new(p).arg("-v").output().is_ok())
        .expect("nginx installed (scripts/setup.sh)");
    Command::new(nginx)
        .arg("-p")
        .arg(dir)
        .arg("-e")
        .arg(dir.join("error.log"))
        .arg("-c")
        .arg(conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn nginx")
}

/// Debian's nginx serving name-based virtual hosts on `ports` cleartext listeners, as a
/// web server in front of several sites does: on each, `server_name` `host` answers
/// `/health` with 200 `vhost <host> ok`, and any other `Host` reaches the default
/// server's 404. The access log records each request's `Host`.
pub struct NginxVhosts {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// One `127.0.0.1:port` per listener.
    pub addrs: Vec<String>,
}

impl NginxVhosts {
    pub fn start(host: &str, ports: usize) -> NginxVhosts {
        let dir = tempfile::tempdir().expect("tempdir");
        let addrs: Vec<String> = (0..ports)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let d = dir.path().display();
        let mut servers = String::new();
        for a in &addrs {
            servers.push_str(&format!(
                "  server {{ listen {a} default_server; server_name _; return 404 \"no such site\\n\"; }}\n\
                 \x20 server {{ listen {a}; server_name {host};\n\
                 \x20   location = /health {{ return 200 \"vhost {host} ok\\n\"; }}\n\
                 \x20   location / {{ return 200 \"vhost {host}\\n\"; }} }}\n"
            ));
        }
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 256; }}\nhttp {{\n\
             \x20 log_format hosts '$http_host $request_method $uri $status';\n\
             \x20 access_log {d}/access.log hosts;\n  client_body_temp_path {d}/body;\n\
             \x20 proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n\
             \x20 uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n{servers}}}\n"
        );
        let conf_path = dir.path().join("nginx.conf");
        fs::write(&conf_path, conf).expect("write nginx.conf");
        let child = spawn(dir.path(), &conf_path);
        let n = NginxVhosts {
            child: Some(child),
            dir,
            addrs,
        };
        eventually(
            DEADLINE,
            || format!("nginx did not listen: {}", n.error_log()),
            || {
                n.addrs
                    .iter()
                    .all(|a| std::net::TcpStream::connect(a).is_ok())
            },
        );
        n
    }

    pub fn error_log(&self) -> String {
        fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// The access log: `<Host> <method> <path> <status>` per request.
    pub fn access_log(&self) -> String {
        fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }
}

impl Drop for NginxVhosts {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
