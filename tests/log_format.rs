//! `[log] format` end to end (CONTRACT §16): the real binary writes its own log lines
//! (stderr) as JSON or as readable text, with the same fields either way; `auto` is JSON
//! when stderr is not a terminal (here: a file). The format is fixed at start: a reload
//! that changes it warns and keeps it.

use portcullis_test_kit as support;

use support::*;

/// The access log is off so that the log file (stdout and stderr) holds only the
/// process's own lines.
fn config(b: &Backend, log: &str) -> String {
    format!(
        "{}\n[access_log]\nenabled = false\n\n{log}",
        one_upstream(b)
    )
}

/// The lines of `logs` that contain `needle`.
fn lines_with<'a>(logs: &'a str, needle: &str) -> Vec<&'a str> {
    logs.lines().filter(|l| l.contains(needle)).collect()
}

fn is_json(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| v.is_object())
}

#[test]
fn text_format_writes_readable_lines_with_the_event_fields() {
    let b = Backend::start("b");
    let p = Proxy::start(&config(&b, "[log]\nformat = \"text\"\n"));
    let logs = p.logs();
    let start = lines_with(&logs, "portcullis starting");
    assert_eq!(start.len(), 1, "one start line expected; logs:\n{logs}");
    let start = start[0];
    assert!(!is_json(start), "text format wrote JSON: {start}");
    for field in [
        "INFO",
        "event=\"start\"",
        "store=\"local\"",
        "upgrade=false",
    ] {
        assert!(start.contains(field), "{field} missing from {start:?}");
    }
    assert!(
        start.contains(&p.admin_addr()),
        "admin address missing: {start}"
    );
    // Not a terminal: no colour codes, even though text was asked for.
    assert!(!logs.contains('\u{1b}'), "ANSI escapes in a file:\n{logs}");
    let ready = lines_with(&logs, "event=\"ready\"");
    assert_eq!(ready.len(), 1, "logs:\n{logs}");
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        assert!(!is_json(line), "a JSON line in text format: {line}");
    }

    // The format is a start-time setting: asking for JSON in a reload warns, and the
    // lines stay text.
    let text = std::fs::read_to_string(p.config_path()).expect("config");
    p.rewrite_config_raw(&text.replace("format = \"text\"", "format = \"json\""));
    p.signal("HUP");
    eventually(
        DEADLINE,
        || format!("no reload line; logs:\n{}", p.logs()),
        || p.logs().contains("configuration reloaded"),
    );
    let logs = p.logs();
    let reloaded = lines_with(&logs, "configuration reloaded");
    assert!(
        !is_json(reloaded[0]) && reloaded[0].contains("result=\"ok\""),
        "{reloaded:?}"
    );
    let warned = lines_with(&logs, "key=\"log.format\"");
    assert_eq!(
        warned.len(),
        1,
        "no restart warning for log.format:\n{logs}"
    );
    assert!(
        warned[0].contains("WARN") && !is_json(warned[0]),
        "{warned:?}"
    );
}

/// Parses the JSON lines of `logs`; panics on a non-empty line that is not a JSON object.
fn json_lines(logs: &str) -> Vec<serde_json::Value> {
    logs.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .filter(serde_json::Value::is_object)
                .unwrap_or_else(|| panic!("not a JSON line: {l:?}\nlogs:\n{logs}"))
        })
        .collect()
}

fn assert_json_start_line(p: &Proxy) {
    let logs = p.logs();
    let lines = json_lines(&logs);
    let start: Vec<_> = lines.iter().filter(|v| v["event"] == "start").collect();
    assert_eq!(start.len(), 1, "logs:\n{logs}");
    let start = start[0];
    assert_eq!(start["message"], "portcullis starting", "{start}");
    assert_eq!(start["level"], "INFO", "{start}");
    assert_eq!(start["store"], "local", "{start}");
    assert_eq!(start["upgrade"], false, "{start}");
    assert_eq!(start["admin"], p.admin_addr().as_str(), "{start}");
    assert!(
        lines.iter().any(|v| v["event"] == "ready"),
        "no ready line; logs:\n{logs}"
    );
}

#[test]
fn json_format_writes_json_lines() {
    let b = Backend::start("b");
    let p = Proxy::start(&config(&b, "[log]\nformat = \"json\"\n"));
    assert_json_start_line(&p);
}

#[test]
fn auto_format_is_json_when_stderr_is_not_a_terminal() {
    let b = Backend::start("b");
    let p = Proxy::start(&config(&b, ""));
    assert_json_start_line(&p);
}

#[test]
fn unknown_log_format_is_a_check_error_with_key_path_and_line() {
    let b = Backend::start("b");
    let text = format!(
        "[server]\nlisten = [\"127.0.0.1:1\"]\n{}\n[log]\nformat = \"xml\"\n",
        one_upstream(&b)
    );
    let line = text
        .lines()
        .position(|l| l.contains("xml"))
        .expect("xml line")
        + 1;
    let (code, stdout, stderr, path) = check_config(&text);
    assert_eq!(code, 2, "stdout: {stdout}\nstderr: {stderr}");
    assert!(!stdout.contains("OK"), "{stdout}");
    assert!(
        stderr.contains(&format!("{path}:{line}:")),
        "file and line {line} expected: {stderr}"
    );
    assert!(stderr.contains("log.format"), "{stderr}");
    for name in ["auto", "json", "text"] {
        assert!(stderr.contains(name), "{name} not offered: {stderr}");
    }
}
