//! The proxy end to end: a real JupyterLab behind it (kernel over HTTP, code over the kernel's
//! websocket, a terminal websocket) here; its routes (`routing`), its connections (`connections`)
//! and who may open what (`authorization`) in the modules below. Routes come from VirtualServices
//! in the fake Kubernetes API server; requests are sent as real clients and, for path tricks, as
//! raw bytes.

mod authorization;
mod connections;
mod routing;

use crate::support::proxy::{ALICE, BOB, CAROL, ROOT, notebook_vs, service_authority, start_proxy};
use crate::{init_crypto, need};
use futures::{SinkExt, StreamExt};
use kube::Api;
use kube::api::PostParams;
use labforge_crds::VirtualService;
use labforge_proxy::{RoutesFrom, RunningProxy};
use labforge_tests::Registry;
use labforge_tests::eventually;
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
use labforge_tests::notebook::JupyterLab;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The same membership as [`static_access`], as RBAC would answer a SubjectAccessReview.
fn rbac_allows(spec: &Value) -> bool {
    let user = spec["user"].as_str().unwrap_or_default();
    let attributes = &spec["resourceAttributes"];
    let namespace = attributes["namespace"].as_str().unwrap_or_default();
    let may_open_notebooks = attributes["group"] == "kubeflow.org"
        && attributes["resource"] == "notebooks"
        && attributes["verb"] == "update";
    may_open_notebooks
        && match user {
            ROOT => true,
            ALICE | CAROL => namespace == "alice",
            BOB => namespace == "bob",
            _ => false,
        }
}

/// A small upstream answering every request with what it received, counting requests.
struct Upstream {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    async fn start(name: &'static str) -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                let header = |n: &str| {
                    request
                        .headers()
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                };
                axum::Json(json!({
                    "upstream": name,
                    "path": request.uri().path_and_query().map(|p| p.as_str()),
                    "host": header("host"),
                    "x-forwarded-for": header("x-forwarded-for"),
                    "x-forwarded-proto": header("x-forwarded-proto"),
                    "x-forwarded-host": header("x-forwarded-host"),
                    "user": header("kubeflow-userid"),
                    "connection": header("connection"),
                    "cookie": header("cookie"),
                    "authorization": header("authorization"),
                    "forwarded": header("forwarded"),
                }))
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Upstream { addr, hits, task }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An upstream that counts the connections it accepted and those still open.
struct CountingUpstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingUpstream {
    async fn start() -> Self {
        Self::serve(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap())
    }

    /// Answers on `listener`, which may have connections waiting already.
    fn serve(listener: tokio::net::TcpListener) -> Self {
        Self::serve_after(listener, Duration::ZERO)
    }

