//! The proxy's connections: upstream pooling and its bounds under bursts, timeouts for slow
//! clients and upstreams, memory given back, TLS and HTTP/2, and error pages.

use crate::init_crypto;
use crate::proxy::{CountingUpstream, Upstream, get_as, metric, raw_get};
use crate::proxy::{EchoServer, assert_closed_to_try_again_later, slow_upstream, websocket_as};
use crate::support::proxy::{
    ALICE, notebook_vs, options, proxy_for_alice_lab, service_authority, start_proxy,
};
use futures::{SinkExt, StreamExt};
use labforge_proxy::{ProxyOptions, RoutesFrom, RunningProxy};
use labforge_tests::eventually;
use serde_json::Value;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

/// One client of alice's (its connections to the proxy reused) getting her notebook's `x`.
pub(super) struct AliceClient {
    http: reqwest::Client,
    url: String,
}

impl AliceClient {
    fn new(proxy: SocketAddr) -> Self {
        Self {
            http: reqwest::Client::new(),
            url: format!("http://{proxy}/notebook/alice/lab/x"),
        }
    }

    /// Status and body.
    async fn get(&self) -> (u16, String) {
        let response = get_as(&self.http, &self.url, ALICE).await;
        (response.status().as_u16(), response.text().await.unwrap())
    }
}

/// Requests in a row share one pooled upstream connection; once it has been idle for longer than
/// the pool's idle timeout the proxy closes it, and the next request opens a new one.
#[tokio::test]
pub(super) async fn pooled_upstream_connections_are_reused_and_closed_once_idle_too_long() {
    let upstream = CountingUpstream::start().await;
    let proxy = proxy_for_alice_lab(upstream.addr, |options| ProxyOptions {
        threads: 1,
        upstream_idle_timeout: Duration::from_millis(400),
        ..options
    })
    .await;
    let alice = AliceClient::new(proxy.addr);
    for _ in 0..3 {
        assert_eq!(alice.get().await, (200, "ok".to_owned()));
    }
    assert_eq!(
        upstream.accepted.load(Ordering::SeqCst),
        1,
        "one connection, reused"
    );
    assert_eq!(upstream.open.load(Ordering::SeqCst), 1);

    eventually(
        "the idle upstream connection closed",
        Duration::from_secs(5),
        || async { (upstream.open.load(Ordering::SeqCst) == 0).then_some(()) },
    )
    .await;
    assert_eq!(alice.get().await, (200, "ok".to_owned()));
    assert_eq!(
        upstream.accepted.load(Ordering::SeqCst),
        2,
        "a new connection"
    );
}

/// After a burst, the pool keeps one idle connection to the upstream for the idle timeout and
/// closes the burst's others once idle for the surplus timeout; the next request reuses the kept
/// one.
#[tokio::test]
pub(super) async fn a_bursts_surplus_upstream_connections_close_soon_and_the_last_one_stays() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = CountingUpstream::serve_after(listener, Duration::from_millis(300));
    let proxy = proxy_for_alice_lab(upstream.addr, |options| ProxyOptions {
        threads: 1,
        upstream_idle_timeout: Duration::from_secs(60),
        ..options
    })
    .await;
    let alice = AliceClient::new(proxy.addr);
    let burst = futures::future::join_all((0..4).map(|_| alice.get())).await;
    assert!(burst.iter().all(|answer| *answer == (200, "ok".to_owned())));
    assert_eq!(
        upstream.accepted.load(Ordering::SeqCst),
        4,
        "four requests in flight at once, four connections"
    );
    let idle_since = Instant::now();

    eventually(
        "the burst's surplus connections closed",
        Duration::from_secs(20),
        || async { (upstream.open.load(Ordering::SeqCst) == 1).then_some(()) },
    )
    .await;
    let surplus_closed_after = idle_since.elapsed();
    assert!(
        surplus_closed_after
            >= labforge_proxy::upstream::SURPLUS_IDLE_TIMEOUT - Duration::from_millis(50),
        "closed after {surplus_closed_after:?}, before the surplus timeout"
    );
    assert_eq!(alice.get().await, (200, "ok".to_owned()));
    assert_eq!(
        upstream.accepted.load(Ordering::SeqCst),
        4,
        "the kept connection is reused"
    );
    assert_eq!(upstream.open.load(Ordering::SeqCst), 1);
}

