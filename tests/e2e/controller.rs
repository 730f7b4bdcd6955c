//! The notebook controller's reconcile loop against the fake Kubernetes API server, which keeps
//! real API semantics and rejects any object that does not validate against the official schemas.

use crate::init_crypto;
use crate::support::cluster::{RunningController, notebook, serve_options};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use labforge_crds::{Notebook, VirtualService};
use labforge_notebook_controller::culler::CullingConfig;
use labforge_tests::eventually;
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
use labforge_tests::tools::reconciles_done;
use serde_json::json;
use std::time::Duration;

async fn fake_server() -> FakeApiServer {
    init_crypto();
    FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap()
}

async fn replicas(api: &Api<StatefulSet>, name: &str) -> Option<i32> {
    api.get_opt(name).await.ok().flatten()?.spec?.replicas
}

#[tokio::test]
async fn notebook_lifecycle_create_stop_start_delete() {
    let server = fake_server().await;
    let client = server.client();
    let _controller =
        RunningController::deployed(&server, serve_options(CullingConfig::default(), None)).await;
    let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "alice");
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), "alice");
    let services: Api<Service> = Api::namespaced(client.clone(), "alice");
    let virtual_services: Api<VirtualService> = Api::namespaced(client.clone(), "alice");

    notebooks
        .create(&PostParams::default(), &notebook("alice", "lab"))
        .await
        .unwrap();
    eventually(
        "StatefulSet with one replica",
        Duration::from_secs(10),
        || async { (replicas(&stateful_sets, "lab").await == Some(1)).then_some(()) },
    )
    .await;
    let service = services.get("lab").await.unwrap();
    assert_eq!(
        service.spec.unwrap().ports.unwrap()[0].name.as_deref(),
        Some("http-lab")
    );
    let vs = virtual_services.get("notebook-alice-lab").await.unwrap();
    assert_eq!(
        vs.spec.http[0].rewrite.as_ref().unwrap().uri.as_deref(),
        Some("/notebook/alice/lab/")
    );
    let sts = stateful_sets.get("lab").await.unwrap();
    assert_eq!(sts.metadata.owner_references.unwrap()[0].kind, "Notebook");
    // Only the platform's namespaces reach the notebook's pods (validated against the schema
    // by the fake API server).
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(client.clone(), "alice");
    let policy = eventually("NetworkPolicy", Duration::from_secs(10), || async {
        policies
            .get_opt("labforge-notebook-lab")
            .await
            .ok()
            .flatten()
    })
    .await;
    assert_eq!(
        policy.metadata.owner_references.unwrap()[0].kind,
        "Notebook"
    );
    let spec = policy.spec.unwrap();
    assert_eq!(
        spec.pod_selector.unwrap().match_labels.unwrap()["statefulset"],
        "lab"
    );
    let from: Vec<String> = spec.ingress.unwrap()[0]
        .from
        .iter()
        .flatten()
        .filter_map(|peer| {
            peer.namespace_selector
                .as_ref()?
                .match_labels
                .as_ref()?
                .get("kubernetes.io/metadata.name")
                .cloned()
        })
        .collect();
    assert_eq!(from, ["kubeflow", "istio-system", "labforge-system"]);

    // Added and then removed annotations reach the VirtualService both ways.
    let headers = json!({"metadata": {"annotations": {
        "notebooks.kubeflow.org/http-headers-request-set": "{\"X-Team\":\"ml\"}"}}});
    notebooks
        .patch("lab", &PatchParams::default(), &Patch::Merge(&headers))
        .await
        .unwrap();
    eventually(
        "header set on the route",
        Duration::from_secs(10),
        || async {
            let vs = virtual_services.get("notebook-alice-lab").await.ok()?;
            vs.spec.http[0].headers.is_some().then_some(())
        },
    )
    .await;
    let no_headers = json!({"metadata": {"annotations": {
        "notebooks.kubeflow.org/http-headers-request-set": null}}});
    notebooks
        .patch("lab", &PatchParams::default(), &Patch::Merge(&no_headers))
        .await
        .unwrap();
    eventually(
        "header removed from the route",
        Duration::from_secs(10),
        || async {
            let vs = virtual_services.get("notebook-alice-lab").await.ok()?;
            vs.spec.http[0].headers.is_none().then_some(())
        },
    )
    .await;
    assert!(
        server.rejected().is_empty(),
        "the API server rejected: {:?}",
        server.rejected()
    );

    // Stop, then start again, through Kubeflow's annotation.
    let stop =
        json!({"metadata": {"annotations": {"kubeflow-resource-stopped": "2026-11-21T10:00:00Z"}}});
    notebooks
        .patch("lab", &PatchParams::default(), &Patch::Merge(&stop))
        .await
        .unwrap();
    eventually("scaled to zero", Duration::from_secs(10), || async {
        (replicas(&stateful_sets, "lab").await == Some(0)).then_some(())
    })
    .await;
    let start = json!({"metadata": {"annotations": {"kubeflow-resource-stopped": null}}});
    notebooks
        .patch("lab", &PatchParams::default(), &Patch::Merge(&start))
        .await
        .unwrap();
    eventually("scaled back to one", Duration::from_secs(10), || async {
        (replicas(&stateful_sets, "lab").await == Some(1)).then_some(())
    })
    .await;

    // As the web app deletes: in the foreground, which waits for the children that block it.
    notebooks
        .delete("lab", &DeleteParams::foreground())
        .await
        .unwrap();
    eventually(
        "children deleted with their owner",
        Duration::from_secs(10),
        || async {
            let sts_gone = stateful_sets.get_opt("lab").await.ok()?.is_none();
            let svc_gone = services.get_opt("lab").await.ok()?.is_none();
            let vs_gone = virtual_services
                .get_opt("notebook-alice-lab")
                .await
                .ok()?
                .is_none();
            let policy_gone = policies
                .get_opt("labforge-notebook-lab")
                .await
                .ok()?
                .is_none();
            let notebook_gone = notebooks.get_opt("lab").await.ok()?.is_none();
            (sts_gone && svc_gone && vs_gone && policy_gone && notebook_gone).then_some(())
        },
    )
    .await;
    // In the foreground the children go first, the Notebook last.
    let removals = server.removals();
    assert_eq!(
        removals.last().map(String::as_str),
        Some("Notebook alice/lab"),
        "{removals:?}"
    );
}

