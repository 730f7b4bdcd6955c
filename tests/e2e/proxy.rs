//! The proxy end to end: a real JupyterLab behind it (kernel over HTTP, code over the kernel's
//! websocket, a terminal websocket), routes from VirtualServices in the fake Kubernetes API
//! server (served within 100 ms of a change), the authorization matrix against path tricks sent
//! as raw bytes, error pages, HTTP/2 and TLS from clients, and no descriptors or tasks left behind
//! by failing or vanishing upstreams.

use crate::controller::notebook;
use crate::{init_crypto, need};
use futures::{SinkExt, StreamExt};
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use labforge_crds::VirtualService;
use labforge_notebook_controller::BuilderConfig;
use labforge_notebook_controller::builders::virtual_service;
use labforge_proxy::authz::{NamespaceAccess, StaticAccess, TrustedHeader};
use labforge_proxy::review::{ReviewCache, ReviewedAccess};
use labforge_proxy::routes::GatewayFilter;
use labforge_proxy::{ProxyOptions, RoutesFrom, RunningProxy};
use labforge_tests::Registry;
use labforge_tests::eventually;
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
use labforge_tests::faulty::FaultyRelay;
use labforge_tests::notebook::JupyterLab;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

pub const ALICE: &str = "alice@example.com";
const CAROL: &str = "carol@example.com";
const BOB: &str = "bob@example.com";
const ROOT: &str = "root@example.com";

/// alice owns namespace alice and shares it with carol; bob owns bob; root is an admin.
fn static_access() -> Arc<dyn NamespaceAccess> {
    Arc::new(
        StaticAccess::with_members(
            [ROOT],
            [
                &*format!("alice={ALICE}"),
                &format!("alice={CAROL}"),
                &format!("bob={BOB}"),
            ],
        )
        .unwrap(),
    )
}

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

fn options(upstreams: HashMap<String, String>) -> ProxyOptions {
    ProxyOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin: "127.0.0.1:0".parse().unwrap(),
        gateway: GatewayFilter(Some("kubeflow/kubeflow-gateway".into())),
        identity: Arc::new(TrustedHeader::default()),
        access: static_access(),
        tls: None,
        upstream_addresses: upstreams,
        threads: 2,
        upstream_idle_timeout: labforge_proxy::upstream::DEFAULT_IDLE_TIMEOUT,
        upstream_connect_timeout: labforge_proxy::upstream::DEFAULT_CONNECT_TIMEOUT,
        request_head_timeout: labforge_proxy::server::DEFAULT_REQUEST_HEAD_TIMEOUT,
        fallback: None,
        confinement: Default::default(),
        visitor_cookies: labforge_proxy::forward::DEFAULT_VISITOR_COOKIES
            .map(String::from)
            .into(),
        max_connections: labforge_proxy::server::DEFAULT_MAX_CONNECTIONS as usize,
        body_pace: Default::default(),
        notebook_hosts: None,
        app_path: None,
        heap_release: true,
    }
}

/// A proxy serving alice's notebook `lab` at `upstream`, with the test options changed by `adjust`.
pub async fn proxy_for_alice_lab(
    upstream: SocketAddr,
    adjust: impl FnOnce(ProxyOptions) -> ProxyOptions,
) -> RunningProxy {
    init_crypto();
    let defaults = options(HashMap::from([(
        service_authority("alice", "lab"),
        upstream.to_string(),
    )]));
    let proxy = labforge_proxy::start(adjust(defaults), RoutesFrom::Pushed)
        .await
        .unwrap();
    proxy.routes.replace_all(vec![notebook_vs("alice", "lab")]);
    proxy
}

pub async fn start_proxy(routes: RoutesFrom, upstreams: HashMap<String, String>) -> RunningProxy {
    init_crypto();
    labforge_proxy::start(options(upstreams), routes)
        .await
        .unwrap()
}

/// The VirtualService the controller writes for `namespace/name`.
pub fn notebook_vs(namespace: &str, name: &str) -> VirtualService {
    virtual_service(&notebook(namespace, name), &BuilderConfig::default()).unwrap()
}

