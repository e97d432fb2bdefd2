//! The documentation: the book in `docs/` (mdBook), the README, and the man pages.
//!
//! - the configuration reference page and the man pages are what the binary generates
//!   from its own types (`--print-config-reference`, `--print-man NAME`), so they cannot
//!   drift from the code;
//! - the man pages render with `man --warnings` and say nothing on stderr;
//! - every relative link and `#anchor` in `docs/src` and `README.md` resolves, every page
//!   is in `SUMMARY.md`, and every repository file they name exists;
//! - the book builds with `mdbook build` without a warning, and every link of the built
//!   site (its own navigation included) reaches a page and an id that exist;
//! - the README stays short (≤ 15,000 bytes), cites no file outside the repository, and
//!   its guided tour is the book's.

use portcullis_test_kit as support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// What the binary under test prints for `args`.
fn printed(args: &[&str]) -> String {
    let out = Command::new(&*support::BIN)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run portcullis {args:?}: {e}"));
    assert!(
        out.status.success(),
        "portcullis {args:?} failed: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The first line where `a` and `b` differ, for a readable failure.
fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}:\n  committed: {x}\n  generated: {y}", i + 1);
        }
    }
    format!(
        "one is a prefix of the other ({} and {} lines)",
        a.lines().count(),
        b.lines().count()
    )
}

const MAN_PAGES: [(&str, &str); 3] = [
    ("portcullis", "docs/man/portcullis.8"),
    ("portcullis.toml", "docs/man/portcullis.toml.5"),
    ("portcullis-ctl", "docs/man/portcullis-ctl.1"),
];

#[test]
fn the_configuration_reference_is_generated_from_the_types() {
    let committed = read("docs/src/reference/config.md");
    let generated = printed(&["--print-config-reference"]);
    assert!(
        committed == generated,
        "docs/src/reference/config.md is not what `portcullis --print-config-reference` \
         prints; regenerate it:\n  portcullis --print-config-reference > \
         docs/src/reference/config.md\n{}",
        first_difference(&committed, &generated)
    );
    // it is the whole file: every section of the schema, every key of a sample
    for needle in [
        "## `[server]`",
        "## `[[upstreams]]`",
        "## `[upstreams.health_check]`",
        "## `[[rate_limit.policies]]`",
        "| `max_concurrency` | integer | `1024` | 0–10000000 |",
        "| `format` | string | `\"auto\"` | `auto` \\| `json` \\| `text` |",
    ] {
        assert!(
            generated.contains(needle),
            "{needle:?} not in the reference"
        );
    }
}

#[test]
fn the_man_pages_are_generated_and_the_package_installs_them() {
    let manifest = read("Cargo.toml");
    for (name, file) in MAN_PAGES {
        let committed = read(file);
        let generated = printed(&["--print-man", name]);
        assert!(
            committed == generated,
            "{file} is not what `portcullis --print-man {name}` prints; regenerate it:\n  \
             portcullis --print-man {name} > {file}\n{}",
            first_difference(&committed, &generated)
        );
        assert!(
            manifest.contains(&format!("[\"{file}\", \"usr/share/man/")),
            "[package.metadata.deb] assets do not install {file}"
        );
    }
    // the toml page carries every section of the reference, the ctl page every command
    let toml = printed(&["--print-man", "portcullis.toml"]);
    for s in [
        "[server]",
        "[[upstreams]]",
        "[upstreams.health_check]",
        "[errors]",
    ] {
        assert!(
            toml.contains(&format!(".SS {}", s)),
            "{s} not in portcullis.toml(5)"
        );
    }
    let ctl = printed(&["--print-man", "portcullis-ctl"]);
    for c in [
        "backends", "drain", "maint", "ready", "weight", "claim", "release", "claims", "feasible",
    ] {
        assert!(
            ctl.contains(&format!(".SS \"portcullis ctl {c}")),
            "ctl {c} not in portcullis-ctl(1)"
        );
    }
    let unknown = Command::new(&*support::BIN)
        .args(["--print-man", "nope"])
        .output()
        .expect("run portcullis");
    assert_eq!(
        unknown.status.code(),
        Some(2),
        "an unknown page is a usage error"
    );
}

