//! Assemble the Pingora server: the proxy service on `server.listen`, the
//! admin service on `admin_listen`, and the background services (health
//! checks, rate-limit flusher, culling, SIGHUP reload).
//!
//! - [`app::EdgeApp`] wraps each accepted connection of the proxy listeners
//!   (`max_connections`, TLS handshake timing, the PROXY header) and hands the HTTP
//!   application an [`crate::edge::stream::EdgeStream`].
//! - [`tls`]: the certificate of each TLS handshake, picked by SNI from the current
//!   configuration ([`crate::config::certs`] holds the certificates).

pub mod app;
mod background;
mod every;
mod fleet_caps;
mod ramp_sync;
mod shared_probing;
mod tenants_sync;
mod tenants_watch;
pub mod tls;

use crate::admin::Admin;
use crate::config::{Config, StoreSettings, TlsSettings};
use crate::lifecycle::{Connections, DrainingShutdown, GracefulApp};
use crate::proxy::Proxy;
use crate::state::Shared;
use pingora::proxy::HttpProxy;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{RunArgs, Server};
use pingora::services::listening::Service;
use pingora::services::ServiceWithDependents;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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

/// What [`run`] reads from the configuration before it moves into the shared state.
struct Startup {
    listen: Vec<SocketAddr>,
    admin_listen: SocketAddr,
    drain: Duration,
    shutdown_timeout: Duration,
    upgrade_sock: PathBuf,
    redis: Option<StoreSettings>,
    threads: usize,
    h2c: bool,
    max_response_buffer_bytes: usize,
    // issue 40, item 8
    max_glitches: u32,
    tls: Option<TlsSettings>,
}

impl Startup {
    fn of(config: &Config) -> Self {
        Self {
            listen: config.server.listen.clone(),
            admin_listen: config.server.admin_listen,
            drain: config.server.drain,
            shutdown_timeout: config.server.shutdown_timeout,
            upgrade_sock: config.server.upgrade_sock.clone(),
            redis: config.store.clone(),
            threads: config.server.threads,
            h2c: config.server.h2c,
            max_response_buffer_bytes: config.server.max_response_buffer_bytes,
            max_glitches: config.server.h2_max_glitches,
            tls: config.tls.clone(),
        }
    }
}

/// The HTTP proxy application with its HTTP/1 and HTTP/2 server options.
fn http_proxy(conf: &Arc<ServerConf>, shared: &Arc<Shared>, s: &Startup) -> HttpProxy<Proxy> {
    let mut http_proxy = pingora::proxy::http_proxy(conf, Proxy::new(Arc::clone(shared)));
    let mut options = pingora::apps::HttpServerOptions::default();
    options.h2c = s.h2c;
    options.h1_discard_header_case = !shared.keep_header_case;
    // HTTP/2 with nothing in flight this long: GOAWAY NO_ERROR (vendored pingora-core).
    options.h2_idle_timeout = Some(shared.runtime.load().config.server.idle_timeout);
    // issue 40, item 8: `h2_max_glitches`, per connection per minute (ours), and the
    // same number for the streams h2 itself resets for the client's protocol errors
    // (h2 counts those over the connection's life; its default is 1024).
    options.h2_glitches = Some(crate::edge::glitches::policy(
        s.max_glitches,
        shared
            .metrics
            .edge
            .refusal_counter(crate::metrics::EdgeRefusal::H2Glitches),
    ));
    let mut h2_options = pingora::protocols::http::v2::server::default_h2_options();
    h2_options.max_local_error_reset_streams(Some(s.max_glitches as usize));
    http_proxy.h2_options = Some(h2_options);
    http_proxy.server_options = Some(options);
    http_proxy.max_response_batch_bytes = s.max_response_buffer_bytes;
    http_proxy
}

