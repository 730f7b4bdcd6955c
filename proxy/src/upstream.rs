//! HTTP/1.1 connections to upstreams, pooled per serving thread.
//!
//! Built on hyper's connection API rather than hyper-util's pooled client because that client
//! locks a shared pool and spawns a task per request to learn when the connection is idle again;
//! here a serving thread owns its pool (the lock is never contended) and a connection goes back
//! to it when the response body ends, which [`PooledBody`] observes. A request that could not be
//! sent on a reused connection (the upstream closed it meanwhile) is retried on another one; a
//! request that was sent is never retried.
//!
//! An upstream's most recently returned connection stays idle for up to the pool's idle timeout,
//! the others (a burst's) for up to [`SURPLUS_IDLE_TIMEOUT`]; a sweep every second closes the
//! expired ones, and forgets the entry of an upstream nobody asks for anymore. An idle
//! connection holds hyper's read and write buffers and the channel its requests go through, so
//! a burst's surplus is not kept long.
//!
//! A thread has at most [`MAX_CONNECTING_PER_UPSTREAM`] new connections to one upstream that have
//! not answered yet; a request that finds neither an idle connection nor a free slot waits for
//! either. Without that, a burst of clients makes as many connections at once and overflows the
//! upstream's accept queue (128 for Jupyter's tornado, as for most servers): the kernel drops the
//! SYNs that do not fit, and each is sent again only a second later. A slot is held until the
//! connection's first response head, not until it is connected: the kernel completes a connect
//! as soon as the handshake is done, while the connection may still wait in the accept queue, so
//! a burst would still overflow a busy upstream's queue that way (a handshake's last packet
//! dropped, its request sent again after the retransmission timeout); a slow first response
//! holds its slot for at most [`SLOT_HELD_FOR_ANSWER`]. Waiting counts towards the connect
//! timeout: behind connects to an address that drops SYNs (a stopped pod's), a request gets its
//! 503 within the timeout, not after its turn at the slots.

use crate::FastMap;
use crate::heap_release::HeapRelease;
use crate::server::PacedBody;
use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

/// How long getting a connection may take, unless configured: waiting for a slot and connecting
/// (a stopped notebook's address may not answer at all). Requests themselves have no timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle connections kept per upstream address.
const MAX_IDLE_PER_UPSTREAM: usize = 512;
/// New connections to one upstream address a serving thread may have that have not answered yet
/// (being opened, or waiting to be accepted): with one thread per core, well inside the usual
/// accept queue of 128.
pub const MAX_CONNECTING_PER_UPSTREAM: usize = 16;
/// How long a new connection's first request may hold its connecting slot while the upstream has
/// not answered. A queued connection is accepted within milliseconds when the upstream is merely
/// busy; a first request unanswered for longer is a slow one (a notebook saving a large file), and
/// the requests waiting behind it would otherwise get their 503 at the connect timeout.
pub const SLOT_HELD_FOR_ANSWER: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("connecting to {address}")]
    Connect {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP/1.1 handshake with {address}")]
    Handshake {
        address: String,
        #[source]
        source: hyper::Error,
    },
    #[error("request to {address}")]
    Request {
        address: String,
        #[source]
        source: hyper::Error,
    },
}

impl UpstreamError {
    /// The upstream could not be reached at all (refused, unreachable, timed out).
    pub fn is_connect(&self) -> bool {
        matches!(self, UpstreamError::Connect { .. })
    }
}

/// How long a pooled connection may stay idle, unless configured: hyper-util's default. Jupyter
/// keeps idle connections for an hour, so without it a burst's connections would stay as long.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long an upstream's idle connections other than its most recently returned one may stay
/// idle (at most the idle timeout). Requests take the most recently returned connection first, so
/// the others stay idle only when fewer requests are in flight than when they were opened: a
/// burst ended. A browser opens up to six connections to a notebook for a page, and each keeps
/// its buffers while idle, so with the idle timeout alone a proxy in front of many notebooks would
/// hold five idle ones per notebook and thread for the whole idle timeout. Not much shorter:
/// under load whose peaks come seconds apart, connections closed between peaks would be opened
/// again at the next one, which adds to those requests' latency.
pub const SURPLUS_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections by upstream address.
pub struct UpstreamPool {
    upstreams: Mutex<FastMap<Arc<str>, Upstream>>,
    idle_timeout: Duration,
    /// [`SURPLUS_IDLE_TIMEOUT`], or the idle timeout when that is shorter.
    surplus_idle_timeout: Duration,
    connect_timeout: Duration,
    /// Counts the connections, whose buffers are freed when they close.
    heap: Arc<HeapRelease>,
}