/// How long `stream` stays open from `since`: reads (and drops) until the proxy closes it.
pub(super) async fn open_for(stream: &mut (impl AsyncRead + Unpin), since: Instant) -> Duration {
    let mut buffer = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) => return since.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the connection is still open after 5 s"),
        }
    }
}

/// A client connection that completes no request head and has none in flight for the request
/// head timeout is closed (a silent client, an idle keep-alive connection, a client trickling
/// its head), while a slow answer and a slowly streamed body keep theirs.
#[tokio::test]
pub(super) async fn connections_without_a_request_head_in_time_are_closed_and_slow_answers_are_not()
{
    let timeout = Duration::from_millis(300);
    let (upstream, serving) = slow_upstream("/notebook/alice/lab/", Duration::from_secs(1)).await;
    let proxy = proxy_for_alice_lab(upstream, |options| ProxyOptions {
        request_head_timeout: timeout,
        ..options
    })
    .await;

    // Sends nothing: closed at the first check, one timeout after connecting.
    let connected = Instant::now();
    let mut silent = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let silent_for = open_for(&mut silent, connected).await;
    assert!(
        silent_for >= timeout - Duration::from_millis(20) && silent_for < 3 * timeout,
        "a silent connection was closed after {silent_for:?}"
    );

    // A request answered after three timeouts keeps its connection; then it is idle and closed.
    let mut idle = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    idle.write_all(
        format!(
            "GET /notebook/alice/lab/slow HTTP/1.1\r\nHost: lab\r\nkubeflow-userid: {ALICE}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    while !answer.ends_with(b"late") {
        let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buffer))
            .await
            .expect("the slow answer in time")
            .unwrap();
        assert!(
            n > 0,
            "closed before the slow answer: {}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&buffer[..n]);
    }
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let idle_for = open_for(&mut idle, Instant::now()).await;
    assert!(
        idle_for < 3 * timeout,
        "an idle connection stayed open {idle_for:?}"
    );

    // A head trickled a byte every 100 ms never completes: shut down at one check (which an
    // unfinished head ignores), dropped at the next.
    let started = Instant::now();
    let mut trickler = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    trickler
        .write_all(b"GET /notebook/alice/lab/slow HTTP/1.1\r\n")
        .await
        .unwrap();
    let (mut reading, mut writing) = trickler.into_split();
    let trickle = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if writing.write_all(b"X").await.is_err() {
                return;
            }
        }
    });
    let trickled_for = open_for(&mut reading, started).await;
    trickle.abort();
    assert!(
        trickled_for >= 2 * timeout - Duration::from_millis(20) && trickled_for < 4 * timeout,
        "a trickling client was closed after {trickled_for:?}"
    );

    // A body streamed over 1.25 s (four timeouts) arrives whole.
    let http = reqwest::Client::new();
    let url = format!("http://{}/notebook/alice/lab/stream", proxy.addr);
    let response = get_as(&http, &url, ALICE).await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.text().await.unwrap(), "01234");
    serving.abort();
}

/// A socket's state in /proc/net/tcp: its SYN sent and not answered yet.
pub(super) const SYN_SENT: &str = "02";

/// Connected.
pub(super) const ESTABLISHED: &str = "01";

/// Sockets of this machine connecting or connected to `port` on 127.0.0.1 (not the listener's
/// side of them) that are in `state`.
pub(super) fn sockets_to(port: u16, state: &str) -> usize {
    let remote = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(2) == Some(&remote.as_str()) && fields.get(3) == Some(&state)
        })
        .count()
}

pub(super) fn connecting_to(port: u16) -> usize {
    sockets_to(port, SYN_SENT)
}

