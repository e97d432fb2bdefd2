use super::*;

fn check(text: &str) -> Result<Config, ConfigError> {
    parse("test.toml", text)
}

const MIN: &str = "[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]\n";

#[test]
fn minimal_config_gets_contract_defaults() {
    let c = check(MIN).expect("valid");
    assert_eq!(c.server.threads, 2);
    assert_eq!(c.server.drain, std::time::Duration::from_secs(5));
    assert_eq!(c.shedding.max_concurrency, 1024);
    assert_eq!(c.rate_limit.params.limit, 600);
    assert_eq!(c.rate_limit.params.window_secs, 60);
    assert_eq!(c.culling.params.tokens, 10);
    assert!(c.store.is_none());
    assert_eq!(c.routes.len(), 1);
    assert_eq!(
        c.rate_limit.source,
        crate::ratelimit::KeySource::Header(http::HeaderName::from_static("x-api-key"))
    );
}

#[test]
fn unknown_key_names_path_and_line() {
    let e = check(&format!("{MIN}\n[rate_limit]\nwindw_seconds = 5\n")).unwrap_err();
    assert_eq!(e.key_path, "rate_limit.windw_seconds");
    assert_eq!(e.line_col.map(|l| l.0), Some(6));
    assert!(e.to_string().starts_with("error: test.toml:6:"), "{e}");
}

#[test]
fn wrong_type_names_path() {
    let e = check(&format!("{MIN}[shedding]\nmax_concurrency = \"lots\"\n")).unwrap_err();
    assert_eq!(e.key_path, "shedding.max_concurrency");
    assert_eq!(e.line_col.map(|l| l.0), Some(5));
}

#[test]
fn bad_backend_address_located() {
    let e =
        check("[[upstreams]]\nname = \"a\"\nbackends = [\"127.0.0.1:1\", \"nope\"]\n").unwrap_err();
    assert_eq!(e.key_path, "upstreams[0].backends[1]");
    assert_eq!(e.line_col, Some((3, 28)));
}

#[test]
fn duplicate_upstream_names() {
    let e = check(&format!("{MIN}{MIN}")).unwrap_err();
    assert_eq!(e.key_path, "upstreams[1].name");
    assert_eq!(e.line_col.map(|l| l.0), Some(5));
}

#[test]
fn route_to_unknown_upstream() {
    let e = check(&format!("{MIN}[[routes]]\nupstream = \"nope\"\n")).unwrap_err();
    assert_eq!(e.key_path, "routes[0].upstream");
    assert_eq!(e.line_col.map(|l| l.0), Some(5));
}

#[test]
fn bad_enums_and_key_spec() {
    let e = check(&format!(
        "{MIN}[[routes]]\nupstream = \"app\"\npriority = \"urgent\"\n"
    ))
    .unwrap_err();
    assert_eq!(e.key_path, "routes[0].priority");
    let e = check(&format!("{MIN}[rate_limit]\nmissing_key = \"maybe\"\n")).unwrap_err();
    assert_eq!(e.key_path, "rate_limit.missing_key");
    let e = check(&format!("{MIN}[rate_limit]\nkey = \"cookie:x\"\n")).unwrap_err();
    assert_eq!(e.key_path, "rate_limit.key");
    assert_eq!(e.line_col.map(|l| l.0), Some(5));
}

#[test]
fn syntax_error_has_line_col() {
    let e = check("[[upstreams]\nname = 1\n").unwrap_err();
    assert!(e.line_col.is_some(), "{e}");
}

#[test]
fn no_upstreams_is_an_error() {
    let e = check("[shedding]\nmax_concurrency = 1\n").unwrap_err();
    assert_eq!(e.key_path, "upstreams");
}

#[test]
fn routes_ordered_longest_prefix_then_host() {
    let c = check(&format!(
        "{MIN}[[routes]]\nupstream = \"app\"\npath_prefix = \"/\"\n[[routes]]\nupstream = \"app\"\npath_prefix = \"/api\"\n[[routes]]\nhost = \"B.example\"\nupstream = \"app\"\npath_prefix = \"/api\"\n"
    ))
    .expect("valid");
    assert_eq!(c.routes[0].host.as_deref(), Some("b.example"));
    assert_eq!(c.routes[1].path_prefix, "/api");
    assert_eq!(c.routes[2].path_prefix, "/");
}

