//! Assemble the Pingora server: the proxy service on `server.listen`, the
//! admin service on `admin_listen`, and the background services (health
//! checks, rate-limit flusher, culling, SIGHUP reload).

use crate::admin::Admin;
use crate::config::Config;
use crate::lifecycle::DrainingShutdown;
use crate::proxy::Proxy;
use crate::ratelimit::{CounterStore, LocalStore, RedisStore};
use crate::state::Shared;
use crate::store::Store;
use async_trait::async_trait;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{RunArgs, Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};
use pingora::services::listening::Service;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs active health checks of every pool of the current runtime, each at
/// its own interval; follows reloads.
struct HealthChecks {
    shared: Arc<Shared>,
}

#[async_trait]
impl BackgroundService for HealthChecks {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut last: HashMap<String, Instant> = HashMap::new();
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            let rt = self.shared.runtime.load_full();
            for pool in &rt.pools {
                let Some(every) = pool.health_check_interval else {
                    continue;
                };
                let due = last.get(&pool.name).is_none_or(|t| t.elapsed() >= every);
                if due {
                    last.insert(pool.name.clone(), Instant::now());
                    pool.run_health_check().await;
                }
            }
        }
    }
}

/// Flushes rate-limit counts to the store in batches.
struct Flusher {
    shared: Arc<Shared>,
    store: Arc<dyn CounterStore>,
    interval: Duration,
}

#[async_trait]
impl BackgroundService for Flusher {
    async fn start(&self, shutdown: ShutdownWatch) {
        let shared = Arc::clone(&self.shared);
        crate::ratelimit::run_flusher(
            move || shared.rate_limiters(),
            Arc::clone(&self.store),
            self.interval,
            shutdown,
        )
        .await;
    }
}

/// Readiness waits until every proxy listener accepts a connection, so
/// `/readyz` never says 200 before traffic can be taken.
struct Readiness {
    shared: Arc<Shared>,
    listen: Vec<std::net::SocketAddr>,
}

#[async_trait]
impl BackgroundService for Readiness {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut pending = self.listen.clone();
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        while !pending.is_empty() {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            let mut still = Vec::with_capacity(pending.len());
            for addr in pending {
                let connect = tokio::net::TcpStream::connect(addr);
                match tokio::time::timeout(Duration::from_millis(500), connect).await {
                    Ok(Ok(_)) => {}
                    _ => still.push(addr),
                }
            }
            pending = still;
        }
        if self.shared.lifecycle.mark_ready() {
            tracing::info!(event = "ready", "proxy listeners accept; ready");
        }
    }
}

/// Reopens the access log on SIGUSR1 (logrotate).
struct AccessLogReopen {
    shared: Arc<Shared>,
}

#[async_trait]
impl BackgroundService for AccessLogReopen {
    async fn start(&self, shutdown: ShutdownWatch) {
        let shared = Arc::clone(&self.shared);
        crate::observe::access_log::reopen_on_sigusr1(
            move || shared.observe.access_log.reopen(),
            shutdown,
        )
        .await;
    }
}

/// Reloads the config on SIGHUP.
struct Reloader {
    shared: Arc<Shared>,
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // DNS re-resolution is applied like a reload, so it runs here too.
        tokio::select! {
            _ = crate::reload::watch_sighup(Arc::clone(&self.shared)) => {}
            _ = crate::state::resolve::run(Arc::clone(&self.shared)) => {}
            _ = shutdown.changed() => {}
        }
    }
}

