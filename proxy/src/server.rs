//! Accepting connections: HTTP/1.1 and HTTP/2 (prior knowledge on plain TCP, ALPN under TLS) on
//! a listener, with upgrades enabled, a task per connection, and rustls when configured. Each
//! serving thread runs one of these loops on its own listener (see [`crate::start`]).
//!
//! A client may not hold a connection by sending nothing, or by trickling a request head: a
//! connection that completed no request head and had none in flight for a whole
//! [`DEFAULT_REQUEST_HEAD_TIMEOUT`] is asked to shut down, and closed after another one if it
//! did not ([`serve_unless_stalled`]). hyper's own header read timeout does the same with a
//! boxed timer armed and cleared for every request, a noticeable share of a request's cost; this
//! is one timer per connection that fires once per period.

use crate::forward::{Forwarder, Peer};
use crate::heap_release::HeapRelease;
use bytes::Bytes;
use futures::FutureExt as _;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use prometheus_client::metrics::counter::Counter;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;

/// Certificate chain and private key, PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading PEM from {}", path.display())]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("building the TLS server configuration")]
    Config(#[source] rustls::Error),
}

/// A TLS acceptor (rustls with the process's crypto provider, ring) offering h2 and http/1.1.
pub fn tls_acceptor(files: &TlsFiles) -> Result<TlsAcceptor, TlsError> {
    fn pem(path: &Path) -> impl Fn(rustls::pki_types::pem::Error) -> TlsError + '_ {
        move |source| TlsError::Pem {
            path: path.to_owned(),
            source,
        }
    }
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .map_err(pem(&files.cert))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem(&files.cert))?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(pem(&files.key))?;
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(TlsError::Config)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// How long a connection may go without completing a request head while none is in flight,
/// unless configured.
pub const DEFAULT_REQUEST_HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Client connections served at once unless configured: each holds two descriptors (client and
/// upstream) and its buffers, and an unbounded number lets one client exhaust either.
pub const DEFAULT_MAX_CONNECTIONS: u64 = 10_000;

/// What a connection over the cap is told before it is closed.
const TOO_MANY_CONNECTIONS: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
Content-Type: text/plain; charset=utf-8\r\nContent-Length: 54\r\nConnection: close\r\n\
Retry-After: 1\r\n\r\n\
The proxy serves too many connections; try again soon.";

/// How fast a request body must arrive, as Apache's mod_reqtimeout `body=60,MinRate=1024`: it
/// may take `grace`, and each byte received extends that by `1/min_rate` s. A client trickling a
/// body cannot hold its connection (and an upstream connection) for longer; an upload at any
/// usable speed is never cut. Bodies are only paced while the upstream reads them, so an
/// upstream that is slow to read does not count against its client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyPace {
    pub grace: Duration,
    /// Bytes per second, at least 1.
    pub min_rate: u64,
}

impl Default for BodyPace {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(60),
            min_rate: 1024,
        }
    }
}

/// A request body held to a [`BodyPace`]: what the upstream gets.
pub struct PacedBody {
    body: Incoming,
    /// `None` for a body that was empty from the start (most requests): no timer.
    pacing: Option<Box<Pacing>>,
}

struct Pacing {
    timer: Pin<Box<tokio::time::Sleep>>,
    min_rate: u64,
    too_slow: Counter,
}

/// Why a request body was not passed on whole.
#[derive(Debug, thiserror::Error)]
pub enum RequestBodyError {
    #[error("reading the client's request body")]
    Client(#[source] hyper::Error),
    #[error("the client's request body came slower than the minimum rate")]
    TooSlow,
}

impl PacedBody {
    pub fn new(body: Incoming, pace: BodyPace, too_slow: &Counter) -> Self {
        let pacing = (!body.is_end_stream()).then(|| {
            Box::new(Pacing {
                timer: Box::pin(tokio::time::sleep(pace.grace)),
                min_rate: pace.min_rate.max(1),
                too_slow: too_slow.clone(),
            })
        });
        Self { body, pacing }
    }
}

impl Body for PacedBody {
    type Data = Bytes;
    type Error = RequestBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(pacing), Some(data)) = (&mut this.pacing, frame.data_ref()) {
                    let nanos = (data.len() as u64).saturating_mul(1_000_000_000) / pacing.min_rate;
                    let later = pacing.timer.deadline() + Duration::from_nanos(nanos);
                    pacing.timer.as_mut().reset(later);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                Poll::Ready(Some(Err(RequestBodyError::Client(error))))
            }
            Poll::Ready(None) => {
                this.pacing = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if let Some(pacing) = &mut this.pacing
                    && pacing.timer.as_mut().poll(cx).is_ready()
                {
                    pacing.too_slow.inc();
                    this.pacing = None;
                    return Poll::Ready(Some(Err(RequestBodyError::TooSlow)));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Tells a plain-text client over the cap so (a TLS client's connection is just closed: a
/// handshake is what the cap saves), then closes.
fn refuse_connection(stream: tokio::net::TcpStream, tls: bool) {
    if tls {
        return;
    }
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt as _;
        let mut stream = stream;
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            stream.write_all(TOO_MANY_CONNECTIONS).await?;
            stream.shutdown().await
        })
        .await;
    });
}