/// The most sockets to `port` in `state` seen at once: watched until `limit` is reached (a loaded
/// machine may take a while to send a burst), then half a second more, so that any beyond it
/// would show up.
pub(super) async fn most_sockets_at_once(port: u16, state: &str, limit: usize) -> usize {
    let mut most = 0;
    let watched = Instant::now();
    let mut reached = None;
    while watched.elapsed() < Duration::from_secs(10)
        && reached.is_none_or(|at: Instant| at.elapsed() < Duration::from_millis(500))
    {
        most = most.max(sockets_to(port, state));
        if most >= limit && reached.is_none() {
            reached = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    most
}

/// A listener whose accept queue is full, so that a SYN to it stays unanswered until it accepts
/// or listens again with a longer queue (as an address that drops SYNs does), with the
/// connections that fill the queue.
pub(super) fn unanswering_listener() -> (socket2::Socket, Vec<std::net::TcpStream>) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    socket.listen(0).unwrap();
    let address = socket.local_addr().unwrap().as_socket().unwrap();
    // Connections until one is not answered: the queue is full then.
    let mut queued = Vec::new();
    while let Ok(filler) =
        std::net::TcpStream::connect_timeout(&address, Duration::from_millis(100))
    {
        queued.push(filler);
        assert!(
            queued.len() < 10,
            "the upstream's accept queue never filled"
        );
    }
    assert_eq!(
        connecting_to(address.port()),
        0,
        "the test's own SYN is gone"
    );
    (socket, queued)
}

/// `count` requests of alice to her notebook sent at once, each answering with its status and
/// how long it took. One client: it opens a connection to the proxy for each request in flight.
pub(super) fn burst_of_gets_to_alice_lab(
    proxy: SocketAddr,
    count: usize,
) -> Vec<tokio::task::JoinHandle<(u16, Duration)>> {
    let url = format!("http://{proxy}/notebook/alice/lab/x");
    let http = reqwest::Client::new();
    (0..count)
        .map(|_| {
            let (http, url) = (http.clone(), url.clone());
            tokio::spawn(async move {
                let sent = Instant::now();
                let status = get_as(&http, &url, ALICE).await.status().as_u16();
                (status, sent.elapsed())
            })
        })
        .collect()
}

/// Waits for each request of a burst, 15 s at most, and asserts it was answered `status`.
pub(super) async fn every_answer_is(
    requests: Vec<tokio::task::JoinHandle<(u16, Duration)>>,
    status: u16,
) {
    for request in requests {
        let (answered, _) = tokio::time::timeout(Duration::from_secs(15), request)
            .await
            .expect("every request of the burst answered")
            .unwrap();
        assert_eq!(answered, status);
    }
}

/// A burst of requests opens at most MAX_CONNECTING_PER_UPSTREAM connections to an upstream at a
/// time (per serving thread), and the rest wait for one of them instead of flooding the
/// upstream's accept queue; once the upstream accepts, every request is answered.
#[tokio::test]
pub(super) async fn a_burst_of_requests_opens_a_bounded_number_of_upstream_connections_at_once() {
    const LIMIT: usize = labforge_proxy::upstream::MAX_CONNECTING_PER_UPSTREAM;
    const BURST: usize = 3 * LIMIT;
    let (socket, _queued) = unanswering_listener();
    let listener: std::net::TcpListener = socket.try_clone().unwrap().into();
    let upstream = listener.local_addr().unwrap();

    let proxy = proxy_for_alice_lab(upstream, |options| ProxyOptions {
        threads: 1,
        ..options
    })
    .await;
    let requests = burst_of_gets_to_alice_lab(proxy.addr, BURST);
    // The unanswered SYNs stay for at least a second, so any others would show up beside them.
    let most = most_sockets_at_once(upstream.port(), SYN_SENT, LIMIT).await;
    assert_eq!(most, LIMIT, "connections being opened at once");

    // Listening again sets the queue's length: the SYNs sent again now find room.
    socket.listen(1024).unwrap();
    listener.set_nonblocking(true).unwrap();
    let _serving = CountingUpstream::serve(tokio::net::TcpListener::from_std(listener).unwrap());
    every_answer_is(requests, 200).await;
}

/// A busy upstream completes handshakes before it accepts them (the kernel queues them): a burst
/// has at most MAX_CONNECTING_PER_UPSTREAM new connections that have not answered yet, not that
/// many handshakes at a time, which would fill the accept queue all the same.
#[tokio::test]
pub(super) async fn a_burst_waits_for_new_upstream_connections_to_answer_before_opening_more() {
    const LIMIT: usize = labforge_proxy::upstream::MAX_CONNECTING_PER_UPSTREAM;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = listener.local_addr().unwrap();
    let proxy = proxy_for_alice_lab(upstream, |options| ProxyOptions {
        threads: 1,
        ..options
    })
    .await;
    let requests = burst_of_gets_to_alice_lab(proxy.addr, 3 * LIMIT);
    // Nobody accepts yet: connected sockets wait in the listener's queue (128 long).
    let most = most_sockets_at_once(upstream.port(), ESTABLISHED, LIMIT).await;
    assert_eq!(most, LIMIT, "connections opened and not answered yet");

    listener.set_nonblocking(true).unwrap();
    let _serving = CountingUpstream::serve(tokio::net::TcpListener::from_std(listener).unwrap());
    every_answer_is(requests, 200).await;
}

/// Slow first answers hold their connecting slots for SLOT_HELD_FOR_ANSWER only: the requests
/// waiting behind them open their own connections within the connect timeout instead of getting
/// a 503.
#[tokio::test]
pub(super) async fn requests_behind_slow_first_answers_get_connections_within_the_connect_timeout()
{
    const LIMIT: usize = labforge_proxy::upstream::MAX_CONNECTING_PER_UPSTREAM;
    let connect_timeout = 2 * labforge_proxy::upstream::SLOT_HELD_FOR_ANSWER;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    // Slower than the connect timeout: slots held until the answer would time the waiting out.
    let upstream =
        CountingUpstream::serve_after(listener, connect_timeout + Duration::from_secs(1));
    let proxy = proxy_for_alice_lab(upstream.addr, |options| ProxyOptions {
        threads: 1,
        upstream_connect_timeout: connect_timeout,
        ..options
    })
    .await;
    every_answer_is(burst_of_gets_to_alice_lab(proxy.addr, 2 * LIMIT), 200).await;
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 2 * LIMIT);
}

