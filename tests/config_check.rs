//! `portcullis -c FILE --check` (CONTRACT §1, §2): exit 0 + `OK`, or exit 2 with the file,
//! the key path and the reason on stderr (plus line:col where the parser knows it).
//! Errors are expected as `error: <file>:<line>:<col>: <key.path>: <reason>`.

use portcullis_test_kit as support;

use std::path::Path;
use support::*;

/// A complete, valid file using every documented section.
const VALID: &str = r#"
[server]
listen = ["127.0.0.1:18080"]
admin_listen = "127.0.0.1:19090"
threads = 2
drain_seconds = 5
shutdown_timeout_seconds = 30
upgrade_sock = "/tmp/portcullis-test-upgrade.sock"

[redis]
url = "redis://127.0.0.1:6379"
key_prefix = "portcullis"
flush_interval_ms = 50
timeout_ms = 200

[[upstreams]]
name = "app"
backends = ["127.0.0.1:9001", "127.0.0.1:9002"]
health_check_path = "/health"
health_check_interval_seconds = 5
connect_timeout_ms = 1000
read_timeout_ms = 30000

[[upstreams]]
name = "admin"
backends = ["127.0.0.1:9003"]

[[routes]]
host = "admin.example"
path_prefix = "/"
upstream = "admin"
priority = "critical"

[[routes]]
path_prefix = "/api"
upstream = "app"
priority = "normal"

[[routes]]
path_prefix = "/batch"
upstream = "app"
priority = "low"

[shedding]
max_concurrency = 1024
retry_after_seconds = 1

[rate_limit]
enabled = true
key = "header:x-api-key"
window_seconds = 60
limit = 600
missing_key = "client_ip"
max_key_bytes = 256
headers = true

[rate_limit.keys]
"example-premium-key" = 6000

[culling]
enabled = true
window_seconds = 60
error_threshold = 5
check_interval_seconds = 10
tokens = 10
token_period_seconds = 600
max_culled_fraction = 0.5
cooldown_seconds = 60
dry_run = false
"#;

/// 1-based number of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in config"))
        + 1
}

/// Replaces exactly one occurrence of `from` in VALID.
fn valid_with(from: &str, to: &str) -> String {
    assert_eq!(VALID.matches(from).count(), 1, "ambiguous edit {from:?}");
    VALID.replacen(from, to, 1)
}

struct Failure {
    stderr: String,
    path: String,
}

/// Runs --check and asserts exit 2, nothing claiming OK on stdout, and the file path in stderr.
fn check_fails(text: &str) -> Failure {
    let (code, stdout, stderr, path) = check_config(text);
    assert_eq!(
        code, 2,
        "expected exit 2\nstdout: {stdout}\nstderr: {stderr}\nconfig:\n{text}"
    );
    assert!(
        !stdout.contains("OK"),
        "stdout must not say OK on error: {stdout}"
    );
    assert!(
        stderr.contains(&path),
        "stderr must name the file {path}: {stderr}"
    );
    Failure { stderr, path }
}

impl Failure {
    fn mentions(&self, key_path: &str) -> &Self {
        assert!(
            self.stderr.contains(key_path),
            "stderr must name the key path `{key_path}`: {}",
            self.stderr
        );
        self
    }

    fn mentions_any(&self, key_paths: &[&str]) -> &Self {
        assert!(
            key_paths.iter().any(|k| self.stderr.contains(k)),
            "stderr must name one of the key paths {key_paths:?}: {}",
            self.stderr
        );
        self
    }

    /// The line number appears as `:LINE:` (file:line:col) or `line LINE`.
    fn at_line(&self, line: usize) -> &Self {
        assert!(
            self.stderr.contains(&format!(":{line}:"))
                || self.stderr.contains(&format!("line {line}")),
            "stderr must give line {line} (as :{line}:COL or `line {line}`): {}",
            self.stderr
        );
        self
    }
}

#[test]
fn valid_full_config_is_ok() {
    let (code, stdout, stderr, _) = check_config(VALID);
    assert_eq!(code, 0, "stderr: {stderr}");
    assert_eq!(stdout.trim(), "OK", "stderr: {stderr}");
}