#[test]
fn shipped_default_config_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/portcullis.toml");
    load(std::path::Path::new(path)).expect("conf/portcullis.toml must validate");
}

#[test]
fn secrets_stay_out_of_debug_output() {
    let c = check(&format!(
        "[server]\nadmin_token = \"tok-3c7e9a\"\n{MIN}[redis]\nurl = \"redis://u:pw-9d1f@127.0.0.1:6379\"\n"
    ))
    .expect("valid");
    assert_eq!(c.server.admin_token.expose(), "tok-3c7e9a");
    let debug = format!("{c:?}");
    assert!(!debug.contains("tok-3c7e9a"), "{debug}");
    assert!(!debug.contains("pw-9d1f"), "{debug}");
    assert!(debug.contains("redis://u:***@127.0.0.1:6379"), "{debug}");
}

#[test]
fn admin_token_must_be_visible_ascii() {
    let e = check(&format!("[server]\nadmin_token = \"a b\"\n{MIN}")).unwrap_err();
    assert_eq!(e.key_path, "server.admin_token");
    assert_eq!(e.line_col.map(|l| l.0), Some(2));
    assert!(!e.to_string().contains("a b"), "{e}");
}

#[test]
fn rate_limit_policies_parse_with_defaults() {
    let c = check(&format!(
        "{MIN}[[rate_limit.policies]]\nname = \"per-ip\"\nkey = \"client_ip\"\nlimit = 100\n\n[[rate_limit.policies]]\nname = \"search\"\npath_prefix = \"/search\"\nwindow_seconds = 10\n[rate_limit.policies.keys]\n\"vip\" = 50\n"
    ))
    .expect("valid");
    let p = &c.rate_limit.policies;
    assert_eq!(p.len(), 2);
    assert_eq!(&*p[0].name, "per-ip");
    assert_eq!(p[0].key, crate::ratelimit::PolicyKey::ClientIp);
    assert_eq!((p[0].params.limit, p[0].params.window_secs), (100, 60));
    assert_eq!(p[0].path_prefix, "/");
    assert_eq!(&*p[1].name, "search");
    assert_eq!(p[1].path_prefix, "/search");
    assert_eq!((p[1].params.limit, p[1].params.window_secs), (600, 10));
    assert_eq!(p[1].params.overrides.get("vip"), Some(&50));
}

#[test]
fn bad_rate_limit_policies_name_the_key_path() {
    let pol = |body: &str| {
        format!("{MIN}[[rate_limit.policies]]\nname = \"a\"\n[[rate_limit.policies]]\nname = \"b\"\n[[rate_limit.policies]]\n{body}\n")
    };
    let cases = [
        (
            "name = \"c\"\nlimit = 0",
            "rate_limit.policies[2].limit",
            10,
        ),
        (
            "name = \"c\"\nwindow_seconds = 0",
            "rate_limit.policies[2].window_seconds",
            10,
        ),
        (
            "name = \"c\"\nkey = \"cookie:x\"",
            "rate_limit.policies[2].key",
            10,
        ),
        (
            "name = \"c\"\npath_prefix = \"api\"",
            "rate_limit.policies[2].path_prefix",
            10,
        ),
        ("name = \"a\"", "rate_limit.policies[2].name", 9),
        ("name = \"default\"", "rate_limit.policies[2].name", 9),
        ("name = \"x y\"", "rate_limit.policies[2].name", 9),
        ("name = \"c\"\nlimt = 5", "rate_limit.policies[2].limt", 10),
        ("limit = 5", "rate_limit.policies[2]", 8),
    ];
    for (body, path, line) in cases {
        let e = check(&pol(body)).unwrap_err();
        assert_eq!(e.key_path, path, "{body}: {e}");
        assert_eq!(e.line_col.map(|l| l.0), Some(line), "{body}: {e}");
    }
    // client_ip is a key of named policies only.
    let e = check(&format!("{MIN}[rate_limit]\nkey = \"client_ip\"\n")).unwrap_err();
    assert_eq!(e.key_path, "rate_limit.key");
}

#[test]
fn log_format_defaults_to_auto_and_takes_the_three_names() {
    assert_eq!(check(MIN).expect("valid").log.format, LogFormat::Auto);
    for (name, format) in [
        ("auto", LogFormat::Auto),
        ("json", LogFormat::Json),
        ("text", LogFormat::Text),
    ] {
        let c = check(&format!("{MIN}[log]\nformat = \"{name}\"\n")).expect(name);
        assert_eq!(c.log.format, format, "{name}");
    }
}

