//! `portcullis --print-config-schema` (CONTRACT §16): the JSON Schema (draft 2020-12) of
//! the config file, generated from the types the parser reads. `conf/` ships it as
//! `portcullis.schema.json` for editors (each `conf/*.toml` names it in a `#:schema`
//! first line). These tests hold the shipped file to the binary's output, check every
//! `conf/*.toml` against it with a real draft 2020-12 validator (the `jsonschema` crate),
//! and show that a typo or a wrong type is refused, by the schema and by `--check` alike.

use portcullis_test_kit as support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const SCHEMA_FILE: &str = "conf/portcullis.schema.json";
const DIRECTIVE: &str = "#:schema ./portcullis.schema.json";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// What the binary under test prints for `--print-config-schema`.
fn printed_schema() -> String {
    let out = Command::new(&*support::BIN)
        .arg("--print-config-schema")
        .output()
        .expect("run portcullis --print-config-schema");
    assert!(
        out.status.success(),
        "--print-config-schema failed: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("the schema is UTF-8")
}

fn shipped_schema() -> Value {
    let text = std::fs::read_to_string(root().join(SCHEMA_FILE)).expect("read the schema");
    serde_json::from_str(&text).expect("the shipped schema is JSON")
}

fn validator() -> jsonschema::Validator {
    jsonschema::draft202012::new(&shipped_schema()).expect("a valid draft 2020-12 schema")
}

/// `conf/*.toml`, sorted.
fn conf_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("conf"))
        .expect("read conf/")
        .map(|e| e.expect("a conf/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no conf/*.toml");
    files
}

/// TOML text as the JSON value a JSON Schema validator checks (what taplo does too).
fn toml_to_json(text: &str) -> Value {
    let value: toml::Value = toml::from_str(text).expect("valid TOML");
    serde_json::to_value(value).expect("TOML as JSON")
}

/// The validator's complaints about `text`, as `instance path: message` lines.
fn schema_errors(text: &str) -> Vec<String> {
    let instance = toml_to_json(text);
    let v = validator();
    v.iter_errors(&instance)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// `portcullis -c FILE --check` on `text`: (exit code, stdout, stderr).
fn check(text: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("portcullis.toml");
    std::fs::write(&path, text).expect("write config");
    check_file(&path)
}

fn check_file(path: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(&*support::BIN)
        .arg("-c")
        .arg(path)
        .arg("--check")
        .output()
        .expect("run portcullis --check");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn shipped_config() -> String {
    std::fs::read_to_string(root().join("conf/portcullis.toml")).expect("read the config")
}

/// `text` with its one occurrence of `from` replaced by `to`.
fn edit(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "{from:?} once in the file");
    text.replace(from, to)
}

#[test]
fn shipped_schema_is_what_the_binary_prints() {
    let shipped = std::fs::read_to_string(root().join(SCHEMA_FILE)).expect("read the schema");
    assert!(
        printed_schema() == shipped,
        "{SCHEMA_FILE} differs from `portcullis --print-config-schema`: regenerate it with \
         `cargo run --bin portcullis -- --print-config-schema > {SCHEMA_FILE}`"
    );
}

#[test]
fn schema_is_draft_2020_12_with_descriptions_and_defaults() {
    let schema = shipped_schema();
    assert_eq!(
        schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
        "declares draft 2020-12"
    );
    assert!(
        jsonschema::draft202012::meta::is_valid(&schema),
        "valid against the 2020-12 meta-schema"
    );
    // Unknown keys are errors at the top and in every section.
    assert_eq!(schema["additionalProperties"], false);
    let defs = schema["$defs"].as_object().expect("$defs");
    for (name, def) in defs {
        if def["type"] == "object" && def.get("properties").is_some() {
            assert_eq!(
                def["additionalProperties"], false,
                "{name}: unknown keys refused"
            );
        }
    }
    // Descriptions from the doc comments, defaults from the parser's defaults
    // (CONTRACT §2's values).
    let shed = &defs["SheddingSection"]["properties"]["max_concurrency"];
    assert_eq!(shed["default"], 1024);
    assert_eq!(shed["type"], "integer");
    assert!(shed["description"]
        .as_str()
        .is_some_and(|d| d.contains("0 = no cap")));
    let rl = &defs["RateLimitSection"]["properties"];
    assert_eq!(rl["key"]["default"], "header:x-api-key");
    assert_eq!(rl["window_seconds"]["default"], 60);
    assert_eq!(rl["missing_key"]["default"], "client_ip");
    assert_eq!(
        defs["ServerSection"]["properties"]["drain_seconds"]["default"],
        5
    );
    assert_eq!(
        defs["UpstreamSection"]["properties"]["read_timeout_ms"]["default"],
        30000
    );
    assert_eq!(
        defs["LogSection"]["properties"]["format"]["default"],
        "auto"
    );
    // Enums as strings: the values the parser accepts.
    let priorities: Vec<&str> = defs["PrioritySection"]["oneOf"]
        .as_array()
        .expect("PrioritySection.oneOf")
        .iter()
        .filter_map(|v| v["const"].as_str())
        .collect();
    assert_eq!(priorities, ["critical", "normal", "low"]);
    // TOML has no null: an absent [redis] or [tls] is how a file says "none".
    assert!(
        !schema.to_string().contains("\"null\""),
        "no null type in the schema"
    );
    assert_eq!(
        schema["properties"]["tls"]["$ref"], "#/$defs/TlsSection",
        "an optional section is its own schema"
    );
    assert_eq!(schema["required"], serde_json::json!(["upstreams"]));
    // Newtypes with their own deserializers are strings.
    assert_eq!(defs["Secret"]["type"], "string");
    assert_eq!(defs["RedisUrl"]["type"], "string");
    // Every section the file may hold is described.
    let props = schema["properties"].as_object().expect("properties");
    for key in [
        "server",
        "redis",
        "upstreams",
        "routes",
        "shedding",
        "rate_limit",
        "culling",
        "watchdog",
        "access_log",
        "tracing",
        "log",
        "tls",
    ] {
        assert!(
            props[key]["description"].is_string(),
            "{key} is described in the schema"
        );
    }
}

#[test]
fn every_shipped_config_names_and_validates_against_the_schema() {
    let v = validator();
    for path in conf_files() {
        let text = std::fs::read_to_string(&path).expect("read conf file");
        assert_eq!(
            text.lines().next(),
            Some(DIRECTIVE),
            "{}: the first line points editors at the schema",
            path.display()
        );
        let instance = toml_to_json(&text);
        let errors: Vec<String> = v
            .iter_errors(&instance)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{} does not validate: {errors:#?}",
            path.display()
        );
        // The directive is a TOML comment: the proxy reads the file as before.
        let (code, stdout, stderr) = check_file(&path);
        assert_eq!(
            (code, stdout.trim()),
            (Some(0), "OK"),
            "{}: --check: {stderr}",
            path.display()
        );
    }
}

#[test]
fn a_typo_is_refused_by_the_schema_and_by_check() {
    let text = edit(
        &shipped_config(),
        "max_concurrency = 1024",
        "max_concurency = 1024",
    );
    let errors = schema_errors(&text);
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("/shedding:") && e.contains("max_concurency")),
        "the schema refuses the typo in [shedding]: {errors:#?}"
    );
    let (code, _, stderr) = check(&text);
    assert_eq!(code, Some(2), "--check refuses it too: {stderr}");
    assert!(stderr.contains("shedding.max_concurency"), "{stderr}");

    // A misspelt section is refused too.
    let text = edit(&shipped_config(), "[culling]", "[culing]");
    let errors = schema_errors(&text);
    assert!(
        errors.iter().any(|e| e.contains("culing")),
        "the schema refuses [culing]: {errors:#?}"
    );
}

