//! The container image and the Kubernetes example, checked statically, in seconds and
//! without a container engine (`scripts/test-container.sh` builds the image with podman
//! and runs it, opt-in: the build is the long release build):
//! - every file the Dockerfile `COPY`s is in the build context that `.dockerignore`
//!   lets through, and nothing of `target/` or `.git/` is;
//! - the builder's rustc can read the committed PGO profile it builds with;
//! - the image's config (the Dockerfile's `sed` over `conf/portcullis.toml`) passes
//!   `--check` and listens on every interface, on the ports the image exposes;
//! - `conf/kubernetes.yaml`'s config passes `--check`, listens on the container ports its
//!   probes use, and its grace period outlasts the drain and the shutdown timeout.
//!
//! `.dockerignore` is read with Docker's rules: patterns in order, the last one that
//! matches a path or one of its parent directories decides, `!` lets a path back in.

use portcullis_test_kit as support;

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

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
    // the path itself and every directory above it
    let prefixes = || {
        path.match_indices('/')
            .map(|(i, _)| &path[..i])
            .chain([path])
    };
    let mut out = false;
    for (neg, p) in patterns {
        if prefixes().any(|prefix| glob(p.as_bytes(), prefix.as_bytes())) {
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
    // the package's build script (portcullis_build_info's commit): without it in the
    // context, the image's build failed at the portcullis crate (env! of its output)
    assert!(repo().join("build.rs").exists());
    assert!(
        sources.iter().any(|s| s == "build.rs") && !excluded(&patterns, "build.rs"),
        "build.rs is copied into the build context: {sources:?}"
    );
    let mut missing = Vec::new();
    for src in &sources {
        assert!(
            repo().join(src).exists(),
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
    // `ARG BUILDER_IMAGE=rust:<version>...` and `FROM ${BUILDER_IMAGE} AS builder`
    let instr = instructions(&dockerfile);
    assert!(
        instr
            .iter()
            .any(|i| i == "FROM ${BUILDER_IMAGE} AS builder"),
        "the builder stage is FROM ${{BUILDER_IMAGE}}"
    );
    let builder = instr
        .into_iter()
        .find_map(|i| i.strip_prefix("ARG BUILDER_IMAGE=").map(str::to_string))
        .expect("`ARG BUILDER_IMAGE=rust:<version>...`, the builder's default image");
    assert!(
        builder.starts_with("rust:") && builder.contains("@sha256:"),
        "{builder}"
    );
    let tag = builder["rust:".len()..]
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

/// `portcullis -c <text> --check` must print `OK`; the config, parsed.
fn checked_config(text: &str, what: &str) -> toml::Table {
    let (code, stdout, stderr, _) = support::check_config(text);
    assert!(
        code == 0 && stdout.trim() == "OK",
        "{what} fails --check: {stdout}{stderr}"
    );
    text.parse::<toml::Table>()
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// `server.listen` and `server.admin_listen` of a config.
fn listeners(config: &toml::Table) -> (Vec<String>, String) {
    let server = config["server"].as_table().expect("[server]");
    let listen = server["listen"]
        .as_array()
        .expect("server.listen")
        .iter()
        .map(|v| v.as_str().expect("an address").to_string())
        .collect();
    let admin = server["admin_listen"]
        .as_str()
        .expect("server.admin_listen")
        .to_string();
    (listen, admin)
}

fn port(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr:?}"))
}

fn all_interfaces(addr: &str) -> bool {
    addr.starts_with("0.0.0.0:") || addr.starts_with("[::]:")
}

#[test]
fn the_image_config_checks_and_listens_on_every_interface() {
    let dockerfile = read("Dockerfile");
    let edit = instructions(&dockerfile)
        .into_iter()
        .find(|i| i.starts_with("RUN sed -i") && i.contains("/etc/portcullis/portcullis.toml"))
        .expect("the RUN that edits the image's config");
    // The `-e '<script>'` arguments, as the shell passes them to sed.
    let scripts: Vec<&str> = edit
        .split("-e '")
        .skip(1)
        .map(|rest| rest.split('\'').next().expect("a closing quote"))
        .collect();
    assert!(!scripts.is_empty(), "no sed scripts in {edit}");
    let mut sed = Command::new("sed");
    for s in &scripts {
        sed.arg("-e").arg(s);
    }
    let mut child = sed
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run sed");
    child
        .stdin
        .take()
        .expect("sed's stdin")
        .write_all(read("conf/portcullis.toml").as_bytes())
        .expect("feed sed");
    let out = child.wait_with_output().expect("sed's output");
    assert!(out.status.success(), "sed failed: {scripts:?}");
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let config = checked_config(&text, "the image's config");
    let (listen, admin) = listeners(&config);
    assert!(
        !listen.is_empty() && listen.iter().all(|a| all_interfaces(a)),
        "the image's proxy listens on {listen:?}: unreachable from outside the container \
         (did conf/portcullis.toml's listen line change under the Dockerfile's sed?)"
    );
    assert!(
        all_interfaces(&admin),
        "the image's admin listener is {admin}: probes cannot reach it"
    );
    let expose: Vec<u16> = instructions(&dockerfile)
        .iter()
        .filter_map(|i| i.strip_prefix("EXPOSE "))
        .flat_map(|ports| {
            ports
                .split_whitespace()
                .map(|p| p.parse::<u16>().expect("a port"))
        })
        .collect();
    for addr in listen.iter().chain([&admin]) {
        assert!(
            expose.contains(&port(addr)),
            "{addr} is not EXPOSEd ({expose:?})"
        );
    }
}

#[test]
fn the_kubernetes_example_config_checks_and_fits_its_pod() {
    let yaml = read("conf/kubernetes.yaml");
    // The ConfigMap's `portcullis.toml: |` block: its lines indented past the key.
    let mut lines = yaml
        .lines()
        .skip_while(|l| l.trim() != "portcullis.toml: |");
    let key = lines
        .next()
        .expect("a `portcullis.toml: |` block in the ConfigMap");
    let key_indent = key.len() - key.trim_start().len();
    let mut block = String::new();
    let mut indent = None;
    for l in lines {
        if l.trim().is_empty() {
            block.push('\n');
            continue;
        }
        let n = l.len() - l.trim_start().len();
        if n <= key_indent {
            break;
        }
        let strip = *indent.get_or_insert(n);
        block.push_str(l.get(strip..).unwrap_or(l.trim_start()));
        block.push('\n');
    }
    let config = checked_config(&block, "conf/kubernetes.yaml's config");
    let (listen, admin) = listeners(&config);
    let container_port = |name: &str| -> u16 {
        let line = yaml
            .lines()
            .find(|l| l.contains(&format!("name: {name},")) && l.contains("containerPort:"))
            .unwrap_or_else(|| panic!("no container port named {name}"));
        line.split("containerPort:")
            .nth(1)
            .and_then(|r| r.trim().trim_end_matches('}').trim().parse().ok())
            .unwrap_or_else(|| panic!("containerPort in {line:?}"))
    };
    assert!(listen.iter().all(|a| all_interfaces(a)), "{listen:?}");
    assert!(all_interfaces(&admin), "{admin}");
    assert!(
        listen.iter().any(|a| port(a) == container_port("http")),
        "the proxy listens on {listen:?}, the `http` container port is {}",
        container_port("http")
    );
    assert_eq!(
        port(&admin),
        container_port("admin"),
        "the probes' `admin` port"
    );
    let server = config["server"].as_table().expect("[server]");
    let secs = |k: &str| {
        server
            .get(k)
            .and_then(|v| v.as_integer())
            .unwrap_or_else(|| panic!("server.{k}"))
    };
    let grace: i64 = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("terminationGracePeriodSeconds:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("terminationGracePeriodSeconds");
    assert!(
        grace > secs("drain_seconds") + secs("shutdown_timeout_seconds"),
        "Kubernetes kills the pod after {grace} s, before portcullis has drained ({} s) and shut down ({} s)",
        secs("drain_seconds"),
        secs("shutdown_timeout_seconds")
    );
}

/// The image's build context, exactly: every file the Dockerfile `COPY`s from it and
/// `.dockerignore` lets in, copied to a directory where `cargo metadata` (what the
/// builder's `cargo build` runs first) must read the workspace. It failed with
/// "failed to read .../crates/policy/Cargo.toml" when the workspace's members
/// (`crates/*`, `fuzz`) were left out of the context.
#[test]
fn cargo_reads_the_workspace_from_the_build_context() {
    let patterns = ignore_patterns(&read(".dockerignore"));
    let context = tempfile::tempdir().expect("tempdir");
    for src in copy_sources(&read("Dockerfile")) {
        for f in files_under(&src) {
            if excluded(&patterns, &f) {
                continue;
            }
            let to = context.path().join(&f);
            fs::create_dir_all(to.parent().expect("a parent")).expect("mkdir");
            fs::copy(repo().join(&f), &to).unwrap_or_else(|e| panic!("copy {f}: {e}"));
        }
    }
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
            "--locked",
        ])
        .current_dir(context.path())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata on the image's build context failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // .cargo/config.toml: the system libssl, as the builder's comment says
    assert!(
        context.path().join(".cargo/config.toml").exists(),
        "the build context has no .cargo/config.toml"
    );
}
