// Copyright 2026 Cloudflare, Inc.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
// http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

//! The listening service
//!
//! A [Service] (listening service) responds to incoming requests on its endpoints.
//! Each [Service] can be configured with custom application logic (e.g. an `HTTPProxy`) and one or
//! more endpoints to listen to.

use crate::apps::{HandshakeFailure, ServerApp};
use crate::listeners::tls::TlsSettings;
#[cfg(feature = "connection_filter")]
use crate::listeners::AcceptAllFilter;
use crate::listeners::{
    ConnectionFilter, ListenerConfig, Listeners, ServerAddress, TcpSocketOptions, TransportStack,
};
use crate::protocols::Stream;
#[cfg(unix)]
use crate::server::ListenFds;
use crate::server::{RuntimeOpts, ShutdownWatch};
use crate::services::Service as ServiceTrait;

use async_trait::async_trait;
use log::{debug, error, info};
use pingora_error::Result;
use pingora_runtime::current_handle;
use pingora_timeout::timeout;
use std::fs::Permissions;
use std::sync::Arc;

/// Override the runtime options used to run a listening service.
pub type RuntimeOptsOverride = Arc<dyn Fn(&RuntimeOpts) -> Option<RuntimeOpts> + Send + Sync>;

/// The type of service that is associated with a list of listening endpoints and a particular application
pub struct Service<A> {
    name: String,
    listeners: Listeners,
    app_logic: Option<A>,
    /// The number of preferred threads. `None` to follow global setting.
    pub threads: Option<usize>,
    runtime_opts_override: Option<RuntimeOptsOverride>,
    #[cfg(feature = "connection_filter")]
    connection_filter: Arc<dyn ConnectionFilter>,
}

impl<A> Service<A> {
    /// Create a new [`Service`] with the given application (see [`crate::apps`]).
    pub fn new(name: String, app_logic: A) -> Self {
        Service {
            name,
            listeners: Listeners::new(),
            app_logic: Some(app_logic),
            threads: None,
            runtime_opts_override: None,
            #[cfg(feature = "connection_filter")]
            connection_filter: Arc::new(AcceptAllFilter),
        }
    }

    /// Create a new [`Service`] with the given application (see [`crate::apps`]) and the given
    /// [`Listeners`].
    pub fn with_listeners(name: String, listeners: Listeners, app_logic: A) -> Self {
        Service {
            name,
            listeners,
            app_logic: Some(app_logic),
            threads: None,
            runtime_opts_override: None,
            #[cfg(feature = "connection_filter")]
            connection_filter: Arc::new(AcceptAllFilter),
        }
    }

    /// Set a runtime options override for this service.
    ///
    /// Returning [`None`] from the override uses the global runtime options.
    pub fn set_runtime_opts_override(&mut self, override_fn: RuntimeOptsOverride) {
        self.runtime_opts_override = Some(override_fn);
    }

    /// Set a custom connection filter for this service.
    ///
    /// The connection filter will be applied to all incoming connections
    /// on all endpoints of this service. Connections that don't pass the
    /// filter will be dropped immediately at the TCP level, before TLS
    /// handshake or any HTTP processing.
    ///
    /// # Feature Flag
    ///
    /// This method requires the `connection_filter` feature to be enabled.
    /// When the feature is disabled, this method is a no-op.
    ///
    /// # Example
    ///
    /// ```rust,no_run
    /// # use std::sync::Arc;
    /// # use pingora_core::listeners::{ConnectionFilter, AcceptAllFilter};
    /// # struct MyService;
    /// # impl MyService {
    /// #   fn new() -> Self { MyService }
    /// # }
    /// let mut service = MyService::new();
    /// let filter = Arc::new(AcceptAllFilter);
    /// service.set_connection_filter(filter);
    /// ```
    #[cfg(feature = "connection_filter")]
    pub fn set_connection_filter(&mut self, filter: Arc<dyn ConnectionFilter>) {
        self.connection_filter = filter.clone();
        self.listeners.set_connection_filter(filter);
    }

    #[cfg(not(feature = "connection_filter"))]
    pub fn set_connection_filter(&mut self, _filter: Arc<dyn ConnectionFilter>) {}

    /// Get the [`Listeners`], mostly to add more endpoints.
    pub fn endpoints(&mut self) -> &mut Listeners {
        &mut self.listeners
    }

    // the follow add* function has no effect if the server is already started

