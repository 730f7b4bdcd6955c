//! Idle culling against a real JupyterLab (podman) and the fake Kubernetes API server: activity is
//! read from Jupyter's kernels API, and an idle notebook is stopped with Kubeflow's annotation.
//! Notebooks without Jupyter's API are culled by the traffic the labforge proxy saw.

use crate::support::cluster::{RunningController, notebook, serve_options};
use crate::{init_crypto, need};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use kube::api::PostParams;
use labforge_crds::Notebook;
use labforge_crds::notebook::{LAST_ACTIVITY_ANNOTATION, STOP_ANNOTATION};
use labforge_notebook_controller::culler::CullingConfig;
use labforge_tests::Registry;
use labforge_tests::eventually;
use labforge_tests::notebook::JupyterLab;
use std::time::Duration;

#[tokio::test]
async fn idle_jupyter_notebook_is_culled_after_its_kernel_goes_quiet() {
    init_crypto();
    let registry = need(Registry::start().await);
    let notebook_server = need(JupyterLab::start(&registry, "alice", "idle").await);
    let base = notebook_server.base_url();
    let http = reqwest::Client::new();
    let jupyter = need(labforge_tests::jupyter::JupyterClient::connect(&base).await);
    let kernel = need(
        jupyter
            .post("/api/kernels", &serde_json::json!({"name": "python3"}))
            .await,
    );
    let kernel_url = format!("{base}/api/kernels/{}", kernel["id"].as_str().unwrap());

    // Pods run: a notebook without one is not culled, as in Kubeflow.
    let server = crate::support::cluster::fake_cluster().await;
    let client = server.client();
    let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "alice");
    notebooks
        .create(&PostParams::default(), &notebook("alice", "idle"))
        .await
        .unwrap();
    let culling = CullingConfig {
        enabled: true,
        idle_time: Duration::from_secs(4),
        check_period: Duration::from_millis(300),
    };
    let _controller = RunningController::deployed(
        &server,
        serve_options(culling, Some(notebook_server.origin())),
    )
    .await;

    // The kernel's own activity time (which predates the controller) is what the culler records;
    // without Jupyter's answer it would record the time of its first check instead.
    eventually(
        "last-activity from the Jupyter kernel",
        Duration::from_secs(10),
        || async {
            let nb = notebooks.get("idle").await.ok()?;
            let seen: jiff::Timestamp = nb.annotation(LAST_ACTIVITY_ANNOTATION)?.parse().ok()?;
            let kernel: serde_json::Value =
                http.get(&kernel_url).send().await.ok()?.json().await.ok()?;
            let kernel_activity: jiff::Timestamp =
                kernel["last_activity"].as_str()?.parse().ok()?;
            (seen == kernel_activity).then_some(())
        },
    )
    .await;
    let nb = notebooks.get("idle").await.unwrap();
    assert!(!nb.is_stopped(), "not culled while within the idle time");

    eventually(
        "culled after the idle time",
        Duration::from_secs(20),
        || async {
            let nb = notebooks.get("idle").await.ok()?;
            nb.annotation(STOP_ANNOTATION).map(|_| ())
        },
    )
    .await;
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), "alice");
    eventually(
        "scaled to zero by the controller",
        Duration::from_secs(10),
        || async {
            let replicas = stateful_sets.get_opt("idle").await.ok()??.spec?.replicas?;
            (replicas == 0).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn notebook_without_jupyter_api_is_kept_by_proxy_traffic_and_culled_without_it() {
    use crate::support::proxy::{ALICE, notebook_vs, service_authority, start_proxy};
    use labforge_proxy::RoutesFrom;
    init_crypto();
    // A code-server stand-in: serves pages, has no Jupyter API.
    let app = axum::Router::new().fallback(|uri: axum::http::Uri| async move {
        if uri.path().contains("/api/") {
            (axum::http::StatusCode::NOT_FOUND, "not jupyter")
        } else {
            (axum::http::StatusCode::OK, "code-server")
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let upstream_task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let proxy = start_proxy(
        RoutesFrom::Pushed,
        ["busy", "quiet"]
            .into_iter()
            .map(|name| (service_authority("alice", name), upstream.to_string()))
            .collect(),
    )
    .await;
    proxy.routes.replace_all(vec![
        notebook_vs("alice", "busy"),
        notebook_vs("alice", "quiet"),
    ]);

    // Pods run: a notebook without one is not culled, as in Kubeflow.
    let server = crate::support::cluster::fake_cluster().await;
    let client = server.client();
    let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "alice");
    for name in ["busy", "quiet"] {
        notebooks
            .create(&PostParams::default(), &notebook("alice", name))
            .await
            .unwrap();
    }
    // Someone keeps using "busy" through the proxy.
    let busy_url = format!("http://{}/notebook/alice/busy/", proxy.addr);
    let traffic = tokio::spawn(async move {
        let http = reqwest::Client::new();
        loop {
            let response = http
                .get(&busy_url)
                .header("kubeflow-userid", ALICE)
                .send()
                .await;
            assert_eq!(response.unwrap().status(), 200);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let idle_time = Duration::from_secs(3);
    let mut options = serve_options(
        CullingConfig {
            enabled: true,
            idle_time,
            check_period: Duration::from_millis(300),
        },
        Some(format!("http://{upstream}")),
    );
    options.proxy_activity_url = Some(format!("http://{}", proxy.admin_addr));
    let _controller = RunningController::deployed(&server, options).await;

    eventually("quiet culled", Duration::from_secs(15), || async {
        notebooks
            .get("quiet")
            .await
            .ok()?
            .annotation(STOP_ANNOTATION)
            .map(|_| ())
    })
    .await;
    // Longer than the idle time again: only the proxy's activity can have kept "busy" running.
    tokio::time::sleep(idle_time + Duration::from_secs(1)).await;
    let busy = notebooks.get("busy").await.unwrap();
    assert!(!busy.is_stopped(), "busy was culled despite its traffic");
    let recorded: jiff::Timestamp = busy
        .annotation(LAST_ACTIVITY_ANNOTATION)
        .unwrap()
        .parse()
        .unwrap();
    let proxy_seen: jiff::Timestamp = proxy.activity.get("alice/busy").unwrap();
    assert!(
        proxy_seen.duration_since(recorded) < jiff::SignedDuration::from_secs(2),
        "the annotation follows the proxy's activity ({recorded} vs {proxy_seen})"
    );
    traffic.abort();
    upstream_task.abort();
}

/// Each proxy replica counts only the requests it serves: the culler reads every ready replica
/// of the proxy's Service (its EndpointSlices, at the endpoint port behind the URL's Service
/// port), takes the newest, and says nothing it could be wrong about when a replica is down.
#[tokio::test]
async fn proxy_activity_is_read_from_every_replica_of_the_proxy_service() {
    use crate::support::proxy::{ALICE, proxy_for_alice_lab};
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use labforge_notebook_controller::culler::ActivitySource;
    use labforge_notebook_controller::proxy_activity::ProxyActivity;

    let app = axum::Router::new().fallback(|| async { "code-server" });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let upstream_task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    // Two replicas, as two pods would be: the same admin port on two addresses.
    let first = proxy_for_alice_lab(upstream, |o| o).await;
    let port = first.admin_addr.port();
    let second = proxy_for_alice_lab(upstream, |mut o| {
        o.admin = format!("127.0.0.2:{port}").parse().unwrap();
        o
    })
    .await;

    // Pods run: a notebook without one is not culled, as in Kubeflow.
    let server = crate::support::cluster::fake_cluster().await;
    let client = server.client();
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "labforge-proxy", "namespace": "kubeflow"},
        "spec": {
            "selector": {"app.kubernetes.io/name": "labforge-proxy"},
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http"},
                {"name": "http-admin", "port": 8081, "targetPort": "http-admin"},
            ],
        },
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), "kubeflow")
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "labforge-proxy-7x2kq",
            "namespace": "kubeflow",
            "labels": {"kubernetes.io/service-name": "labforge-proxy"},
        },
        "addressType": "IPv4",
        "ports": [
            {"name": "http", "port": first.addr.port()},
            {"name": "http-admin", "port": port},
        ],
        "endpoints": [
            {"addresses": ["127.0.0.1"], "conditions": {"ready": true}},
            {"addresses": ["127.0.0.2"], "conditions": {"ready": true}},
        ],
    }))
    .unwrap();
    Api::<EndpointSlice>::namespaced(client.clone(), "kubeflow")
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();

    let lab = notebook("alice", "lab");
    let all = ProxyActivity::in_cluster("http://labforge-proxy.kubeflow:8081", client.clone());
    let first_only = ProxyActivity::new(format!("http://{}", first.admin_addr));
    assert_eq!(all.last_activity(&lab).await.unwrap(), None);

    let http = reqwest::Client::new();
    let open = |proxy: std::net::SocketAddr| {
        let http = http.clone();
        async move {
            let response = http
                .get(format!("http://{proxy}/notebook/alice/lab/"))
                .header("kubeflow-userid", ALICE)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
        }
    };
    // Used through the second replica only: the first has nothing to say.
    open(second.addr).await;
    let seen_by_second = second.activity.get("alice/lab").unwrap();
    assert_eq!(first_only.last_activity(&lab).await.unwrap(), None);
    assert_eq!(all.last_activity(&lab).await.unwrap(), Some(seen_by_second));

    // Later through the first: the newest wins.
    tokio::time::sleep(Duration::from_millis(20)).await;
    open(first.addr).await;
    let seen_by_first = first.activity.get("alice/lab").unwrap();
    assert!(seen_by_first > seen_by_second);
    assert_eq!(all.last_activity(&lab).await.unwrap(), Some(seen_by_first));

    // A replica that cannot answer: no answer, rather than one from part of the traffic.
    // (A new reader: the old one's pooled connection would outlive the admin listener.)
    drop(second);
    let after = ProxyActivity::in_cluster("http://labforge-proxy.kubeflow:8081", client.clone());
    let error = eventually(
        "the second replica gone",
        Duration::from_secs(5),
        || async { after.last_activity(&lab).await.err() },
    )
    .await
    .to_string();
    assert!(error.contains("127.0.0.2"), "{error}");
    upstream_task.abort();
}