/// Requests that wait behind connects nobody answers (a stopped notebook's address drops SYNs)
/// get their 503 within the connect timeout, waiting included, rather than one timeout per
/// round of connecting slots ahead of them.
#[tokio::test]
pub(super) async fn requests_waiting_for_a_connection_get_503_within_the_connect_timeout() {
    const TIMEOUT: Duration = Duration::from_secs(1);
    // Three rounds of connecting slots: the last requests would wait two timeouts for a slot.
    const BURST: usize = 3 * labforge_proxy::upstream::MAX_CONNECTING_PER_UPSTREAM;
    let (socket, _queued) = unanswering_listener();
    let upstream = socket.local_addr().unwrap().as_socket().unwrap();
    let proxy = proxy_for_alice_lab(upstream, |options| ProxyOptions {
        threads: 1,
        upstream_connect_timeout: TIMEOUT,
        ..options
    })
    .await;
    for request in burst_of_gets_to_alice_lab(proxy.addr, BURST) {
        let (status, took) = request.await.unwrap();
        assert_eq!(status, 503);
        // One timeout and scheduling; without the bound the last third took three.
        assert!(took < 2 * TIMEOUT, "answered after {took:?}");
    }
}

/// `count` clients, each with a connection of its own, get alice's notebook at once; their
/// connections stay open while the clients live.
pub(super) async fn burst_to_alice_lab(proxy: &RunningProxy, count: usize) -> Vec<reqwest::Client> {
    let clients: Vec<reqwest::Client> = (0..count).map(|_| reqwest::Client::new()).collect();
    let url = format!("http://{}/notebook/alice/lab/x", proxy.addr);
    let statuses = futures::future::join_all(
        clients
            .iter()
            .map(|http| async { get_as(http, &url, ALICE).await.status().as_u16() }),
    )
    .await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    clients
}