#[tokio::test]
async fn pod_failure_becomes_a_condition_and_an_event_on_the_notebook() {
    let server = fake_server().await;
    let client = server.client();
    let _controller =
        RunningController::deployed(&server, serve_options(CullingConfig::default(), None)).await;
    let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "alice");
    notebooks
        .create(&PostParams::default(), &notebook("alice", "broken"))
        .await
        .unwrap();
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), "alice");
    eventually("StatefulSet", Duration::from_secs(10), || async {
        replicas(&stateful_sets, "broken").await
    })
    .await;

    // What the kubelet would write for a pod whose image cannot be pulled.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "alice");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "broken-0", "labels": { "statefulset": "broken", "notebook-name": "broken" } },
        "spec": { "containers": [{ "name": "broken", "image": "kubeflownotebookswg/jupyter-scipy:v1.9.0" }] }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), "alice");
    let event: CoreEvent = serde_json::from_value(json!({
        "metadata": { "name": "broken-0.pull" },
        "involvedObject": { "kind": "Pod", "name": "broken-0", "namespace": "alice" },
        "reason": "Failed",
        "message": "Failed to pull image: not found",
        "type": "Warning"
    }))
    .unwrap();
    events.create(&PostParams::default(), &event).await.unwrap();
    let status = json!({ "status": {
        "phase": "Pending",
        "conditions": [{ "type": "Ready", "status": "False", "reason": "ContainersNotReady" }],
        "containerStatuses": [{
            "name": "broken", "image": "kubeflownotebookswg/jupyter-scipy:v1.9.0", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": { "waiting": { "reason": "ImagePullBackOff", "message": "Back-off pulling image" } }
        }]
    }});
    pods.patch_status("broken-0", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();

    let nb_status = eventually(
        "Notebook status mirrors the pod",
        Duration::from_secs(10),
        || async {
            let status = notebooks.get("broken").await.ok()?.status?;
            status.container_state.waiting.is_some().then_some(status)
        },
    )
    .await;
    assert_eq!(
        nb_status.container_state.waiting.unwrap().reason.as_deref(),
        Some("ImagePullBackOff")
    );
    assert_eq!(
        nb_status.conditions[0].reason.as_deref(),
        Some("ContainersNotReady")
    );

    let reemitted: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "alice");
    let count_reemitted = || async {
        let list = reemitted.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Notebook")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("Failed to pull image"))
            })
            .count()
    };
    eventually(
        "pod warning re-emitted on the Notebook",
        Duration::from_secs(10),
        || async { (count_reemitted().await == 1).then_some(()) },
    )
    .await;

    // A controller restart does not repeat warnings an earlier instance already re-emitted.
    drop(_controller);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let _restarted =
        RunningController::deployed(&server, serve_options(CullingConfig::default(), None)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        count_reemitted().await,
        1,
        "warning re-emitted again after a restart"
    );
}

