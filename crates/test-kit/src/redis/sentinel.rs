//! [`RedisSentinels`]: a real Sentinel-managed master of [`RedisServer`]s.

use super::*;

/// A Sentinel-managed master: one master, one replica (`--replicaof`) and three sentinels
/// (quorum 2, `down-after-milliseconds 1000`), all on free ports. Ready (sentinels see the
/// replica and each other) when [`RedisSentinels::start`] returns.
pub struct RedisSentinels {
    name: String,
    /// Master and replica (roles swap on failover).
    data: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
}

impl RedisSentinels {
    /// Monitored as `master_name`; `password`: `--requirepass` on master and replica.
    pub fn start(master_name: &str, password: Option<&str>) -> RedisSentinels {
        let mut auth: Vec<&str> = Vec::new();
        if let Some(pw) = password {
            auth = vec!["--requirepass", pw, "--masterauth", pw];
        }
        let master = RedisServer::start_with_args(&auth);
        let mport = master.port().to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &mport];
        replica_args.extend_from_slice(&auth);
        let replica = RedisServer::start_with_args(&replica_args);
        let mut conf = format!(
            "sentinel monitor {master_name} 127.0.0.1 {mport} 2\n\
             sentinel down-after-milliseconds {master_name} 1000\n\
             sentinel failover-timeout {master_name} 10000\n\
             sentinel parallel-syncs {master_name} 1\n"
        );
        if let Some(pw) = password {
            conf.push_str(&format!("sentinel auth-pass {master_name} {pw}\n"));
        }
        let sentinels = (0..3).map(|_| RedisServer::start_sentinel(&conf)).collect();
        let set = RedisSentinels {
            name: master_name.to_string(),
            data: vec![master, replica],
            sentinels,
        };
        poll(
            FORM_DEADLINE,
            "sentinels see the replica and each other",
            || {
                set.data[1]
                    .info_field("replication", "master_link_status")
                    .as_deref()
                    == Some("up")
                    && set.sentinels.iter().all(|s| {
                        let r = s
                            .try_cmd(&["SENTINEL", "REPLICAS", master_name])
                            .unwrap_or_default();
                        let o = s
                            .try_cmd(&["SENTINEL", "SENTINELS", master_name])
                            .unwrap_or_default();
                        r.contains(&set.data[1].port().to_string())
                            && set
                                .sentinels
                                .iter()
                                .filter(|x| o.contains(&x.port().to_string()))
                                .count()
                                == 2
                    })
            },
        );
        set
    }

    /// `127.0.0.1:PORT` of the three sentinels.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::addr).collect()
    }

    /// The master's port as the first running sentinel reports it.
    pub fn master_port(&self) -> u16 {
        let s = self
            .sentinels
            .iter()
            .find(|s| s.is_running())
            .expect("a running sentinel");
        let out = s.cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.name]);
        out.lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("GET-MASTER-ADDR-BY-NAME: {out:?}"))
    }

    /// The data node (master or replica) on `port`.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.data
            .iter()
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no data node on port {port}"))
    }

    /// The current master.
    pub fn master(&self) -> &RedisServer {
        self.server(self.master_port())
    }

    /// `SENTINEL FAILOVER` (graceful: the old master becomes a replica); returns once
    /// every sentinel names the new master and it says `role:master`.
    pub fn failover(&self) -> u16 {
        let old = self.master_port();
        let out = self.sentinels[0].cmd(&["SENTINEL", "FAILOVER", &self.name]);
        assert!(out.contains("OK"), "SENTINEL FAILOVER: {out}");
        self.wait_new_master(old)
    }

    /// Kills the master (SIGKILL); returns its port. [`RedisSentinels::wait_new_master`]
    /// then waits for the promotion.
    pub fn kill_master(&mut self) -> u16 {
        let old = self.master_port();
        if let Some(s) = self.data.iter_mut().find(|s| s.port() == old) {
            s.kill();
        }
        old
    }

    /// Waits until every running sentinel names a master other than `old` and that node
    /// says `role:master`; returns its port.
    pub fn wait_new_master(&self, old: u16) -> u16 {
        let mut new = 0;
        poll(FORM_DEADLINE, "sentinel failover", || {
            let ports: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .filter(|s| s.is_running())
                .map(|s| {
                    s.try_cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.name])
                        .ok()?
                        .lines()
                        .nth(1)?
                        .trim()
                        .parse()
                        .ok()
                })
                .collect();
            match ports.first() {
                Some(&Some(p)) if p != old && ports.iter().all(|&q| q == Some(p)) => {
                    new = p;
                    self.server(p).info_field("replication", "role").as_deref() == Some("master")
                }
                _ => false,
            }
        });
        new
    }
}
