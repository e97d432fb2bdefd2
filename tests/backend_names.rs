//! Backends as tables (HAProxy's `server NAME ADDRESS weight N maxconn N backup`), end to
//! end with the real binary and real backends: the name everywhere a person reads a
//! backend (and `ctl` and the runtime API taking it), `max_conn` and `backup` in
//! selection, and `--check` errors for what cannot be.

use portcullis_test_kit as support;

use serde_json::Value;
use std::process::Command;
use std::time::Duration;
use support::*;

const OFF: &str = "[rate_limit]\nenabled = false\n[culling]\nenabled = false\n";

fn record(p: &Proxy, addr: &str) -> Value {
    let all: Value = serde_json::from_str(&p.admin_get("/backends").body_str()).unwrap_or_default();
    all.as_array()
        .and_then(|a| a.iter().find(|b| b["address"] == addr).cloned())
        .unwrap_or(Value::Null)
}

fn ctl(p: &Proxy, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(&*BIN)
        .args(["ctl", "--admin", &format!("http://{}", p.admin_addr())])
        .args(args)
        .env_remove("PORTCULLIS_ADMIN")
        .env_remove("PORTCULLIS_TOKEN_FILE")
        .output()
        .expect("ctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_name_shows_everywhere_and_ctl_takes_it() {
    let (b1, b2) = (Backend::start("b1"), Backend::start("b2"));
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let p = Proxy::start(&format!(
        "[[upstreams]]\nname = \"api\"\nbackends = [\"{}\", {{ name = \"api-2\", address = \"{}\", weight = 3 }}]\n\
         {OFF}[access_log]\nenabled = true\npath = \"{}\"\n",
        b1.addr(),
        b2.addr(),
        log.display()
    ));
    let r = record(&p, &b2.addr());
    assert_eq!(
        (r["name"].as_str(), r["weight"].as_u64()),
        (Some("api-2"), Some(3)),
        "{r}"
    );
    assert_eq!(
        record(&p, &b1.addr())["name"],
        b1.addr(),
        "no name: the address"
    );
    let s = p.status_json();
    let names: Vec<&str> = s["upstreams"][0]["backends"]
        .as_array()
        .map(|a| a.iter().filter_map(|b| b["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(names.contains(&"api-2"), "{s}");
    // The access log names the backend.
    for _ in 0..8 {
        assert_eq!(get(&p.addr(), "/", &[]).status, 200);
    }
    eventually(
        DEADLINE,
        || std::fs::read_to_string(&log).unwrap_or_default(),
        || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("\"backend\":\"api-2\"")
        },
    );
    // ctl: drain by name, the table shows it.
    let (code, out, err) = ctl(&p, &["drain", "api", "api-2", "--reason", "disk swap"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(record(&p, &b2.addr())["state"], "draining");
    let (code, table, err) = ctl(&p, &["backends"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        table.lines().next().is_some_and(|h| h.contains("NAME")),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.contains(&b2.addr()))
        .unwrap_or_default();
    assert!(row.contains("api-2") && row.contains("draining"), "{table}");
    let (code, out, err) = ctl(&p, &["ready", "api", "api-2"]);
    assert_eq!(code, 0, "{out}{err}");
    // The page, rendered by a real browser, shows the name.
    let bin =
        chromium().unwrap_or_else(|| panic!("chromium is not installed: run scripts/setup.sh"));
    let dom = dump_dom(bin, &format!("http://{}/", p.admin_addr()));
    // its row, and the journal's two actions on it (drain, ready) by name too
    assert!(dom.matches("api-2").count() >= 3, "{dom}");
}

#[test]
fn a_backup_serves_only_when_no_primary_can() {
    let (b1, b2, b3) = (
        Backend::start("b1"),
        Backend::start("b2"),
        Backend::start("b3"),
    );
    let p = Proxy::start(&format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [\"{}\", \"{}\", {{ name = \"spare\", address = \"{}\", backup = true }}]\n{OFF}",
        b1.addr(),
        b2.addr(),
        b3.addr()
    ));
    for _ in 0..20 {
        assert_eq!(get(&p.addr(), "/", &[]).status, 200);
    }
    assert_eq!(
        b3.requests(),
        0,
        "a backup took traffic while primaries could"
    );
    assert!(b1.requests() > 0 && b2.requests() > 0);
    let drain = |addr: &str| {
        post(
            &p.admin_addr(),
            &format!("/backends/app/{addr}/drain"),
            &[("Content-Type", "application/json")],
            br#"{"reason": "test", "force": true}"#,
        )
    };
    assert_eq!(drain(&b1.addr()).status, 200);
    let r = drain(&b2.addr());
    assert_eq!(r.status, 200, "{}", r.body_str());
    for _ in 0..10 {
        assert_eq!(get(&p.addr(), "/", &[]).status, 200);
    }
    assert_eq!(
        b3.requests(),
        10,
        "the backup serves once every primary is out"
    );
    let r = post(
        &p.admin_addr(),
        &format!("/backends/app/{}/ready", b1.addr()),
        &[],
        b"",
    );
    assert_eq!(r.status, 200);
    for _ in 0..10 {
        assert_eq!(get(&p.addr(), "/", &[]).status, 200);
    }
    assert_eq!(b3.requests(), 10, "left again once a primary is back");
}

#[test]
fn max_conn_caps_the_requests_in_flight_to_a_backend() {
    let (b1, b2) = (Backend::start("b1"), Backend::start("b2"));
    b1.set_mode(Mode::Hold);
    b2.set_mode(Mode::Hold);
    let p = Proxy::start(&format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [{{ address = \"{}\", max_conn = 2 }}, \"{}\"]\nretries = 0\n{OFF}",
        b1.addr(),
        b2.addr()
    ));
    let addr = p.addr();
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let a = addr.clone();
            std::thread::spawn(move || get(&a, "/", &[]).status)
        })
        .collect();
    eventually(
        Duration::from_secs(10),
        || format!("held: b1 {} b2 {}", b1.in_flight(), b2.in_flight()),
        || b1.in_flight() + b2.in_flight() == 8,
    );
    assert_eq!((b1.in_flight(), b2.in_flight()), (2, 6));
    b1.release_all();
    b2.release_all();
    b1.set_mode(Mode::Ok);
    b2.set_mode(Mode::Ok);
    for c in clients {
        assert_eq!(c.join().unwrap_or(0), 200);
    }
    assert_eq!(b1.max_in_flight(), 2);
    assert_eq!(record(&p, &b1.addr())["max_conn"], 2);
}

#[test]
fn bad_backend_tables_are_check_errors() {
    let t = |backends: &str, extra: &str| {
        check_config(&format!(
            "[[upstreams]]\nname = \"a\"\nbackends = [{backends}]\n{extra}"
        ))
    };
    for (backends, extra, key, why) in [
        (
            r#"{ name = "x", address = "127.0.0.1:1" }, { name = "x", address = "127.0.0.1:2" }"#,
            "",
            "upstreams[0].backends[1].name",
            "names another backend",
        ),
        (
            r#"{ name = "x", address = "not an address" }"#,
            "",
            "upstreams[0].backends[0].address",
            "",
        ),
        (
            r#"{ name = "x", adress = "127.0.0.1:1" }"#,
            "",
            "upstreams[0].backends[0]",
            "adress",
        ),
        (
            r#"{ address = "127.0.0.1:1", weight = 2 }, "127.0.0.1:2""#,
            "weights = [1, 1]\n",
            "upstreams[0].backends[0].weight",
            "weights is set too",
        ),
        (
            r#"{ address = "127.0.0.1:1", backup = true }"#,
            "",
            "upstreams[0].backends",
            "every backend is a backup",
        ),
        (
            r#"{ name = "a b", address = "127.0.0.1:1" }"#,
            "",
            "upstreams[0].backends[0].name",
            "letters, digits",
        ),
    ] {
        let (code, _, stderr, _) = t(backends, extra);
        assert_ne!(code, 0, "{backends} accepted");
        assert!(stderr.contains(key), "{backends}: {stderr}");
        assert!(stderr.contains(why), "{backends}: {stderr}");
        assert!(stderr.contains(".toml:"), "the file and line: {stderr}");
    }
    // A name may be a group member.
    let (code, _, stderr, _) = t(
        r#"{ name = "api-1", address = "127.0.0.1:1" }, "127.0.0.1:2""#,
        "groups = { zone-a = [\"api-1\"] }\n",
    );
    assert_eq!(code, 0, "{stderr}");
}