/// The proxy gives freed memory back to the system once a complete route list is loaded and when a
/// burst of connections ends, not while the connections are open.
#[tokio::test]
pub(super) async fn free_memory_is_given_back_after_a_route_list_and_after_a_burst_of_connections()
{
    const RELEASES: &str = "labforge_proxy_heap_releases_total";
    let upstream = CountingUpstream::start().await;
    let proxy = proxy_for_alice_lab(upstream.addr, |options| options).await;
    eventually(
        "one release after the complete route list",
        Duration::from_secs(5),
        || async { (metric(&proxy, RELEASES).await == 1.0).then_some(()) },
    )
    .await;

    // 40 clients with a connection each, all open at once, and their upstream connections.
    let clients = burst_to_alice_lab(&proxy, 40).await;
    assert_eq!(
        metric(&proxy, "labforge_proxy_connections_open").await,
        40.0
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        metric(&proxy, RELEASES).await,
        1.0,
        "none while the connections are open"
    );

    drop(clients);
    eventually(
        "a release once the burst's connections closed",
        Duration::from_secs(5),
        || async { (metric(&proxy, RELEASES).await >= 2.0).then_some(()) },
    )
    .await;
    assert_eq!(metric(&proxy, "labforge_proxy_connections_open").await, 0.0);
}

