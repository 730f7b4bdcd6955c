//! Who may open which notebook through the proxy: the authorization matrix (static and by
//! SubjectAccessReview), cookies and credentials kept from notebooks, confinement of a profile
//! owner's routes, and tunnels that close when their session ends.

use crate::proxy::{ClientWebSocket, Upstream, metric, raw_get, rbac_allows};
use crate::proxy::{EchoServer, Lands};
use crate::support::proxy::{
    ALICE, BOB, CAROL, ROOT, notebook_vs, options, proxy_for_alice_lab, service_authority,
    start_proxy, static_access,
};
use crate::{init_crypto, need};
use futures::{SinkExt, StreamExt};
use labforge_proxy::authz::NamespaceAccess;
use labforge_proxy::review::{ReviewCache, ReviewedAccess};
use labforge_proxy::{ProxyOptions, RoutesFrom, RunningProxy};
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
use labforge_tests::faulty::FaultyRelay;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

#[tokio::test]
pub(super) async fn authorization_matrix_over_users_and_path_tricks() {
    authorization_matrix(static_access()).await;
}

/// The same matrix with access from Kubernetes RBAC (the deployed proxy's default): every case
/// decides as the static membership does, each user and namespace pair is reviewed once, and a
/// burst of requests from a new user waits for one shared review.
#[tokio::test]
pub(super) async fn authorization_by_subject_access_review_matches_the_matrix() {
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

/// A SubjectAccessReview that cannot be made (the API server unreachable) refuses the request as
/// unavailable, 503 and not 403, and nothing reaches the notebook; the failure is not cached, so
/// once the API server answers again the same user gets through.
#[tokio::test]
pub(super) async fn a_failed_access_review_answers_unavailable_and_is_asked_again() {
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
pub(super) async fn authorization_matrix(access: Arc<dyn NamespaceAccess>) -> RunningProxy {
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

/// A notebook's server belongs to its owner; what the proxy forwards reaches them.
#[tokio::test]
pub(super) async fn the_visitors_cookies_and_credentials_never_reach_a_notebook() {
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
pub(super) fn bobs_attacks(alice_port: u16) -> Vec<Value> {
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
pub(super) async fn a_profile_owners_virtual_services_cannot_reach_beyond_their_namespace() {
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
pub(super) async fn a_websocket_tunnel_closes_when_its_session_ends() {
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

pub(super) const PATHS: &[(&str, Lands, &str)] = &[
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