/// Serves `listener` forever, one task per connection (each counted by `heap`), and closes this
/// thread's expired upstream connections as it goes.
pub async fn serve(
    listener: TcpListener,
    forwarder: Arc<Forwarder>,
    tls: Option<TlsAcceptor>,
    heap: Arc<HeapRelease>,
    request_head_timeout: Duration,
    max_connections: usize,
) {
    let max_connections = i64::try_from(max_connections).unwrap_or(i64::MAX);
    tokio::spawn(forwarder.upstreams().clone().close_expired_forever());
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of descriptors, most likely: wait instead of spinning.
                tracing::warn!(error = %err, "accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let metrics = forwarder.metrics();
        // The open count is shared by every thread, so the cap holds for the whole proxy.
        if metrics.connections_open.inc() >= max_connections {
            metrics.connections_open.dec();
            metrics.connections_refused.inc();
            tracing::debug!(%peer, "refused: too many connections");
            refuse_connection(stream, tls.is_some());
            continue;
        }
        let forwarder = forwarder.clone();
        let connections = forwarder.metrics().connections_open.clone();
        let open = heap.open_connection();
        let builder = builder.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let is_tls = tls.is_some();
            let client = Arc::new(Peer::new(peer));
            let progress = Arc::new(Progress::default());
            let counted = progress.clone();
            // `map`, not an async block awaiting it: that would hold the future twice.
            let service = service_fn(move |request| {
                let in_flight = counted.request_started();
                forwarder
                    .handle(request, client.clone(), is_tls)
                    .map(move |response| {
                        Ok::<_, Infallible>(response.map(|body| InFlightBody {
                            body,
                            _in_flight: in_flight,
                        }))
                    })
            });
            // One connection type for both, so that one serving path drives them.
            let io = match tls {
                Some(acceptor) => {
                    match opening(&stream, request_head_timeout).await {
                        Opening::TlsHandshake => {}
                        Opening::PlainText => {
                            redirect_to_https(stream, request_head_timeout).await;
                            connections.dec();
                            return;
                        }
                        Opening::Nothing => {
                            connections.dec();
                            return;
                        }
                    }
                    // A handshake begun and never finished holds no connection for longer than
                    // a request head may take.
                    let handshake =
                        tokio::time::timeout(request_head_timeout, acceptor.accept(stream)).await;
                    match handshake {
                        Ok(Ok(stream)) => Either::Left(stream),
                        Ok(Err(err)) => {
                            tracing::debug!(%peer, error = %err, "TLS handshake");
                            connections.dec();
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake not finished in time");
                            connections.dec();
                            return;
                        }
                    }
                }
                None => Either::Right(stream),
            };
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
            let served = serve_unless_stalled(
                connection,
                |c| c.graceful_shutdown(),
                &progress,
                request_head_timeout,
            )
            .await;
            match served {
                Some(Ok(())) => {}
                Some(Err(err)) => tracing::debug!(%peer, error = %err, "connection"),
                None => tracing::debug!(%peer, "closed: no complete request head in time"),
            }
            connections.dec();
            drop(open);
        });
    }
}

/// How a connection to a TLS listener begins.
enum Opening {
    /// A TLS record of type handshake (a ClientHello).
    TlsHandshake,
    /// Anything else: a plain HTTP request, most likely.
    PlainText,
    /// Nothing within the request head timeout, or the connection closed.
    Nothing,
}

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

async fn opening(stream: &tokio::net::TcpStream, timeout: Duration) -> Opening {
    let mut first = [0u8; 1];
    match tokio::time::timeout(timeout, stream.peek(&mut first)).await {
        Ok(Ok(1..)) if first[0] == TLS_HANDSHAKE_RECORD => Opening::TlsHandshake,
        Ok(Ok(1..)) => Opening::PlainText,
        _ => Opening::Nothing,
    }
}

