//! The systemd notify protocol (`sd_notify(3)`, CONTRACT §16), spoken only when the
//! service manager set `NOTIFY_SOCKET`; without it every call here does nothing.
//!
//! | when | message |
//! |---|---|
//! | the proxy listeners accept (`/readyz` turns 200) | `READY=1` (and `MAINPID=<pid>` in a process started with `-u`) |
//! | a reload (SIGHUP or `POST /reload`) starts | `RELOADING=1` and `MONOTONIC_USEC=<CLOCK_MONOTONIC in µs>` |
//! | it ends, applied or refused | `READY=1` |
//! | draining starts (SIGTERM, a watchdog restart) or SIGINT | `STOPPING=1` |
//! | every `WATCHDOG_USEC / 2`, when `WATCHDOG_USEC` is set for this pid | `WATCHDOG=1` |
//!
//! A SIGQUIT hand-over to a new process sends no `STOPPING=1`: the service is not
//! stopping, the new process carries it on and says so with `MAINPID` (the unit needs
//! `NotifyAccess=all` for systemd to take that from a process other than the main one).
//!
//! Each message is one datagram written to the socket with std's [`UnixDatagram`]: a
//! path, or an abstract address (`@name`). A failed send is logged once and never
//! stops the proxy. The state (the socket, whether `READY=1` names the main pid, whether a
//! failure was logged) is a [`Notifier`], owned by the process's
//! [`Lifecycle`](super::Lifecycle).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

/// The service manager's socket, read from `NOTIFY_SOCKET` once.
#[derive(Debug)]
struct Target {
    socket: UnixDatagram,
    addr: SocketAddr,
}

/// The process's side of the notify protocol: the service manager's socket and what was
/// said on it.
#[derive(Debug, Default)]
pub struct Notifier {
    /// The service manager's socket, read from `NOTIFY_SOCKET` at the first message.
    target: OnceLock<Option<Target>>,
    /// Set in a process started with `-u`: its `READY=1` also says `MAINPID=<pid>`.
    announce_main_pid: AtomicBool,
    /// Only the first failed send is logged (the watchdog pings would repeat it).
    send_failed: AtomicBool,
}

/// The address `NOTIFY_SOCKET` names: an absolute path, or `@name` for an abstract
/// socket. Anything else (systemd's `vsock:` addresses) is not supported.
pub fn socket_addr(value: &OsStr) -> std::io::Result<SocketAddr> {
    let bytes = value.as_bytes();
    match bytes.first() {
        Some(b'/') => SocketAddr::from_pathname(value),
        Some(b'@') => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(&bytes[1..])
        }
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "NOTIFY_SOCKET must be an absolute path or @abstract-name",
        )),
    }
}

impl Notifier {
    fn target(&self) -> Option<&Target> {
        self.target
            .get_or_init(|| {
                let value = std::env::var_os("NOTIFY_SOCKET")?;
                let opened = socket_addr(&value)
                    .and_then(|addr| UnixDatagram::unbound().map(|socket| Target { socket, addr }));
                match opened {
                    Ok(t) => Some(t),
                    Err(e) => {
                        tracing::warn!(
                            event = "notify",
                            notify_socket = %value.to_string_lossy(),
                            error = %e,
                            "NOTIFY_SOCKET unusable; not notifying the service manager"
                        );
                        None
                    }
                }
            })
            .as_ref()
    }

    /// Whether `NOTIFY_SOCKET` names a usable socket.
    pub fn enabled(&self) -> bool {
        self.target().is_some()
    }