#[tokio::test]
async fn notebook_without_containers_gets_a_condition_and_no_children() {
    let server = fake_server().await;
    let client = server.client();
    let _controller =
        RunningController::deployed(&server, serve_options(CullingConfig::default(), None)).await;
    let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "alice");
    let mut empty = notebook("alice", "empty");
    empty
        .spec
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers
        .clear();
    notebooks
        .create(&PostParams::default(), &empty)
        .await
        .unwrap();
    let condition = eventually("InvalidSpec condition", Duration::from_secs(10), || async {
        let status = notebooks.get("empty").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "InvalidSpec")
    })
    .await;
    assert!(
        condition
            .message
            .unwrap()
            .contains("spec.template.spec.containers")
    );
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), "alice");
    assert!(
        stateful_sets.get_opt("empty").await.unwrap().is_none(),
        "nothing half-created"
    );
}

#[tokio::test]
async fn restart_mid_way_converges_without_duplicates_and_idle_resync_sends_nothing() {
    let server = fake_server().await;
    let client = server.client();
    let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "team");
    // Kubeflow's default quantities, which the API server stores in another form (`500m`).
    for i in 0..8 {
        create_raw(
            &client,
            &kubeflow_notebook("team", &format!("nb-{i}"), None),
        )
        .await;
    }
    let first =
        RunningController::deployed(&server, serve_options(CullingConfig::default(), None)).await;
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), "team");
    eventually("some StatefulSets", Duration::from_secs(10), || async {
        let n = stateful_sets
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .len();
        (n >= 1).then_some(())
    })
    .await;
    drop(first);

    let _second =
        RunningController::deployed(&server, serve_options(CullingConfig::default(), None)).await;
    let virtual_services: Api<VirtualService> = Api::namespaced(client.clone(), "team");
    eventually("all eight converged", Duration::from_secs(20), || async {
        let sts = stateful_sets
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .len();
        let vs = virtual_services
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .len();
        let with_status = notebooks
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .iter()
            .filter(|n| n.status.is_some())
            .count();
        (sts == 8 && vs == 8 && with_status == 8).then_some(())
    })
    .await;

    // A full resync by a fresh controller finds nothing to change: no write at all.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = server.write_count();
    let requests_before = server.write_requests();
    let writes_before = server.writes_by();
    drop(_second);
    let port = labforge_tests::tools::free_port().unwrap();
    let mut options = serve_options(CullingConfig::default(), None);
    options.admin_addr = format!("127.0.0.1:{port}").parse().unwrap();
    options.resync = Duration::from_secs(1);
    let _third = RunningController::deployed(&server, options).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        server.write_count(),
        before,
        "resync wrote: before {writes_before:?}, after {:?}",
        server.writes_by()
    );
    assert_eq!(
        server.write_requests(),
        requests_before,
        "resync sent write requests that changed nothing (no-op applies or status patches)"
    );
    assert!(server.rejected().is_empty(), "{:?}", server.rejected());

    // Later resyncs are served from the watch caches: not even a read reaches the server.
    let requests_before = server.requests_by();
    let reconciles_before = reconciles_done(port).await;
    eventually(
        "two more resyncs of all eight",
        Duration::from_secs(10),
        || async { (reconciles_done(port).await >= reconciles_before + 16).then_some(()) },
    )
    .await;
    let sent: Vec<String> = server
        .requests_by()
        .into_iter()
        .filter(|(key, count)| requests_before.get(key) != Some(count))
        .map(|(key, _)| key)
        .filter(|key| !key.starts_with("watch "))
        .collect();
    assert!(sent.is_empty(), "an idle resync sent {sent:?}");
}