#[test]
fn bad_log_format_names_the_key_path_and_line() {
    let e = check(&format!("{MIN}[log]\nformat = \"xml\"\n")).unwrap_err();
    assert_eq!(e.key_path, "log.format");
    assert_eq!(e.line_col.map(|l| l.0), Some(5), "{e}");
    assert!(e.reason.contains("xml"), "{e}");
    let e = check(&format!("{MIN}[log]\nlevel = \"debug\"\n")).unwrap_err();
    assert_eq!(e.key_path, "log.level");
}

#[test]
fn validation_asks_no_dns() {
    // Names are checked as written; the runtime resolves them (state::resolve).
    let c = check("[[upstreams]]\nname = \"a\"\nbackends = [\"no-such-host.invalid:80\"]\n")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.upstreams[0].backends.is_empty());
    assert_eq!(c.upstreams[0].entries[0].0, "no-such-host.invalid:80");
    for (bad, why) in [
        ("\"app:0\"", "port"),
        ("\"app:http\"", "port"),
        ("\"ap p:80\"", "DNS name"),
        ("\"-app:80\"", "DNS name"),
        ("\"app..x:80\"", "DNS name"),
        ("\"app:80\", \"APP:80\"", "duplicate backend"),
    ] {
        let e = check(&format!(
            "[[upstreams]]\nname = \"a\"\nbackends = [{bad}]\n"
        ))
        .unwrap_err();
        assert!(e.key_path.starts_with("upstreams[0].backends["), "{e}");
        assert!(e.reason.contains(why), "{bad}: {e}");
    }
}

#[test]
fn listen_addresses_are_ip_addresses_or_localhost() {
    let c = check(&format!(
        "[server]\nlisten = [\"localhost:8080\"]\nadmin_listen = \"[::1]:9090\"\n{MIN}"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.listen[0].to_string(), "127.0.0.1:8080");
    let e = check(&format!(
        "[server]\nlisten = [\"proxy.example.com:8080\"]\n{MIN}"
    ))
    .unwrap_err();
    assert_eq!(e.key_path, "server.listen[0]");
    assert!(e.reason.contains("IP address"), "{e}");
    assert_eq!(e.line_col.map(|l| l.0), Some(2));
}

#[test]
fn culling_outlier_keys_parse_and_bad_ones_name_the_key_path_and_line() {
    let c = check(MIN).unwrap();
    let o = &c.culling.params.outlier;
    assert_eq!(o.rule, portcullis_policy::cull::OutlierRule::None);
    assert_eq!(
        (o.min_requests, o.stdev_factor, o.latency_factor),
        (50, 1.9, 3.0)
    );
    assert!(!c.culling.blame_tenants);
    let c = check(&format!(
        "{MIN}[culling]\noutlier = \"latency\"\noutlier_min_requests = 20\nlatency_factor = 4.5\nblame_tenants = true\n"
    ))
    .unwrap();
    let o = &c.culling.params.outlier;
    assert_eq!(o.rule, portcullis_policy::cull::OutlierRule::Latency);
    assert_eq!((o.min_requests, o.latency_factor), (20, 4.5));
    assert!(c.culling.blame_tenants);
    let cases = [
        ("outlier = \"p99\"", "culling.outlier"),
        ("outlier_min_requests = 0", "culling.outlier_min_requests"),
        ("outlier_stdev_factor = 0.0", "culling.outlier_stdev_factor"),
        (
            "outlier_stdev_factor = -1.0",
            "culling.outlier_stdev_factor",
        ),
        ("latency_factor = 1.0", "culling.latency_factor"),
        ("latency_factor = nan", "culling.latency_factor"),
    ];
    for (body, path) in cases {
        let e = check(&format!("{MIN}[culling]\nenabled = true\n{body}\n")).unwrap_err();
        assert_eq!(e.key_path, path, "{body}: {e}");
        assert_eq!(e.line_col.map(|l| l.0), Some(6), "{body}: {e}");
    }
}

#[test]
fn an_adaptive_upstream_needs_a_ceiling() {
    let ok = check("[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]\nadaptive = true\nmax_inflight = 64\n").unwrap();
    assert!(ok.upstreams[0].balance.adaptive);
    let e =
        check("[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]\nadaptive = true\n")
            .unwrap_err();
    assert_eq!(e.key_path, "upstreams[0].adaptive", "{e}");
    assert_eq!(e.line_col.map(|l| l.0), Some(4), "{e}");
}

#[test]
fn every_file_read_is_capped_by_its_kind_and_must_be_regular() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("secret");
    std::fs::write(&path, vec![b'a'; 64 << 10]).expect("write");
    assert_eq!(
        read_regular_file(&path, FileKind::Secret)
            .map(|b| b.len())
            .ok(),
        Some(64 << 10),
        "exactly the cap is read"
    );
    std::fs::write(&path, vec![b'a'; (64 << 10) + 1]).expect("write");
    let e = read_regular_file(&path, FileKind::Secret).unwrap_err();
    assert!(
        e.to_string()
            .contains("larger than 64 KiB, the most a secret file may hold"),
        "{e}"
    );
    // A sparse 1 GiB file: refused by its size, never read.
    let huge = dir.path().join("tenants.toml");
    let f = std::fs::File::create(&huge).expect("create");
    f.set_len(1 << 30).expect("set_len");
    let e = read_regular_file(&huge, FileKind::Tenants(file_caps::TENANTS)).unwrap_err();
    assert!(e.to_string().contains("32 MiB"), "{e}");
    assert!(e.to_string().contains("tenants.max_file_bytes"), "{e}");
    // Not regular: a directory, a device.
    let e = read_regular_file(dir.path(), FileKind::Pem).unwrap_err();
    assert!(e.to_string().contains("a directory"), "{e}");
    let e = read_regular_file(Path::new("/dev/zero"), FileKind::Jwks).unwrap_err();
    assert!(e.to_string().contains("a device"), "{e}");
    assert_eq!(human_bytes(4 << 20), "4 MiB");
    assert_eq!(human_bytes(1500), "1500 bytes");
}