    /// Sends `message` (newline-separated `KEY=VALUE` lines) to the service manager.
    /// Returns whether it was sent; false without `NOTIFY_SOCKET`.
    fn send(&self, message: &str) -> bool {
        let Some(t) = self.target() else {
            return false;
        };
        match t.socket.send_to_addr(message.as_bytes(), &t.addr) {
            Ok(_) => true,
            Err(e) => {
                if !self.send_failed.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        event = "notify",
                        error = %e,
                        "cannot write to NOTIFY_SOCKET (logged once)"
                    );
                }
                false
            }
        }
    }

    /// A process started with `-u` takes over the service: its `READY=1` names it the
    /// main process.
    pub fn announce_main_pid_when_ready(&self) {
        self.announce_main_pid.store(true, Ordering::Relaxed);
    }

    /// `READY=1`: the listeners accept, or a reload ended.
    pub fn ready(&self) -> bool {
        if self.announce_main_pid.load(Ordering::Relaxed) {
            self.send(&format!("READY=1\nMAINPID={}\n", std::process::id()))
        } else {
            self.send("READY=1\n")
        }
    }

    /// `RELOADING=1` with the `MONOTONIC_USEC` systemd (253 and later) needs to tell this
    /// reload from an older one.
    pub fn reloading(&self) -> bool {
        if !self.enabled() {
            return false;
        }
        self.send(&format!(
            "RELOADING=1\nMONOTONIC_USEC={}\n",
            monotonic_usec()
        ))
    }

    /// `STOPPING=1`: draining started; the process exits once it is done.
    pub fn stopping(&self) -> bool {
        self.send("STOPPING=1\n")
    }

    /// `WATCHDOG=1`: the process is alive.
    fn watchdog(&self) -> bool {
        self.send("WATCHDOG=1\n")
    }

    /// [`watchdog_interval_of`] from the environment; `None` without `NOTIFY_SOCKET`.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        if !self.enabled() {
            return None;
        }
        let usec = std::env::var("WATCHDOG_USEC").ok();
        let pid = std::env::var("WATCHDOG_PID").ok();
        watchdog_interval_of(usec.as_deref(), pid.as_deref(), std::process::id())
    }
}

/// `CLOCK_MONOTONIC` in microseconds, the clock systemd reads `MONOTONIC_USEC` against.
pub fn monotonic_usec() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let micros = u64::try_from(t.tv_nsec).unwrap_or(0) / 1_000;
    secs.saturating_mul(1_000_000).saturating_add(micros)
}

/// How often to send `WATCHDOG=1`: half of `WATCHDOG_USEC`, when it is set (and not 0)
/// and `WATCHDOG_PID`, if set, is this process. Pure, for tests: the values of the two
/// variables and this pid.
pub fn watchdog_interval_of(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(me) {
            return None;
        }
    }
    Some(Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
}

/// The background service that sends `WATCHDOG=1` every `interval` until shutdown. It
/// runs on a runtime of the server like the other background services, so a process
/// whose runtimes stop turning stops pinging, and systemd restarts it.
pub struct WatchdogPings {
    pub interval: Duration,
    /// The process's lifecycle, whose notifier sends the pings.
    pub lifecycle: std::sync::Arc<super::Lifecycle>,
}

#[async_trait]
impl BackgroundService for WatchdogPings {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tracing::info!(
            event = "notify",
            interval_ms = self.interval.as_millis() as u64,
            "sending WATCHDOG=1 to the service manager"
        );
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    self.lifecycle.notifier.watchdog();
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses() {
        let path = socket_addr(OsStr::new("/run/systemd/notify")).expect("path");
        assert_eq!(
            path.as_pathname(),
            Some(std::path::Path::new("/run/systemd/notify"))
        );
        let abs = socket_addr(OsStr::new("@portcullis/notify")).expect("abstract");
        use std::os::linux::net::SocketAddrExt;
        assert_eq!(abs.as_abstract_name(), Some(&b"portcullis/notify"[..]));
        assert!(socket_addr(OsStr::new("relative.sock")).is_err());
        assert!(socket_addr(OsStr::new("")).is_err());
    }

    #[test]
    fn watchdog_interval_is_half_of_watchdog_usec_for_this_pid() {
        let half = Some(Duration::from_secs(5));
        assert_eq!(watchdog_interval_of(Some("10000000"), None, 42), half);
        assert_eq!(watchdog_interval_of(Some("10000000"), Some("42"), 42), half);
        assert_eq!(watchdog_interval_of(Some("10000000"), Some("41"), 42), None);
        assert_eq!(watchdog_interval_of(Some("10000000"), Some("x"), 42), None);
        assert_eq!(watchdog_interval_of(Some("0"), None, 42), None);
        assert_eq!(watchdog_interval_of(Some("soon"), None, 42), None);
        assert_eq!(watchdog_interval_of(None, Some("42"), 42), None);
    }

    #[test]
    fn monotonic_clock_moves_forward_in_microseconds() {
        let a = monotonic_usec();
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(2) {}
        let b = monotonic_usec();
        assert!(b >= a + 2_000, "{a} {b}");
        assert!(b - a < 10_000_000, "{a} {b}");
    }
}