#[tokio::test]
async fn admin_endpoints_serve_kubeflow_metrics_and_readiness() {
    let server = fake_server().await;
    let client = server.client();
    let port = labforge_tests::tools::free_port().unwrap();
    let mut options = serve_options(CullingConfig::default(), None);
    options.admin_addr = format!("127.0.0.1:{port}").parse().unwrap();
    let _controller = RunningController::deployed(&server, options).await;
    let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "alice");
    notebooks
        .create(&PostParams::default(), &notebook("alice", "metered"))
        .await
        .unwrap();

    let http = reqwest::Client::new();
    let metrics = eventually(
        "creation counted in /metrics",
        Duration::from_secs(10),
        || async {
            let text = http
                .get(format!("http://127.0.0.1:{port}/metrics"))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            // The gauge is set by the reconcile after the create: wait for both.
            (text.contains(r#"notebook_create_total{namespace="alice"} 1"#)
                && text.contains(r#"notebook_running{namespace="alice"}"#))
            .then_some(text)
        },
    )
    .await;
    assert!(
        metrics.contains(r#"notebook_running{namespace="alice"} 0"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("labforge_notebook_reconcile_duration_seconds_count"),
        "{metrics}"
    );
    for path in ["/healthz", "/readyz"] {
        let status = http
            .get(format!("http://127.0.0.1:{port}{path}"))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 200, "{path}");
    }
}

#[tokio::test]
async fn one_replica_leads_and_another_takes_over_an_expired_lease() {
    use k8s_openapi::api::coordination::v1::Lease;
    use labforge_notebook_controller::leader::LeaderElector;
    let server = fake_server().await;
    let client = server.client();
    let lease = Duration::from_secs(2);
    let a = LeaderElector::new(
        client.clone(),
        "labforge-system",
        "notebooks",
        "replica-a",
        lease,
    );
    let b = LeaderElector::new(
        client.clone(),
        "labforge-system",
        "notebooks",
        "replica-b",
        lease,
    );

    assert!(
        a.try_acquire_or_renew().await.unwrap(),
        "first replica takes the free lease"
    );
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "second waits while it is held"
    );
    assert!(a.try_acquire_or_renew().await.unwrap(), "the holder renews");
    assert!(!b.try_acquire_or_renew().await.unwrap());

    // The holder stops renewing (crashed); after the lease duration the other takes over.
    tokio::time::sleep(lease + Duration::from_millis(600)).await;
    assert!(
        b.try_acquire_or_renew().await.unwrap(),
        "expired lease is taken over"
    );
    assert!(
        !a.try_acquire_or_renew().await.unwrap(),
        "the old holder does not win it back"
    );
    let leases: Api<Lease> = Api::namespaced(client, "labforge-system");
    let spec = leases.get("notebooks").await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("replica-b"));
    assert_eq!(spec.lease_transitions, Some(1));
}