    /// Add a TCP listening endpoint with the given address (e.g., `127.0.0.1:8000`).
    pub fn add_tcp(&mut self, addr: &str) {
        self.listeners.add_tcp(addr);
    }

    /// Add a listening endpoint configured by a [`ListenerConfig`].
    pub fn add_listener(&mut self, endpoint: ListenerConfig) {
        self.listeners.add_listener(endpoint);
    }

    /// Add a TCP listening endpoint with the given [`TcpSocketOptions`].
    pub fn add_tcp_with_settings(&mut self, addr: &str, sock_opt: TcpSocketOptions) {
        self.listeners.add_tcp_with_settings(addr, sock_opt);
    }

    /// Add a Unix domain socket listening endpoint with the given path.
    ///
    /// Optionally take a permission of the socket file. The default is read and write access for
    /// everyone (0o666).
    #[cfg(unix)]
    pub fn add_uds(&mut self, addr: &str, perm: Option<Permissions>) {
        self.listeners.add_uds(addr, perm);
    }

    /// Add a TLS listening endpoint with the given certificate and key paths.
    pub fn add_tls(&mut self, addr: &str, cert_path: &str, key_path: &str) -> Result<()> {
        self.listeners.add_tls(addr, cert_path, key_path)
    }

    /// Add a TLS listening endpoint with the given [`TlsSettings`] and [`TcpSocketOptions`].
    pub fn add_tls_with_settings(
        &mut self,
        addr: &str,
        sock_opt: Option<TcpSocketOptions>,
        settings: TlsSettings,
    ) {
        self.listeners
            .add_tls_with_settings(addr, sock_opt, settings)
    }

    /// Add an endpoint according to the given [`ServerAddress`]
    pub fn add_address(&mut self, addr: ServerAddress) {
        self.listeners.add_address(addr);
    }

    /// Get a reference to the application inside this service
    pub fn app_logic(&self) -> Option<&A> {
        self.app_logic.as_ref()
    }

    /// Get a mutable reference to the application inside this service
    pub fn app_logic_mut(&mut self) -> Option<&mut A> {
        self.app_logic.as_mut()
    }
}

tokio::task_local! {
    /// portcullis patch (per-thread accept): the handles of every thread of the service's
    /// runtime, set by `Server::run_service` around `start_service` when that runtime is
    /// one single-threaded runtime per thread (`work_stealing = false`) of more than one
    /// thread; `None` (or unset) otherwise.
    pub(crate) static SERVICE_THREADS: Option<Arc<[tokio::runtime::Handle]>>;
}

/// portcullis patch (per-thread accept): the threads of a service's runtime and how many
/// connections each is serving, so that accepting where a connection arrives does not
/// leave the threads uneven (a burst of connections taken mostly by one thread, say).
pub(crate) struct ThreadLoad {
    handles: Arc<[tokio::runtime::Handle]>,
    open: Box<[OpenCount]>,
}

/// One thread's count of open connections, on a cache line of its own.
#[repr(align(64))]
#[derive(Default)]
struct OpenCount(std::sync::atomic::AtomicUsize);

impl ThreadLoad {
    fn new(handles: Arc<[tokio::runtime::Handle]>) -> Self {
        let open = handles.iter().map(|_| OpenCount::default()).collect();
        Self { handles, open }
    }

    /// The thread to serve a connection accepted on thread `me`: `me`, unless the thread
    /// with the fewest open connections has more than `1 + n / 8` fewer than `me` (`n` its
    /// count). Then the connection goes there, as HAProxy hands a connection to its least
    /// loaded thread; between threads that are even, nothing is handed over.
    fn pick(&self, me: usize) -> usize {
        use std::sync::atomic::Ordering::Relaxed;
        let mine = self.open.get(me).map_or(0, |c| c.0.load(Relaxed));
        let (least, n) = self
            .open
            .iter()
            .enumerate()
            .map(|(i, c)| (i, c.0.load(Relaxed)))
            .min_by_key(|&(_, n)| n)
            .unwrap_or((me, mine));
        if mine > n + 1 + n / 8 {
            least
        } else {
            me
        }
    }
}

/// A connection counted as open on thread `.1` of `.0` while this lives.
struct Open(Arc<ThreadLoad>, usize);

