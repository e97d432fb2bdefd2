//! Configuration: the serde file schema (`schema.rs`), then validation into the
//! runtime [`Config`]. Every error names the file, the key path
//! (`rate_limit.window_seconds`, `upstreams[1].name`) and, where the TOML
//! parser knows it, `line:column`.

pub mod certs;
mod check;
mod edge;
pub mod env;
mod errors;
mod health;
mod jwt;
mod locate;
mod protection;
mod ratelimit;
pub mod redact;
pub mod reference;
mod schema;
mod server;
mod settings;
mod store;
mod telemetry;
pub mod tenants;
mod tls;
mod upstreams;
mod validate;

use schema::FileConfig;
pub use schema::UnmatchedSection;
pub use settings::{
    AccessLogSettings, BackendMeta, Config, HealthCheck, LogFormat, LogSettings, RateLimitSettings,
    RatePolicySettings, RedisUrl, Route, RouteAction, Secret, ServerSettings, StoreSettings,
    Tenant, TenantSettings, Tier, TlsSettings, TracingSettings, UnknownKey, Upstream,
    UpstreamTransport, WatchdogSettings,
};

use std::fmt;
use std::path::Path;

/// A configuration error, formatted `error: FILE:LINE:COL: KEY.PATH: reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub line_col: Option<(usize, usize)>,
    pub key_path: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error: {}", self.file)?;
        if let Some((line, col)) = self.line_col {
            write!(f, ":{line}:{col}")?;
        }
        if !self.key_path.is_empty() {
            write!(f, ": {}", self.key_path)?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// Every error is built here: its reason never carries a Redis password.
    fn new(file: &str, line_col: Option<(usize, usize)>, key_path: String, reason: &str) -> Self {
        Self {
            file: file.to_string(),
            line_col,
            key_path,
            reason: redact::redact_secrets(reason),
        }
    }
}

/// The kinds of file the proxy reads, each with the most bytes it reads of one: a larger
/// file is refused with an error naming the cap, before it is read (and, should it grow
/// meanwhile, after at most the cap and one byte were read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// The configuration file: 64 MiB.
    Config,
    /// A token, password or HMAC secret (`server.admin_token_file`,
    /// `redis.password_file`, `jwt.hs256_secret_file`): 64 KiB.
    Secret,
    /// A PEM certificate chain, private key or CA bundle: 4 MiB.
    Pem,
    /// `jwt.jwks_file`: 4 MiB.
    Jwks,
    /// The tenants file: `tenants.max_file_bytes`.
    Tenants(u64),
    /// An error page (`errors.pages.STATUS.file`): 64 KiB.
    Page,
}

/// The caps of [`FileKind`].
pub mod file_caps {
    pub const CONFIG: u64 = 64 << 20;
    pub const SECRET: u64 = 64 << 10;
    pub const PEM: u64 = 4 << 20;
    pub const JWKS: u64 = 4 << 20;
    pub const PAGE: u64 = 64 << 10;
    /// `tenants.max_file_bytes`' default.
    pub const TENANTS: u64 = 32 << 20;
}

impl FileKind {
    /// The most bytes read from a file of this kind.
    pub fn cap(self) -> u64 {
        match self {
            FileKind::Config => file_caps::CONFIG,
            FileKind::Secret => file_caps::SECRET,
            FileKind::Pem => file_caps::PEM,
            FileKind::Jwks => file_caps::JWKS,
            FileKind::Tenants(cap) => cap,
            FileKind::Page => file_caps::PAGE,
        }
    }

    fn too_large(self) -> std::io::Error {
        let cap = human_bytes(self.cap());
        let why = match self {
            FileKind::Config => format!("larger than {cap}, the most a config file may hold"),
            FileKind::Secret => format!("larger than {cap}, the most a secret file may hold"),
            FileKind::Pem => format!("larger than {cap}, the most a PEM file may hold"),
            FileKind::Jwks => format!("larger than {cap}, the most a JWKS file may hold"),
            FileKind::Page => format!("larger than {cap}, the most an error page may hold"),
            FileKind::Tenants(_) => {
                format!("larger than {cap}, the tenants file's cap (tenants.max_file_bytes)")
            }
        };
        std::io::Error::new(std::io::ErrorKind::InvalidData, why)
    }
}

