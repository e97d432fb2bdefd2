//! `ctl --conf FILE`: the admin API's address and token as the running proxy's config
//! file gives them, for a caller that knows the file but not the address (the systemd
//! unit's `ExecReload`). Read leniently: only `[server] admin_listen`, `admin_token` and
//! `admin_token_file` are looked at, `${VAR}` references are expanded as the proxy does,
//! and a file that cannot be read or parsed (say, the bad edit about to be refused by
//! the reload) gives nothing, so the defaults apply.

use std::net::SocketAddr;
use std::path::Path;

use super::client::Token;

/// What the file says.
#[derive(Debug, Default, PartialEq)]
pub struct FromConf {
    /// `http://<admin_listen>`, an unspecified address replaced by loopback.
    pub admin: Option<String>,
    /// `admin_token_file` when set (it wins, as in the proxy), else `admin_token`.
    pub token: Option<Token>,
    /// The file could not be read or is not TOML: nothing could be taken from it.
    pub unreadable: bool,
}

impl FromConf {
    fn unreadable() -> Self {
        Self {
            unreadable: true,
            ..Self::default()
        }
    }
}

/// [`from_text`] of the file at `path` (nothing when it cannot be read).
pub fn read(path: &Path) -> FromConf {
    match crate::config::read_regular_file(path, crate::config::FileKind::Config) {
        Ok(bytes) => from_text(
            &String::from_utf8_lossy(&bytes),
            &path.display().to_string(),
            &crate::config::env::from_process,
        ),
        Err(_) => FromConf::unreadable(),
    }
}

/// The admin address and token of the config text `text` (named `file` in messages),
/// with `${VAR}` looked up by `lookup`.
pub fn from_text(text: &str, file: &str, lookup: &dyn Fn(&str) -> Option<String>) -> FromConf {
    let expanded = crate::config::env::expand_text(text, lookup)
        .map(|t| t.into_owned())
        .unwrap_or_else(|_| text.to_string());
    let Ok(doc) = expanded.parse::<toml::Table>() else {
        return FromConf::unreadable();
    };
    let Some(server) = doc.get("server").and_then(toml::Value::as_table) else {
        return FromConf::default();
    };
    let string = |key: &str| {
        server
            .get(key)
            .and_then(toml::Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let admin = string("admin_listen")
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .map(|mut a| {
            if a.ip().is_unspecified() {
                a.set_ip(match a {
                    SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                    SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                });
            }
            format!("http://{a}")
        });
    let token = match (string("admin_token_file"), string("admin_token")) {
        (Some(f), _) => Some(Token::File(f.into())),
        (None, Some(t)) => Some(Token::Value {
            token: t.to_string(),
            source: format!("server.admin_token of {file}"),
        }),
        (None, None) => None,
    };
    FromConf {
        admin,
        token,
        unreadable: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn the_admin_address_and_token_of_a_config() {
        let c = from_text(
            "[server]\nadmin_listen = \"127.0.0.1:9191\"\nadmin_token = \"s3cret\"\n",
            "/etc/p.toml",
            &no_env,
        );
        assert_eq!(c.admin.as_deref(), Some("http://127.0.0.1:9191"));
        assert_eq!(
            c.token,
            Some(Token::Value {
                token: "s3cret".into(),
                source: "server.admin_token of /etc/p.toml".into()
            })
        );
        // the token file wins; an unspecified address is reached on loopback
        let c = from_text(
            "[server]\nadmin_listen = \"0.0.0.0:9090\"\nadmin_token = \"x\"\n\
             admin_token_file = \"/etc/portcullis/admin.token\"\n",
            "f",
            &no_env,
        );
        assert_eq!(c.admin.as_deref(), Some("http://127.0.0.1:9090"));
        assert_eq!(
            c.token,
            Some(Token::File("/etc/portcullis/admin.token".into()))
        );
        let c = from_text("[server]\nadmin_listen = \"[::]:9090\"\n", "f", &no_env);
        assert_eq!(c.admin.as_deref(), Some("http://[::1]:9090"));
        assert_eq!(c.token, None);
    }

    #[test]
    fn variables_are_expanded_as_the_proxy_does() {
        let env = |n: &str| (n == "ADMIN_PORT").then(|| "9292".to_string());
        let c = from_text(
            "[server]\nadmin_listen = \"127.0.0.1:${ADMIN_PORT}\"\n",
            "f",
            &env,
        );
        assert_eq!(c.admin.as_deref(), Some("http://127.0.0.1:9292"));
    }

    #[test]
    fn a_file_that_does_not_parse_or_says_nothing_gives_the_defaults() {
        assert!(from_text("[server\nadmin_listen = \"127.0.0.1:1\"", "f", &no_env).unreadable);
        assert!(read(Path::new("/nonexistent/portcullis.toml")).unreadable);
        for text in [
            "",
            "[server]\nthreads = 2\n",
            "[server]\nadmin_listen = \"not an address\"\n",
            "[server]\nadmin_listen = 9090\n",
            "server = 1\n",
        ] {
            assert_eq!(from_text(text, "f", &no_env), FromConf::default(), "{text}");
        }
    }
}