/// One upstream address's connections.
struct Upstream {
    /// The address, this pool's own copy: what its requests and connections hold of it, and so
    /// the reference count only this thread touches.
    address: Arc<str>,
    idle: Vec<Idle>,
    /// Connections being opened now.
    connecting: usize,
    /// Requests waiting for an idle connection or a free connecting slot.
    ready: Arc<Notify>,
}

struct Idle {
    sender: SendRequest<PacedBody>,
    since: Instant,
}

/// What a request gets from the pool.
enum Lease {
    Idle(SendRequest<PacedBody>),
    /// A connecting slot, taken: open a new connection, and free the slot ([`Connecting`]).
    Connect,
    /// Neither: wait for this (already registered), then ask again.
    Wait(Pin<Box<OwnedNotified>>),
}

impl Upstream {
    fn new(address: Arc<str>) -> Self {
        Self {
            address,
            idle: Vec::new(),
            connecting: 0,
            ready: Arc::default(),
        }
    }

    /// Closed idle connections are dropped, busy ones stay. Expired ones are left to the sweep
    /// ([`UpstreamPool::close_expired`]): a request takes the most recently returned connection,
    /// which has not expired, and reading the clock to tell cost every request.
    fn lease(&mut self) -> Lease {
        // From the most recently returned one, which is nearly always ready: a request looks at
        // one or two entries, not all of them.
        let mut at = self.idle.len();
        while at > 0 {
            at -= 1;
            if self.idle[at].sender.is_closed() {
                self.idle.swap_remove(at);
            } else if self.idle[at].sender.is_ready() {
                return Lease::Idle(self.idle.swap_remove(at).sender);
            }
        }
        if self.connecting < MAX_CONNECTING_PER_UPSTREAM {
            self.connecting += 1;
            return Lease::Connect;
        }
        // Registered while the pool is locked, as every notification is sent: a connection
        // put back or a slot freed after this wakes it, and each wakes one waiting request.
        let mut waiting = Box::pin(self.ready.clone().notified_owned());
        waiting.as_mut().enable();
        Lease::Wait(waiting)
    }
}

/// A connecting slot; dropping it frees the slot and wakes one waiting request.
struct Connecting {
    pool: Arc<UpstreamPool>,
    address: Arc<str>,
}

impl Drop for Connecting {
    fn drop(&mut self) {
        let mut upstreams = self.pool.lock();
        if let Some(upstream) = upstreams.get_mut(&self.address) {
            upstream.connecting -= 1;
            upstream.ready.notify_one();
        }
    }
}

impl Idle {
    fn is_usable(&self, now: Instant, timeout: Duration) -> bool {
        !self.sender.is_closed() && now.duration_since(self.since) < timeout
    }
}

impl Upstream {
    /// Closes the connections idle for longer than their timeout: `idle_timeout` for the most
    /// recently returned one (the next request after a pause takes it), `surplus_idle_timeout`
    /// for the others.
    fn close_expired(&mut self, now: Instant, idle_timeout: Duration, surplus: Duration) {
        let newest = (0..self.idle.len()).max_by_key(|&i| self.idle[i].since);
        let mut at = 0;
        self.idle.retain(|idle| {
            let timeout = if Some(at) == newest {
                idle_timeout
            } else {
                surplus
            };
            at += 1;
            idle.is_usable(now, timeout)
        });
    }
}

