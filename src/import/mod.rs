//! Importers of other proxies' configurations (`portcullis import-haproxy`): plain Rust,
//! apart from the proxy runtime.

pub mod haproxy;