/// Our CRD types quantities as strings, so a bad one passes the CR schema; the API server then
/// refuses the StatefulSet, and that must end as a condition, not a retry loop.
#[tokio::test]
async fn notebook_the_api_server_refuses_gets_a_condition_and_no_retry_loop() {
    init_crypto();
    let (options, _schemas) = FakeApiServerOptions::with_labforge_notebook_crd().unwrap();
    let server = FakeApiServer::start(options).await.unwrap();
    let client = server.client();
    let _controller =
        RunningController::deployed(&server, serve_options(CullingConfig::default(), None)).await;
    let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "alice");
    let mut bad = notebook("alice", "greedy");
    let limits = json!({"cpu": "1", "memory": "2GB"});
    bad.spec.template.spec.as_mut().unwrap().containers[0].resources =
        Some(serde_json::from_value(json!({ "limits": limits })).unwrap());
    notebooks
        .create(&PostParams::default(), &bad)
        .await
        .unwrap();

    let condition = eventually(
        "InvalidSpec condition from the API's refusal",
        Duration::from_secs(10),
        || async {
            let status = notebooks.get("greedy").await.ok()?.status?;
            status
                .conditions
                .into_iter()
                .find(|c| c.type_ == "InvalidSpec")
        },
    )
    .await;
    let message = condition.message.unwrap();
    assert!(
        message.contains("StatefulSet rejected") && message.contains("2GB"),
        "{message}"
    );
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), "alice");
    assert!(stateful_sets.get_opt("greedy").await.unwrap().is_none());
    // No retry loop: the refused apply is not repeated while nothing changes.
    let rejected = server.rejected().len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(server.rejected().len(), rejected, "{:?}", server.rejected());
}

/// A Notebook as Kubeflow's web app writes it: its default CPU and memory, written as Kubeflow
/// writes them (`0.5`, `1.0Gi`), and, when `gpus` is set, a GPU limit written as a JSON integer,
/// which the CRD allows and the API server keeps as written.
fn kubeflow_notebook(namespace: &str, name: &str, gpus: Option<u32>) -> serde_json::Value {
    let mut limits = json!({"cpu": "0.6", "memory": "1.2Gi"});
    if let Some(gpus) = gpus {
        limits["nvidia.com/gpu"] = json!(gpus);
    }
    json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"template": {"spec": {"containers": [{
            "name": name,
            "image": "kubeflownotebookswg/jupyter-scipy:v1.9.0",
            "resources": {"requests": {"cpu": "0.5", "memory": "1.0Gi"}, "limits": limits}
        }]}}}
    })
}

/// Creates `notebook` as written, numbers and all (a typed client would write strings).
async fn create_raw(client: &Client, notebook: &serde_json::Value) {
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("kubeflow.org", "v1", "Notebook"),
        "notebooks",
    );
    let namespace = notebook["metadata"]["namespace"].as_str().unwrap();
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &resource);
    let object: kube::api::DynamicObject = serde_json::from_value(notebook.clone()).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

/// What the kubelet reports for the notebook container of `pod`.
async fn set_container_state(
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
    state: serde_json::Value,
) {
    let ready = state.get("running").is_some();
    let status = json!({ "status": {
        "phase": if ready { "Running" } else { "Pending" },
        "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }],
        "containerStatuses": [{
            "name": container, "image": "kubeflownotebookswg/jupyter-scipy:v1.9.0", "imageID": "",
            "ready": ready, "restartCount": 0, "state": state
        }]
    }});
    let mut current = pods.get(pod).await.unwrap();
    current.status = serde_json::from_value(status["status"].clone()).unwrap();
    pods.replace_status(pod, &PostParams::default(), &current)
        .await
        .unwrap();
}

