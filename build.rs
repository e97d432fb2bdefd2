//! The commit `portcullis_build_info{commit}` names: `PORTCULLIS_COMMIT` when set (a
//! build from a tarball or a container context without `.git`), else `git rev-parse
//! --short=12 HEAD`, else `unknown`. Only HEAD and its branch are watched (not the
//! index): a `git add` must not rebuild the crate.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    Some(s)
}

/// Rebuild when `path` changes; a path that does not exist is not watched (cargo would
/// rerun the script on every build).
fn watch(path: Option<String>) {
    if let Some(p) = path.filter(|p| std::path::Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={p}");
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=PORTCULLIS_COMMIT");
    let commit = match std::env::var("PORTCULLIS_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => match git(&["rev-parse", "--short=12", "HEAD"]) {
            Some(c) if !c.is_empty() => {
                // Rebuild when HEAD moves (a commit, a checkout).
                for path in ["HEAD", "packed-refs"] {
                    watch(git(&["rev-parse", "--git-path", path]));
                }
                if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    watch(git(&["rev-parse", "--git-path", &r]));
                }
                c
            }
            _ => "unknown".to_string(),
        },
    };
    // Printable ASCII only: it becomes a label value.
    let commit: String = commit
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(64)
        .collect();
    println!("cargo:rustc-env=PORTCULLIS_BUILD_COMMIT={commit}");
}