#[test]
fn the_man_pages_render_without_warnings() {
    for (_, file) in MAN_PAGES {
        let out = Command::new("man")
            .args(["--warnings", "-l"])
            .arg(root().join(file))
            .env("MANWIDTH", "80")
            .env("PAGER", "cat")
            .env("MANPAGER", "cat")
            .output()
            .expect("run man (man-db: scripts/setup.sh installs it)");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.trim().is_empty(),
            "man --warnings -l {file}: {:?}\n{stderr}",
            out.status
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("NAME") && text.lines().count() > 40,
            "{file} rendered to almost nothing:\n{text}"
        );
    }
}

// ---- Markdown: links, anchors, file names ------------------------------------------

/// Every Markdown file the checks read: the book's pages and the README.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "md") {
                out.push(p);
            }
        }
    }
    let mut files = vec![root().join("README.md")];
    walk(&root().join("docs/src"), &mut files);
    files
}

/// The text outside fenced code blocks, line by line (code spans are kept: a link is
/// never inside one, and the caller strips them).
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if let Some(f) = &fence {
            if t.starts_with(f.as_str()) {
                fence = None;
            }
            continue;
        }
        if t.starts_with("```") || t.starts_with("~~~") {
            fence = Some(t[..3].to_string());
            continue;
        }
        out.push((i + 1, line.to_string()));
    }
    out
}

/// `line` without its code spans.
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The code spans of `line`.
fn code_spans(line: &str) -> Vec<String> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
}

/// The targets of the inline links `[text](target)` of `line` (code spans removed).
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or("");
        out.push(target.to_string());
        rest = &after[end..];
    }
    out
}

/// The id mdBook (and GitHub) gives a heading: its text without code markers, lower case,
/// letters, digits, `-` and `_` kept, spaces made `-`, everything else dropped. The
/// generator of the reference uses the same rule for its own links.
fn slug(heading: &str) -> String {
    portcullis::config::reference::anchor(heading)
}

/// The anchors a Markdown file defines: its headings' ids (a repeated one gets `-1`,
/// `-2`... as mdBook and GitHub number them).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let t = line.trim_start();
        if !t.starts_with('#') {
            continue;
        }
        let text = t.trim_start_matches('#');
        if !text.starts_with(' ') {
            continue;
        }
        let id = slug(text.trim());
        let n = seen.entry(id.clone()).or_insert(0);
        out.insert(if *n == 0 {
            id.clone()
        } else {
            format!("{id}-{n}")
        });
        *n += 1;
    }
    out
}