impl Open {
    fn new(load: Arc<ThreadLoad>, thread: usize) -> Self {
        if let Some(c) = load.open.get(thread) {
            c.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Self(load, thread)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(c) = self.0.open.get(self.1) {
            c.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl<A: ServerApp + Send + Sync + 'static> Service<A> {
    pub async fn handle_event(event: Stream, app_logic: Arc<A>, shutdown: ShutdownWatch) {
        debug!("new event!");
        let mut reuse_event = app_logic.process_new(event, &shutdown).await;
        while let Some(event) = reuse_event {
            // TODO: with no steal runtime, consider spawn() the next event on
            // another thread for more evenly load balancing
            debug!("new reusable event!");
            reuse_event = app_logic.process_new(event, &shutdown).await;
        }
    }

    /// The accept loop. `local`: the stack's socket is registered with this thread's
    /// runtime (per-thread accept: the threads' load and this thread's index), and each
    /// connection is served on this thread unless another serves notably fewer
    /// ([`ThreadLoad::pick`]); else each goes to a thread of the service's runtime picked
    /// at random (`current_handle`).
    async fn run_endpoint(
        app_logic: Arc<A>,
        mut stack: TransportStack,
        mut shutdown: ShutdownWatch,
        local: Option<(Arc<ThreadLoad>, usize)>,
    ) {
        // the accept loop, until the system is shutting down
        loop {
            let new_io = tokio::select! { // TODO: consider biased for perf reason?
                new_io = stack.accept() => new_io,
                shutdown_signal = shutdown.changed() => {
                    match shutdown_signal {
                        Ok(()) => {
                            if !*shutdown.borrow() {
                                // happen in the initial read
                                continue;
                            }
                            info!("Shutting down {}", stack.as_str());
                            break;
                        }
                        Err(e) => {
                            error!("shutdown_signal error {e}");
                            break;
                        }
                    }
                }
            };
            match new_io {
                Ok(mut io) => {
                    // portcullis patch (connections from accept): the application counts
                    // the connection, or refuses it, before its handshake; the timeout
                    // of the handshake is the application's.
                    let Some(accepted) = app_logic.accept() else {
                        drop(io);
                        continue;
                    };
                    let app = app_logic.clone();
                    let shutdown = shutdown.clone();
                    // portcullis patch: see UninitializedStream::register_on_this_thread
                    let accepted_on = std::thread::current().id();
                    // portcullis patch: boxed once, here, so that the wrapper below, the
                    // spawn and the task cell move a pointer, not the whole future (the
                    // handshake's and the connection's states, ~1.5 KB) several times.
                    let serve = Box::pin(async move {
                        if let Err(e) = io.register_on_this_thread(accepted_on) {
                            error!("{e}");
                            return;
                        }
                        // portcullis patch (connections from accept): held until the
                        // connection ends
                        let _hold = accepted.hold;
                        let peer_addr = io.peer_addr();
                        match timeout(accepted.handshake_timeout, io.handshake()).await {
                            Ok(handshake) => {
                                match handshake {
                                    Ok(io) => Self::handle_event(io, app, shutdown).await,
                                    // portcullis patch (connections from accept): the
                                    // application logs it (Pingora: one ERROR each)
                                    Err(e) => app.handshake_failed(
                                        peer_addr.as_ref(),
                                        HandshakeFailure::Error(&e),
                                    ),
                                }
                            }
                            Err(_) => {
                                app.handshake_failed(peer_addr.as_ref(), HandshakeFailure::Timeout)
                            }
                        }
                    });
                    match &local {
                        Some((load, me)) => {
                            let to = load.pick(*me);
                            let open = Open::new(load.clone(), to);
                            let serve = async move {
                                let _open = open;
                                serve.await
                            };
                            if to == *me {
                                tokio::spawn(serve);
                            } else {
                                load.handles[to].spawn(serve);
                            }
                        }
                        None => {
                            current_handle().spawn(serve);
                        }
                    }
                }
                Err(e) => {
                    error!("Accept() failed {e}");
                    if let Some(io_error) = e
                        .root_cause()
                        .downcast_ref::<std::io::Error>()
                        .and_then(|e| e.raw_os_error())
                    {
                        // 24: too many open files. In this case accept() will continue return this
                        // error without blocking, which could use up all the resources
                        if io_error == 24 {
                            // call sleep to calm the thread down and wait for others to release
                            // some resources
                            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        }
                    }
                }
            }
        }

        stack.cleanup();
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServiceTrait for Service<A> {
    async fn start_service(
        &mut self,
        #[cfg(unix)] fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
    ) {
        let runtime = current_handle();
        let endpoints = self
            .listeners
            .build(
                #[cfg(unix)]
                fds,
            )
            .await
            .expect("Failed to build listeners");

        let app_logic = self
            .app_logic
            .take()
            .expect("can only start_service() once");
        let app_logic = Arc::new(app_logic);

        let mut handlers = Vec::new();

        // portcullis patch (per-thread accept): under a runtime of one single-threaded
        // runtime per thread, every thread runs its own accept loops, each on a copy of the
        // listening socket registered with its own I/O driver, and serves what it accepts.
        // Otherwise one thread accepts for all and hands each connection to a random
        // thread: a wake-up of that thread and the socket moved between the two drivers
        // (two `epoll_ctl`s) per connection. The detached sockets stay open until every
        // loop has ended, as the stack's socket did.
        let threads = SERVICE_THREADS.try_with(Clone::clone).ok().flatten();
        let mut detached = Vec::new();
        match threads {
            Some(threads) => {
                let load = Arc::new(ThreadLoad::new(threads));
                for endpoint in endpoints {
                    let stack = Arc::new(endpoint.detach().expect("Failed to detach listener"));
                    for (me, thread) in load.handles.iter().enumerate() {
                        for _ in 0..listeners_per_fd {
                            let shutdown = shutdown.clone();
                            let my_app_logic = app_logic.clone();
                            let stack = stack.clone();
                            let local = Some((load.clone(), me));
                            handlers.push(thread.spawn(async move {
                                match stack.stack_here() {
                                    Ok(endpoint) => {
                                        Self::run_endpoint(my_app_logic, endpoint, shutdown, local)
                                            .await
                                    }
                                    Err(e) => error!("Listener {}: {e}", stack.as_str()),
                                }
                            }));
                        }
                    }
                    detached.push(stack);
                }
            }
            None => endpoints.into_iter().for_each(|endpoint| {
                for _ in 0..listeners_per_fd {
                    let shutdown = shutdown.clone();
                    let my_app_logic = app_logic.clone();
                    let endpoint = endpoint.clone();

                    let jh = runtime.spawn(async move {
                        Self::run_endpoint(my_app_logic, endpoint, shutdown, None).await;
                    });

                    handlers.push(jh);
                }
            }),
        }

        futures::future::join_all(handlers).await;
        drop(detached);
        self.listeners.cleanup();
        app_logic.cleanup().await;
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn threads(&self) -> Option<usize> {
        self.threads
    }

    fn runtime_opts_override(&self, global: &RuntimeOpts) -> Option<RuntimeOpts> {
        self.runtime_opts_override
            .as_ref()
            .and_then(|override_fn| override_fn(global))
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        Some(self.listeners.addresses())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    // portcullis patch (per-thread accept): a connection stays on the thread that accepted
    // it unless another thread serves more than 1 + n/8 fewer connections.
    #[test]
    fn thread_load_keeps_connections_local_until_threads_are_uneven() {
        let runtimes: Vec<_> = (0..3)
            .map(|_| {
                tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap()
            })
            .collect();
        let handles: Arc<[_]> = runtimes.iter().map(|r| r.handle().clone()).collect();
        let load = Arc::new(ThreadLoad::new(handles));
        let set = |counts: [usize; 3]| {
            for (c, n) in load.open.iter().zip(counts) {
                c.0.store(n, Relaxed);
            }
        };
        set([0, 0, 0]);
        assert_eq!((load.pick(0), load.pick(1), load.pick(2)), (0, 1, 2));
        set([2, 0, 0]); // 2 > 0 + 1: handed over
        assert_eq!(load.pick(0), 1);
        set([10, 8, 9]); // 10 > 8 + 1 + 1 is false: stays
        assert_eq!(load.pick(0), 0);
        set([11, 8, 9]);
        assert_eq!(load.pick(0), 1);
        assert_eq!(load.pick(2), 2);
        set([100, 90, 95]); // 100 > 90 + 1 + 11 is false
        assert_eq!(load.pick(0), 0);

        // an open connection counts on its thread until it ends
        set([0, 0, 0]);
        let open = Open::new(load.clone(), 2);
        assert_eq!(load.open[2].0.load(Relaxed), 1);
        drop(open);
        assert_eq!(load.open[2].0.load(Relaxed), 0);
    }
}
