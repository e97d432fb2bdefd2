//! The quick start's guided tour (`scripts/demo.sh`, README "Quick start") run as
//! a user runs it: the real script, the real `portcullis` binary, the real demo
//! backend binary, curl, and (for the two-instance tour) a real `redis-server`.
//! Every port is a free one passed through the script's `DEMO_*_PORT` variables.
//!
//! The script checks each step itself and exits 1 at the first one whose outcome
//! is not what it claims; these tests also check each step's printed outcome, so
//! the README's expected output stays true.

use portcullis_test_kit as support;

use std::fs;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{free_port, RedisServer};

/// The whole tour takes about 30 s on an idle machine (the cull's cooldown is 15 s).
const TOUR_DEADLINE: Duration = Duration::from_secs(240);

/// A running `scripts/demo.sh`; stopped with SIGTERM (its trap stops the proxy and
/// the backends it started) if the test ends early.
struct Demo {
    child: Option<Child>,
    log: tempfile::NamedTempFile,
    /// `(port used, the shipped default it stands for)`.
    ports: Vec<(u16, u16)>,
}

impl Demo {
    fn start(env: &[(&str, String)]) -> Demo {
        let log = tempfile::NamedTempFile::new().expect("log file");
        let out = log.reopen().expect("reopen log");
        let err = out.try_clone().expect("clone log");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/demo.sh");
        let mut ports: Vec<(u16, u16)> = [8080, 9090, 8081, 9091, 9001, 9002]
            .into_iter()
            .map(|default| (free_port(), default))
            .collect();
        // The tour sorts backend answers by address: keep the two backends' free ports in the
        // order of the defaults they stand for, so the README's order holds.
        if ports[4].0 > ports[5].0 {
            let (a, b) = (ports[4].0, ports[5].0);
            ports[4].0 = b;
            ports[5].0 = a;
        }
        let mut cmd = Command::new("bash");
        cmd.arg(script)
            .env("PORTCULLIS_BIN", &*support::BIN)
            .env("DEMO_BACKEND_BIN", env!("CARGO_BIN_EXE_demo_backend"))
            .env("DEMO_PROXY_PORT", ports[0].0.to_string())
            .env("DEMO_ADMIN_PORT", ports[1].0.to_string())
            .env("DEMO_PROXY2_PORT", ports[2].0.to_string())
            .env("DEMO_ADMIN2_PORT", ports[3].0.to_string())
            .env(
                "DEMO_BACKEND_PORTS",
                format!("{} {}", ports[4].0, ports[5].0),
            )
            .env_remove("REDIS_URL")
            .env_remove("DEMO_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn bash scripts/demo.sh");
        Demo {
            child: Some(child),
            log,
            ports,
        }
    }

    /// Waits for the script to end; returns its exit code and everything it printed,
    /// with the free ports it used written as the shipped defaults they stand for.
    fn finish(mut self) -> (Option<i32>, String) {
        let deadline = Instant::now() + TOUR_DEADLINE;
        let mut child = self.child.take().expect("running");
        let code = loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                break st.code();
            }
            if Instant::now() >= deadline {
                terminate(&mut child);
                panic!(
                    "demo.sh still running after {TOUR_DEADLINE:?}:\n{}",
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        (code, self.output())
    }

    fn output(&self) -> String {
        let raw = fs::read_to_string(self.log.path()).unwrap_or_default();
        self.ports.iter().fold(raw, |text, &(used, default)| {
            replace_port(&text, used, default)
        })
    }
}

fn terminate(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c);
        }
    }
}

