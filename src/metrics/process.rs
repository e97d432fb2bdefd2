//! `portcullis_build_info{version,commit}` = 1, and the standard `process_*` metrics of
//! Prometheus's client libraries, read from `/proc/self` at each scrape:
//! `process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds` and
//! `process_start_time_seconds` (an alert on a restart compares it to its value a while
//! ago). Where `/proc` cannot be read the series are left out of that scrape.

use super::must;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Gauge, Registry};

/// The commit the binary was built from (`build.rs`: `PORTCULLIS_COMMIT`, else `git`,
/// else `unknown`; `unknown` too in a build that did not run `build.rs`).
pub const COMMIT: &str = match option_env!("PORTCULLIS_BUILD_COMMIT") {
    Some(c) => c,
    None => "unknown",
};

/// What `/proc/self` says, in Prometheus's units.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: f64,
    pub virtual_bytes: f64,
    pub start_time_seconds: f64,
    pub open_fds: f64,
    pub max_fds: f64,
}

/// The fields of `/proc/self/stat` after the command name (`) `), `/proc/stat`'s `btime`,
/// `/proc/self/limits`' open-files soft limit and the count of `/proc/self/fd`, with the
/// clock tick and page size: the stats. `None` when a text is not what Linux writes.
pub fn parse_stats(
    stat: &str,
    proc_stat: &str,
    limits: &str,
    open_fds: usize,
    ticks_per_second: f64,
    page_size: f64,
) -> Option<ProcessStats> {
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // After the name, field 3 (state) is f[0]: utime is field 14, stime 15, starttime
    // 22, vsize 23, rss 24.
    let num = |i: usize| f.get(i - 3).and_then(|v| v.parse::<f64>().ok());
    let (utime, stime) = (num(14)?, num(15)?);
    let (start, vsize, rss) = (num(22)?, num(23)?, num(24)?);
    let btime = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<f64>().ok())?;
    let max_fds = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .map(|v| v.parse::<f64>().unwrap_or(f64::INFINITY))?;
    Some(ProcessStats {
        cpu_seconds: (utime + stime) / ticks_per_second,
        resident_bytes: rss * page_size,
        virtual_bytes: vsize,
        start_time_seconds: btime + start / ticks_per_second,
        open_fds: open_fds as f64,
        max_fds,
    })
}

/// This process's stats now.
pub fn read_stats() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let proc_stat = std::fs::read_to_string("/proc/stat").ok()?;
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let fds = std::fs::read_dir("/proc/self/fd").ok()?.count();
    // The directory's own descriptor, open while it was counted, is not the process's.
    let fds = fds.saturating_sub(1);
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    let page = rustix::param::page_size() as f64;
    parse_stats(&stat, &proc_stat, &limits, fds, ticks, page)
}

/// The `process_*` series, refreshed from [`read_stats`] when scraped.
struct ProcessCollector {
    descs: Vec<Desc>,
    cpu: Counter,
    resident: Gauge,
    virt: Gauge,
    start: Gauge,
    open_fds: Gauge,
    max_fds: Gauge,
}

impl ProcessCollector {
    fn new() -> Self {
        let cpu = must(Counter::new(
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
        ));
        let gauge = |name: &str, help: &str| must(Gauge::new(name, help));
        let resident = gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
        );
        let virt = gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
        );
        let start = gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
        );
        let open_fds = gauge("process_open_fds", "Number of open file descriptors.");
        let max_fds = gauge(
            "process_max_fds",
            "Maximum number of open file descriptors.",
        );
        let descs = [
            cpu.desc(),
            resident.desc(),
            virt.desc(),
            start.desc(),
            open_fds.desc(),
            max_fds.desc(),
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
        Self {
            descs,
            cpu,
            resident,
            virt,
            start,
            open_fds,
            max_fds,
        }
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Some(s) = read_stats() else {
            return Vec::new();
        };
        let grown = s.cpu_seconds - self.cpu.get();
        if grown > 0.0 {
            self.cpu.inc_by(grown);
        }
        self.resident.set(s.resident_bytes);
        self.virt.set(s.virtual_bytes);
        self.start.set(s.start_time_seconds);
        self.open_fds.set(s.open_fds);
        self.max_fds.set(s.max_fds);
        [
            self.cpu.collect(),
            self.resident.collect(),
            self.virt.collect(),
            self.start.collect(),
            self.open_fds.collect(),
            self.max_fds.collect(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Registers `portcullis_build_info` and the `process_*` collector in `registry`.
pub fn register(registry: &Registry) {
    let info = super::gauge_vec(
        registry,
        "portcullis_build_info",
        "1, labelled with the version and the commit the binary was built from",
        &["version", "commit"],
    );
    info.with_label_values(&[env!("CARGO_PKG_VERSION"), COMMIT])
        .set(1);
    must(registry.register(Box::new(ProcessCollector::new())));
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (portcullis (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                        250 50 0 0 20 0 7 0 12345 1048576000 2048 18446744073709551615 \
                        1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units     \n\
                          Max cpu time              unlimited            unlimited            seconds   \n\
                          Max open files            65536                524288               files     \n";

    #[test]
    fn proc_texts_parse_into_prometheus_units() {
        let s = parse_stats(
            STAT,
            "cpu 1 2 3\nbtime 1700000000\n",
            LIMITS,
            9,
            100.0,
            4096.0,
        );
        assert_eq!(
            s,
            Some(ProcessStats {
                cpu_seconds: 3.0,
                resident_bytes: 2048.0 * 4096.0,
                virtual_bytes: 1_048_576_000.0,
                start_time_seconds: 1_700_000_000.0 + 123.45,
                open_fds: 9.0,
                max_fds: 65536.0,
            })
        );
        let unlimited = LIMITS.replace("65536 ", "unlimited ");
        let s = parse_stats(STAT, "btime 1\n", &unlimited, 1, 100.0, 4096.0);
        assert_eq!(s.map(|s| s.max_fds), Some(f64::INFINITY));
        assert_eq!(
            parse_stats("garbage", "btime 1\n", LIMITS, 1, 100.0, 1.0),
            None
        );
        assert_eq!(parse_stats(STAT, "cpu 1\n", LIMITS, 1, 100.0, 1.0), None);
    }

    #[test]
    fn this_process_reads_and_the_series_render() {
        let s = read_stats().expect("/proc/self");
        assert!(s.resident_bytes > 0.0 && s.virtual_bytes >= s.resident_bytes);
        assert!(s.open_fds >= 3.0 && s.max_fds >= s.open_fds);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        assert!(s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 86_400.0);
        let r = Registry::new();
        register(&r);
        let mut buf = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &r.gather(), &mut buf)
            .expect("encode");
        let text = String::from_utf8(buf).expect("utf8");
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(&format!("\n{name}")), "{name} in {text}");
        }
        assert!(text.contains(&format!(
            "portcullis_build_info{{commit=\"{COMMIT}\",version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )));
    }
}
