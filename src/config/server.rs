//! Validation of `[server]`: the listen addresses, the process keys (threads,
//! drain, upgrade socket, admin token), the request and response buffer sizes and
//! the admin listener; the edge keys are checked in `edge.rs`.

use super::check::{err, listen_addrs, parse_addr, range, VResult, HOUR};
use super::edge::{validate_server_edge, ServerEdge};
use super::schema::*;
use super::settings::*;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub(super) fn validate_server(s: &ServerSection) -> VResult<ServerSettings> {
    let listen = listen_addrs("server.listen", &s.listen)?;
    process_keys(s)?;
    let admin_token = admin_token(s)?;
    admin_tokens(s, admin_token.expose())?;
    buffer_sizes(s)?;
    let edge = validate_server_edge(s)?;
    let admin_listen = admin_listen(s, &listen)?;
    admin_hosts(s)?;
    let mut settings = server_settings(s, listen, admin_listen, edge);
    settings.admin_token = admin_token;
    Ok(settings)
}

/// `admin_token`, or the content of `admin_token_file` when set (it wins).
fn admin_token(s: &ServerSection) -> VResult<Secret> {
    let (key, token) = if s.admin_token_file.is_empty() {
        ("server.admin_token", s.admin_token.clone())
    } else {
        let path = "server.admin_token_file";
        (
            path,
            Secret::new(super::read_secret_file(path, &s.admin_token_file)?),
        )
    };
    let t = token.expose();
    if t.len() > 1024 || !t.bytes().all(|b| b.is_ascii_graphic()) {
        return err(
            key,
            "must be at most 1024 visible ASCII characters (no spaces)",
        );
    }
    Ok(token)
}

/// `threads`, the drain and shutdown timers and `upgrade_sock`.
fn process_keys(s: &ServerSection) -> VResult<()> {
    range("server.threads", s.threads as u64, 1, 1024, "")?;
    range("server.drain_seconds", s.drain_seconds, 0, HOUR, "seconds")?;
    range(
        "server.shutdown_timeout_seconds",
        s.shutdown_timeout_seconds,
        0,
        HOUR,
        "seconds",
    )?;
    range(
        "server.keepalive_timeout_seconds",
        s.keepalive_timeout_seconds,
        0,
        HOUR,
        "seconds",
    )?;
    Ok(())
}

/// `[server.admin_tokens]`: names of letters, digits, `_`, `-` and `.` (they appear in
/// journals and logs), tokens as `admin_token`, no token twice (its name would be
/// ambiguous); `admin_token` is the one named `admin`.
fn admin_tokens(s: &ServerSection, admin_token: &str) -> VResult<()> {
    let mut seen: Vec<&str> = vec![admin_token];
    for (name, token) in &s.admin_tokens {
        let path = format!("server.admin_tokens.{name}");
        let name_ok = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !name_ok {
            return err(
                path,
                "a token's name is 1 to 64 letters, digits, '_', '-' or '.'",
            );
        }
        let t = token.expose();
        if t.is_empty() || t.len() > 1024 || !t.bytes().all(|b| b.is_ascii_graphic()) {
            return err(
                path,
                "must be 1 to 1024 visible ASCII characters (no spaces)",
            );
        }
        if seen.contains(&t) {
            return err(
                path,
                "the same token is given twice: each name needs its own",
            );
        }
        seen.push(t);
    }
    Ok(())
}

/// `admin_hosts`: host names (letters, digits, `-`, `.`, `_`; no port, scheme or path),
/// or `"*"` alone.
fn admin_hosts(s: &ServerSection) -> VResult<()> {
    for (i, h) in s.admin_hosts.iter().enumerate() {
        let path = format!("server.admin_hosts[{i}]");
        if h == "*" {
            if s.admin_hosts.len() > 1 {
                return err(path, "\"*\" (any host) stands alone");
            }
            continue;
        }
        let ok = (1..=253).contains(&h.len())
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if !ok {
            return err(
                path,
                "a host name is 1 to 253 letters, digits, '-', '.' or '_' (no port, scheme or \
                 path: the admin listener compares the Host header without its port), or \"*\"",
            );
        }
    }
    Ok(())
}

/// `max_request_header_bytes` and `max_response_buffer_bytes`.
fn buffer_sizes(s: &ServerSection) -> VResult<()> {
    range(
        "server.max_request_header_bytes",
        s.max_request_header_bytes as u64,
        1024,
        1_048_575,
        "bytes",
    )?;
    range(
        "server.max_response_buffer_bytes",
        s.max_response_buffer_bytes as u64,
        4096,
        1 << 30,
        "bytes",
    )
}