impl UpstreamPool {
    pub fn new(idle_timeout: Duration, connect_timeout: Duration, heap: Arc<HeapRelease>) -> Self {
        Self {
            upstreams: Mutex::default(),
            idle_timeout,
            surplus_idle_timeout: SURPLUS_IDLE_TIMEOUT.min(idle_timeout),
            connect_timeout,
            heap,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FastMap<Arc<str>, Upstream>> {
        self.upstreams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes expired connections every second (every half surplus idle timeout when that is
    /// shorter), forever: spawned on the serving thread's runtime, it ends with it.
    pub async fn close_expired_forever(self: Arc<Self>) {
        let period = (self.surplus_idle_timeout / 2)
            .min(Duration::from_secs(1))
            .max(Duration::from_millis(10));
        let mut sweep = tokio::time::interval(period);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            sweep.tick().await;
            self.close_expired();
        }
    }

    /// Closes connections idle for longer than their timeout, and forgets upstreams left without
    /// any and with nobody connecting or waiting.
    fn close_expired(&self) {
        let now = Instant::now();
        self.lock().retain(|_, upstream| {
            upstream.close_expired(now, self.idle_timeout, self.surplus_idle_timeout);
            !upstream.idle.is_empty()
                || upstream.connecting > 0
                || Arc::strong_count(&upstream.ready) > 1
        });
    }

    /// Sends `request` to `address` (`host:port`) on an idle connection or a new one.
    pub async fn send(
        self: Arc<Self>,
        address: &str,
        mut request: Request<PacedBody>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        // Set when the request first has to wait: from then on it has the connect timeout.
        let mut deadline = None;
        loop {
            let (address, lease) = self.lease(address);
            match lease {
                Lease::Idle(mut sender) => match sender.try_send_request(request).await {
                    Ok(response) => return Ok(self.wrap(&address, sender, response)),
                    Err(mut error) => match error.take_message() {
                        // Not sent (the connection closed meanwhile): another connection may
                        // take it.
                        Some(unsent) => request = unsent,
                        None => {
                            return Err(UpstreamError::Request {
                                address: address.to_string(),
                                source: error.into_error(),
                            });
                        }
                    },
                },
                // Boxed, as is waiting: both are rare, and inline their futures (a connect, a
                // timer) would be part of every request's, which is moved whole as it starts.
                Lease::Connect => {
                    let deadline =
                        deadline.unwrap_or_else(|| Instant::now() + self.connect_timeout);
                    let connected =
                        Box::pin(self.clone().connect_and_send(address, request, deadline));
                    return connected.await;
                }
                Lease::Wait(waiting) => {
                    let deadline =
                        *deadline.get_or_insert_with(|| Instant::now() + self.connect_timeout);
                    let woken = Box::pin(tokio::time::timeout_at(deadline.into(), waiting));
                    if woken.await.is_err() {
                        return Err(timed_out(&address));
                    }
                }
            }
        }
    }

    /// Opens a connection to `address` in a connecting slot (taken) by `deadline` and sends
    /// `request` on it.
    async fn connect_and_send(
        self: Arc<Self>,
        address: Arc<str>,
        request: Request<PacedBody>,
        deadline: Instant,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        let slot = Connecting {
            pool: self.clone(),
            address: address.clone(),
        };
        let mut sender = tokio::time::timeout_at(deadline.into(), self.connect(&address))
            .await
            .unwrap_or_else(|_| Err(timed_out(&address)))?;
        // The slot is held until the upstream has answered on the connection, not just until it
        // connected: the kernel completes a connect before the upstream accepts it, so slots
        // freed then let a burst fill the upstream's accept queue all the same. But not for
        // longer than SLOT_HELD_FOR_ANSWER (see the module doc).
        let mut sending = std::pin::pin!(sender.send_request(request));
        let answered = tokio::time::timeout(SLOT_HELD_FOR_ANSWER, sending.as_mut()).await;
        drop(slot);
        let response = match answered {
            Ok(answered) => answered,
            Err(_) => sending.await,
        }
        .map_err(|source| UpstreamError::Request {
            address: address.to_string(),
            source,
        })?;
        Ok(self.wrap(&address, sender, response))
    }

    /// An idle connection ready for a request, else a slot to open one, else something to wait
    /// on; with this pool's copy of the address.
    fn lease(&self, address: &str) -> (Arc<str>, Lease) {
        with_upstream(&mut self.lock(), address, |upstream| {
            let lease = upstream.lease();
            (upstream.address.clone(), lease)
        })
    }

    fn put_back(&self, address: Arc<str>, sender: SendRequest<PacedBody>) {
        if sender.is_closed() {
            return;
        }
        with_upstream(&mut self.lock(), &address, |upstream| {
            if upstream.idle.len() < MAX_IDLE_PER_UPSTREAM {
                upstream.idle.push(Idle {
                    sender,
                    since: Instant::now(),
                });
                upstream.ready.notify_one();
            }
        });
    }

    async fn connect(&self, address: &str) -> Result<SendRequest<PacedBody>, UpstreamError> {
        let connect_error = |source| UpstreamError::Connect {
            address: address.to_owned(),
            source,
        };
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .map_err(connect_error)?;
        configure_socket(&stream);
        let (sender, connection) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|source| UpstreamError::Handshake {
                address: address.to_owned(),
                source,
            })?;
        // The connection lives in its own task until either side closes it; an upgraded one
        // (websocket) is handed over through `hyper::upgrade::on`.
        let open = self.heap.open_connection();
        tokio::spawn(async move {
            if let Err(error) = connection.with_upgrades().await {
                tracing::debug!(%error, "upstream connection");
            }
            drop(open);
        });
        Ok(sender)
    }

    fn wrap(
        self: &Arc<Self>,
        address: &Arc<str>,
        sender: SendRequest<PacedBody>,
        response: Response<Incoming>,
    ) -> Response<PooledBody> {
        // An upgraded connection belongs to its tunnel, never to the pool.
        let back = (response.status() != StatusCode::SWITCHING_PROTOCOLS)
            .then(|| (self.clone(), address.clone(), sender));
        response.map(|inner| PooledBody {
            inner,
            back,
            deadline: None,
        })
    }
}

/// `f` on the entry for `address`, made when there is none.
fn with_upstream<R>(
    upstreams: &mut FastMap<Arc<str>, Upstream>,
    address: &str,
    f: impl FnOnce(&mut Upstream) -> R,
) -> R {
    // Looked up by `&str`: only a new entry needs a copy of the address.
    match upstreams.get_mut(address) {
        Some(upstream) => f(upstream),
        None => {
            let address: Arc<str> = address.into();
            f(upstreams
                .entry(address.clone())
                .or_insert_with(|| Upstream::new(address)))
        }
    }
}

fn timed_out(address: &str) -> UpstreamError {
    UpstreamError::Connect {
        address: address.to_owned(),
        source: std::io::ErrorKind::TimedOut.into(),
    }
}

/// Keepalive probes after a minute of silence, then every 10 s, three unanswered ones end the
/// connection: an upstream that vanished without a FIN (a killed pod, a host gone) under an idle
/// websocket is found in about 90 s instead of the system's 75 s × 9 probes (some 12 minutes),
/// and its client gets a close.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 3;

fn configure_socket(stream: &tokio::net::TcpStream) {
    let _ = stream.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive);
}

/// An upstream response body that returns its connection to the pool once it has ended.
pub struct PooledBody {
    inner: Incoming,
    back: Option<(Arc<UpstreamPool>, Arc<str>, SendRequest<PacedBody>)>,
    /// When the body must have ended (a route's timeout); boxed, since few routes have one.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl PooledBody {
    /// A body from a connection of no pool's (a notebook port's).
    pub fn unpooled(inner: Incoming) -> Self {
        Self {
            inner,
            back: None,
            deadline: None,
        }
    }
}

/// Why a response body could not be streamed whole.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("reading the upstream's response body")]
    Upstream(#[source] hyper::Error),
    #[error("the route's timeout passed before the response was received whole")]
    TimedOut,
}

impl PooledBody {
    /// The body, failing at `deadline` unless it has ended by then.
    pub fn until(mut self, deadline: tokio::time::Instant) -> Self {
        self.deadline = Some(Box::pin(tokio::time::sleep_until(deadline)));
        self
    }

