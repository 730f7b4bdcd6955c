//! Idle culling against a real JupyterLab (podman) and the fake Kubernetes API server: activity is
//! read from Jupyter's kernels API, and an idle notebook is stopped with Kubeflow's annotation.

use crate::controller::{RunningController, eventually, notebook, serve_options};
use crate::{init_crypto, need};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use kube::api::PostParams;
use labforge_crds::Notebook;
use labforge_crds::notebook::{LAST_ACTIVITY_ANNOTATION, STOP_ANNOTATION};
use labforge_notebook_controller::culler::CullingConfig;
use labforge_tests::Registry;
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
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

    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
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
    let _controller = RunningController::start(
        client.clone(),
        serve_options(culling, Some(notebook_server.origin())),
    );

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
