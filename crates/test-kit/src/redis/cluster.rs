//! [`RedisCluster`]: a real Redis Cluster of [`RedisServer`] nodes.

use super::*;

/// `cluster-node-timeout` of [`RedisCluster`] nodes: a killed master is detected and its
/// replica promoted within a few seconds.
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 1_000;

/// Certificate, key and CA files of a TLS cluster.
type TlsFiles<'a> = (
    &'a std::path::Path,
    &'a std::path::Path,
    &'a std::path::Path,
);

/// A real Redis Cluster: `masters` masters with `replicas_per_master` replicas each, every
/// node a [`RedisServer`] with `--cluster-enabled yes` on a free port, joined by
/// `redis-cli --cluster create … --cluster-replicas N --cluster-yes`. Ready (every slot
/// covered, every replica in sync) when [`RedisCluster::start`] returns.
///
/// ```ignore
/// let cluster = RedisCluster::start(3, 1);
/// let seeds = cluster.nodes();          // "127.0.0.1:PORT" of every node
/// let port = cluster.kill_master(0);    // SIGKILL the master of the lowest slots
/// cluster.wait_ok();                    // its replica promoted, every slot served again
/// ```
pub struct RedisCluster {
    /// Every node ever started, in creation order (killed ones stay, not running).
    servers: Vec<RedisServer>,
}

