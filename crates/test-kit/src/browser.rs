//! A real headless Chromium (Debian's `chromium` package): render a page and return its
//! DOM after the page's scripts ran, or take a screenshot.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The Chromium binary, if installed (scripts/setup.sh installs it).
pub fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

fn headless(bin: &str, extra: &[&str], url: &str) -> Output {
    let profile = tempfile::tempdir().expect("profile dir");
    Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            // let the page's fetch and timers run before the DOM is taken
            "--virtual-time-budget=4000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {bin}: {e}"))
}

/// The serialized DOM of `url` after its scripts ran.
pub fn dump_dom(bin: &str, url: &str) -> String {
    let out = headless(bin, &["--dump-dom"], url);
    assert!(
        out.status.success(),
        "{bin} --dump-dom failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A PNG screenshot of `url` at `width`x`height` written to `path`.
pub fn screenshot(bin: &str, url: &str, path: &Path, width: u32, height: u32) {
    let shot = format!("--screenshot={}", path.display());
    let size = format!("--window-size={width},{height}");
    let out = headless(bin, &[&shot, &size], url);
    assert!(
        out.status.success() && path.exists(),
        "{bin} --screenshot failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