#[tokio::test]
async fn status_follows_the_pod_exactly_and_a_stop_from_kubectl_clears_the_idle_clock() {
    let server = fake_server().await;
    let client = server.client();
    let _controller =
        RunningController::deployed(&server, serve_options(CullingConfig::default(), None)).await;
    let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "alice");
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), "alice");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "alice");
    create_raw(&client, &kubeflow_notebook("alice", "lab", Some(1))).await;
    eventually("StatefulSet", Duration::from_secs(10), || async {
        replicas(&stateful_sets, "lab").await
    })
    .await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "lab-0", "labels": { "statefulset": "lab", "notebook-name": "lab" } },
        "spec": { "containers": [{ "name": "lab", "image": "kubeflownotebookswg/jupyter-scipy:v1.9.0" }] }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();

    set_container_state(
        &pods,
        "lab-0",
        "lab",
        json!({"waiting": {"reason": "ErrImagePull", "message": "pull access denied"}}),
    )
    .await;
    eventually("waiting mirrored", Duration::from_secs(10), || async {
        let state = notebooks.get("lab").await.ok()?.status?.container_state;
        state.waiting.filter(|w| w.message.is_some())
    })
    .await;
    set_container_state(
        &pods,
        "lab-0",
        "lab",
        json!({"waiting": {"reason": "ContainerCreating"}}),
    )
    .await;
    let waiting = eventually(
        "the new waiting reason",
        Duration::from_secs(10),
        || async {
            let state = notebooks.get("lab").await.ok()?.status?.container_state;
            state
                .waiting
                .filter(|w| w.reason.as_deref() == Some("ContainerCreating"))
        },
    )
    .await;
    assert_eq!(waiting.message, None, "the old reason's message stayed");
    set_container_state(
        &pods,
        "lab-0",
        "lab",
        json!({"running": {"startedAt": "2026-11-25T10:00:00Z"}}),
    )
    .await;
    let state = eventually("running mirrored", Duration::from_secs(10), || async {
        let state = notebooks.get("lab").await.ok()?.status?.container_state;
        state.running.is_some().then_some(state)
    })
    .await;
    assert_eq!(state.waiting, None, "waiting stayed next to running");

    // The culler has seen activity; then someone stops the notebook with kubectl, and the
    // StatefulSet controller removes the pod.
    let seen = json!({"metadata": {"annotations": {
        "notebooks.kubeflow.org/last-activity": "2026-11-25T09:00:00Z",
        "notebooks.kubeflow.org/last_activity_check_timestamp": "2026-11-25T09:00:00Z"}}});
    notebooks
        .patch("lab", &PatchParams::default(), &Patch::Merge(&seen))
        .await
        .unwrap();
    let stop =
        json!({"metadata": {"annotations": {"kubeflow-resource-stopped": "2026-11-25T11:00:00Z"}}});
    notebooks
        .patch("lab", &PatchParams::default(), &Patch::Merge(&stop))
        .await
        .unwrap();
    eventually("scaled to zero", Duration::from_secs(10), || async {
        (replicas(&stateful_sets, "lab").await == Some(0)).then_some(())
    })
    .await;
    pods.delete("lab-0", &DeleteParams::default())
        .await
        .unwrap();
    let stopped = eventually(
        "stopped, with nothing left of the run",
        Duration::from_secs(10),
        || async {
            let nb = notebooks.get("lab").await.ok()?;
            let status = nb.status.clone()?;
            let annotations = nb.metadata.annotations.clone().unwrap_or_default();
            (status.container_state == Default::default()
                && !annotations.contains_key("notebooks.kubeflow.org/last-activity"))
            .then_some((status, annotations))
        },
    )
    .await;
    assert_eq!(stopped.0.ready_replicas, 0);
    assert!(
        stopped.0.conditions.is_empty(),
        "{:?}",
        stopped.0.conditions
    );
    assert!(
        !stopped
            .1
            .contains_key("notebooks.kubeflow.org/last_activity_check_timestamp")
    );

    // Started again: no stale activity that would get it culled at once.
    let start = json!({"metadata": {"annotations": {"kubeflow-resource-stopped": null}}});
    notebooks
        .patch("lab", &PatchParams::default(), &Patch::Merge(&start))
        .await
        .unwrap();
    eventually("scaled back to one", Duration::from_secs(10), || async {
        (replicas(&stateful_sets, "lab").await == Some(1)).then_some(())
    })
    .await;
    let nb = notebooks.get("lab").await.unwrap();
    assert_eq!(nb.annotation("notebooks.kubeflow.org/last-activity"), None);
    // The integer GPU limit was read, and the StatefulSet asks for it.
    let sts = stateful_sets.get("lab").await.unwrap();
    let limits = sts.spec.unwrap().template.spec.unwrap().containers[0]
        .resources
        .clone()
        .unwrap()
        .limits
        .unwrap();
    assert_eq!(limits["nvidia.com/gpu"].0, "1");
    assert!(server.rejected().is_empty(), "{:?}", server.rejected());
}