/// `n` bytes as `N MiB`, `N KiB` or `N bytes`, whichever is exact.
pub fn human_bytes(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

/// Reads a file that must be a regular file (CONTRACT §17): a FIFO, a device or a
/// directory is refused before it is opened (opening a FIFO blocks until a writer comes),
/// and checked again once open (in case it was swapped meanwhile). Symbolic links to a
/// regular file are followed, as Kubernetes mounts secrets. A file larger than its kind's
/// cap ([`FileKind`]) is refused without being read, and at most the cap and one byte are
/// ever read (a file growing meanwhile is refused too).
pub fn read_regular_file(path: &Path, kind: FileKind) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    fn not_regular(t: std::fs::FileType) -> std::io::Error {
        use std::os::unix::fs::FileTypeExt;
        let kind = if t.is_fifo() {
            "a FIFO"
        } else if t.is_dir() {
            "a directory"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else {
            "not a regular file"
        };
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not a regular file ({kind})"),
        )
    }
    let cap = kind.cap();
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type()));
    }
    if meta.len() > cap {
        return Err(kind.too_large());
    }
    let f = std::fs::File::open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type()));
    }
    if meta.len() > cap {
        return Err(kind.too_large());
    }
    let mut out = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    f.take(cap.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > cap {
        return Err(kind.too_large());
    }
    Ok(out)
}

/// A secret read from the file a `*_file` key names (`key` labels the error): a regular
/// file, UTF-8, its trailing newline (`\n` or `\r\n`, once or more) removed, not empty.
/// The error never shows the file's content.
pub(crate) fn read_secret_file(key: &str, path: &str) -> Result<String, (String, String)> {
    let fail = |why: String| Err((key.to_string(), format!("cannot read {path:?}: {why}")));
    let bytes = match read_regular_file(Path::new(path), FileKind::Secret) {
        Ok(b) => b,
        Err(e) => return fail(e.to_string()),
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return fail("not UTF-8".into());
    };
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        return fail("the file is empty".into());
    }
    Ok(secret.to_string())
}

/// The JSON Schema (draft 2020-12) of the config file, pretty-printed: generated from the
/// types the parser reads (`schema.rs`), with their doc comments and defaults. Printed by
/// `--print-config-schema`; `conf/portcullis.schema.json` is this text.
pub fn json_schema() -> String {
    format!("{:#}\n", schema::json_schema())
}

/// Read and validate a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let file = path.display().to_string();
    let bytes = read_regular_file(path, FileKind::Config).map_err(|e| {
        ConfigError::new(
            &file,
            None,
            String::new(),
            &format!("cannot read config file: {e}"),
        )
    })?;
    let text = String::from_utf8(bytes).map_err(|e| not_utf8(&file, &e))?;
    parse(&file, &text)
}

/// An error found after validation (the `--check` probe of the store), located in the
/// text of `path` when the key is found there.
pub fn error_at(path: &Path, key_path: &str, reason: &str) -> ConfigError {
    let file = path.display().to_string();
    let text = read_regular_file(path, FileKind::Config)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let reason = env_values_of(&text).redact(reason);
    ConfigError::new(
        &file,
        locate::locate(&text, key_path),
        key_path.to_string(),
        &reason,
    )
}

/// `text` (a note about the config file `path`, such as a `--check` warning) without the
/// values the environment gives the file, nor a URL's password.
pub fn redact_note(path: &Path, text: &str) -> String {
    let config = read_regular_file(path, FileKind::Config)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    redact::redact_secrets(&env_values_of(&config).redact(text))
}