    /// Answers each request `delay` after it came: requests sent together are in flight together.
    fn serve_after(listener: tokio::net::TcpListener, delay: Duration) -> Self {
        let addr = listener.local_addr().unwrap();
        let (accepted, open) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (accepted_count, open_count) = (accepted.clone(), open.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                accepted_count.fetch_add(1, Ordering::SeqCst);
                open_count.fetch_add(1, Ordering::SeqCst);
                let open = open_count.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|_request| async move {
                        tokio::time::sleep(delay).await;
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Full::new(bytes::Bytes::from_static(b"ok")),
                        ))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        CountingUpstream {
            addr,
            accepted,
            open,
            task,
        }
    }
}

impl Drop for CountingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sends `GET path` exactly as written (no client-side normalization) and returns status and body.
async fn raw_get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request =
        format!("GET {path} HTTP/1.1\r\nHost: lab.example.com\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buffer = Vec::new();
    stream.read_to_end(&mut buffer).await.unwrap();
    let text = String::from_utf8_lossy(&buffer).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn user_headers(user: &str) -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("kubeflow-userid", user.parse().unwrap());
    headers
}

/// `GET url` as `user` (the trusted header), on `http`'s connections.
async fn get_as(http: &reqwest::Client, url: &str, user: &str) -> reqwest::Response {
    http.get(url)
        .headers(user_headers(user))
        .send()
        .await
        .unwrap()
}

/// The JSON body of `GET url` as `user`.
async fn get_json_as(http: &reqwest::Client, url: &str, user: &str) -> Value {
    get_as(http, url, user).await.json().await.unwrap()
}

async fn admin_json(proxy: &RunningProxy, path: &str) -> (u16, Value) {
    let response = reqwest::get(format!("http://{}{path}", proxy.admin_addr))
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn metric(proxy: &RunningProxy, name: &str) -> f64 {
    let text = reqwest::get(format!("http://{}/metrics", proxy.admin_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in metrics:\n{text}"))
}

#[tokio::test]
async fn jupyterlab_kernel_and_terminal_work_through_the_proxy() {
    init_crypto();
    let registry = need(Registry::start().await);
    let lab = need(JupyterLab::start(&registry, "alice", "lab").await);
    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
    let vs_api: Api<VirtualService> = Api::namespaced(server.client(), "alice");
    vs_api
        .create(&PostParams::default(), &notebook_vs("alice", "lab"))
        .await
        .unwrap();
    let jupyter_addr = lab.origin().trim_start_matches("http://").to_owned();
    let proxy = start_proxy(
        RoutesFrom::Kubernetes(server.client()),
        HashMap::from([(service_authority("alice", "lab"), jupyter_addr)]),
    )
    .await;
    eventually("proxy ready", Duration::from_secs(10), || async {
        (admin_json(&proxy, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    let base = format!("http://{}/notebook/alice/lab", proxy.addr);
    let (_, before) = admin_json(&proxy, "/activity/alice/lab").await;
    assert_eq!(before["last_activity"], Value::Null, "no traffic yet");

    // The kernel, created over HTTP through the proxy as carol (a member of alice's namespace).
    let jupyter = need(
        labforge_tests::jupyter::JupyterClient::connect_with_headers(&base, user_headers(CAROL))
            .await,
    );
    let kernel = need(
        jupyter
            .post("/api/kernels", &json!({"name": "python3"}))
            .await,
    );
    let kernel_id = kernel["id"].as_str().unwrap();

    // Code runs over the kernel's websocket, through the proxy.
    let ws_base = base.replacen("http://", "ws://", 1);
    let connect = |path: String| {
        let mut request = format!("{ws_base}{path}").into_client_request().unwrap();
        let headers = request.headers_mut();
        headers.insert("kubeflow-userid", CAROL.parse().unwrap());
        headers.insert(
            "cookie",
            format!("_xsrf={}", jupyter.xsrf()).parse().unwrap(),
        );
        headers.insert("x-xsrftoken", jupyter.xsrf().parse().unwrap());
        tokio_tungstenite::connect_async(request)
    };
    let (mut kernel_ws, response) = connect(format!("/api/kernels/{kernel_id}/channels"))
        .await
        .expect("kernel websocket through the proxy");
    assert_eq!(response.status(), 101);
    let msg_id = "labforge-proxy-e2e-1";
    let execute = json!({
        "header": {"msg_id": msg_id, "username": "carol", "session": "labforge-e2e",
                   "msg_type": "execute_request", "version": "5.3", "date": jiff::Timestamp::now().to_string()},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": "print(6 * 7)", "silent": false, "store_history": false,
                    "user_expressions": {}, "allow_stdin": false, "stop_on_error": true}
    });
    kernel_ws
        .send(Message::text(execute.to_string()))
        .await
        .unwrap();
    let output = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(message) = kernel_ws.next().await {
            let Ok(Message::Text(text)) = message else {
                continue;
            };
            let value: Value = serde_json::from_str(&text).unwrap();
            if value["parent_header"]["msg_id"] == msg_id && value["msg_type"] == "stream" {
                return value["content"]["text"].as_str().unwrap().to_owned();
            }
        }
        panic!("kernel websocket closed before the output");
    })
    .await
    .expect("kernel output within 30 s");
    assert_eq!(output, "42\n");
    assert_eq!(
        metric(&proxy, "labforge_proxy_websockets_active").await,
        1.0
    );

    // A terminal over its websocket.
    let terminal = need(jupyter.post("/api/terminals", &json!({})).await);
    let terminal_name = terminal["name"].as_str().unwrap();
    let (mut terminal_ws, _) = connect(format!("/terminals/websocket/{terminal_name}"))
        .await
        .expect("terminal websocket through the proxy");
    terminal_ws
        .send(Message::text(
            json!(["stdin", "echo via-proxy-$((6*7))\r"]).to_string(),
        ))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), async {
        let mut seen = String::new();
        while let Some(message) = terminal_ws.next().await {
            let Ok(Message::Text(text)) = message else {
                continue;
            };
            let value: Value = serde_json::from_str(&text).unwrap();
            if value[0] == "stdout" {
                seen.push_str(value[1].as_str().unwrap_or_default());
                if seen.contains("via-proxy-42") {
                    return;
                }
            }
        }
        panic!("terminal closed before the output; saw {seen:?}");
    })
    .await
    .expect("terminal output within 20 s");

    // The traffic is the notebook's activity, for the culler.
    let (status, after) = admin_json(&proxy, "/activity/alice/lab").await;
    assert_eq!(status, 200);
    let seen: jiff::Timestamp = after["last_activity"].as_str().unwrap().parse().unwrap();
    assert!(jiff::Timestamp::now().duration_since(seen) < jiff::SignedDuration::from_secs(30));
    let (_, all) = admin_json(&proxy, "/activity").await;
    assert_eq!(all["alice/lab"], after["last_activity"]);

    // bob is not in alice's namespace: refused, and no websocket is opened for him.
    match websocket_as(&format!("{ws_base}/api/kernels/{kernel_id}/channels"), BOB).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 403)
        }
        other => panic!("bob's websocket: {other:?}"),
    }
    drop(kernel_ws);
    drop(terminal_ws);
    eventually("tunnels closed", Duration::from_secs(5), || async {
        (metric(&proxy, "labforge_proxy_websockets_active").await == 0.0).then_some(())
    })
    .await;
}