/// `127.0.0.1:<used>` written as `127.0.0.1:<default>` (not when more digits follow).
fn replace_port(text: &str, used: u16, default: u16) -> String {
    let from = format!("127.0.0.1:{used}");
    let to = format!("127.0.0.1:{default}");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(&from) {
        let after = &rest[i + from.len()..];
        out.push_str(&rest[..i]);
        if after.starts_with(|c: char| c.is_ascii_digit()) {
            out.push_str(&from);
        } else {
            out.push_str(&to);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Whether `line` matches `pattern`, where `…` in the pattern stands for any text
/// (both trimmed; without `…` they must be equal).
fn matches(pattern: &str, line: &str) -> bool {
    let (pattern, line) = (pattern.trim(), line.trim());
    let parts: Vec<&str> = pattern.split('…').collect();
    if parts.len() == 1 {
        return pattern == line;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !line.starts_with(first) || line.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &line[first.len()..];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// The README's expected tour output: the `text` block after the demo-output marker.
fn readme_expected_output() -> Vec<String> {
    let readme = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("read README.md");
    let marker = readme
        .find("<!-- demo-output")
        .expect("README.md has the demo-output marker");
    let block = &readme[marker..];
    let start = block
        .find("```text\n")
        .expect("a text block after the marker")
        + 8;
    let end = block[start..].find("```").expect("the block ends") + start;
    block[start..end]
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// The text of step `n` (from its `== n/5` heading to the next heading).
fn step(out: &str, n: u32) -> &str {
    let head = format!("== {n}/5 ");
    let start = out
        .find(&head)
        .unwrap_or_else(|| panic!("no step {n} in:\n{out}"));
    let rest = &out[start + head.len()..];
    let end = rest.find("\n== ").unwrap_or(rest.len());
    &rest[..end]
}

fn assert_has(text: &str, needle: &str, what: &str) {
    assert!(
        text.contains(needle),
        "{what}: expected {needle:?} in:\n{text}"
    );
}

/// The first line starting with `prefix`.
fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{text}"))
}

/// Checks of the tour's output common to both modes.
fn assert_tour(code: Option<i32>, out: &str) {
    assert_eq!(code, Some(0), "demo.sh failed:\n{out}");
    assert!(!out.contains("FAIL "), "{out}");

    // 1: a proxied 200 with its RateLimit fields.
    let s1 = step(out, 1);
    assert_has(s1, "HTTP/1.1 200 OK", "step 1");
    assert_has(s1, "hello from demo backend 127.0.0.1:", "step 1");
    assert_has(s1, "ratelimit-policy: \"default\";q=600;w=60", "step 1");
    assert_has(s1, "ratelimit: \"default\";r=599;", "step 1");
    assert!(line(s1, "ok 1: ").contains("proxied 200"), "{s1}");

    // 2: the key past its limit: 429 with Retry-After, RateLimit-Policy, RateLimit r=0.
    let s2 = step(out, 2);
    assert_has(s2, "HTTP/1.1 429 Too Many Requests", "step 2");
    let retry_after: u64 = line(s2, "retry-after: ")["retry-after: ".len()..]
        .trim()
        .parse()
        .expect("Retry-After is an integer");
    assert!(retry_after >= 1, "{s2}");
    assert_has(s2, "ratelimit: \"default\";r=0;t=", "step 2");
    let ok2 = line(s2, "ok 2: ");
    let admitted: u64 = ok2["ok 2: ".len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no admitted count in {ok2:?}"));
    assert!(
        (540..=631).contains(&admitted),
        "admitted {admitted} for a limit of 600: {ok2}"
    );

    // 3: a burst past the cap: 503 with Retry-After, some of the burst shed.
    let s3 = step(out, 3);
    assert_has(s3, "HTTP/1.1 503 Service Unavailable", "step 3");
    assert_has(s3, "retry-after: ", "step 3");
    assert_has(s3, "load shed", "step 3");
    let ok3 = line(s3, "ok 3: ");
    assert!(ok3.contains("shed with 503"), "{ok3}");

    // 4: culled, visible in /status, then readmitted and serving again.
    let s4 = step(out, 4);
    assert_has(s4, "\"state\": \"culled\"", "step 4");
    assert_has(
        s4,
        "portcullis_cull_decisions_total{result=\"culled\"} 1",
        "step 4",
    );
    assert_has(s4, "readmitted at t=", "step 4");
    assert_has(
        s4,
        "portcullis_cull_decisions_total{result=\"readmitted\"} 1",
        "step 4",
    );
    let served_by = s4
        .lines()
        .filter(|l| l.contains("hello from demo backend"))
        .count();
    assert_eq!(served_by, 2, "both backends answer after readmission: {s4}");
    line(s4, "ok 4: ");

    // 5: the metrics of each gate.
    let s5 = step(out, 5);
    for outcome in ["proxied", "rate_limited", "shed"] {
        let l = line(
            s5,
            &format!("portcullis_requests_total{{outcome=\"{outcome}\"}} "),
        );
        assert_ne!(l.rsplit(' ').next(), Some("0"), "{l}");
    }
    line(s5, "ok 5: ");
    assert_has(out, "demo passed: all four gates shown", "end");
}

#[test]
fn tour_on_the_in_process_store() {
    let (code, out) = Demo::start(&[]).finish();
    assert_tour(code, &out);
    assert_has(&out, "one instance, in-process store", "heading");
    // The README's expected output, line by line and in order.
    let expected = readme_expected_output();
    assert!(expected.len() > 40, "README block too short: {expected:?}");
    let mut lines = out.lines();
    for want in &expected {
        assert!(
            lines.any(|l| matches(want, l)),
            "README line {want:?} not found (in order) in the tour's output:\n{out}"
        );
    }
}

#[test]
fn readme_line_matching() {
    assert!(matches(
        "ok 2: … admitted (limit 600), then …",
        "ok 2: 600 of 636 requests admitted (limit 600), then 429"
    ));
    assert!(matches("… 200", "    599 200"));
    assert!(!matches("… 200", "    36 429"));
    assert!(!matches(
        "HTTP/1.1 200 OK",
        "HTTP/1.1 503 Service Unavailable"
    ));
    assert!(!matches("a…b…c", "a c b"));
    assert_eq!(
        replace_port("127.0.0.1:4000 127.0.0.1:40001", 4000, 8080),
        "127.0.0.1:8080 127.0.0.1:40001"
    );
}

#[test]
fn tour_on_two_instances_sharing_redis() {
    let redis = RedisServer::start();
    let (code, out) = Demo::start(&[("REDIS_URL", redis.url())]).finish();
    assert_tour(code, &out);
    let s2 = step(&out, 2);
    assert_has(s2, "one limit for the fleet", "step 2");
    assert_has(s2, "instance a refuses the key too: 429", "step 2");
    assert_has(s2, "across two instances", "step 2");
    let s4 = step(&out, 4);
    assert_has(s4, "instance b's /status shows", "step 4");
    assert_has(s4, "instance b readmitted it too", "step 4");
    assert!(
        !redis.keys("portcullis-demo-*").is_empty(),
        "the tour wrote nothing under its key prefix in Redis"
    );
}

/// The script's own checks bite: with the RateLimit fields switched off on admitted
/// responses, step 1 cannot show them, and the tour fails there.
#[test]
fn tour_fails_when_a_step_does_not_show_what_it_claims() {
    let shipped = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/portcullis.toml"))
        .expect("read conf/portcullis.toml");
    let changed = shipped.replacen("\nheaders = true", "\nheaders = false", 1);
    assert_ne!(
        changed, shipped,
        "conf/portcullis.toml has no `headers = true`"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("no-headers.toml");
    fs::write(&cfg, changed).expect("write config");
    let (code, out) = Demo::start(&[("DEMO_CONFIG", cfg.display().to_string())]).finish();
    assert_eq!(code, Some(1), "{out}");
    assert_has(&out, "FAIL 1: RateLimit-Policy is ''", "step 1");
    assert!(!out.contains("demo passed"), "{out}");
}