/// Answers plain HTTP sent to a TLS listener (someone typed `http://`) with the same URL over
/// HTTPS, one request and done.
async fn redirect_to_https(stream: tokio::net::TcpStream, timeout: Duration) {
    let service = service_fn(|request: hyper::Request<Incoming>| async move {
        Ok::<_, Infallible>(https_redirect(&request))
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(timeout, connection).await;
}

/// The answer to `request`, sent in plain HTTP to a TLS listener: a temporary redirect to the
/// same host and path over HTTPS. Temporary, because browsers keep permanent redirects long
/// after the address stopped serving TLS.
pub fn https_redirect<B>(
    request: &hyper::Request<B>,
) -> hyper::Response<http_body_util::Full<Bytes>> {
    use hyper::header;
    let authority = request
        .headers()
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
        .filter(|host| !host.contains('@'))
        .and_then(|host| host.parse::<hyper::http::uri::Authority>().ok())
        .filter(|authority| !authority.host().is_empty());
    let response = hyper::Response::builder()
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .header(header::CONNECTION, "close");
    let answer = match authority {
        Some(authority) => {
            let path = request
                .uri()
                .path_and_query()
                .map_or("/", |path| path.as_str());
            let location = format!("https://{authority}{path}");
            response
                .status(hyper::StatusCode::TEMPORARY_REDIRECT)
                .header(header::LOCATION, &location)
                .body(format!("This address serves HTTPS: {location}\n"))
        }
        None => response
            .status(hyper::StatusCode::BAD_REQUEST)
            .body("This address serves HTTPS; plain HTTP came without a valid Host.\n".to_owned()),
    };
    answer
        .map(|response| response.map(|body| http_body_util::Full::new(Bytes::from(body))))
        .unwrap_or_else(|_| {
            let mut failed = hyper::Response::new(http_body_util::Full::default());
            *failed.status_mut() = hyper::StatusCode::BAD_REQUEST;
            failed
        })
}

/// What a connection's requests have done, for [`serve_unless_stalled`]: written and read on
/// the connection's own thread, so the counters never move between cores.
#[derive(Debug, Default)]
struct Progress {
    /// Request heads received.
    heads: AtomicU64,
    /// Requests whose response has not been sent whole yet (HTTP/2 may have several).
    in_flight: AtomicU64,
}

impl Progress {
    fn request_started(self: &Arc<Self>) -> InFlight {
        self.heads.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }
}

/// A request until its response body is sent or dropped.
struct InFlight(Arc<Progress>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request in flight until hyper has sent it (or dropped it).
struct InFlightBody<B> {
    body: B,
    _in_flight: InFlight,
}

impl<B: Body<Data = Bytes> + Unpin> Body for InFlightBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Drives `connection` to its end, unless it completes no request head and has none in flight
/// for a whole `timeout`: then it is shut down gracefully (an idle HTTP/1.1 connection closes at
/// once, HTTP/2 gets a GOAWAY), and dropped, which closes it, if it is still stalled a `timeout`
/// later (a client trickling a head). `None` when it was dropped.
///
/// The timer is polled only when it has fired: once registered it wakes the connection's task
/// itself, and polling it on every wake-up (a `select!`) would add work to every request.
async fn serve_unless_stalled<C: Future>(
    connection: C,
    shut_down: impl Fn(Pin<&mut C>),
    progress: &Progress,
    timeout: Duration,
) -> Option<C::Output> {
    let mut connection = std::pin::pin!(connection);
    let mut timer = std::pin::pin!(tokio::time::sleep(timeout));
    let mut armed = false;
    let mut heads_seen = 0;
    let mut shutting_down = false;
    std::future::poll_fn(|cx| {
        loop {
            if let Poll::Ready(served) = connection.as_mut().poll(cx) {
                return Poll::Ready(Some(served));
            }
            if armed && !timer.is_elapsed() {
                return Poll::Pending;
            }
            if timer.as_mut().poll(cx).is_pending() {
                armed = true;
                return Poll::Pending;
            }
            let heads = progress.heads.load(Ordering::Relaxed);
            let stalled = heads == heads_seen && progress.in_flight.load(Ordering::Relaxed) == 0;
            heads_seen = heads;
            match (stalled, shutting_down) {
                (false, _) => shutting_down = false,
                (true, false) => {
                    shut_down(connection.as_mut());
                    shutting_down = true;
                }
                (true, true) => return Poll::Ready(None),
            }
            // Another period: the connection is polled again (a shutdown may end it at once)
            // and the timer registered for the new deadline.
            timer.as_mut().reset(tokio::time::Instant::now() + timeout);
            armed = false;
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(host: Option<&str>, target: &str) -> hyper::Request<()> {
        let mut request = hyper::Request::get(target);
        if let Some(host) = host {
            request = request.header(hyper::header::HOST, host);
        }
        request.body(()).unwrap()
    }

    #[test]
    fn plain_http_to_a_tls_listener_is_sent_to_the_same_url_over_https() {
        let response = https_redirect(&plain(
            Some("lab--alice.localhost:8443"),
            "/notebook/alice/lab/tree?x=1",
        ));
        assert_eq!(response.status(), 307);
        assert_eq!(
            response.headers()["location"],
            "https://lab--alice.localhost:8443/notebook/alice/lab/tree?x=1"
        );
        let root = https_redirect(&plain(Some("lab.example.com"), "/"));
        assert_eq!(root.headers()["location"], "https://lab.example.com/");
    }

    #[test]
    fn a_plain_request_without_a_usable_host_is_refused_not_redirected() {
        for host in [
            None,
            Some(""),
            Some("evil.example@lab.example.com"),
            Some("a b"),
        ] {
            let response = https_redirect(&plain(host, "/"));
            assert_eq!(response.status(), 400, "{host:?}");
            assert!(response.headers().get("location").is_none());
        }
    }
}