fn server_conf(config: &Config) -> ServerConf {
    let s = &config.server;
    let mut conf = ServerConf {
        threads: s.threads,
        upgrade_sock: s.upgrade_sock.display().to_string(),
        // Our own shutdown watch exits as soon as nothing is in flight; this is
        // only the upper bound Pingora sleeps after closing the listeners.
        grace_period_seconds: Some(s.shutdown_timeout.as_secs()),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    conf.upstream_keepalive_pool_size = 256;
    // One single-threaded runtime per thread (Pingora's `work_stealing = false`), as
    // HAProxy and nginx run a thread per core: a connection and everything it does stay on
    // the thread that took it. Patches to the vendored pingora-core make that hold
    // (vendor/README.md): every thread accepts on its own copy of each listening socket
    // and serves what it accepts (eleventh patch), idle upstream connections are pooled
    // per thread, so reusing one wakes no other thread, and an HTTP/2 stream runs on its
    // connection's thread. At 2 threads that is ~10% less CPU per request and ~14% more
    // requests per second than the work-stealing runtime (medians of 10 rounds;
    // benches/history/2026-11-passes.md, issue 16, fourth pass).
    conf.work_stealing = false;
    conf
}

/// A plain (not TLS) proxy listener on `addr`, whose connections read straight into
/// Pingora's own buffers. Pingora's default puts a 64 KB read buffer in front of every
/// accepted socket: a `calloc` (64 KB zeroed) and a free per connection. It saves no
/// system call over plain HTTP, where every read already goes into a buffer of its own
/// (the request header's, the body's, the PROXY header's chunk). Above jemalloc's
/// thread cache (32 KB) each such buffer is an arena extent taken and given back. With a
/// connection per request that was 2.1k of 81.5k instructions, 4 connections at a time,
/// and 9k of 94k, 50 at a time (benches/history/2026-11-passes.md, issue 16, sixteenth
/// pass). TLS listeners keep the buffer: OpenSSL reads a record's 5-byte header and then
/// its body, two reads that the buffer serves from one `recv`.
fn plain_listener(addr: &std::net::SocketAddr) -> pingora::listeners::ListenerConfig {
    use pingora::listeners::{L4BufferSettings, ListenerConfig};
    ListenerConfig::tcp(addr.to_string()).l4_buffer(L4BufferSettings::default().read(0))
}

/// Build everything and run until shutdown. `upgrade`: take the listeners of
/// a running process over `upgrade_sock` (`-u`).
pub fn run(config: Config, config_path: PathBuf, upgrade: bool) {
    let opt = Opt {
        upgrade,
        ..Opt::default()
    };
    let conf = server_conf(&config);
    let listen = config.server.listen.clone();
    let admin_listen = config.server.admin_listen;
    let drain = config.server.drain;
    let shutdown_timeout = config.server.shutdown_timeout;
    let upgrade_sock = config.server.upgrade_sock.clone();
    let redis = config.store.clone();
    let threads = config.server.threads;
    let h2c = config.server.h2c;
    let max_response_buffer_bytes = config.server.max_response_buffer_bytes;
    // issue 40, item 8
    let max_glitches = config.server.h2_max_glitches;
    let tls = config.tls.clone();

    let shared = Shared::new(config, config_path);
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();

    // Counts client connections and lets the last accepted ones be served at shutdown.
    let connections = Arc::new(crate::lifecycle::Connections::default());
    let mut http_proxy =
        pingora::proxy::http_proxy(&server.configuration, Proxy::new(Arc::clone(&shared)));
    let mut options = pingora::apps::HttpServerOptions::default();
    options.h2c = h2c;
    options.h1_discard_header_case = !shared.keep_header_case;
    // HTTP/2 with nothing in flight this long: GOAWAY NO_ERROR (vendored pingora-core).
    options.h2_idle_timeout = Some(shared.runtime.load().config.server.idle_timeout);
    // issue 40, item 8: `h2_max_glitches`, per connection per minute (ours), and the
    // same number for the streams h2 itself resets for the client's protocol errors
    // (h2 counts those over the connection's life; its default is 1024).
    options.h2_glitches = Some(crate::edge::glitches::policy(
        max_glitches,
        shared
            .metrics
            .edge_refusal_counter(crate::metrics::EdgeRefusal::H2Glitches),
    ));
    let mut h2_options = pingora::protocols::http::v2::server::default_h2_options();
    h2_options.max_local_error_reset_streams(Some(max_glitches as usize));
    http_proxy.h2_options = Some(h2_options);
    http_proxy.server_options = Some(options);
    http_proxy.max_response_batch_bytes = max_response_buffer_bytes;
    // Edge first: the connection cap and the PROXY header come before anything else.
    let mut proxy = Service::new(
        "portcullis proxy".into(),
        crate::edge::EdgeApp::new(
            crate::lifecycle::GracefulApp::new(http_proxy, Arc::clone(&connections)),
            Arc::clone(&shared),
        ),
    );
    for addr in &listen {
        proxy.add_listener(plain_listener(addr));
    }
    let mut ready_addrs = listen.clone();
    if let Some(tls) = &tls {
        for addr in &tls.listen {
            match crate::edge::tls::listener_settings(&shared, tls.min_version) {
                Ok(settings) => proxy.add_tls_with_settings(&addr.to_string(), None, settings),
                Err(e) => {
                    tracing::error!(error = %e, listen = %addr, "cannot set up the TLS listener");
                    std::process::exit(1);
                }
            }
            ready_addrs.push(*addr);
        }
    }
    proxy.threads = Some(threads);

    {
        let rt = shared.runtime.load();
        let labels: Vec<_> = rt
            .config
            .routes
            .iter()
            .map(|r| crate::observe::route_label(r).into_owned())
            .collect();
        shared
            .metrics
            .init_routes(labels.iter().map(String::as_str).chain(["default"]));
    }
    {
        // Read at each scrape; a weak handle so the registry does not keep
        // the shared state alive.
        let weak = Arc::downgrade(&shared);
        shared.metrics.set_sampler(move || {
            weak.upgrade()
                .map_or(0, |s| s.observe.access_log.dropped_lines())
        });
    }

    let mut admin = Service::new(
        "portcullis admin".into(),
        crate::admin::AdminApp::new(Admin::new(Arc::clone(&shared))),
    );
    admin.add_tcp(&admin_listen.to_string());
    admin.threads = Some(1);

    // The one Redis client of the process, shared by the limiter's flusher, culling and
    // the watchdog (one connection for the whole process).
    let fleet_store = match &redis {
        Some(r) => {
            Store::with_endpoint(&r.endpoint, &r.key_prefix, r.timeout).unwrap_or_else(|e| {
                // validated at load; only reachable if the URL became invalid
                tracing::error!(error = %e, "invalid Redis settings; using the in-process store");
                Store::Local
            })
        }
        None => Store::Local,
    };
    let (store, flush_interval): (Arc<dyn CounterStore>, Duration) = match (&fleet_store, &redis) {
        (Store::Redis(client), Some(r)) => (
            Arc::new(RedisStore::new(Arc::clone(client))),
            r.flush_interval,
        ),
        _ => (Arc::new(LocalStore::new()), Duration::from_millis(50)),
    };
    // Every background service holds the shared state.
    let sh = || Arc::clone(&shared);
    let health = background_service("health checks", HealthChecks { shared: sh() });
    let flusher = background_service(
        "rate-limit flusher",
        Flusher {
            shared: sh(),
            store,
            interval: flush_interval,
        },
    );
    let culling = crate::cull::driver::service(sh(), fleet_store.budget());
    let readiness = background_service(
        "readiness",
        Readiness {
            shared: sh(),
            listen: ready_addrs,
        },
    );
    let reloader = background_service("reload", Reloader { shared: sh() });
    let access_log_reopen =
        background_service("access log reopen", AccessLogReopen { shared: sh() });
    let watchdog = crate::watchdog::Watchdog::new(sh(), &fleet_store);
    let watchdog = background_service("watchdog", watchdog);

    server.add_service(proxy);
    server.add_service(admin);
    server.add_service(health);
    server.add_service(flusher);
    server.add_service(reloader);
    server.add_service(access_log_reopen);
    server.add_service(readiness);
    server.add_service(watchdog);
    server.add_service(culling);

    let phases = server.watch_execution_phase();
    tracing::info!(
        event = "start",
        listen = ?listen,
        admin = %admin_listen,
        store = shared.store_kind,
        upgrade,
        "portcullis starting"
    );
    server.run(RunArgs {
        shutdown_signal: Box::new(DrainingShutdown {
            lifecycle: Arc::clone(&shared.lifecycle),
            shedder: Arc::clone(&shared.shedder),
            drain,
            shutdown_timeout,
            phases: std::sync::Mutex::new(Some(phases)),
            upgrade_sock,
            connections,
        }),
    });
    // Write the access-log lines still lingering in memory and export queued spans.
    shared.observe.close();
}