fn tenants_config(dir: &Path, tenants: &str, extra: &str) -> String {
    let file = dir.join("tenants.toml");
    std::fs::write(&file, tenants).expect("write");
    format!(
        "{MIN}[tenants]\nfile = \"{}\"\n{extra}\n[tiers.pro]\nlimit = 5\n",
        file.display()
    )
}

#[test]
fn a_tenants_file_with_no_tenant_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().expect("tempdir");
    for empty in ["", "# being written\n", "\n\n"] {
        let e = check(&tenants_config(dir.path(), empty, "")).unwrap_err();
        assert!(e.file.ends_with("tenants.toml"), "{e}");
        assert!(e.reason.contains("holds no [[tenant]]"), "{e}");
        assert!(e.reason.contains("tenants.allow_empty"), "{e}");
        let c = check(&tenants_config(dir.path(), empty, "allow_empty = true")).expect("allowed");
        assert!(c.tenants.tenants.is_empty());
    }
    let one = "[[tenant]]\nname = \"a\"\ntier = \"pro\"\n";
    assert_eq!(
        check(&tenants_config(dir.path(), one, ""))
            .expect("one tenant")
            .tenants
            .tenants
            .len(),
        1
    );
    // The cap: a key of its own, in range.
    let e = check(&tenants_config(dir.path(), one, "max_file_bytes = 1024")).map(|_| ());
    assert!(e.is_ok(), "{e:?}");
    let e = check(&tenants_config(dir.path(), one, "max_file_bytes = 10")).unwrap_err();
    assert_eq!(e.key_path, "tenants.max_file_bytes");
    let big = format!("{one}{}", "#\n".repeat(1024));
    let e = check(&tenants_config(dir.path(), &big, "max_file_bytes = 1024")).unwrap_err();
    assert!(e.reason.contains("larger than 1 KiB"), "{e}");
}

#[test]
fn a_quota_is_at_most_two_to_the_fifty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = "[[tenant]]\nname = \"a\"\ntier = \"pro\"\n";
    let cfg = |q: u64| {
        format!(
            "{}\nquota = {q}\n",
            tenants_config(dir.path(), one, "").trim_end()
        )
    };
    assert!(check(&cfg(1 << 50)).is_ok());
    let e = check(&cfg((1 << 50) + 1)).unwrap_err();
    assert_eq!(e.key_path, "tiers.pro.quota");
}
