//! The proxy's routes: VirtualService changes served as they happen, Istio's match conditions,
//! direct answers, redirects, rewrites and timeouts, and notebooks on hosts of their own.

use crate::init_crypto;
use crate::proxy::{EchoServer, assert_closed_to_try_again_later, slow_upstream, websocket_as};
use crate::proxy::{Upstream, admin_json, get_as, get_json_as, metric, raw_get, user_headers};
use crate::support::cluster::notebook;
use crate::support::proxy::{
    ALICE, BOB, notebook_vs, options, proxy_for_alice_lab, service_authority, start_proxy,
};
use futures::{SinkExt, StreamExt};
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use labforge_crds::VirtualService;
use labforge_notebook_controller::BuilderConfig;
use labforge_notebook_controller::builders::virtual_service;
use labforge_proxy::{ProxyOptions, RoutesFrom, RunningProxy};
use labforge_tests::eventually;
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// Polls `url` (as alice) until `check` accepts the answer; fails after 5 s.
pub(super) async fn served_eventually(url: &str, check: impl Fn(u16, &Value) -> bool) {
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
pub(super) async fn proxy_on_fake_api_server(
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
pub(super) async fn create_alice_virtual_service(server: &FakeApiServer, name: &str, http: Value) {
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
pub(super) async fn virtual_service_changes_are_served_for_every_version() {
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
pub(super) async fn authority_query_and_absent_header_conditions_route_as_in_istio() {
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
pub(super) async fn rules_answer_directly_redirect_rewrite_the_authority_and_never_pass_on_a_delegation()
 {
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

// A rule's `timeout` (Istio's, Envoy's route timeout) runs from forwarding to the response's last
// byte: a late head gets 504 at the timeout, a body still streaming then is cut off, a late
// websocket upgrade a 1013 close, and a rule without one (a notebook's) waits as long as the
// notebook takes; an upgraded tunnel is not held to it.
#[tokio::test]
pub(super) async fn a_rules_timeout_answers_504_or_cuts_the_body_and_no_timeout_waits() {
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

/// With the web app's path known, a browser opening a notebook without a route (stopped,
/// deleted) lands on the app's page of it, and error pages link back to the app.
#[tokio::test]
pub(super) async fn a_notebook_without_a_route_sends_browsers_to_the_apps_page_of_it() {
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

/// A cluster's proxy with `--notebook-domain`: each notebook only on its own host, old path URLs
/// sent there, other origins and other namespaces' routes refused there.
#[tokio::test]
pub(super) async fn with_a_notebook_domain_each_notebook_is_served_on_its_own_host_only() {
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