/// With `heap_release` off (`--no-heap-release`, for measuring what it saves) the proxy serves
/// as usual and never gives memory back.
#[tokio::test]
pub(super) async fn with_heap_release_off_no_memory_is_given_back() {
    let upstream = CountingUpstream::start().await;
    let proxy = proxy_for_alice_lab(upstream.addr, |options| ProxyOptions {
        heap_release: false,
        ..options
    })
    .await;
    drop(burst_to_alice_lab(&proxy, 40).await);
    eventually(
        "the burst's connections closed",
        Duration::from_secs(5),
        || async { (metric(&proxy, "labforge_proxy_connections_open").await == 0.0).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        metric(&proxy, "labforge_proxy_heap_releases_total").await,
        0.0
    );
}

#[tokio::test]
pub(super) async fn forwarding_preserves_host_adds_forwarded_headers_and_serves_http2() {
    let up = Upstream::start("one").await;
    let proxy = start_proxy(
        RoutesFrom::Pushed,
        HashMap::from([(service_authority("alice", "lab"), up.addr.to_string())]),
    )
    .await;
    proxy.routes.replace_all(vec![notebook_vs("alice", "lab")]);
    let (status, body) = raw_get(
        proxy.addr,
        "/notebook/alice/lab/api?a=b",
        &[
            ("kubeflow-userid", ALICE),
            ("x-forwarded-for", "203.0.113.7"),
            ("Connection", "close, x-drop"),
            ("x-drop", "1"),
        ],
    )
    .await;
    assert_eq!(status, 200);
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["host"], "lab.example.com", "Host preserved");
    assert_eq!(seen["x-forwarded-host"], "lab.example.com");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(
        seen["x-forwarded-for"], "127.0.0.1",
        "set by the proxy, not appended to the client's"
    );
    assert_eq!(seen["path"], "/notebook/alice/lab/api?a=b");
    assert_ne!(
        seen["connection"], "close, x-drop",
        "hop-by-hop headers are not forwarded"
    );

    // An absolute-form target wins over the Host header, for routing and for the upstream.
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(
            format!(
                "GET http://lab.example.com/notebook/alice/lab/abs HTTP/1.1\r\nHost: other.example.org\r\n\
                 kubeflow-userid: {ALICE}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let seen: Value = serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(seen["host"], "lab.example.com");
    assert_eq!(seen["path"], "/notebook/alice/lab/abs");

    // HTTP/2 with prior knowledge: the upstream still gets HTTP/1.1 with a Host header.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let request = hyper::Request::get(format!("http://{}/notebook/alice/lab/h2", proxy.addr))
        .header("kubeflow-userid", ALICE)
        .body(http_body_util::Empty::new())
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.version(), hyper::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    use http_body_util::BodyExt;
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let seen: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(seen["host"], proxy.addr.to_string());
    assert_eq!(seen["path"], "/notebook/alice/lab/h2");
}

#[tokio::test]
pub(super) async fn error_pages_are_html_for_browsers_and_json_for_api_clients() {
    let closed = labforge_tests::tools::free_port().unwrap();
    let proxy = start_proxy(
        RoutesFrom::Pushed,
        HashMap::from([(
            service_authority("alice", "lab"),
            format!("127.0.0.1:{closed}"),
        )]),
    )
    .await;
    proxy.routes.replace_all(vec![notebook_vs("alice", "lab")]);
    let http = reqwest::Client::new();
    let get = |path: &str, accept: &str| {
        http.get(format!("http://{}{path}", proxy.addr))
            .header("kubeflow-userid", ALICE)
            .header("accept", accept)
            .send()
    };
    for (path, status) in [("/nowhere/", 404), ("/notebook/alice/lab/lab", 503)] {
        let page = get(path, "text/html,*/*;q=0.8").await.unwrap();
        assert_eq!(page.status().as_u16(), status, "{path}");
        assert!(
            page.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        assert!(
            page.text()
                .await
                .unwrap()
                .contains(&format!("<h1>{status} "))
        );
        let json = get(path, "application/json").await.unwrap();
        assert_eq!(json.status().as_u16(), status);
        let body: Value = json.json().await.unwrap();
        assert_eq!(body["status"], status);
        assert!(body["message"].as_str().unwrap().len() > 5);
    }
    // Jupyter's API without an Accept header is an API client.
    let api = http
        .get(format!(
            "http://{}/notebook/alice/lab/api/kernels",
            proxy.addr
        ))
        .header("kubeflow-userid", ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), 503);
    assert_eq!(api.headers()["content-type"], "application/json");
    // A websocket to a stopped notebook is accepted and closed at once with 1013 (try again
    // later) and the reason, so the client's retry logic can act on it.
    let url = format!(
        "ws://{}/notebook/alice/lab/api/kernels/k/channels",
        proxy.addr
    );
    let mut ws = websocket_as(&url, ALICE).await.unwrap();
    assert_closed_to_try_again_later(&mut ws, "not reachable").await;
    assert_eq!(
        metric(
            &proxy,
            "labforge_proxy_upstream_errors_total{kind=\"connect\"}"
        )
        .await,
        4.0,
        "two pages, the API request and the websocket"
    );
}

/// Descriptors this process holds.
pub(super) fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn failing_and_vanishing_upstreams_leave_no_sockets_or_tasks() {
    let closed = labforge_tests::tools::free_port().unwrap();
    let echo = EchoServer::start().await;
    let proxy = start_proxy(
        RoutesFrom::Pushed,
        HashMap::from([
            (
                service_authority("alice", "gone"),
                format!("127.0.0.1:{closed}"),
            ),
            (service_authority("alice", "echo"), echo.addr.to_string()),
        ]),
    )
    .await;
    proxy.routes.replace_all(vec![
        notebook_vs("alice", "gone"),
        notebook_vs("alice", "echo"),
    ]);
    // No keep-alive: the test's own idle connections would blur the count.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let fail = |n: usize| {
        let http = http.clone();
        let url = format!("http://{}/notebook/alice/gone/x", proxy.addr);
        async move {
            for _ in 0..n {
                let response = http
                    .get(&url)
                    .header("kubeflow-userid", ALICE)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 503);
            }
        }
    };
    // Warm up lazily created state, let the connections close, then measure. The proxy serves on
    // its own threads: its tasks are its connections (the connections_open gauge) and tunnels.
    fail(50).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fds = open_fds();
    assert_eq!(metric(&proxy, "labforge_proxy_connections_open").await, 0.0);
    futures::future::join_all((0..4).map(|_| fail(500))).await;
    eventually(
        "descriptors and connection tasks back to where they were after 2,000 upstream failures",
        Duration::from_secs(5),
        || async {
            let open = metric(&proxy, "labforge_proxy_connections_open").await;
            (open_fds() <= fds + 1 && open == 0.0).then_some(())
        },
    )
    .await;

    // Websockets whose upstream vanishes: every client gets a close frame (1001, going away),
    // and the tunnels' sockets and tasks go with them.
    let baseline_fds = open_fds();
    let mut clients = Vec::new();
    for i in 0..20 {
        let url = format!("ws://{}/notebook/alice/echo/ws/{i}", proxy.addr);
        let mut ws = websocket_as(&url, ALICE).await.unwrap();
        ws.send(Message::text(format!("ping {i}"))).await.unwrap();
        assert_eq!(
            ws.next().await.unwrap().unwrap(),
            Message::text(format!("ping {i}"))
        );
        clients.push(ws);
    }
    assert_eq!(
        metric(&proxy, "labforge_proxy_websockets_active").await,
        20.0
    );
    echo.task.abort();
    for mut ws in clients {
        let ended = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("a client kept a tunnel to a vanished upstream");
        match ended {
            Some(Ok(Message::Close(Some(frame)))) => {
                assert_eq!(u16::from(frame.code), 1001, "{frame:?}");
                assert!(frame.reason.contains("went away"), "{frame:?}");
            }
            other => panic!("expected a 1001 close: {other:?}"),
        }
    }
    eventually("tunnels gone", Duration::from_secs(5), || async {
        (metric(&proxy, "labforge_proxy_websockets_active").await == 0.0).then_some(())
    })
    .await;
    eventually("descriptors back", Duration::from_secs(5), || async {
        (open_fds() <= baseline_fds + 2).then_some(())
    })
    .await;
}

