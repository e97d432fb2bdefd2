//! One small HTTP/1.1 client for culling's own requests (the readmission probe
//! and the webhook), on Pingora's connector: timeouts, and TLS later, come from
//! the same machinery as proxied requests.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::upstreams::peer::HttpPeer;

/// Send one request and return the response status. The whole exchange,
/// connect included, is bounded by `timeout`.
pub async fn status_of(
    addr: SocketAddr,
    method: &str,
    path: &str,
    host: &str,
    user_agent: &str,
    body: Option<(&'static str, String)>,
    timeout: Duration,
) -> pingora::Result<u16> {
    timed_status_of(addr, method, path, host, user_agent, body, timeout)
        .await
        .map(|(status, _)| status)
}

/// [`status_of`], with the time from the request sent to the response header read
/// (what the backend took to answer; the connect and the client's setup left out).
pub async fn timed_status_of(
    addr: SocketAddr,
    method: &str,
    path: &str,
    host: &str,
    user_agent: &str,
    body: Option<(&'static str, String)>,
    timeout: Duration,
) -> pingora::Result<(u16, Duration)> {
    let exchange = async {
        let mut peer = HttpPeer::new(addr, false, String::new());
        peer.options.connection_timeout = Some(timeout);
        peer.options.read_timeout = Some(timeout);
        peer.options.write_timeout = Some(timeout);
        let connector = Connector::new(None);
        let (mut session, _) = connector.get_http_session(&peer).await?;
        let mut req = RequestHeader::build(method, path.as_bytes(), None)?;
        req.insert_header("host", host)?;
        req.insert_header("user-agent", user_agent)?;
        req.insert_header("connection", "close")?;
        if let Some((content_type, body)) = &body {
            req.insert_header("content-type", *content_type)?;
            req.insert_header("content-length", body.len())?;
        }
        session.write_request_header(Box::new(req)).await?;
        if let Some((_, body)) = body {
            session
                .write_request_body(Bytes::from(body.into_bytes()), true)
                .await?;
        }
        session.finish_request_body().await?;
        let sent = std::time::Instant::now();
        session.read_response_header().await?;
        let took = sent.elapsed();
        let status = session.response_header().map(|r| r.status.as_u16());
        session.shutdown().await;
        status.map(|s| (s, took)).ok_or_else(|| {
            pingora::Error::explain(pingora::ErrorType::InvalidHTTPHeader, "no response header")
        })
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => pingora::Error::e_explain(pingora::ErrorType::ReadTimedout, "request timed out"),
    }
}