impl RedisCluster {
    /// At least 3 masters (`redis-cli --cluster create` refuses fewer).
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        Self::start_with_args(masters, replicas_per_master, &[])
    }

    /// Like [`RedisCluster::start`] with extra `redis-server` arguments for every node
    /// (e.g. `["--requirepass", pw, "--masterauth", pw]`).
    pub fn start_with_args(
        masters: usize,
        replicas_per_master: usize,
        extra: &[&str],
    ) -> RedisCluster {
        Self::start_inner(masters, replicas_per_master, extra, None)
    }

    /// Every node also listens with TLS (`--tls-port`, `--tls-cluster yes`,
    /// `--tls-replication yes`) serving `cert`/`key`; [`RedisCluster::tls_nodes`] are the
    /// seeds for a TLS client (which the nodes answer with their TLS ports).
    pub fn start_tls(
        masters: usize,
        replicas_per_master: usize,
        cert: &std::path::Path,
        key: &std::path::Path,
        ca: &std::path::Path,
    ) -> RedisCluster {
        Self::start_inner(masters, replicas_per_master, &[], Some((cert, key, ca)))
    }

    /// `127.0.0.1:TLS_PORT` of every node of [`RedisCluster::start_tls`].
    pub fn tls_nodes(&self) -> Vec<String> {
        self.servers
            .iter()
            .filter_map(|s| s.tls_port().map(|p| format!("127.0.0.1:{p}")))
            .collect()
    }

    fn start_inner(
        masters: usize,
        replicas_per_master: usize,
        extra: &[&str],
        tls: Option<TlsFiles<'_>>,
    ) -> RedisCluster {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let n = masters * (1 + replicas_per_master);
        let servers = (0..n).map(|_| Self::node(extra, tls)).collect();
        let cluster = RedisCluster { servers };
        cluster.create(replicas_per_master);
        poll(
            FORM_DEADLINE,
            "cluster formed with replicas in sync",
            || {
                cluster.servers.iter().all(|s| {
                    let info = s.try_cmd(&["CLUSTER", "INFO"]).unwrap_or_default();
                    info.contains("cluster_state:ok")
                        && info.contains(&format!("cluster_known_nodes:{n}"))
                        && (s.info_field("replication", "role").as_deref() == Some("master")
                            || s.info_field("replication", "master_link_status").as_deref()
                                == Some("up"))
                })
            },
        );
        cluster
    }

    /// One cluster node on a free port, with `extra` arguments and, with `tls`, a TLS
    /// port too.
    fn node(extra: &[&str], tls: Option<TlsFiles<'_>>) -> RedisServer {
        let timeout = CLUSTER_NODE_TIMEOUT_MS.to_string();
        // The bus port defaults to port + 10000, which is past 65535 for much of the
        // ephemeral range: every node gets a free one of its own.
        let bus = free_port().to_string();
        let mut a = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &timeout,
        ];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--cluster-port", &bus]);
        let tls_port = free_port().to_string();
        let files = tls.map(|(c, k, a)| {
            (
                c.display().to_string(),
                k.display().to_string(),
                a.display().to_string(),
            )
        });
        if let Some((c, k, ca)) = &files {
            a.extend_from_slice(&[
                "--tls-port",
                &tls_port,
                "--tls-cluster",
                "yes",
                "--tls-replication",
                "yes",
                "--tls-cert-file",
                c,
                "--tls-key-file",
                k,
                "--tls-ca-cert-file",
                ca,
                "--tls-auth-clients",
                "no",
            ]);
        }
        RedisServer::start_with_args(&a)
    }

    /// Joins the nodes with `redis-cli --cluster create`.
    fn create(&self, replicas_per_master: usize) {
        // Bounded: `--cluster create` waits for the join forever if the nodes cannot meet.
        let mut cmd = Command::new("timeout");
        cmd.args(["60", "redis-cli"]);
        if let Some(pw) = self.servers[0].password() {
            cmd.args(["-a", pw, "--no-auth-warning"]);
        }
        let out = cmd
            .args(["--cluster", "create"])
            .args(self.nodes())
            .args([
                "--cluster-replicas",
                &replicas_per_master.to_string(),
                "--cluster-yes",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `127.0.0.1:PORT` of every node (seeds for a cluster client; killed ones included).
    pub fn nodes(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::addr).collect()
    }

    /// The node on `port`.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    /// Any running node (for `redis-cli`).
    fn live(&self) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.is_running())
            .expect("no running cluster node")
    }

    /// `redis-cli -c` against a running node (follows MOVED).
    pub fn cmd(&self, args: &[&str]) -> String {
        let mut all = vec!["-c"];
        all.extend_from_slice(args);
        self.live().cmd(&all)
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, key: &str) -> u16 {
        let out = self.live().cmd(&["CLUSTER", "KEYSLOT", key]);
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("CLUSTER KEYSLOT {key}: {out:?}"))
    }

    /// Masters that own slots as a running node sees them (a killed master keeps its
    /// slots until its replica is promoted): (port, first slot), ordered by first slot.
    pub fn masters(&self) -> Vec<(u16, u16)> {
        let text = self.live().cmd(&["CLUSTER", "NODES"]);
        let mut out: Vec<(u16, u16)> = text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let flags = f.get(2)?;
                if !flags.contains("master") {
                    return None;
                }
                let port = f
                    .get(1)?
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()?;
                let first = f.get(8)?.split('-').next()?.parse().ok()?;
                Some((port, first))
            })
            .collect();
        out.sort_by_key(|&(_, slot)| slot);
        out
    }

    /// Kills (SIGKILL) the `i`-th master by slot order; returns its port.
    pub fn kill_master(&mut self, i: usize) -> u16 {
        let masters = self.masters();
        let (port, _) = *masters
            .get(i)
            .unwrap_or_else(|| panic!("no master {i} in {masters:?}"));
        self.kill(port);
        port
    }

    /// Kills the node on `port`.
    pub fn kill(&mut self, port: u16) {
        if let Some(s) = self.servers.iter_mut().find(|s| s.port() == port) {
            s.kill();
        }
    }

    /// Restarts a killed node on its port with its `nodes.conf`: it rejoins (as a replica
    /// when its slots were failed over).
    pub fn restart(&mut self, port: u16) {
        if let Some(s) = self.servers.iter_mut().find(|s| s.port() == port) {
            s.restart();
        }
    }

    /// Waits until every running node says `cluster_state:ok` and every master with slots
    /// is running (after a kill: the replica was promoted). Panics after a minute.
    pub fn wait_ok(&self) {
        poll(
            FORM_DEADLINE,
            "cluster state ok with every master running",
            || {
                let running: Vec<u16> = self
                    .servers
                    .iter()
                    .filter(|s| s.is_running())
                    .map(RedisServer::port)
                    .collect();
                self.servers.iter().filter(|s| s.is_running()).all(|s| {
                    s.try_cmd(&["CLUSTER", "INFO"])
                        .unwrap_or_default()
                        .contains("cluster_state:ok")
                }) && {
                    let m = self.masters();
                    !m.is_empty() && m.iter().all(|(p, _)| running.contains(p))
                }
            },
        );
    }
}