/// `admin_listen`: an address apart from every `listen` address.
fn admin_listen(s: &ServerSection, listen: &[SocketAddr]) -> VResult<SocketAddr> {
    let admin_listen = parse_addr("server.admin_listen", &s.admin_listen)?;
    if listen.contains(&admin_listen) {
        return err(
            "server.admin_listen",
            "must differ from every server.listen address",
        );
    }
    Ok(admin_listen)
}

/// The upgrade socket of an `upgrade_sock = ""` config read from `file`: one per config
/// file (its absolute path, symlinks resolved when it exists, hashed), the same for the
/// running process and the `-u` one started on the same file, and different for two
/// instances of different files.
pub fn default_upgrade_sock(file: &std::path::Path) -> PathBuf {
    use sha2::Digest;
    let abs = std::fs::canonicalize(file)
        .or_else(|_| std::path::absolute(file))
        .unwrap_or_else(|_| file.to_path_buf());
    let digest = sha2::Sha256::digest(abs.as_os_str().as_encoded_bytes());
    PathBuf::from(format!(
        "/tmp/portcullis-{}.sock",
        hex::encode(&digest[..8])
    ))
}

/// The validated section as settings.
fn server_settings(
    s: &ServerSection,
    listen: Vec<SocketAddr>,
    admin_listen: SocketAddr,
    edge: ServerEdge,
) -> ServerSettings {
    ServerSettings {
        listen,
        admin_listen,
        threads: s.threads,
        drain: Duration::from_secs(s.drain_seconds),
        shutdown_timeout: Duration::from_secs(s.shutdown_timeout_seconds),
        upgrade_sock: PathBuf::from(&s.upgrade_sock),
        max_request_header_bytes: s.max_request_header_bytes,
        keepalive_seconds: s.keepalive_timeout_seconds,
        h2c: s.h2c,
        preserve_header_case: s.preserve_header_case,
        admin_token: s.admin_token.clone(),
        admin_tokens: s
            .admin_tokens
            .iter()
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect(),
        trusted_proxies: edge.trusted_proxies,
        proxy_protocol: s.proxy_protocol,
        unmatched: s.unmatched,
        max_request_body_bytes: s.max_request_body_bytes,
        client_header_timeout: edge.client_header_timeout,
        client_body_timeout: edge.client_body_timeout,
        max_connections: s.max_connections,
        max_response_buffer_bytes: s.max_response_buffer_bytes,
        idle_timeout: edge.idle_timeout,
        tls_handshake_timeout: edge.tls_handshake_timeout,
        admin_max_connections: s.admin_max_connections,
        admin_hosts: s
            .admin_hosts
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect(),
        tunnel_idle_timeout: edge.tunnel_idle_timeout,
        h2_max_glitches: s.h2_max_glitches,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_default_upgrade_socket_is_one_per_config_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (dir.path().join("a.toml"), dir.path().join("b.toml"));
        std::fs::write(&a, "").expect("a");
        std::fs::write(&b, "").expect("b");
        let sock_a = default_upgrade_sock(&a);
        assert_ne!(sock_a, default_upgrade_sock(&b));
        // the same file however it is named: a symlink, a path with `..`
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&a, &link).expect("symlink");
        assert_eq!(default_upgrade_sock(&link), sock_a);
        let dotted = dir.path().join("sub").join("..").join("a.toml");
        std::fs::create_dir(dir.path().join("sub")).expect("sub");
        assert_eq!(default_upgrade_sock(&dotted), sock_a);
        let name = sock_a.display().to_string();
        assert!(
            name.starts_with("/tmp/portcullis-") && name.ends_with(".sock") && name.len() == 37,
            "{name}"
        );
        // a file that does not exist (yet): its absolute path
        assert_eq!(
            default_upgrade_sock(Path::new("/nonexistent/p.toml")),
            default_upgrade_sock(Path::new("/nonexistent/p.toml"))
        );
    }

    #[test]
    fn an_empty_upgrade_sock_takes_the_files_default_and_a_set_one_stays() {
        let upstream = "[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:1\"]\n";
        let c = crate::config::parse("/etc/x/p.toml", upstream).expect("valid");
        assert_eq!(
            c.server.upgrade_sock,
            default_upgrade_sock(Path::new("/etc/x/p.toml"))
        );
        let c = crate::config::parse(
            "/etc/x/p.toml",
            &format!("[server]\nupgrade_sock = \"/run/p/u.sock\"\n{upstream}"),
        )
        .expect("valid");
        assert_eq!(c.server.upgrade_sock, PathBuf::from("/run/p/u.sock"));
    }
}