/// A websocket client's side of a connection.
type ClientWebSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Where a path lands after normalization: `Ok(Some(ns))` a notebook of `ns`, `Ok(None)` no
/// route, `Err(status)` refused before routing. This is the specification the matrix checks.
/// `Ok(Some(ns))`, `Ok(None)` or `Err(status)`, as above.
type Lands = Result<Option<&'static str>, u16>;

/// Opens a websocket to `url` as `user` (the trusted header).
async fn websocket_as(
    url: &str,
    user: &str,
) -> Result<ClientWebSocket, tokio_tungstenite::tungstenite::Error> {
    let mut request = url.into_client_request()?;
    request
        .headers_mut()
        .insert("kubeflow-userid", user.parse().unwrap());
    tokio_tungstenite::connect_async(request)
        .await
        .map(|(ws, _)| ws)
}

/// Asserts that the proxy's next message on `ws` closes it with 1013 (try again later) and a
/// reason that contains `reason`.
async fn assert_closed_to_try_again_later(ws: &mut ClientWebSocket, reason: &str) {
    match ws.next().await {
        Some(Ok(Message::Close(Some(frame)))) => {
            assert_eq!(u16::from(frame.code), 1013);
            assert!(frame.reason.contains(reason), "{}", frame.reason);
        }
        other => panic!("expected a 1013 close ({reason}): {other:?}"),
    }
}

/// A websocket echo server whose connections all drop when it is dropped.
struct EchoServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl EchoServer {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                connections.spawn(async move {
                    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                        return;
                    };
                    while let Some(Ok(message)) = ws.next().await {
                        if message.is_text() && ws.send(message).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        EchoServer { addr, task }
    }
}

/// An upstream under `prefix` answering `quick` at once, `slow` ("late") after `slow`, and
/// `stream` as five chunks 250 ms apart (its head at once).
async fn slow_upstream(prefix: &str, slow: Duration) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let app = axum::Router::new()
        .route(
            &format!("{prefix}quick"),
            axum::routing::get(|| async { "quick" }),
        )
        .route(
            &format!("{prefix}slow"),
            axum::routing::get(move || async move {
                tokio::time::sleep(slow).await;
                "late"
            }),
        )
        .route(
            &format!("{prefix}stream"),
            axum::routing::get(|| async {
                let chunks = futures::stream::iter(0..5).then(|i| async move {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    Ok::<_, std::convert::Infallible>(bytes::Bytes::from(i.to_string()))
                });
                axum::body::Body::from_stream(chunks)
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let serving = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (upstream, serving)
}