    fn release(&mut self) {
        if let Some((pool, address, sender)) = self.back.take() {
            pool.put_back(address, sender);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        // Before the body, so that one always ready (a fast download) is cut at the deadline too.
        if let Some(deadline) = &mut self.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            // Half read: the connection is closed with the body, not reused.
            self.back = None;
            return Poll::Ready(Some(Err(BodyError::TimedOut)));
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.release(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.release(),
            // A failed body leaves the connection in an unknown state: it is not reused.
            Poll::Ready(Some(Err(_))) => self.back = None,
            _ => {}
        }
        polled.map_err(BodyError::Upstream)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // Bodies that are empty from the start (204, 304, HEAD) are never polled.
        if self.inner.is_end_stream() {
            self.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn upstream_sockets_probe_a_silent_peer_within_about_ninety_seconds() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        configure_socket(&stream);
        let socket = socket2::SockRef::from(&stream);
        assert!(socket.keepalive().unwrap());
        assert!(socket.tcp_nodelay().unwrap());
        let idle = socket.tcp_keepalive_time().unwrap();
        let interval = socket.tcp_keepalive_interval().unwrap();
        let probes = socket.tcp_keepalive_retries().unwrap();
        assert_eq!(
            (idle, interval, probes),
            (KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, 3)
        );
        assert!(idle + interval * probes <= Duration::from_secs(90));
    }
}