#[test]
fn minimal_config_is_ok() {
    let (code, stdout, stderr, _) = check_config(
        r#"
[[upstreams]]
name = "app"
backends = ["127.0.0.1:9001"]
"#,
    );
    assert_eq!(code, 0, "stderr: {stderr}");
    assert_eq!(stdout.trim(), "OK");
}

#[test]
fn shipped_configs_are_ok() {
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf");
    let default = conf.join("portcullis.toml");
    assert!(default.exists(), "{} must be shipped", default.display());
    let mut checked = 0;
    for entry in std::fs::read_dir(&conf).expect("read conf/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "toml") {
            let (code, stdout, stderr) = check_config_file(&path);
            assert_eq!(code, 0, "{} fails --check: {stderr}", path.display());
            assert_eq!(stdout.trim(), "OK", "{}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 1);
}

#[test]
fn unknown_key_is_an_error() {
    let text = valid_with("window_seconds = 60\nlimit", "windw_seconds = 60\nlimit");
    let f = check_fails(&text);
    f.mentions("rate_limit.windw_seconds")
        .at_line(line_of(&text, "windw_seconds"));
    // the documented shape: error: <file>:<line>:<col>: <key.path>: <reason>
    let line = line_of(&text, "windw_seconds");
    let prefix = format!("error: {}:{line}:", f.path);
    assert!(
        f.stderr.lines().any(|l| l.starts_with(&prefix)),
        "expected a line starting with {prefix:?}: {}",
        f.stderr
    );
}

#[test]
fn unknown_key_in_second_upstream() {
    let text = valid_with(
        "name = \"admin\"\n",
        "name = \"admin\"\nhelth_check_path = \"/h\"\n",
    );
    check_fails(&text)
        .mentions("upstreams[1].helth_check_path")
        .at_line(line_of(&text, "helth_check_path"));
}

#[test]
fn unknown_section_is_an_error() {
    let text = format!("{VALID}\n[ratelimit]\nlimit = 5\n");
    check_fails(&text).mentions("ratelimit");
}

#[test]
fn wrong_type_is_an_error() {
    let text = valid_with("max_concurrency = 1024", "max_concurrency = \"lots\"");
    check_fails(&text)
        .mentions("shedding.max_concurrency")
        .at_line(line_of(&text, "max_concurrency"));
}

#[test]
fn negative_count_is_an_error() {
    let text = valid_with("limit = 600", "limit = -5");
    check_fails(&text)
        .mentions("rate_limit.limit")
        .at_line(line_of(&text, "limit = -5"));
}

#[test]
fn zero_window_is_an_error() {
    let text = valid_with("window_seconds = 60\nlimit", "window_seconds = 0\nlimit");
    check_fails(&text).mentions("rate_limit.window_seconds");
}

#[test]
fn culled_fraction_out_of_range_is_an_error() {
    let text = valid_with("max_culled_fraction = 0.5", "max_culled_fraction = 1.5");
    check_fails(&text).mentions("culling.max_culled_fraction");
}

#[test]
fn bad_backend_address_is_an_error() {
    let text = valid_with(
        r#"backends = ["127.0.0.1:9001", "127.0.0.1:9002"]"#,
        r#"backends = ["127.0.0.1:9001", "not-an-address"]"#,
    );
    check_fails(&text).mentions_any(&["upstreams[0].backends[1]", "upstreams[0].backends"]);
}

#[test]
fn empty_backends_is_an_error() {
    let text = valid_with(r#"backends = ["127.0.0.1:9003"]"#, "backends = []");
    check_fails(&text).mentions("upstreams[1].backends");
}

#[test]
fn bad_listen_address_is_an_error() {
    let text = valid_with(r#"listen = ["127.0.0.1:18080"]"#, r#"listen = ["nope"]"#);
    check_fails(&text).mentions("server.listen");
    let text = valid_with(
        r#"admin_listen = "127.0.0.1:19090""#,
        r#"admin_listen = "127.0.0.1:99999""#,
    );
    check_fails(&text).mentions("server.admin_listen");
}

#[test]
fn duplicate_upstream_names_are_an_error() {
    let text = valid_with("name = \"admin\"", "name = \"app\"");
    check_fails(&text).mentions("upstreams[1].name");
}

#[test]
fn missing_upstream_name_is_an_error() {
    let text = valid_with("name = \"admin\"\n", "");
    check_fails(&text).mentions_any(&["upstreams[1].name", "upstreams[1]"]);
}

#[test]
fn route_to_unknown_upstream_is_an_error() {
    let text = valid_with("upstream = \"admin\"", "upstream = \"nowhere\"");
    check_fails(&text).mentions("routes[0].upstream");
}

#[test]
fn bad_priority_is_an_error() {
    let text = valid_with("priority = \"low\"", "priority = \"urgent\"");
    check_fails(&text)
        .mentions("routes[2].priority")
        .at_line(line_of(&text, "urgent"));
}

#[test]
fn bad_missing_key_mode_is_an_error() {
    let text = valid_with("missing_key = \"client_ip\"", "missing_key = \"maybe\"");
    check_fails(&text)
        .mentions("rate_limit.missing_key")
        .at_line(line_of(&text, "maybe"));
}

#[test]
fn bad_key_source_is_an_error() {
    let text = valid_with("key = \"header:x-api-key\"", "key = \"cookie:x\"");
    check_fails(&text).mentions("rate_limit.key");
}

#[test]
fn other_key_sources_are_ok() {
    for key in ["query:api_key", "bearer", "header:authorization"] {
        let text = valid_with("key = \"header:x-api-key\"", &format!("key = \"{key}\""));
        let (code, stdout, stderr, _) = check_config(&text);
        assert_eq!(code, 0, "key = {key:?} should be valid: {stderr}");
        assert_eq!(stdout.trim(), "OK");
    }
}

#[test]
fn invalid_toml_syntax_reports_line() {
    let text = valid_with("[shedding]\n", "[shedding\n");
    check_fails(&text).at_line(line_of(&text, "[shedding"));

    let text = valid_with("retry_after_seconds = 1\n", "retry_after_seconds = = 1\n");
    check_fails(&text).at_line(line_of(&text, "retry_after_seconds"));
}

#[test]
fn no_upstreams_is_an_error() {
    let (code, _, stderr, path) = check_config(
        r#"
[shedding]
max_concurrency = 10
"#,
    );
    assert_eq!(code, 2, "stderr: {stderr}");
    assert!(stderr.contains(&path), "{stderr}");
    assert!(stderr.contains("upstreams"), "{stderr}");
}

#[test]
fn missing_file_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("does-not-exist.toml");
    let (code, stdout, stderr) = check_config_file(&path);
    assert_eq!(code, 2, "stdout {stdout} stderr {stderr}");
    assert!(
        stderr.contains(&path.display().to_string()),
        "stderr must name the file: {stderr}"
    );
}

#[test]
fn check_resolves_backend_names_and_locates_the_failure() {
    // Validation only checks how a name is written; --check (like start and reload)
    // resolves it and names the entry that does not resolve, with its line.
    let text = valid_with(
        r#"backends = ["127.0.0.1:9001", "127.0.0.1:9002"]"#,
        r#"backends = ["127.0.0.1:9001", "no-such-host.invalid:9002"]"#,
    );
    let f = check_fails(&text);
    f.mentions("upstreams[0].backends[1]");
    assert!(
        f.stderr.contains("no-such-host.invalid:9002"),
        "{}",
        f.stderr
    );
    let line = text
        .lines()
        .position(|l| l.contains("no-such-host"))
        .map(|i| i + 1)
        .unwrap_or_else(|| unreachable!());
    assert!(
        f.stderr.contains(&format!("{}:{line}:", f.path)),
        "no line {line}: {}",
        f.stderr
    );
    let ok = valid_with(
        r#"backends = ["127.0.0.1:9001", "127.0.0.1:9002"]"#,
        r#"backends = ["localhost:9001", "127.0.0.1:9002"]"#,
    );
    let (code, stdout, stderr, _) = check_config(&ok);
    assert_eq!(code, 0, "{stdout}{stderr}");
}