/// A TLS listener serves over rustls; plain HTTP sent to it is redirected to HTTPS, and a
/// client that begins a handshake (or nothing) and stalls is closed within the request head
/// timeout.
#[tokio::test]
pub(super) async fn tls_listener_serves_with_rustls() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = labforge_tests::tools::self_signed_certificate(dir.path()).unwrap();
    let up = Upstream::start("one").await;
    let mut opts = options(HashMap::from([(
        service_authority("alice", "lab"),
        up.addr.to_string(),
    )]));
    let timeout = Duration::from_millis(300);
    opts.request_head_timeout = timeout;
    opts.tls = Some(labforge_proxy::server::TlsFiles {
        cert: cert.clone(),
        key,
    });
    init_crypto();
    let proxy = labforge_proxy::start(opts, RoutesFrom::Pushed)
        .await
        .unwrap();
    proxy.routes.replace_all(vec![notebook_vs("alice", "lab")]);
    let http = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&cert).unwrap()).unwrap(),
        )
        .resolve("localhost", proxy.addr)
        .build()
        .unwrap();
    let response = http
        .get(format!(
            "https://localhost:{}/notebook/alice/lab/tls",
            proxy.addr.port()
        ))
        .header("kubeflow-userid", ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seen: Value = response.json().await.unwrap();
    assert_eq!(seen["x-forwarded-proto"], "https");

    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let redirected = plain
        .get(format!("http://{}/notebook/alice/lab/tls?x=1", proxy.addr))
        .header("host", "lab.example.com:8443")
        .send()
        .await
        .unwrap();
    assert_eq!(redirected.status(), 307);
    assert_eq!(
        redirected.headers()["location"],
        "https://lab.example.com:8443/notebook/alice/lab/tls?x=1"
    );

    for opening in [&[0x16u8][..], &[][..]] {
        let connected = Instant::now();
        let mut stalled = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        stalled.write_all(opening).await.unwrap();
        let open = open_for(&mut stalled, connected).await;
        assert!(
            open < 3 * timeout,
            "a stalled client ({opening:?}) held its connection {open:?}"
        );
    }
}

