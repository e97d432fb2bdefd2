//! The container image's build, checked without a container engine (none is on the
//! machines this is developed on, so `docker build` never runs here):
//! - every file the Dockerfile `COPY`s is in the build context that `.dockerignore`
//!   lets through, and nothing of `target/` or `.git/` is;
//! - the builder's rustc can read the committed PGO profile it builds with.
//!
//! `.dockerignore` is read with Docker's rules: patterns in order, the last one that
//! matches a path or one of its parent directories decides, `!` lets a path back in.

use std::fs;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `.dockerignore`'s patterns: (re-include, pattern), in order.
fn ignore_patterns(text: &str) -> Vec<(bool, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (neg, p) = match l.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, l),
            };
            assert!(
                !p.contains("**") && !p.contains('[') && !p.contains('\\'),
                ".dockerignore pattern {l:?}: this check reads only `*`, `?` and literal paths; \
                 extend `glob` before using more of Docker's syntax"
            );
            (
                neg,
                p.trim_start_matches('/').trim_end_matches('/').to_string(),
            )
        })
        .collect()
}

/// Go's `filepath.Match` for `*` and `?` (neither crosses a `/`), as Docker uses it.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            glob(&pattern[1..], name)
                || (!name.is_empty() && name[0] != b'/' && glob(pattern, &name[1..]))
        }
        (Some(b'?'), Some(&c)) if c != b'/' => glob(&pattern[1..], &name[1..]),
        (Some(&p), Some(&c)) if p == c => glob(&pattern[1..], &name[1..]),
        _ => false,
    }
}

/// Whether `path` (relative, `/`-separated) is left out of the build context.
fn excluded(patterns: &[(bool, String)], path: &str) -> bool {
    let mut out = false;
    for (neg, p) in patterns {
        // the path itself or any directory above it
        let mut hit = false;
        let mut prefix = String::new();
        for part in path.split('/') {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if glob(p.as_bytes(), prefix.as_bytes()) {
                hit = true;
                break;
            }
        }
        if hit {
            out = !neg;
        }
    }
    out
}

/// Every file at or under `rel`, relative to the repository, `/`-separated.
fn files_under(rel: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![repo().join(rel)];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            for e in fs::read_dir(&p).expect("read a COPY source directory") {
                stack.push(e.expect("directory entry").path());
            }
        } else {
            let r = p.strip_prefix(repo()).expect("under the repository");
            out.push(r.to_string_lossy().replace('\\', "/"));
        }
    }
    out
}

/// The Dockerfile's instructions, continuation lines joined.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(head) => {
                cur.push_str(head);
                cur.push(' ');
            }
            None => {
                cur.push_str(t);
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    out
}

/// Sources of every `COPY` from the build context (not `--from` another stage).
fn copy_sources(dockerfile: &str) -> Vec<String> {
    let mut out = Vec::new();
    for ins in instructions(dockerfile) {
        let mut words = ins.split_whitespace();
        if !words.next().is_some_and(|w| w.eq_ignore_ascii_case("COPY")) {
            continue;
        }
        let args: Vec<&str> = words.collect();
        if args.iter().any(|a| a.starts_with("--from")) {
            continue;
        }
        let args: Vec<&str> = args.into_iter().filter(|a| !a.starts_with("--")).collect();
        assert!(args.len() >= 2, "COPY without a destination: {ins}");
        out.extend(
            args[..args.len() - 1]
                .iter()
                .map(|s| s.trim_end_matches('/').to_string()),
        );
    }
    out
}

fn read(rel: &str) -> String {
    fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

#[test]
fn the_ignore_rules_read_as_docker_reads_them() {
    let p = ignore_patterns("# c\n*\n!src\n!scripts/one.sh\n!pgo\npgo/*.tmp\n");
    assert!(excluded(&p, "target/release/portcullis"));
    assert!(excluded(&p, "README.md"));
    assert!(!excluded(&p, "src/main.rs"));
    assert!(!excluded(&p, "src/proxy/mod.rs"));
    assert!(excluded(&p, "scripts/two.sh"));
    assert!(!excluded(&p, "scripts/one.sh"));
    assert!(!excluded(&p, "pgo/profile.env"));
    assert!(excluded(&p, "pgo/x.tmp"));
    assert!(glob(b"*.md", b"README.md"));
    assert!(!glob(b"*.md", b"docs/README.md"));
    assert!(glob(b"s?c", b"src"));
}

#[test]
fn every_copied_file_is_in_the_build_context() {
    let patterns = ignore_patterns(&read(".dockerignore"));
    let sources = copy_sources(&read("Dockerfile"));
    assert!(
        sources.iter().any(|s| s == "vendor"),
        "the patched Pingora crates: {sources:?}"
    );
    let mut missing = Vec::new();
    for src in &sources {
        assert!(
            Path::new(&repo().join(src)).exists(),
            "the Dockerfile copies {src}, which is not in the repository"
        );
        for f in files_under(src) {
            if excluded(&patterns, &f) {
                missing.push(f);
            }
        }
    }
    assert!(
        missing.is_empty(),
        ".dockerignore leaves out files the Dockerfile copies (the build would fail or differ): {:?}",
        &missing[..missing.len().min(10)]
    );
    for f in [
        "target/release/portcullis",
        ".git/config",
        "tests/demo.rs",
        "scripts/run.sh",
    ] {
        assert!(excluded(&patterns, f), "{f} is in the build context");
    }
}

/// (major, minor, patch) of a `1.95.0`-style version.
fn version(v: &str) -> (u32, u32, u32) {
    let mut it = v
        .split('.')
        .map(|n| n.parse::<u32>().unwrap_or_else(|_| panic!("version {v:?}")));
    let mut next = || it.next().unwrap_or(0);
    (next(), next(), next())
}

#[test]
fn the_builder_reads_the_committed_profile() {
    let dockerfile = read("Dockerfile");
    let env = read("pgo/profile.env");
    let trained_with = env
        .lines()
        .find_map(|l| l.strip_prefix("RUSTC="))
        .expect("pgo/profile.env names the rustc that wrote the profile");
    let builder = instructions(&dockerfile)
        .into_iter()
        .find(|i| i.starts_with("FROM rust:") && i.ends_with(" AS builder"))
        .expect("a `FROM rust:<version>... AS builder` stage");
    let tag = builder["FROM rust:".len()..]
        .split(['-', '@', ' '])
        .next()
        .expect("an image tag");
    assert!(
        version(tag) >= version(trained_with),
        "the builder's rust {tag} is older than the rustc {trained_with} (and its LLVM) that wrote \
         pgo/portcullis.profdata.gz: it cannot read the profile; move the builder image up"
    );
    let build = instructions(&dockerfile)
        .into_iter()
        .find(|i| i.starts_with("RUN ") && i.contains("cargo build --release"))
        .expect("the builder's cargo build");
    assert!(
        build.contains("scripts/pgo-profile.sh") && build.contains("-Cprofile-use="),
        "the image is built with the committed profile: {build}"
    );
}