/// The proxy service on `server.listen` and the `[tls]` listeners, and the addresses
/// readiness waits for. Exits the process when a TLS listener cannot be set up.
fn proxy_service(
    http_proxy: HttpProxy<Proxy>,
    shared: &Arc<Shared>,
    connections: &Arc<Connections>,
    s: &Startup,
) -> (impl ServiceWithDependents, Vec<SocketAddr>) {
    // Edge first: the connection cap and the PROXY header come before anything else.
    let mut proxy = Service::new(
        "portcullis proxy".into(),
        app::EdgeApp::new(
            GracefulApp::new(http_proxy, Arc::clone(connections)),
            Arc::clone(shared),
        ),
    );
    for addr in &s.listen {
        proxy.add_listener(plain_listener(addr));
    }
    let mut ready_addrs = s.listen.clone();
    if let Some(tls) = &s.tls {
        for addr in &tls.listen {
            match tls::listener_settings(shared, tls.min_version) {
                Ok(settings) => proxy.add_tls_with_settings(&addr.to_string(), None, settings),
                Err(e) => {
                    tracing::error!(error = %e, listen = %addr, "cannot set up the TLS listener");
                    std::process::exit(1);
                }
            }
            ready_addrs.push(*addr);
        }
    }
    proxy.threads = Some(s.threads);
    (proxy, ready_addrs)
}

/// The default route's series from the start (each outcome at 0, for dashboards and
/// alerts), and the access log's dropped lines read at each scrape. A configured route
/// gets its series with its first request: a scrape grows with the routes that see
/// traffic, not with the routes configured.
fn init_metrics(shared: &Arc<Shared>) {
    shared.metrics.proxy.init_routes(["default"]);
    // Read at each scrape; a weak handle so the registry does not keep
    // the shared state alive.
    let weak = Arc::downgrade(shared);
    shared.metrics.access_log.set_sampler(move || {
        weak.upgrade()
            .map_or(0, |s| s.observe.access_log.dropped_lines())
    });
}

/// The admin service on `admin_listen`, on one thread.
fn admin_service(
    shared: &Arc<Shared>,
    admin_listen: SocketAddr,
    budget: Arc<dyn portcullis_policy::cull::BudgetStore>,
    view: Arc<crate::fleet::sync::FleetView>,
) -> impl ServiceWithDependents {
    let mut admin = Service::new(
        "portcullis admin".into(),
        crate::admin::AdminApp::new(Admin::new(Arc::clone(shared), budget, view)),
    );
    admin.add_tcp(&admin_listen.to_string());
    admin.threads = Some(1);
    admin
}

/// Build everything and run until shutdown. `upgrade`: take the listeners of
/// a running process over `upgrade_sock` (`-u`).
pub fn run(config: Config, config_path: PathBuf, upgrade: bool) {
    let opt = Opt {
        upgrade,
        ..Opt::default()
    };
    let conf = server_conf(&config);
    let s = Startup::of(&config);

    let shared = Shared::new(config, config_path);
    if upgrade {
        // Under systemd the new process of an upgrade becomes the service's main process.
        shared.lifecycle.notifier.announce_main_pid_when_ready();
    }
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();

    // Counts client connections and lets the last accepted ones be served at shutdown.
    let connections = Arc::new(Connections::default());
    let http_proxy = http_proxy(&server.configuration, &shared, &s);
    let (proxy, ready_addrs) = proxy_service(http_proxy, &shared, &connections, &s);
    init_metrics(&shared);
    // The one store client of the process, and the disruption budget on it that the culls
    // and the runtime API share.
    let fleet_store = background::fleet_store(s.redis.as_ref());
    let budget = fleet_store.budget();
    let view = Arc::clone(&shared.fleet_view);
    let admin = admin_service(
        &shared,
        s.admin_listen,
        Arc::clone(&budget),
        Arc::clone(&view),
    );
    let background = background::services(
        &shared,
        &fleet_store,
        budget,
        view,
        s.redis.as_ref(),
        ready_addrs,
    );

    server.add_service(proxy);
    server.add_service(admin);
    server.add_services(background);

    let phases = server.watch_execution_phase();
    tracing::info!(
        event = "start",
        listen = ?s.listen,
        admin = %s.admin_listen,
        store = shared.store_kind,
        upgrade,
        "portcullis starting"
    );
    server.run(RunArgs {
        shutdown_signal: Box::new(DrainingShutdown {
            lifecycle: Arc::clone(&shared.lifecycle),
            shedder: Arc::clone(&shared.shedder),
            drain: s.drain,
            shutdown_timeout: s.shutdown_timeout,
            phases: std::sync::Mutex::new(Some(phases)),
            upgrade_sock: s.upgrade_sock,
            connections,
        }),
    });
    // Write the access-log lines still lingering in memory and export queued spans.
    shared.observe.close();
}
