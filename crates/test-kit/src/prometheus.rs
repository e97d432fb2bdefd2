//! [`Prometheus`]: a real `prometheus` server (Debian's package) on a free port, scraping
//! the admin listener of a proxy every second, with rule files loaded; and a PromQL
//! client ([`Prometheus::query`]).

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::*;

pub struct Prometheus {
    child: Child,
    addr: String,
    dir: tempfile::TempDir,
}

/// Percent-encodes a query-string value.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

impl Prometheus {
    /// Whether the `prometheus` binary is installed (scripts/setup.sh installs it).
    pub fn available() -> bool {
        Command::new("prometheus")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts scraping `target` (host:port, `GET /metrics`) as job `portcullis` every
    /// second, evaluating `rules` every second; waits until it is ready.
    pub fn start(target: &str, rules: &Path) -> Prometheus {
        let dir = tempfile::tempdir().expect("tempdir");
        let rules_copy = dir.path().join("alerts.yml");
        fs::copy(rules, &rules_copy).expect("copy rules");
        let cfg = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: portcullis\n    static_configs:\n      - targets: ['{target}']\n",
            rules_copy.display()
        );
        let cfg_path = dir.path().join("prometheus.yml");
        fs::write(&cfg_path, cfg).expect("write prometheus.yml");
        let addr = format!("127.0.0.1:{}", free_port());
        let log = fs::File::create(dir.path().join("prometheus.log")).expect("log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("clone")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn prometheus");
        let p = Prometheus { child, addr, dir };
        eventually(
            DEADLINE,
            || format!("prometheus not ready:\n{}", p.logs()),
            || try_get(&p.addr, "/-/ready", &[]).is_ok_and(|r| r.status == 200),
        );
        p
    }

    pub fn logs(&self) -> String {
        fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// GET an API path; the parsed JSON body.
    pub fn api(&self, path_and_query: &str) -> serde_json::Value {
        let r = get(&self.addr, path_and_query, &[]);
        serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("{path_and_query}: not JSON ({e}): {}", r.body_str()))
    }

    /// An instant query: the `data.result` array (panics when the query is refused).
    pub fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let v = self.api(&format!("/api/v1/query?query={}", url_encode(promql)));
        assert_eq!(v["status"], "success", "query {promql}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Names of the alerts firing now.
    pub fn firing(&self) -> Vec<String> {
        let v = self.api("/api/v1/alerts");
        v["data"]["alerts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|x| x["state"] == "firing")
                    .filter_map(|x| x["labels"]["alertname"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