#[tokio::test]
async fn a_notebook_with_an_integer_gpu_limit_stops_no_other_from_being_reconciled() {
    let server = fake_server().await;
    let client = server.client();
    for i in 0..50 {
        create_raw(
            &client,
            &kubeflow_notebook("team", &format!("nb-{i}"), None),
        )
        .await;
    }
    create_raw(&client, &kubeflow_notebook("team", "gpu", Some(1))).await;
    let _controller =
        RunningController::deployed(&server, serve_options(CullingConfig::default(), None)).await;
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), "team");
    eventually("all 51 reconciled", Duration::from_secs(30), || async {
        let n = stateful_sets
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .len();
        (n == 51).then_some(())
    })
    .await;
    let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "team");
    let listed = notebooks.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 51);
}

/// Taking over from Kubeflow's controller: children it made (owner references at
/// `kubeflow.org/v1beta1`, its field manager) are brought in line without rewriting their owner
/// references, which clusters enforcing owner-reference permissions allow only to who may delete
/// the child.
#[tokio::test]
async fn children_kubeflow_made_are_taken_over_with_their_owner_references() {
    let server = fake_server().await;
    let client = server.client();
    let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "alice");
    let created = notebooks
        .create(&PostParams::default(), &notebook("alice", "lab"))
        .await
        .unwrap();
    let kubeflows_owner = json!([{"apiVersion": "kubeflow.org/v1beta1", "kind": "Notebook",
        "name": "lab", "uid": created.metadata.uid.clone().unwrap(),
        "controller": true, "blockOwnerDeletion": true}]);
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), "alice");
    let as_kubeflow = PostParams {
        field_manager: Some("manager".into()),
        ..PostParams::default()
    };
    stateful_sets
        .create(
            &as_kubeflow,
            &serde_json::from_value(json!({
                "metadata": {"name": "lab", "ownerReferences": kubeflows_owner},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"statefulset": "lab"}},
                    "template": {"metadata": {"labels": {"statefulset": "lab"}},
                        "spec": {"containers": [{"name": "lab", "image": "kubeflownotebookswg/jupyter-scipy:v1.9.0"}]}}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let _controller =
        RunningController::deployed(&server, serve_options(CullingConfig::default(), None)).await;
    let taken_over = eventually(
        "the StatefulSet brought in line",
        Duration::from_secs(10),
        || async {
            let sts = stateful_sets.get("lab").await.ok()?;
            let labels = sts
                .spec
                .as_ref()?
                .template
                .metadata
                .as_ref()?
                .labels
                .clone()?;
            labels.contains_key("notebook-name").then_some(sts)
        },
    )
    .await;
    let owners = taken_over.metadata.owner_references.unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].api_version, "kubeflow.org/v1beta1");
    assert!(server.rejected().is_empty(), "{:?}", server.rejected());
}