#[tokio::test]
pub(super) async fn pooled_connections_the_upstream_closed_never_fail_a_request() {
    // An upstream that closes every connection after its first response, without saying so in
    // the response (as servers with a short idle timeout do): the pooled connection is dead when
    // the next request comes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closing = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let server = tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 4096];
                let mut read = 0;
                while !buffer[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer[read..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read += n,
                    }
                }
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n")
                    .await;
                let _ = stream.shutdown().await;
            });
        }
    });
    let steady = Upstream::start("steady").await;
    let proxy = start_proxy(
        RoutesFrom::Pushed,
        HashMap::from([
            (service_authority("alice", "closing"), closing.to_string()),
            (
                service_authority("alice", "steady"),
                steady.addr.to_string(),
            ),
        ]),
    )
    .await;
    proxy.routes.replace_all(vec![
        notebook_vs("alice", "closing"),
        notebook_vs("alice", "steady"),
    ]);
    let http = reqwest::Client::new();
    for name in ["closing", "steady"] {
        for i in 0..50 {
            let response = http
                .get(format!("http://{}/notebook/alice/{name}/{i}", proxy.addr))
                .header("kubeflow-userid", ALICE)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{name} request {i}");
            // Give the closing upstream's FIN time to arrive sometimes, and sometimes not.
            if i % 2 == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        50,
        "one connection per request"
    );
    assert_eq!(steady.hits(), 50);
    assert_eq!(
        metric(&proxy, "labforge_proxy_requests_total{code=\"200\"}").await,
        100.0,
        "no request failed"
    );
    server.abort();
}

#[tokio::test]
pub(super) async fn a_trickled_body_is_cut_and_connections_over_the_cap_get_503() {
    // An upstream that reads the whole body and answers its length.
    let app = axum::Router::new()
        .fallback(|body: axum::body::Bytes| async move { body.len().to_string() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let proxy = proxy_for_alice_lab(upstream, |options| ProxyOptions {
        body_pace: labforge_proxy::server::BodyPace {
            grace: Duration::from_secs(1),
            min_rate: 1000,
        },
        max_connections: 3,
        ..options
    })
    .await;
    let post = |length: usize| {
        format!(
            "POST /notebook/alice/lab/upload HTTP/1.1\r\nHost: lab.example.com\r\n\
             kubeflow-userid: {ALICE}\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
        )
    };
    // A body at a usable rate goes through whole.
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(post(200_000).as_bytes()).await.unwrap();
    stream.write_all(&vec![b'x'; 200_000]).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("200000"),
        "{answer}"
    );

    // A body trickled a byte every 200 ms is cut off after its grace, not held forever.
    let started = Instant::now();
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(post(1_000).as_bytes()).await.unwrap();
    let trickle = async {
        for _ in 0..1_000 {
            if stream.write_all(b"x").await.is_err() {
                break;
            }
            let mut byte = [0u8; 64];
            match tokio::time::timeout(Duration::from_millis(200), stream.read(&mut byte)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(_)) => break,
                Err(_) => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), trickle)
        .await
        .expect("the trickled body still held its connection after 10 s");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "cut before its grace"
    );
    assert_eq!(
        metric(&proxy, "labforge_proxy_slow_request_bodies_total").await,
        1.0
    );

    // Three connections open (silent ones, within their head timeout): the fourth gets 503.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tokio::net::TcpStream::connect(proxy.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, body) = raw_get(
        proxy.addr,
        "/notebook/alice/lab/",
        &[("kubeflow-userid", ALICE)],
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("too many connections"), "{body}");
    assert!(metric(&proxy, "labforge_proxy_connections_refused_total").await >= 1.0);
    // One closed: another is served again.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, _) = raw_get(
            proxy.addr,
            "/notebook/alice/lab/",
            &[("kubeflow-userid", ALICE)],
        )
        .await;
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {status} after a connection closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    task.abort();
}