/// A file that is not UTF-8: where, and under which key.
fn not_utf8(file: &str, e: &std::string::FromUtf8Error) -> ConfigError {
    let at = e.utf8_error().valid_up_to();
    let bytes = e.as_bytes();
    let lossy = String::from_utf8_lossy(bytes);
    let byte = bytes.get(at).copied().unwrap_or(0);
    ConfigError::new(
        file,
        Some(locate::line_col(&lossy, at)),
        locate::path_at(&lossy, at).unwrap_or_default(),
        &format!("invalid UTF-8 (byte 0x{byte:02x}): the config file must be UTF-8"),
    )
}

/// Parse and validate config text; `file` only labels errors. `${NAME}`,
/// `${NAME:-default}` and `$$` in string values are expanded from the process
/// environment first ([`env`]).
pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
    let (expanded, env) = expand_from_process(text);
    let expanded = expanded.map_err(|(key_path, at, reason)| {
        ConfigError::new(file, Some(locate::line_col(text, at)), key_path, &reason)
    })?;
    // No error shows what the environment gave (CONTRACT §13): its variable instead.
    let hide = |mut e: ConfigError| {
        e.file = env.redact(&e.file);
        e.reason = env.redact(&e.reason);
        e
    };
    let text = &*expanded;
    let raw: FileConfig = deserialize(file, text, &env)?;
    let mut config = validate::validate(raw).map_err(|(key_path, reason)| {
        let reason = env.redact(&reason);
        ConfigError::new(file, locate::locate(text, &key_path), key_path, &reason)
    })?;
    if config.server.upgrade_sock.as_os_str().is_empty() {
        config.server.upgrade_sock = server::default_upgrade_sock(Path::new(file));
    }
    // The tenants file: its errors point into it.
    tenants::read_file(&mut config.tenants).map_err(hide)?;
    tenants::tier_limits(&config.tenants, &mut config.rate_limit.params.overrides);
    Ok(config)
}

/// `text` (a config file) expanded from the process environment ([`env::expand_text`]),
/// and the values the environment gave it, to keep out of errors.
fn expand_from_process(
    text: &str,
) -> (
    Result<std::borrow::Cow<'_, str>, env::TextError>,
    redact::EnvValues,
) {
    let seen = std::cell::RefCell::new(Vec::new());
    let lookup = |name: &str| {
        let value = env::from_process(name);
        if let Some(v) = &value {
            seen.borrow_mut().push((name.to_string(), v.clone()));
        }
        value
    };
    let expanded = env::expand_text(text, &lookup);
    (expanded, redact::EnvValues::new(seen.into_inner()))
}

/// The values the environment gives the strings of `text` (a config file).
fn env_values_of(text: &str) -> redact::EnvValues {
    expand_from_process(text).1
}

/// `env`: the values from the environment, hidden before the message is redacted of URL
/// secrets (a URL from the environment is shown as its variable, not as a redacted URL).
fn deserialize(file: &str, text: &str, env: &redact::EnvValues) -> Result<FileConfig, ConfigError> {
    let de = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(de).map_err(|err| {
        let mut key_path = err.path().to_string();
        if key_path == "." {
            key_path.clear();
        }
        let inner = err.into_inner();
        let reason = env.redact(inner.message().trim());
        // serde reports an unknown key at its parent table: name the key itself.
        if let Some(unknown) = reason
            .strip_prefix("unknown field `")
            .and_then(|r| r.split('`').next())
        {
            if !key_path.ends_with(unknown) {
                key_path = if key_path.is_empty() {
                    unknown.to_string()
                } else {
                    format!("{key_path}.{unknown}")
                };
            }
        }
        // Parse errors (an integer too large for 64 bits) come without a
        // path: take it from the position.
        if key_path.is_empty() {
            if let Some(span) = inner.span() {
                key_path = locate::path_at(text, span.start).unwrap_or_default();
            }
        }
        let line_col = inner
            .span()
            .map(|s| locate::line_col(text, s.start))
            .or_else(|| locate::locate(text, &key_path));
        ConfigError::new(file, line_col, key_path, &reason)
    })
}

#[cfg(test)]
mod tests;
