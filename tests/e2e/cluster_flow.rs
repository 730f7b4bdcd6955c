//! One user's journey in a cluster, end to end: the web API in cluster mode, the notebook
//! controller, and the fake API server running pods for StatefulSets (its kubelet), in a
//! namespace with a ResourceQuota and no LimitRange, with the save agent's init container on.

use crate::support::cluster::{RunningController, serve_options};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ResourceQuota, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use labforge_crds::VirtualService;
use labforge_crds::notebook::{Notebook, STOP_ANNOTATION};
use labforge_notebook_controller::BuilderConfig;
use labforge_notebook_controller::culler::CullingConfig;
use labforge_tests::eventually;
use labforge_tests::fake_kube::FakeApiServer;
use serde_json::{Value, json};
use std::time::Duration;

const ALICE: &str = "alice@example.com";
const WAIT: Duration = Duration::from_secs(20);

/// A fake cluster whose StatefulSets get pods, with a ResourceQuota of these `hard` limits in
/// namespace `alice` and no LimitRange.
async fn cluster_with_quota(hard: Value) -> FakeApiServer {
    let server = crate::support::cluster::fake_cluster().await;
    add_resource_quota(&server, "alice", hard).await;
    server
}

/// Gives `namespace` a ResourceQuota (Kubeflow's profile quota) of these `hard` limits.
pub async fn add_resource_quota(server: &FakeApiServer, namespace: &str, hard: Value) {
    let quotas: Api<ResourceQuota> = Api::namespaced(server.client(), namespace);
    let quota = json!({"metadata": {"name": "kf-resource-quota"}, "spec": {"hard": hard}});
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(quota).unwrap(),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn create_run_stop_start_and_delete_a_notebook_in_a_cluster() {
    // A profile's quota: every container, init containers included, must state its limits.
    let server = cluster_with_quota(json!({"limits.cpu": "8", "limits.memory": "16Gi",
        "requests.cpu": "8", "requests.memory": "16Gi"}))
    .await;
    let client = server.client();
    server.set_access_rule(|spec| {
        spec["user"] == ALICE && spec["resourceAttributes"]["namespace"] == "alice"
    });
    let mut options = serve_options(
        CullingConfig {
            enabled: true,
            idle_time: Duration::from_secs(60),
            check_period: Duration::from_millis(200),
        },
        None,
    );
    options.builder = BuilderConfig {
        agent_image: Some("registry.example.com/labforge/labforge:1".into()),
        ..BuilderConfig::default()
    };
    let _controller = RunningController::deployed(&server, options).await;
    let web = crate::support::cluster::WebApp::start(&server, None, None).await;
    let api = web.client();
    let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "alice");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "alice");

    // The default form: a new workspace.
    let (status, created) = api
        .post(
            Some(ALICE),
            "/api/namespaces/alice/notebooks",
            json!({"name": "lab"}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "alice");
    assert!(claims.get_opt("lab-workspace").await.unwrap().is_some());
    let ready = eventually("the notebook Ready", WAIT, || async {
        let status = notebooks.get("lab").await.ok()?.status?;
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (ready && status.ready_replicas == 1).then_some(status)
    })
    .await;
    assert!(ready.container_state.running.is_some());
    let pod = pods.get("lab-0").await.unwrap();
    let init = &pod.spec.unwrap().init_containers.unwrap()[0];
    assert_eq!(
        init.name, "labforge-agent-install",
        "the agent's init container ran"
    );
    let (_, view) = api
        .get(Some(ALICE), "/api/namespaces/alice/notebooks/lab")
        .await;
    assert_eq!(view["notebook"]["state"], "ready", "{view}");

    // Stop: the pod goes and the status keeps nothing of the run.
    let (status, _) = api
        .patch(
            Some(ALICE),
            "/api/namespaces/alice/notebooks/lab",
            json!({"stopped": true}),
        )
        .await;
    assert_eq!(status, 200);
    let stopped = eventually("stopped, pod gone", WAIT, || async {
        let nb = notebooks.get("lab").await.ok()?;
        let pod_gone = pods.get_opt("lab-0").await.ok()?.is_none();
        let status = nb.status?;
        (pod_gone && status.ready_replicas == 0 && status.conditions.is_empty()).then_some(status)
    })
    .await;
    assert_eq!(
        stopped.container_state,
        Default::default(),
        "no stale container state"
    );
    let (_, view) = api
        .get(Some(ALICE), "/api/namespaces/alice/notebooks/lab")
        .await;
    assert_eq!(view["notebook"]["state"], "stopped", "{view}");
    // An activity record from long ago, as a stop from elsewhere leaves it: the controller
    // clears it while the notebook is stopped, so the start below begins a fresh idle clock.
    let stale = json!({"metadata": {"annotations": {
        "notebooks.kubeflow.org/last-activity": "2026-01-01T00:00:00Z"}}});
    notebooks
        .patch("lab", &PatchParams::default(), &Patch::Merge(&stale))
        .await
        .unwrap();
    eventually("the stale activity cleared", WAIT, || async {
        let nb = notebooks.get("lab").await.ok()?;
        nb.annotation("notebooks.kubeflow.org/last-activity")
            .is_none()
            .then_some(())
    })
    .await;

    // Start: running again, and not culled by the culler checking five times a second (it
    // would be at once, idle since January, had the record stayed).
    let (status, _) = api
        .patch(
            Some(ALICE),
            "/api/namespaces/alice/notebooks/lab",
            json!({"stopped": false}),
        )
        .await;
    assert_eq!(status, 200);
    eventually("running again", WAIT, || async {
        let status = notebooks.get("lab").await.ok()?.status?;
        (status.ready_replicas == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let nb = notebooks.get("lab").await.unwrap();
    assert_eq!(
        nb.annotation(STOP_ANNOTATION),
        None,
        "culled right after its start"
    );

    // Delete, in the foreground: the children first, then the Notebook; the workspace stays.
    let (status, _) = api
        .call(
            Some(ALICE),
            reqwest::Method::DELETE,
            "/api/namespaces/alice/notebooks/lab",
            None,
        )
        .await;
    assert_eq!(status, 200);
    eventually("everything gone", WAIT, || async {
        let gone = [
            notebooks.get_opt("lab").await.ok()?.is_none(),
            Api::<StatefulSet>::namespaced(client.clone(), "alice")
                .get_opt("lab")
                .await
                .ok()?
                .is_none(),
            pods.get_opt("lab-0").await.ok()?.is_none(),
            Api::<Service>::namespaced(client.clone(), "alice")
                .get_opt("lab")
                .await
                .ok()?
                .is_none(),
            Api::<VirtualService>::namespaced(client.clone(), "alice")
                .get_opt("notebook-alice-lab")
                .await
                .ok()?
                .is_none(),
            Api::<NetworkPolicy>::namespaced(client.clone(), "alice")
                .get_opt("labforge-notebook-lab")
                .await
                .ok()?
                .is_none(),
        ];
        gone.iter().all(|g| *g).then_some(())
    })
    .await;
    assert!(
        claims.get_opt("lab-workspace").await.unwrap().is_some(),
        "the workspace is kept"
    );
    // The last removal of each: the stop removed the pod once already.
    let removals = server.removals();
    let at = |what: &str| {
        removals
            .iter()
            .rposition(|r| r == what)
            .unwrap_or_else(|| panic!("{what} in {removals:?}"))
    };
    assert!(
        at("Pod alice/lab-0") < at("StatefulSet alice/lab"),
        "{removals:?}"
    );
    assert!(
        at("StatefulSet alice/lab") < at("Notebook alice/lab"),
        "{removals:?}"
    );
    assert!(server.rejected().is_empty(), "{:?}", server.rejected());
}

/// What users see when the cluster cannot run their notebook: a Notebook written by hand
/// without limits in a namespace whose quota needs them gets no pod, and the StatefulSet's
/// FailedCreate reaches the notebook's events; a missing claim leaves the pod Pending with the
/// scheduler's reason in the notebook's status.
#[tokio::test]
async fn a_notebook_the_cluster_cannot_run_says_why() {
    let server = cluster_with_quota(json!({"limits.cpu": "8"})).await;
    let client = server.client();
    let _controller =
        RunningController::deployed(&server, serve_options(CullingConfig::default(), None)).await;
    let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "alice");
    notebooks
        .create(
            &PostParams::default(),
            &crate::support::cluster::notebook("alice", "limited"),
        )
        .await
        .unwrap();
    let mut no_limits = crate::support::cluster::notebook("alice", "bare");
    if let Some(container) = no_limits.container_mut() {
        container.resources = None;
    }
    notebooks
        .create(&PostParams::default(), &no_limits)
        .await
        .unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), "alice");
    let note = eventually("FailedCreate on the Notebook", WAIT, || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find_map(|e| {
                let on_notebook = e.regarding.as_ref()?.kind.as_deref() == Some("Notebook");
                (on_notebook && e.reason.as_deref() == Some("FailedCreate")).then_some(e.note?)
            })
    })
    .await;
    assert!(note.contains("must specify limits.cpu for: bare"), "{note}");
    assert!(
        Api::<Pod>::namespaced(client.clone(), "alice")
            .get_opt("bare-0")
            .await
            .unwrap()
            .is_none()
    );

    // A claim nobody made: Pending, and the notebook says why.
    let mut claiming = crate::support::cluster::notebook("alice", "claims");
    let pod = claiming.spec.template.spec.as_mut().unwrap();
    pod.volumes = Some(vec![
        serde_json::from_value(json!(
        {"name": "data", "persistentVolumeClaim": {"claimName": "nobody-made-this"}}))
        .unwrap(),
    ]);
    notebooks
        .create(&PostParams::default(), &claiming)
        .await
        .unwrap();
    let condition = eventually("Unschedulable in the notebook's status", WAIT, || async {
        let status = notebooks.get("claims").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.reason.as_deref() == Some("Unschedulable"))
    })
    .await;
    assert!(
        condition
            .message
            .unwrap()
            .contains("persistentvolumeclaim \"nobody-made-this\" not found")
    );
    // The notebook with limits ran all along.
    eventually("the other notebook Ready", WAIT, || async {
        (notebooks.get("limited").await.ok()?.status?.ready_replicas == 1).then_some(())
    })
    .await;
}