/// `base/rel` with `.` and `..` resolved, without touching the file system.
fn join(base: &Path, rel: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for c in base.join(rel).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).expect("read a page");
        let rel = file
            .strip_prefix(root())
            .unwrap_or(&file)
            .display()
            .to_string();
        for (n, line) in prose_lines(&text) {
            for target in link_targets(&line) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let dest = if path.is_empty() {
                    file.clone()
                } else {
                    join(file.parent().unwrap_or(root()), path)
                };
                if !dest.starts_with(root()) || !dest.exists() {
                    broken.push(format!("{rel}:{n}: {target}: no such file"));
                    continue;
                }
                if let Some(a) = anchor {
                    if dest.extension().is_some_and(|e| e == "md") {
                        let t = std::fs::read_to_string(&dest).expect("read the target");
                        if !anchors(&t).contains(a) {
                            broken.push(format!("{rel}:{n}: {target}: no heading with id {a:?}"));
                        }
                    }
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: is the parser wrong?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_checker_finds_what_is_broken() {
    let text = "# A `b` c\n\n## A `b` c\n\n```\n# not a heading\n[x](nowhere.md)\n```\n";
    let a = anchors(text);
    assert!(
        a.contains("a-b-c") && a.contains("a-b-c-1") && a.len() == 2,
        "{a:?}"
    );
    assert_eq!(
        link_targets("see [a](x.md#y) and `[b](not-a-link)` and [c](../z.md)"),
        ["x.md#y", "../z.md"]
    );
    assert_eq!(prose_lines(text).len(), 4);
    assert_eq!(
        slug("`[[rate_limit.policies]]`: several"),
        "rate_limitpolicies-several"
    );
    assert_eq!(
        join(Path::new("/r/docs/src/guide"), "../x.md"),
        Path::new("/r/docs/src/x.md")
    );
}

#[test]
fn every_page_is_in_the_summary() {
    let summary = read("docs/src/SUMMARY.md");
    let listed: BTreeSet<String> = prose_lines(&summary)
        .iter()
        .flat_map(|(_, l)| link_targets(l))
        .collect();
    for file in markdown_files().iter().skip(1) {
        let rel = file
            .strip_prefix(root().join("docs/src"))
            .expect("a page of the book")
            .display()
            .to_string();
        if rel == "SUMMARY.md" {
            continue;
        }
        assert!(
            listed.contains(&rel),
            "docs/src/{rel} is not in SUMMARY.md: mdBook would not build it"
        );
    }
}

/// A code span that names a file or folder of the repository: `src/...`, `tests/...`,
/// `BENCHMARKS.md`. Placeholders (`TARGET`, `NAME`, `*`, `…`, `<...>`) are not names.
fn repo_path(span: &str) -> Option<&str> {
    const TOP: [&str; 13] = [
        "src/",
        "tests/",
        "conf/",
        "scripts/",
        "benches/",
        "crates/",
        "debian/",
        "examples/",
        "fuzz/",
        "pgo/",
        "vendor/",
        "docs/",
        ".ci/",
    ];
    let s = span.trim();
    let named = TOP.iter().any(|t| s.starts_with(t))
        || (s.ends_with(".md") && !s.contains('/') && s.chars().next()?.is_ascii_uppercase());
    let placeholder = s.contains(['*', '…', '<', '{', ' ', '$'])
        || s.split('/')
            .any(|part| part.len() > 1 && part.chars().all(|c| c.is_ascii_uppercase() || c == '_'));
    (named && !placeholder).then_some(s)
}

#[test]
fn every_file_the_docs_name_is_in_the_repository() {
    let mut missing = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).expect("read a page");
        let rel = file
            .strip_prefix(root())
            .unwrap_or(&file)
            .display()
            .to_string();
        for (n, line) in prose_lines(&text) {
            for span in code_spans(&line) {
                let Some(path) = repo_path(&span) else {
                    continue;
                };
                // `src/config/schema.rs`'s, `scripts/run.sh my.toml`: the path part
                let path = path.split([' ', ':']).next().unwrap_or(path);
                let path = path.trim_end_matches(['.', ',', ')']);
                // generated at build or run time, never committed
                if path.starts_with("fuzz/crashes/") || path.starts_with("docs/book") {
                    continue;
                }
                checked += 1;
                if !root().join(path).exists() {
                    missing.push(format!("{rel}:{n}: `{span}`"));
                }
            }
        }
        assert!(
            !text.contains("CONTRACT"),
            "{rel} cites CONTRACT, a file that is not in the repository"
        );
    }
    assert!(checked > 50, "only {checked} file names found");
    assert!(
        missing.is_empty(),
        "files named in the docs that are not in the repository:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_readme_is_short_and_its_tour_is_the_books() {
    let readme = read("README.md");
    assert!(
        readme.len() <= 15_000,
        "README.md is {} bytes; the limit is 15,000: move detail into docs/",
        readme.len()
    );
    // the first screen says what it is, and the two commands come first
    let first: String = readme.lines().take(25).collect::<Vec<_>>().join("\n");
    assert!(
        first.contains("edge proxy"),
        "the first screen does not say what it is"
    );
    let run = readme
        .find("scripts/run.sh")
        .expect("scripts/run.sh in the README");
    let test = readme
        .find("scripts/test.sh")
        .expect("scripts/test.sh in the README");
    assert!(
        run < 3000 && test < 3000,
        "the two commands are not near the top"
    );
    let block = |text: &str, what: &str| -> String {
        let start = text
            .find("<!-- demo-output")
            .unwrap_or_else(|| panic!("{what} has no demo-output marker"));
        let open = start + text[start..].find("```text").expect("a text block");
        let close = open + 7 + text[open + 7..].find("```").expect("the block's end");
        text[open..close].to_string()
    };
    assert_eq!(
        block(&readme, "README.md"),
        block(&read("docs/src/quick-start.md"), "docs/src/quick-start.md"),
        "the guided tour's output in the README and in the book's quick start differ"
    );
}

// ---- the built book -------------------------------------------------------------------

/// The `href="..."` and `id="..."` values of an HTML page.
fn attributes(html: &str, name: &str) -> Vec<String> {
    let key = format!("{name}=\"");
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(i) = rest.find(&key) {
        // an attribute, not the end of a longer name (`data-href=`)
        let ok = i == 0 || rest.as_bytes()[i - 1].is_ascii_whitespace();
        let after = &rest[i + key.len()..];
        let end = after.find('"').unwrap_or(after.len());
        if ok {
            out.push(after[..end].replace("&amp;", "&"));
        }
        rest = &after[end..];
    }
    out
}

#[test]
fn the_book_builds_without_warnings_and_its_links_resolve() {
    let out_dir = tempfile::tempdir().expect("a temporary directory");
    let out = Command::new("mdbook")
        .arg("build")
        .arg(root().join("docs"))
        .arg("--dest-dir")
        .arg(out_dir.path())
        .output()
        .expect("run mdbook (scripts/setup.sh installs it: cargo install mdbook)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mdbook build failed:\n{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("warning"))
        .collect();
    assert!(
        warnings.is_empty(),
        "mdbook build warned:\n{}",
        warnings.join("\n")
    );

    // every page of the site: its links reach a file, and an id in it
    let mut pages: BTreeMap<PathBuf, String> = BTreeMap::new();
    fn walk(dir: &Path, pages: &mut BTreeMap<PathBuf, String>) {
        for e in std::fs::read_dir(dir).expect("read the book").flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, pages);
            } else if p.extension().is_some_and(|x| x == "html") {
                let html = std::fs::read_to_string(&p).expect("read a page");
                pages.insert(p, html);
            }
        }
    }
    walk(out_dir.path(), &mut pages);
    assert!(pages.len() > 20, "only {} pages built", pages.len());
    let ids: BTreeMap<&PathBuf, BTreeSet<String>> = pages
        .iter()
        .map(|(p, html)| (p, attributes(html, "id").into_iter().collect()))
        .collect();
    let mut broken = Vec::new();
    for (page, html) in &pages {
        // the 404 page's links are absolute from the site's root, wherever it is served
        if page.file_name().is_some_and(|n| n == "404.html") {
            continue;
        }
        for href in attributes(html, "href") {
            if href.contains("://")
                || href.starts_with("mailto:")
                || href.starts_with("javascript:")
            {
                continue;
            }
            let (path, frag) = match href.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (href.as_str(), None),
            };
            let path = path.split('?').next().unwrap_or(path);
            let dest = if path.is_empty() {
                page.clone()
            } else {
                join(page.parent().expect("a folder"), path)
            };
            let dest = if dest.is_dir() {
                dest.join("index.html")
            } else {
                dest
            };
            let shown = page
                .strip_prefix(out_dir.path())
                .unwrap_or(page)
                .display()
                .to_string();
            if !dest.exists() {
                broken.push(format!("{shown}: {href}: no such file"));
                continue;
            }
            if let (Some(f), Some(set)) = (frag, ids.get(&dest)) {
                if !f.is_empty() && !set.contains(f) {
                    broken.push(format!("{shown}: {href}: no id {f:?}"));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "broken links in the built book:\n{}",
        broken.join("\n")
    );
}

// ---- the metrics reference ---------------------------------------------------------------

#[test]
fn every_metric_the_proxy_exposes_is_in_the_metrics_reference() {
    let b = support::Backend::start("A");
    let p = support::Proxy::start(&support::one_upstream(&b));
    // one proxied request, so that the per-request series exist
    let r = support::get(&p.addr(), "/", &[]);
    assert_eq!(r.status, 200);
    let text = p.admin_get("/metrics").body_str();
    let names: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        names.len() > 20,
        "only {} metrics exposed:\n{text}",
        names.len()
    );
    let page = read("docs/src/reference/metrics.md");
    let missing: Vec<&&str> = names
        .iter()
        .filter(|n| !page.contains(&format!("`{n}")))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics /metrics exposes that docs/src/reference/metrics.md does not list: {missing:?}"
    );
}
