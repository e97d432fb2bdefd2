//! Configuration: the serde file schema ([`schema`]), then validation into the
//! runtime [`Config`]. Every error names the file, the key path
//! (`rate_limit.window_seconds`, `upstreams[1].name`) and, where the TOML
//! parser knows it, `line:column`.

mod locate;
pub mod schema;
mod validate;

pub use schema::*;
pub use validate::{Config, KeySpec, MissingKey, Route, Upstream};

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

/// Read and validate a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: file.clone(),
        line_col: None,
        key_path: String::new(),
        reason: format!("cannot read config file: {e}"),
    })?;
    parse(&file, &text)
}

/// Parse and validate config text; `file` only labels errors.
pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
    let raw: FileConfig = deserialize(file, text)?;
    validate::validate(raw).map_err(|(key_path, reason)| ConfigError {
        file: file.to_string(),
        line_col: locate::locate(text, &key_path),
        key_path,
        reason,
    })
}

fn deserialize(file: &str, text: &str) -> Result<FileConfig, ConfigError> {
    let de = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(de).map_err(|err| {
        let mut key_path = err.path().to_string();
        if key_path == "." {
            key_path.clear();
        }
        let inner = err.into_inner();
        let reason = inner.message().trim().to_string();
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
        let line_col = inner
            .span()
            .map(|s| locate::line_col(text, s.start))
            .or_else(|| locate::locate(text, &key_path));
        ConfigError {
            file: file.to_string(),
            line_col,
            key_path,
            reason,
        }
    })
}

#[cfg(test)]
mod tests;
