//! Minimal Pingora 0.9 passthrough proxy, the baseline for `benches/load/run.sh`.
//!
//! One upstream peer, plain HTTP/1.1, `threads = 2`, no filters, no metrics,
//! no logging: whatever portcullis costs above this is the price of its gates.
//!
//! ```text
//! cargo run --release --example bare_pingora -- 127.0.0.1:18080 127.0.0.1:19001 [threads]
//! ```
//!
//! `BARE_WORK_STEALING=0` runs the service on one single-threaded runtime per
//! thread (Pingora's `work_stealing = false`) instead of one work-stealing runtime.
//!
//! `BARE_TLS=<cert.pem>:<key.pem>` terminates TLS on the listener instead (Mozilla's
//! intermediate settings, ALPN h2 and http/1.1), for `benches/load/tls_h2.sh`'s h2 rows.

use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::upstreams::peer::HttpPeer;
use std::net::SocketAddr;

struct Bare {
    upstream: SocketAddr,
}

impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:18080".into());
    let upstream: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:9001".into())
        .parse()
        .expect("upstream must be host:port (an IP address)");
    let threads: usize = args.next().map_or(2, |t| t.parse().expect("threads"));

    let work_stealing = !matches!(std::env::var("BARE_WORK_STEALING").as_deref(), Ok("0"));
    let conf = ServerConf {
        threads,
        work_stealing,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut proxy = pingora::proxy::http_proxy_service(&server.configuration, Bare { upstream });
    match std::env::var("BARE_TLS") {
        Ok(pair) => {
            let (cert, key) = pair
                .split_once(':')
                .expect("BARE_TLS is <cert.pem>:<key.pem>");
            let mut tls = pingora::listeners::tls::TlsSettings::intermediate(cert, key)
                .expect("BARE_TLS: certificate and key");
            tls.enable_h2();
            proxy.add_tls_with_settings(&listen, None, tls);
        }
        Err(_) => proxy.add_tcp(&listen),
    }
    proxy.threads = Some(threads);
    server.add_service(proxy);
    server.run_forever();
}