/// With per-notebook secrets, the culler presents the notebook's secret to Jupyter's API, which
/// labforge's images refuse without it: activity is read, not guessed from the first check.
#[tokio::test]
async fn with_notebook_secrets_the_culler_reads_jupyter_with_the_notebooks_secret() {
    init_crypto();
    let key = "a-cluster-key-of-at-least-16-bytes";
    let secret = labforge_notebook_controller::secret::SecretKey::new(key.as_bytes().to_vec())
        .of("alice", "guarded");
    // Recent, so that it is recorded rather than culled.
    let kernel_activity =
        jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() - 10).unwrap();
    let activity_text = kernel_activity.to_string();
    // A Jupyter stand-in that answers its API only with that secret.
    let expected = format!("token {secret}");
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let expected = expected.clone();
        async move {
            let authorized = request
                .headers()
                .get("authorization")
                .is_some_and(|value| value.as_bytes() == expected.as_bytes());
            let path = request.uri().path().to_owned();
            match (authorized, path.as_str()) {
                (false, _) => (axum::http::StatusCode::FORBIDDEN, "no".to_owned()),
                (true, "/notebook/alice/guarded/api/kernels") => (
                    axum::http::StatusCode::OK,
                    serde_json::json!([{"id": "k", "execution_state": "idle",
                                        "last_activity": activity_text}])
                    .to_string(),
                ),
                (true, _) => (axum::http::StatusCode::OK, "[]".to_owned()),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let _jupyter = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // Pods run: a notebook without one is not culled, as in Kubeflow.
    let server = crate::support::cluster::fake_cluster().await;
    let client = server.client();
    let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "alice");
    notebooks
        .create(&PostParams::default(), &notebook("alice", "guarded"))
        .await
        .unwrap();
    let culling = CullingConfig {
        enabled: true,
        idle_time: Duration::from_secs(3600),
        check_period: Duration::from_millis(300),
    };
    let mut options = serve_options(culling, Some(origin));
    options.builder = labforge_notebook_controller::BuilderConfig::from_env(|variable| {
        (variable == "LABFORGE_NOTEBOOK_SECRET_KEY").then(|| key.to_owned())
    })
    .unwrap();
    let _controller = RunningController::deployed(&server, options).await;
    eventually(
        "last-activity from the guarded Jupyter",
        Duration::from_secs(10),
        || async {
            let nb = notebooks.get("guarded").await.ok()?;
            let seen: jiff::Timestamp = nb.annotation(LAST_ACTIVITY_ANNOTATION)?.parse().ok()?;
            (seen == kernel_activity).then_some(())
        },
    )
    .await;
}