#[test]
fn a_wrong_type_or_value_is_refused_by_the_schema_and_by_check() {
    // (edit, JSON pointer of the refused value)
    let cases = [
        (
            ("max_concurrency = 1024", "max_concurrency = \"1024\""),
            "/shedding/max_concurrency",
        ),
        (
            ("retry_after_seconds = 1 ", "retry_after_seconds = -1 "),
            "/shedding/retry_after_seconds",
        ),
        (
            ("enabled = true\nkey", "enabled = 1\nkey"),
            "/rate_limit/enabled",
        ),
        (
            ("priority = \"normal\"", "priority = \"urgent\""),
            "/routes/0/priority",
        ),
        (
            ("missing_key = \"client_ip\"", "missing_key = \"ip\""),
            "/rate_limit/missing_key",
        ),
        (("format = \"auto\"", "format = \"yaml\""), "/log/format"),
        (
            (
                "listen = [\"127.0.0.1:8080\"]",
                "listen = \"127.0.0.1:8080\"",
            ),
            "/server/listen",
        ),
        (
            ("key = \"header:x-api-key\"", "key = \"cookie:session\""),
            "/rate_limit/key",
        ),
    ];
    for ((from, to), pointer) in cases {
        let text = edit(&shipped_config(), from, to);
        let errors = schema_errors(&text);
        assert!(
            errors.iter().any(|e| e.starts_with(&format!("{pointer}:"))),
            "{to:?}: the schema refuses {pointer}: {errors:#?}"
        );
        let (code, _, stderr) = check(&text);
        assert_eq!(code, Some(2), "{to:?}: --check refuses it too: {stderr}");
    }

    // And a key valid in one place only is accepted there, by both: client_ip keys a
    // [[rate_limit.policies]] entry (not [rate_limit] itself).
    let text = format!(
        "{}\n[[rate_limit.policies]]\nname = \"per-ip\"\nkey = \"client_ip\"\nlimit = 100\n",
        shipped_config()
    );
    assert_eq!(schema_errors(&text), Vec::<String>::new());
    let (code, _, stderr) = check(&text);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn a_missing_required_part_is_refused_by_the_schema_and_by_check() {
    // No [[upstreams]] at all.
    let text = "[server]\nthreads = 2\n";
    let errors = schema_errors(text);
    assert!(
        errors.iter().any(|e| e.contains("upstreams")),
        "the schema needs [[upstreams]]: {errors:#?}"
    );
    let (code, _, stderr) = check(text);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("upstreams"), "{stderr}");

    // An upstream without backends; a route without its upstream.
    let text = edit(
        &shipped_config(),
        "backends = [\"127.0.0.1:9001\", \"127.0.0.1:9002\"]",
        "backends = []",
    );
    let errors = schema_errors(&text);
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("/upstreams/0/backends:")),
        "{errors:#?}"
    );
    assert_eq!(check(&text).0, Some(2));
    let text = edit(&shipped_config(), "upstream = \"app\"\n", "");
    let errors = schema_errors(&text);
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("/routes/0:") && e.contains("upstream")),
        "{errors:#?}"
    );
    assert_eq!(check(&text).0, Some(2));

    // [tls] without a certificate.
    let text = format!(
        "{}\n[tls]\nlisten = [\"127.0.0.1:8443\"]\n",
        shipped_config()
    );
    let errors = schema_errors(&text);
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("/tls:") && e.contains("certificates")),
        "{errors:#?}"
    );
    let (code, _, stderr) = check(&text);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("tls.certificates"), "{stderr}");
}