/// `name.namespace.svc.cluster.local:80`, the controller's destination.
pub fn service_authority(namespace: &str, name: &str) -> String {
    format!("{name}.{namespace}.svc.cluster.local:80")
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

/// Polls `url` (as alice) until `check` accepts the answer; fails after 5 s.
async fn served_eventually(url: &str, check: impl Fn(u16, &Value) -> bool) {
    let http = reqwest::Client::new();
    let started = Instant::now();
    loop {
        if let Ok(response) = http.get(url).header("kubeflow-userid", ALICE).send().await {
            let status = response.status().as_u16();
            let body = response.json().await.unwrap_or(Value::Null);
            if check(status, &body) {
                return;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never served: {url}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A proxy reading VirtualServices from a fake API server, with each `(name, upstream)` as the
/// Service `name.alice.svc.cluster.local:80`.
async fn proxy_on_fake_api_server(
    upstreams: &[(&str, &Upstream)],
) -> (FakeApiServer, RunningProxy) {
    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
    let addresses = upstreams
        .iter()
        .map(|(name, upstream)| {
            (
                format!("{name}.alice.svc.cluster.local:80"),
                upstream.addr.to_string(),
            )
        })
        .collect();
    let proxy = start_proxy(RoutesFrom::Kubernetes(server.client()), addresses).await;
    (server, proxy)
}

/// Creates a `networking.istio.io/v1` VirtualService `name` in alice's namespace, bound to the
/// proxy's gateway, with `http` as its rules.
async fn create_alice_virtual_service(server: &FakeApiServer, name: &str, http: Value) {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": name, "namespace": "alice"},
        "spec": {"hosts": ["*"], "gateways": ["kubeflow/kubeflow-gateway"], "http": http}
    }))
    .unwrap();
    Api::<DynamicObject>::namespaced_with(
        server.client(),
        "alice",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("networking.istio.io", "v1", "VirtualService"),
            "virtualservices",
        ),
    )
    .create(&PostParams::default(), &object)
    .await
    .unwrap();
}

#[tokio::test]
async fn virtual_service_changes_are_served_for_every_version() {
    let one = Upstream::start("one").await;
    let two = Upstream::start("two").await;
    let (server, proxy) = proxy_on_fake_api_server(&[("one", &one), ("two", &two)]).await;
    eventually("proxy ready", Duration::from_secs(10), || async {
        (admin_json(&proxy, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    let url = |name: &str| format!("http://{}/notebook/alice/{name}/x?q=1", proxy.addr);

    for (i, version) in ["v1", "v1beta1", "v1alpha3"].into_iter().enumerate() {
        let name = format!("nb{i}");
        let api: Api<DynamicObject> = Api::namespaced_with(
            server.client(),
            "alice",
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("networking.istio.io", version, "VirtualService"),
                "virtualservices",
            ),
        );
        let mut vs = serde_json::to_value(notebook_vs("alice", &name)).unwrap();
        vs["apiVersion"] = json!(format!("networking.istio.io/{version}"));
        vs["spec"]["http"][0]["route"][0]["destination"]["host"] =
            json!("one.alice.svc.cluster.local");
        let object: DynamicObject = serde_json::from_value(vs).unwrap();
        let vs_name = object.metadata.name.clone().unwrap();

        api.create(&PostParams::default(), &object).await.unwrap();
        served_eventually(&url(&name), |s, b| s == 200 && b["upstream"] == "one").await;

        let patch = json!({"spec": {"http": [{
            "match": [{"uri": {"prefix": format!("/notebook/alice/{name}/")}}],
            "rewrite": {"uri": "/"},
            "route": [{"destination": {"host": "two.alice.svc.cluster.local", "port": {"number": 80}}}]
        }]}});
        api.patch(&vs_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        served_eventually(&url(&name), |s, b| {
            s == 200 && b["upstream"] == "two" && b["path"] == "/x?q=1"
        })
        .await;

        api.delete(&vs_name, &DeleteParams::default())
            .await
            .unwrap();
        served_eventually(&url(&name), |s, _| s == 404).await;
    }
    // A VirtualService of another gateway is never served.
    let mut other = notebook_vs("alice", "elsewhere");
    other.spec.gateways = vec!["istio-system/other-gateway".into()];
    other.spec.http[0].route[0].destination.host = "one.alice.svc.cluster.local".into();
    Api::<VirtualService>::namespaced(server.client(), "alice")
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    let marker = notebook_vs("alice", "marker");
    Api::<VirtualService>::namespaced(server.client(), "alice")
        .create(&PostParams::default(), &{
            let mut m = marker;
            m.spec.http[0].route[0].destination.host = "one.alice.svc.cluster.local".into();
            m
        })
        .await
        .unwrap();
    served_eventually(&url("marker"), |s, _| s == 200).await;
    let (status, _) = raw_get(
        proxy.addr,
        "/notebook/alice/elsewhere/",
        &[("kubeflow-userid", ALICE)],
    )
    .await;
    assert_eq!(status, 404, "a route of another gateway");
}

// Istio's other match conditions narrow a rule as in Istio, and one the proxy does not evaluate
// leaves its match out instead of being dropped from it (which would widen the rule).
#[tokio::test]
async fn authority_query_and_absent_header_conditions_route_as_in_istio() {
    let one = Upstream::start("one").await;
    let two = Upstream::start("two").await;
    let (server, proxy) = proxy_on_fake_api_server(&[("one", &one), ("two", &two)]).await;
    let prefix = "/notebook/alice/lab/";
    let to = |host: &str| json!([{"destination": {"host": format!("{host}.alice.svc.cluster.local"), "port": {"number": 80}}}]);
    let rule = |mut condition: Value, host: &str| {
        condition["uri"] = json!({"prefix": prefix});
        json!({"match": [condition], "route": to(host)})
    };
    create_alice_virtual_service(
        &server,
        "conditions",
        json!([
            rule(json!({"queryParams": {"view": {"exact": "two"}}}), "two"),
            rule(json!({"headers": {"x-team": {}}}), "two"),
            rule(json!({"sourceLabels": {"app": "elsewhere"}}), "two"),
            rule(json!({"authority": {"prefix": "lab.example.com:"}}), "two"),
            rule(json!({"withoutHeaders": {"x-canary": {"exact": "1"}}}), "one"),
            {"match": [{"uri": {"prefix": prefix}}], "route": to("two")}
        ]),
    )
    .await;
    let url = format!("http://{}{prefix}x", proxy.addr);
    served_eventually(&url, |s, _| s == 200).await;

    let http = reqwest::Client::new();
    let upstream_of = |query: &'static str, extra: &'static [(&'static str, &'static str)]| {
        let mut request = http
            .get(format!("{url}{query}"))
            .headers(user_headers(ALICE));
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        async move {
            let answer = request.send().await.unwrap();
            assert_eq!(answer.status(), 200);
            answer.json::<Value>().await.unwrap()["upstream"].clone()
        }
    };
    // The `sourceLabels` rule, were its condition dropped, would take all of these.
    assert_eq!(upstream_of("", &[]).await, "one");
    assert_eq!(upstream_of("?view=two", &[]).await, "two");
    assert_eq!(upstream_of("?view=one", &[]).await, "one");
    assert_eq!(
        upstream_of("", &[("host", "lab.example.com:8080")]).await,
        "two"
    );
    assert_eq!(upstream_of("", &[("x-canary", "1")]).await, "two");
    assert_eq!(upstream_of("", &[("x-canary", "0")]).await, "one");
    // `{}`: present, whatever the value.
    assert_eq!(upstream_of("", &[("x-team", "data")]).await, "two");
}

// A rule may answer itself (Istio's directResponse and redirect), after authorization like any;
// a delegating rule, which the proxy cannot serve, keeps its requests from later rules.
#[tokio::test]
async fn rules_answer_directly_redirect_rewrite_the_authority_and_never_pass_on_a_delegation() {
    let one = Upstream::start("one").await;
    let (server, proxy) = proxy_on_fake_api_server(&[("one", &one)]).await;
    let prefix = "/notebook/alice/lab/";
    create_alice_virtual_service(
        &server,
        "answers",
        json!([
            {"match": [{"uri": {"exact": format!("{prefix}blocked")}}],
             "directResponse": {"status": 403, "body": {"string": "blocked by policy"}}},
            {"match": [{"uri": {"prefix": format!("{prefix}old/")}}],
             "redirect": {"prefixRewrite": format!("{prefix}new/"), "redirectCode": 302}},
            {"match": [{"uri": {"prefix": format!("{prefix}delegated/")}}],
             "delegate": {"name": "elsewhere", "namespace": "alice"}},
            {"match": [{"uri": {"prefix": format!("{prefix}v2/")}}],
             "rewrite": {"uriRegexRewrite": {"match": "^/notebook/alice/lab/v2/(.*)$", "rewrite": "/api/\\1"}},
             "route": [{"destination": {"host": "one.alice.svc.cluster.local", "port": {"number": 80}}}]},
            {"match": [{"uri": {"prefix": prefix}}],
             "rewrite": {"authority": "internal.example.com"},
             "route": [{"destination": {"host": "one.alice.svc.cluster.local", "port": {"number": 80}}}]}
        ]),
    )
    .await;
    let base = format!("http://{}", proxy.addr);
    served_eventually(&format!("{base}{prefix}x"), |s, _| s == 200).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    let blocked = get_as(&http, &format!("{base}{prefix}blocked"), ALICE).await;
    assert_eq!(blocked.status(), 403);
    assert_eq!(blocked.text().await.unwrap(), "blocked by policy");

    let moved = get_as(&http, &format!("{base}{prefix}old/a?x=1"), ALICE).await;
    assert_eq!(moved.status(), 302);
    assert_eq!(
        moved.headers()["location"],
        format!("http://{}{prefix}new/a?x=1", proxy.addr).as_str()
    );
    // Answers are authorized like forwarded requests.
    let other = get_as(&http, &format!("{base}{prefix}old/a"), BOB).await;
    assert_eq!(other.status(), 403);

    let delegated = get_as(&http, &format!("{base}{prefix}delegated/x"), ALICE).await;
    assert_eq!(delegated.status(), 404);

    let regex_rewritten = get_json_as(&http, &format!("{base}{prefix}v2/items?q=1"), ALICE).await;
    assert_eq!(regex_rewritten["path"], "/api/items?q=1");

    let hits = one.hits();
    let forwarded = get_json_as(&http, &format!("{base}{prefix}x"), ALICE).await;
    assert_eq!(forwarded["host"], "internal.example.com");
    assert_eq!(forwarded["x-forwarded-host"], proxy.addr.to_string());
    assert_eq!(
        one.hits(),
        hits + 1,
        "only the forwarded request reached the notebook"
    );
}

/// Where a path lands after normalization: `Ok(Some(ns))` a notebook of `ns`, `Ok(None)` no
/// route, `Err(status)` refused before routing. This is the specification the matrix checks.
/// `Ok(Some(ns))`, `Ok(None)` or `Err(status)`, as above.
type Lands = Result<Option<&'static str>, u16>;

const PATHS: &[(&str, Lands, &str)] = &[
    (
        "/notebook/alice/lab/api/status",
        Ok(Some("alice")),
        "/notebook/alice/lab/api/status",
    ),
    (
        "/notebook/bob/lab/api/status",
        Ok(Some("bob")),
        "/notebook/bob/lab/api/status",
    ),
    // Dot segments resolve before matching: this is bob's notebook, and bob's rules apply.
    (
        "/notebook/alice/lab/../../bob/lab/api",
        Ok(Some("bob")),
        "/notebook/bob/lab/api",
    ),
    (
        "/notebook/bob/lab/../../alice/lab/api",
        Ok(Some("alice")),
        "/notebook/alice/lab/api",
    ),
    (
        "//notebook//bob///lab/api",
        Ok(Some("bob")),
        "/notebook/bob/lab/api",
    ),
    (
        "/notebook/%62ob/lab/api",
        Ok(Some("bob")),
        "/notebook/bob/lab/api",
    ),
    (
        "/notebook/alice/lab/./api?x=%2F",
        Ok(Some("alice")),
        "/notebook/alice/lab/api?x=%2F",
    ),
    // Encoded separators and dots that would change the route: refused outright.
    (
        "/notebook/alice/lab/%2e%2e/%2e%2e/bob/lab/api",
        Err(400),
        "",
    ),
    (
        "/notebook/alice/lab%2F..%2F..%2Fbob%2Flab/api",
        Err(400),
        "",
    ),
    ("/notebook/alice/lab/..%2f..%2fbob/lab/", Err(400), ""),
    ("/notebook/alice/lab/..%5C..%5Cbob/lab/", Err(400), ""),
    ("/notebook/alice/lab/../../../../etc/passwd", Err(400), ""),
    // Case and trailing-slash tricks match no route (Istio is case-sensitive, prefixes end in /).
    ("/notebook/Bob/lab/api", Ok(None), ""),
    ("/NOTEBOOK/bob/lab/api", Ok(None), ""),
    ("/notebook/bob/lab", Ok(None), ""),
    ("/notebook/bob/lab2/", Ok(None), ""),
];

// A rule's `timeout` (Istio's, Envoy's route timeout) runs from forwarding to the response's last
// byte: a late head gets 504 at the timeout, a body still streaming then is cut off, a late
// websocket upgrade a 1013 close, and a rule without one (a notebook's) waits as long as the
// notebook takes; an upgraded tunnel is not held to it.
#[tokio::test]
async fn a_rules_timeout_answers_504_or_cuts_the_body_and_no_timeout_waits() {
    let (upstream, serving) = slow_upstream("/", Duration::from_millis(1200)).await;
    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
    let echo = EchoServer::start().await;
    let addresses = HashMap::from([
        (
            "api.alice.svc.cluster.local:80".to_string(),
            upstream.to_string(),
        ),
        (
            "echo.alice.svc.cluster.local:80".to_string(),
            echo.addr.to_string(),
        ),
    ]);
    let proxy = start_proxy(RoutesFrom::Kubernetes(server.client()), addresses).await;
    let to = |host: &str| json!([{"destination": {"host": format!("{host}.alice.svc.cluster.local"), "port": {"number": 80}}}]);
    create_alice_virtual_service(
        &server,
        "timeouts",
        json!([
            {"match": [{"uri": {"prefix": "/notebook/alice/timed/"}}], "rewrite": {"uri": "/"},
             "timeout": "400ms", "route": to("api")},
            {"match": [{"uri": {"prefix": "/notebook/alice/untimed/"}}], "rewrite": {"uri": "/"},
             "route": to("api")},
            {"match": [{"uri": {"prefix": "/notebook/alice/timed-ws/"}}], "timeout": "400ms",
             "route": to("echo")}
        ]),
    )
    .await;
    let base = format!("http://{}/notebook/alice", proxy.addr);
    served_eventually(&format!("{base}/timed/quick"), |s, _| s == 200).await;
    let http = reqwest::Client::new();

    let started = Instant::now();
    let late = get_as(&http, &format!("{base}/timed/slow"), ALICE).await;
    let waited = started.elapsed();
    assert_eq!(late.status().as_u16(), 504);
    assert!(
        waited >= Duration::from_millis(390) && waited < Duration::from_millis(1100),
        "504 after {waited:?}"
    );
    assert!(
        late.text()
            .await
            .unwrap()
            .contains("upstream request timeout")
    );

    // The head comes at once, the body would take 1.25 s: cut off at the timeout.
    let started = Instant::now();
    let streaming = get_as(&http, &format!("{base}/timed/stream"), ALICE).await;
    assert_eq!(streaming.status().as_u16(), 200);
    let body = streaming.bytes().await;
    let cut_after = started.elapsed();
    assert!(
        body.is_err(),
        "a body past the timeout arrived whole: {body:?}"
    );
    assert!(
        cut_after >= Duration::from_millis(390) && cut_after < Duration::from_millis(1100),
        "cut off after {cut_after:?}"
    );

    // Without a timeout, the same requests are answered whole, however long they take.
    let slow = get_as(&http, &format!("{base}/untimed/slow"), ALICE).await;
    assert_eq!(slow.status().as_u16(), 200);
    assert_eq!(slow.text().await.unwrap(), "late");
    let stream = get_as(&http, &format!("{base}/untimed/stream"), ALICE).await;
    assert_eq!(stream.text().await.unwrap(), "01234");
    // And a timed route still serves what comes in time.
    let quick = get_as(&http, &format!("{base}/timed/quick"), ALICE).await;
    assert_eq!(quick.text().await.unwrap(), "quick");

    // A websocket on a timed rule: the upgrade is held to the timeout, the tunnel is not.
    let ws_base = format!("ws://{}/notebook/alice", proxy.addr);
    let mut ws = websocket_as(&format!("{ws_base}/timed-ws/echo"), ALICE)
        .await
        .unwrap();
    for round in 0..2 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        ws.send(Message::text(format!("still here {round}")))
            .await
            .unwrap();
        assert_eq!(
            ws.next().await.unwrap().unwrap(),
            Message::text(format!("still here {round}")),
            "the tunnel outlives its rule's timeout"
        );
    }
    let mut late = websocket_as(&format!("{ws_base}/timed/slow"), ALICE)
        .await
        .unwrap();
    assert_closed_to_try_again_later(&mut late, "upstream request timeout").await;
    assert_eq!(
        metric(
            &proxy,
            "labforge_proxy_upstream_errors_total{kind=\"timeout\"}"
        )
        .await,
        2.0
    );
    serving.abort();
}

#[tokio::test]
async fn authorization_matrix_over_users_and_path_tricks() {
    authorization_matrix(static_access()).await;
}

/// The same matrix with access from Kubernetes RBAC (the deployed proxy's default): every case
/// decides as the static membership does, each user and namespace pair is reviewed once, and a
/// burst of requests from a new user waits for one shared review.
#[tokio::test]
async fn authorization_by_subject_access_review_matches_the_matrix() {
    init_crypto();
    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
    let reviews = Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let asked = reviews.clone();
    server.set_access_rule(move |spec| {
        asked.lock().unwrap().push((
            spec["user"].as_str().unwrap_or_default().to_owned(),
            spec["resourceAttributes"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        ));
        // Slow enough for the burst below to arrive while the first review is under way.
        std::thread::sleep(Duration::from_millis(50));
        rbac_allows(spec)
    });
    // Answers outlive the matrix, so any second review of a pair is a caching bug.
    let long = ReviewCache {
        allowed_for: Duration::from_secs(600),
        denied_for: Duration::from_secs(600),
    };
    let access = Arc::new(ReviewedAccess::new(
        server.client(),
        ["kubeflow".to_owned()].into(),
        long,
    ));
    let proxy = authorization_matrix(access).await;

    let mut asked: Vec<(String, String)> = reviews.lock().unwrap().clone();
    let all = asked.len();
    asked.sort();
    asked.dedup();
    assert_eq!(all, asked.len(), "a pair reviewed twice: {asked:?}");
    let expected: Vec<(String, String)> = [
        (ALICE, "alice"),
        (ALICE, "bob"),
        (BOB, "alice"),
        (BOB, "bob"),
        (CAROL, "alice"),
        (CAROL, "bob"),
        (ROOT, "alice"),
        (ROOT, "bob"),
    ]
    .iter()
    .map(|(u, n)| (u.to_string(), n.to_string()))
    .collect();
    assert_eq!(asked, expected);

    // A burst from a user nobody asked about yet shares one review, even with answers not kept
    // at all (so only the sharing of the review under way can explain a single one).
    drop(proxy);
    // A client of its own: the pooled connections of the first one were driven by the proxy's
    // serving threads, which are stopping now, so a request on one of them could fail.
    let config = kube::Config::new(server.url().parse().unwrap());
    let uncached = ReviewedAccess::new(
        kube::Client::try_from(config).unwrap(),
        ["kubeflow".to_owned()].into(),
        ReviewCache {
            allowed_for: Duration::ZERO,
            denied_for: Duration::ZERO,
        },
    );
    let before = reviews.lock().unwrap().len();
    let burst = (0..20).map(|_| uncached.may_use("dave@example.com", "bob").resolve());
    let answers = futures::future::join_all(burst).await;
    assert!(
        answers.iter().all(|answer| *answer == Ok(false)),
        "dave is nobody's member"
    );
    assert_eq!(
        reviews.lock().unwrap().len() - before,
        1,
        "one review for the burst"
    );
}

/// One client of alice's (its connections to the proxy reused) getting her notebook's `x`.
struct AliceClient {
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
async fn pooled_upstream_connections_are_reused_and_closed_once_idle_too_long() {
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
async fn a_bursts_surplus_upstream_connections_close_soon_and_the_last_one_stays() {
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
async fn open_for(stream: &mut (impl AsyncRead + Unpin), since: Instant) -> Duration {
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
async fn connections_without_a_request_head_in_time_are_closed_and_slow_answers_are_not() {
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
const SYN_SENT: &str = "02";
/// Connected.
const ESTABLISHED: &str = "01";

/// Sockets of this machine connecting or connected to `port` on 127.0.0.1 (not the listener's
/// side of them) that are in `state`.
fn sockets_to(port: u16, state: &str) -> usize {
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

fn connecting_to(port: u16) -> usize {
    sockets_to(port, SYN_SENT)
}

/// The most sockets to `port` in `state` seen at once: watched until `limit` is reached (a loaded
/// machine may take a while to send a burst), then half a second more, so that any beyond it
/// would show up.
async fn most_sockets_at_once(port: u16, state: &str, limit: usize) -> usize {
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
fn unanswering_listener() -> (socket2::Socket, Vec<std::net::TcpStream>) {
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
fn burst_of_gets_to_alice_lab(
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
async fn every_answer_is(requests: Vec<tokio::task::JoinHandle<(u16, Duration)>>, status: u16) {
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
async fn a_burst_of_requests_opens_a_bounded_number_of_upstream_connections_at_once() {
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
async fn a_burst_waits_for_new_upstream_connections_to_answer_before_opening_more() {
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
async fn requests_behind_slow_first_answers_get_connections_within_the_connect_timeout() {
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
async fn requests_waiting_for_a_connection_get_503_within_the_connect_timeout() {
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
async fn burst_to_alice_lab(proxy: &RunningProxy, count: usize) -> Vec<reqwest::Client> {
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
async fn free_memory_is_given_back_after_a_route_list_and_after_a_burst_of_connections() {
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
async fn with_heap_release_off_no_memory_is_given_back() {
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

/// A SubjectAccessReview that cannot be made (the API server unreachable) refuses the request as
/// unavailable, 503 and not 403, and nothing reaches the notebook; the failure is not cached, so
/// once the API server answers again the same user gets through.
#[tokio::test]
async fn a_failed_access_review_answers_unavailable_and_is_asked_again() {
    init_crypto();
    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
    server.set_access_rule(rbac_allows);
    let api_address: SocketAddr = server.url().trim_start_matches("http://").parse().unwrap();
    let relay = need(FaultyRelay::start(api_address).await);
    let config = kube::Config::new(format!("http://{}", relay.host()).parse().unwrap());
    let through_relay = kube::Client::try_from(config).unwrap();
    let access = Arc::new(ReviewedAccess::new(
        through_relay,
        ["kubeflow".to_owned()].into(),
        ReviewCache::default(),
    ));
    let notebook = Upstream::start("alice-lab").await;
    let proxy =
        proxy_for_alice_lab(notebook.addr, |options| ProxyOptions { access, ..options }).await;
    let path = "/notebook/alice/lab/api/status";

    relay.fail_after(0);
    let (status, body) = raw_get(proxy.addr, path, &[("kubeflow-userid", ALICE)]).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("could not be checked"), "{body}");
    assert_eq!(notebook.hits(), 0);

    relay.heal();
    let (status, body) = raw_get(proxy.addr, path, &[("kubeflow-userid", ALICE)]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(notebook.hits(), 1);
    // A real answer is still a real answer: bob is refused as forbidden.
    let (status, _) = raw_get(proxy.addr, path, &[("kubeflow-userid", BOB)]).await;
    assert_eq!(status, 403);
}

/// Every user × path trick against two notebooks; the proxy is returned for more checks.
async fn authorization_matrix(access: Arc<dyn NamespaceAccess>) -> RunningProxy {
    let alice_nb = Upstream::start("alice-lab").await;
    let bob_nb = Upstream::start("bob-lab").await;
    init_crypto();
    let proxy = labforge_proxy::start(
        ProxyOptions {
            access,
            ..options(HashMap::from([
                (service_authority("alice", "lab"), alice_nb.addr.to_string()),
                (service_authority("bob", "lab"), bob_nb.addr.to_string()),
            ]))
        },
        RoutesFrom::Pushed,
    )
    .await
    .unwrap();
    proxy
        .routes
        .replace_all(vec![notebook_vs("alice", "lab"), notebook_vs("bob", "lab")]);
    let users: [(&str, Option<&str>, &[&str]); 5] = [
        ("owner", Some(ALICE), &["alice"]),
        ("same-namespace user", Some(CAROL), &["alice"]),
        ("other user", Some(BOB), &["bob"]),
        ("admin", Some(ROOT), &["alice", "bob"]),
        ("anonymous", None, &[]),
    ];
    let mut cases = 0;
    for (role, user, namespaces) in users {
        for &(path, lands, upstream_path) in PATHS {
            let expected = match (lands, user) {
                (Err(status), _) => status,
                (_, None) => 401,
                (Ok(None), Some(_)) => 404,
                (Ok(Some(ns)), Some(_)) if namespaces.contains(&ns) => 200,
                (Ok(Some(_)), Some(_)) => 403,
            };
            let hits_before = alice_nb.hits() + bob_nb.hits();
            let headers: Vec<(&str, &str)> =
                user.map(|u| ("kubeflow-userid", u)).into_iter().collect();
            let (status, body) = raw_get(proxy.addr, path, &headers).await;
            assert_eq!(status, expected, "{role} GET {path}: {body}");
            let hits_after = alice_nb.hits() + bob_nb.hits();
            if expected == 200 {
                let body: Value = serde_json::from_str(&body).unwrap();
                let ns = lands.unwrap().unwrap();
                assert_eq!(body["upstream"], format!("{ns}-lab"), "{role} GET {path}");
                assert_eq!(body["path"], upstream_path, "{role} GET {path}");
                assert_eq!(body["user"], user.unwrap());
                assert_eq!(hits_after, hits_before + 1);
            } else {
                assert_eq!(
                    hits_after, hits_before,
                    "{role} GET {path} reached a notebook"
                );
            }
            cases += 1;
        }
    }
    assert_eq!(cases, 5 * PATHS.len());

    // bob's own VirtualService leading to alice's notebook: guarded by both namespaces.
    let mut sneaky = notebook_vs("bob", "lab");
    sneaky.metadata.name = Some("sneaky".into());
    sneaky.metadata.owner_references = None;
    sneaky.spec.http[0].matches[0].uri =
        Some(labforge_crds::istio::StringMatch::Prefix("/sneaky/".into()));
    sneaky.spec.http[0].rewrite = None;
    sneaky.spec.http[0].route[0].destination.host = "lab.alice.svc.cluster.local".into();
    proxy.routes.upsert(sneaky);
    for (user, expected) in [(BOB, 403), (ALICE, 403), (CAROL, 403), (ROOT, 200)] {
        let hits_before = alice_nb.hits();
        let (status, _) = raw_get(proxy.addr, "/sneaky/api", &[("kubeflow-userid", user)]).await;
        assert_eq!(
            status, expected,
            "{user} through bob's route to alice's notebook"
        );
        assert_eq!(alice_nb.hits() - hits_before, usize::from(expected == 200));
    }

    // A user header sent twice (one appended by the client) is no identity at all.
    let (status, _) = raw_get(
        proxy.addr,
        "/notebook/alice/lab/",
        &[("kubeflow-userid", BOB), ("kubeflow-userid", ALICE)],
    )
    .await;
    assert_eq!(status, 401);
    proxy
}

#[tokio::test]
async fn forwarding_preserves_host_adds_forwarded_headers_and_serves_http2() {
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

/// With the web app's path known, a browser opening a notebook without a route (stopped,
/// deleted) lands on the app's page of it, and error pages link back to the app.
#[tokio::test]
async fn a_notebook_without_a_route_sends_browsers_to_the_apps_page_of_it() {
    let closed = labforge_tests::tools::free_port().unwrap();
    let upstream: SocketAddr = format!("127.0.0.1:{closed}").parse().unwrap();
    let proxy = proxy_for_alice_lab(upstream, |options| ProxyOptions {
        app_path: Some("/jupyter/".into()),
        ..options
    })
    .await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let get = |path: &str, accept: &str| {
        http.get(format!("http://{}{path}", proxy.addr))
            .header("kubeflow-userid", ALICE)
            .header("accept", accept)
            .send()
    };
    let page = get("/notebook/alice/gone/lab?x=1", "text/html,*/*;q=0.8")
        .await
        .unwrap();
    assert_eq!(page.status(), 302);
    assert_eq!(page.headers()["location"], "/jupyter/notebooks/alice/gone");
    // A path that names no possible notebook is not put into a URL.
    let odd = get("/notebook/Alice%20x/gone/lab", "text/html")
        .await
        .unwrap();
    assert_eq!(odd.status(), 404);
    // Scripts and API clients get the 404 they can act on.
    let api = get("/notebook/alice/gone/api/kernels", "application/json")
        .await
        .unwrap();
    assert_eq!(api.status(), 404);
    // A notebook that has a route but does not answer: the page, linking back to the app.
    let unavailable = get("/notebook/alice/lab/lab", "text/html").await.unwrap();
    assert_eq!(unavailable.status(), 503);
    let body = unavailable.text().await.unwrap();
    assert!(
        body.contains(r#"<a href="/jupyter/">Back to your notebooks</a>"#),
        "{body}"
    );
}

#[tokio::test]
async fn error_pages_are_html_for_browsers_and_json_for_api_clients() {
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
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_and_vanishing_upstreams_leave_no_sockets_or_tasks() {
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
async fn tls_listener_serves_with_rustls() {
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
async fn pooled_connections_the_upstream_closed_never_fail_a_request() {
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

/// A notebook's server belongs to its owner; what the proxy forwards reaches them.
#[tokio::test]
async fn the_visitors_cookies_and_credentials_never_reach_a_notebook() {
    let up = Upstream::start("alice-lab").await;
    let proxy = start_proxy(
        RoutesFrom::Pushed,
        HashMap::from([
            (service_authority("alice", "lab"), up.addr.to_string()),
            (service_authority("alice", "plain"), up.addr.to_string()),
        ]),
    )
    .await;
    // The route gives its upstream a credential of its own (the embedded mode's per-notebook
    // secret): it applies after the visitor's are stripped.
    let mut with_secret = notebook_vs("alice", "lab");
    with_secret.spec.http[0].headers = Some(
        serde_json::from_value(
            json!({ "request": { "set": { "authorization": "Bearer nb-secret" } } }),
        )
        .unwrap(),
    );
    let plain = notebook_vs("alice", "plain");
    proxy.routes.replace_all(vec![with_secret, plain]);
    let headers = [
        ("kubeflow-userid", ALICE),
        (
            "Cookie",
            "_xsrf=2|xsrf; labforge_session=SECRET-SESSION; _oauth2_proxy=SECRET-OAUTH",
        ),
        (
            "Cookie",
            "_oauth2_proxy_1=SECRET-SPLIT; authservice_session=SECRET-AUTHSERVICE",
        ),
        ("Authorization", "Bearer SECRET-ID-TOKEN"),
        ("Forwarded", "for=198.51.100.1;host=SECRET-FORWARDED"),
        ("X-Forwarded-For", "198.51.100.1"),
        ("X-Forwarded-Proto", "https"),
        ("X-Forwarded-Host", "evil.example"),
    ];
    let (status, body) = raw_get(proxy.addr, "/notebook/alice/lab/api", &headers).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !body.contains("SECRET"),
        "a visitor's secret reached the notebook: {body}"
    );
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        seen["cookie"], "_xsrf=2|xsrf",
        "the notebook's own cookie is kept"
    );
    assert_eq!(seen["authorization"], "Bearer nb-secret");
    assert_eq!(seen["forwarded"], Value::Null);
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["x-forwarded-host"], "lab.example.com");
    assert_eq!(seen["user"], ALICE);

    // Only the visitor's cookies: no Cookie header at all; and no route edit, no Authorization.
    let (status, body) = raw_get(
        proxy.addr,
        "/notebook/alice/plain/api",
        &[
            ("kubeflow-userid", ALICE),
            ("Cookie", "labforge_session=SECRET"),
            headers[3],
        ],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["cookie"], Value::Null);
    assert_eq!(seen["authorization"], Value::Null);
}

/// bob's VirtualServices, as a profile owner may write them in his namespace, next to alice's
/// notebook route: all in one routes file, read as the watch reads them (untrusted).
fn bobs_attacks(alice_port: u16) -> Vec<Value> {
    let bob = |name: &str, http: Value| {
        json!({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": { "name": name, "namespace": "bob", "creationTimestamp": "2020-01-01T00:00:00Z" },
            "spec": { "hosts": ["*"], "gateways": ["kubeflow/kubeflow-gateway"], "http": [http] }
        })
    };
    let to = |host: &str, port: u16| json!([{ "destination": { "host": host, "port": { "number": port } } }]);
    let prefix = |p: &str| json!([{ "uri": { "prefix": p } }]);
    vec![
        bob(
            "impersonate",
            json!({ "match": prefix("/notebook/bob/as-root/"), "route": to("lab", 80),
                    "headers": { "request": { "set": { "kubeflow-userid": ROOT } } } }),
        ),
        bob(
            "other-namespace",
            json!({ "match": prefix("/notebook/bob/to-alice/"), "route": to("lab.alice.svc.cluster.local", 80) }),
        ),
        bob(
            "ip",
            json!({ "match": prefix("/notebook/bob/ip/"), "route": to("127.0.0.1", alice_port) }),
        ),
        bob(
            "squat",
            json!({ "match": prefix("/notebook/alice/"), "route": to("lab", 80) }),
        ),
        bob(
            "regex",
            json!({ "match": [{ "uri": { "regex": "/notebook/.*" } }], "route": to("lab", 80) }),
        ),
    ]
}

#[tokio::test]
async fn a_profile_owners_virtual_services_cannot_reach_beyond_their_namespace() {
    let alice_nb = Upstream::start("alice-lab").await;
    let bob_nb = Upstream::start("bob-lab").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("routes.yaml");
    let alice_vs = serde_json::to_value(notebook_vs("alice", "lab")).unwrap();
    let yaml: Vec<String> = std::iter::once(alice_vs)
        .chain(bobs_attacks(alice_nb.addr.port()))
        .map(|vs| serde_yaml_ng::to_string(&vs).unwrap())
        .collect();
    std::fs::write(&file, yaml.join("---\n")).unwrap();
    let proxy = start_proxy(
        RoutesFrom::Files(vec![file]),
        HashMap::from([
            (service_authority("alice", "lab"), alice_nb.addr.to_string()),
            (service_authority("bob", "lab"), bob_nb.addr.to_string()),
        ]),
    )
    .await;
    let hits = || (alice_nb.hits(), bob_nb.hits());

    // alice's own route keeps working.
    let (status, body) = raw_get(
        proxy.addr,
        "/notebook/alice/lab/x",
        &[("kubeflow-userid", ALICE)],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (seen["upstream"].as_str(), seen["user"].as_str()),
        (Some("alice-lab"), Some(ALICE))
    );

    // bob reaches none of alice's paths: not by squatting her prefix, not by his older regex.
    for path in [
        "/notebook/alice/lab/x",
        "/notebook/alice/lab/api/contents",
        "/notebook/alice/other/",
    ] {
        let before = hits();
        let (status, body) = raw_get(proxy.addr, path, &[("kubeflow-userid", BOB)]).await;
        assert!(
            status == 403 || status == 404,
            "bob GET {path}: {status} {body}"
        );
        assert_eq!(hits(), before, "bob GET {path} reached a notebook");
    }
    // The refused rules serve nothing, even to an admin, whom authorization would let through.
    for path in [
        "/notebook/bob/as-root/x",
        "/notebook/bob/to-alice/x",
        "/notebook/bob/ip/x",
    ] {
        let before = hits();
        let (status, body) = raw_get(proxy.addr, path, &[("kubeflow-userid", ROOT)]).await;
        let landed: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        // bob's regex rule still serves bob's own paths, on bob's own notebook, as the visitor.
        if status == 200 {
            assert_eq!(landed["upstream"], "bob-lab", "{path}: {body}");
            assert_eq!(landed["user"], ROOT, "{path}: {body}");
            assert_eq!(alice_nb.hits(), before.0, "{path}");
        } else {
            assert_eq!(status, 404, "{path}: {body}");
            assert_eq!(hits(), before, "{path}");
        }
    }
    let refused = |reason: &'static str| {
        let proxy = &proxy;
        async move {
            metric(
                proxy,
                &format!("labforge_proxy_rules_refused_total{{reason=\"{reason}\"}}"),
            )
            .await
        }
    };
    assert_eq!(refused("identity_header").await, 1.0);
    assert_eq!(refused("destination").await, 2.0);
    assert_eq!(refused("path").await, 1.0);
}

#[tokio::test]
async fn a_trickled_body_is_cut_and_connections_over_the_cap_get_503() {
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

#[tokio::test]
async fn a_websocket_tunnel_closes_when_its_session_ends() {
    use labforge_web::users::{LocalAuth, SESSION_COOKIE};
    let echo = EchoServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let auth = Arc::new(LocalAuth::open(dir.path(), SESSION_COOKIE).unwrap());
    auth.users.add("alice", false).unwrap();
    let proxy = proxy_for_alice_lab(echo.addr, |options| ProxyOptions {
        identity: auth.clone(),
        access: auth.clone(),
        ..options
    })
    .await;
    let open = |token: String| {
        let url = format!(
            "ws://{}/notebook/alice/lab/api/kernels/k/channels",
            proxy.addr
        );
        async move {
            let mut request = url.into_client_request().unwrap();
            request.headers_mut().insert(
                "cookie",
                format!("{SESSION_COOKIE}={token}").parse().unwrap(),
            );
            let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
            ws.send(Message::text("ping")).await.unwrap();
            assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("ping"));
            ws
        }
    };
    let closes_within = |mut ws: ClientWebSocket, what: &'static str| async move {
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match ws.next().await {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                    Some(Ok(_)) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the tunnel outlived {what}");
    };

    // Sign-out (the web app's logout ends the session).
    let token = auth.sessions.start("alice").unwrap();
    let ws = open(token.clone()).await;
    auth.sessions.end(&token);
    closes_within(ws, "sign-out").await;

    // `labforge user reset` from another process, noticed by the session check.
    let token = auth.sessions.start("alice").unwrap();
    let ws = open(token).await;
    labforge_web::users::Users::open(dir.path())
        .unwrap()
        .reset_password("alice")
        .unwrap();
    auth.check_sessions();
    closes_within(ws, "a password reset").await;
    assert_eq!(
        metric(&proxy, "labforge_proxy_tunnels_revoked_total").await,
        2.0
    );
}

/// A cluster's proxy with `--notebook-domain`: each notebook only on its own host, old path URLs
/// sent there, other origins and other namespaces' routes refused there.
#[tokio::test]
async fn with_a_notebook_domain_each_notebook_is_served_on_its_own_host_only() {
    init_crypto();
    let alice_nb = Upstream::start("alice-lab").await;
    let bob_nb = Upstream::start("bob-lab").await;
    let domain = "nb.example.com";
    let config = BuilderConfig {
        notebook_domain: Some(domain.into()),
        ..BuilderConfig::default()
    };
    let alice_vs = virtual_service(&notebook("alice", "lab"), &config).unwrap();
    assert_eq!(alice_vs.spec.hosts, ["lab--alice.nb.example.com"]);
    // bob's VirtualService (older than hers) names alice's host and a wildcard over the notebook
    // domain: refused for those hosts, it puts nothing of bob's on alice's origin.
    let mut squat = serde_json::to_value(notebook_vs("bob", "lab")).unwrap();
    squat["metadata"]["name"] = json!("squat");
    squat["metadata"]["creationTimestamp"] = json!("2020-01-01T00:00:00Z");
    squat["spec"]["hosts"] = json!(["lab--alice.nb.example.com", "*.nb.example.com"]);
    let bob_vs =
        serde_json::to_value(virtual_service(&notebook("bob", "lab"), &config).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("routes.yaml");
    let yaml: Vec<String> = [serde_json::to_value(&alice_vs).unwrap(), squat, bob_vs]
        .iter()
        .map(|vs| serde_yaml_ng::to_string(vs).unwrap())
        .collect();
    std::fs::write(&file, yaml.join("---\n")).unwrap();
    let mut options = options(HashMap::from([
        (service_authority("alice", "lab"), alice_nb.addr.to_string()),
        (service_authority("bob", "lab"), bob_nb.addr.to_string()),
    ]));
    options.confinement.notebook_domain = Some(domain.into());
    options.notebook_hosts = Some(labforge_proxy::notebook_host::NotebookHosts {
        domain: domain.into(),
        app_host: domain.into(),
        sign_in: None,
        ports: None,
    });
    let proxy = labforge_proxy::start(options, RoutesFrom::Files(vec![file]))
        .await
        .unwrap();
    assert_eq!(
        metric(
            &proxy,
            "labforge_proxy_rules_refused_total{reason=\"host\"}"
        )
        .await,
        2.0,
        "bob's names for alice's host and the whole domain"
    );

    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let port = proxy.addr.port();
    let alice_host = format!("lab--alice.{domain}:{port}");
    let get = |host: &str, path: &str, user: &str, extra: &[(&str, &str)]| {
        let mut request = http
            .get(format!("http://127.0.0.1:{port}{path}"))
            .header("host", host)
            .header("kubeflow-userid", user);
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        request.send()
    };
    let hits = || (alice_nb.hits(), bob_nb.hits());

    // alice on her notebook's host: her server, which sees that host.
    let response = get(&alice_host, "/notebook/alice/lab/x", ALICE, &[])
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seen: Value = response.json().await.unwrap();
    assert_eq!(seen["upstream"], "alice-lab", "{seen}");
    assert_eq!(seen["host"], alice_host.as_str());
    assert_eq!(
        get(
            &alice_host,
            "/notebook/alice/lab/x",
            ALICE,
            &[("origin", &format!("https://{alice_host}"))]
        )
        .await
        .unwrap()
        .status(),
        200,
        "its own pages"
    );

    // The old path URL on the dashboard's host: sent to the notebook's, query kept.
    let response = get(
        &format!("{domain}:{port}"),
        "/notebook/alice/lab/lab?a=1",
        ALICE,
        &[],
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 302);
    assert_eq!(
        response.headers()["location"],
        format!("//{alice_host}/notebook/alice/lab/lab?a=1").as_str()
    );

    let before = hits();
    // Pages of other origins (websockets, frames and images included) are refused as such;
    // another notebook's path and the rest are not found on this host; bob is forbidden.
    let bob_page = format!("http://lab--bob.{domain}:{port}");
    let main_page = format!("http://{domain}:{port}");
    for (path, user, extra, want) in [
        (
            "/notebook/alice/lab/x",
            ALICE,
            vec![("origin", bob_page.as_str())],
            403,
        ),
        (
            "/notebook/alice/lab/api/kernels/k/channels",
            ALICE,
            vec![
                ("origin", main_page.as_str()),
                ("connection", "upgrade"),
                ("upgrade", "websocket"),
                ("sec-websocket-version", "13"),
                ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ],
            403,
        ),
        (
            "/notebook/alice/lab/x",
            ALICE,
            vec![("origin", "null")],
            403,
        ),
        (
            "/notebook/alice/lab/x",
            ALICE,
            vec![
                ("sec-fetch-site", "same-site"),
                ("sec-fetch-mode", "navigate"),
                ("sec-fetch-dest", "iframe"),
            ],
            403,
        ),
        (
            "/notebook/alice/lab/x",
            ALICE,
            vec![
                ("sec-fetch-site", "same-site"),
                ("sec-fetch-mode", "no-cors"),
                ("sec-fetch-dest", "image"),
            ],
            403,
        ),
        ("/notebook/bob/lab/x", BOB, vec![], 404),
        ("/notebook/alice/lab/x", BOB, vec![], 403),
        ("/elsewhere", ALICE, vec![], 404),
    ] {
        let status = get(&alice_host, path, user, &extra).await.unwrap().status();
        assert_eq!(status, want, "{user} {path} {extra:?}");
    }
    // A link from another notebook's page opens alice's notebook as a page of its own.
    let navigation = get(
        &alice_host,
        "/notebook/alice/lab/x",
        ALICE,
        &[
            ("sec-fetch-site", "same-site"),
            ("sec-fetch-mode", "navigate"),
            ("sec-fetch-dest", "document"),
        ],
    )
    .await
    .unwrap();
    assert_eq!(navigation.status(), 200);
    assert_eq!(
        hits(),
        (before.0 + 1, before.1),
        "nothing refused reached a notebook; the navigation did"
    );
    // bob's own notebook, on its own host, is bob's.
    let response = get(
        &format!("lab--bob.{domain}:{port}"),
        "/notebook/bob/lab/x",
        BOB,
        &[],
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.json::<Value>().await.unwrap()["upstream"],
        "bob-lab"
    );
}
