//! The fake Kubernetes API server through the same `kube::Client` the controller uses: the API
//! semantics Kubernetes-mode code relies on, and schema validation of what is written.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

async fn start() -> FakeApiServer {
    start_with(FakeApiServerOptions::default()).await
}

async fn start_with(options: FakeApiServerOptions) -> FakeApiServer {
    FakeApiServer::start(options).await.unwrap()
}

fn notebooks(client: Client, version: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("kubeflow.org", version, "Notebook");
    Api::namespaced_with(
        client,
        "default",
        &ApiResource::from_gvk_with_plural(&gvk, "notebooks"),
    )
}

fn virtual_services(client: Client, version: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("networking.istio.io", version, "VirtualService");
    Api::namespaced_with(
        client,
        "default",
        &ApiResource::from_gvk_with_plural(&gvk, "virtualservices"),
    )
}

fn dynamic(value: Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

fn notebook(name: &str) -> DynamicObject {
    dynamic(json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"containers": [{"name": name, "image": "jupyter:latest"}]}}},
    }))
}

fn statefulset_json(name: &str, image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "labels": {"app": "notebook", "notebook-name": name}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"statefulset": name}},
            "template": {
                "metadata": {"labels": {"statefulset": name}},
                "spec": {"containers": [{
                    "name": name,
                    "image": image,
                    "resources": {"limits": {"memory": "1Gi"}},
                }]},
            },
        },
    })
}

fn statefulset(name: &str) -> StatefulSet {
    serde_json::from_value(statefulset_json(name, "jupyter:latest")).unwrap()
}

fn config_map(name: &str, labels: Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}),
    )
    .unwrap()
}

type Events<K> = futures::stream::BoxStream<'static, watcher::Result<watcher::Event<K>>>;

/// The next watcher event, failing the test if none comes in time.
async fn next_event<K>(events: &mut Events<K>) -> watcher::Result<watcher::Event<K>> {
    tokio::time::timeout(WAIT, events.next())
        .await
        .expect("a watcher event in time")
        .expect("the watcher stream does not end")
}

#[track_caller]
fn api_error<T: std::fmt::Debug>(result: kube::Result<T>) -> Box<kube::core::Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn fake_kube_create_get_and_list_with_label_selector() {
    let server = start().await;
    let api: Api<StatefulSet> = Api::default_namespaced(server.client());
    let created = api
        .create(&PostParams::default(), &statefulset("alpha"))
        .await
        .unwrap();
    assert_eq!(created.namespace().as_deref(), Some("default"));
    assert!(created.uid().is_some());
    assert_eq!(created.metadata.generation, Some(1));
    let mut other = statefulset("beta");
    other.labels_mut().insert("app".into(), "other".into());
    api.create(&PostParams::default(), &other).await.unwrap();

    let fetched = api.get("alpha").await.unwrap();
    assert_eq!(fetched.resource_version(), created.resource_version());

    let all = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        all.items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>(),
        ["alpha", "beta"]
    );
    assert!(
        all.metadata
            .resource_version
            .is_some_and(|rv| !rv.is_empty())
    );
    let selected = api
        .list(&ListParams::default().labels("app=notebook"))
        .await
        .unwrap();
    assert_eq!(
        selected
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>(),
        ["alpha"]
    );
    let selected = api
        .list(&ListParams::default().labels("app in (other, nope),notebook-name"))
        .await
        .unwrap();
    assert_eq!(
        selected
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>(),
        ["beta"]
    );
    let by_name = api
        .list(&ListParams::default().fields("metadata.name=beta"))
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);
    let metadata = api
        .list_metadata(&ListParams::default().labels("app=notebook"))
        .await
        .unwrap();
    assert_eq!(
        metadata
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>(),
        ["alpha"]
    );
    assert_eq!(
        api.get_metadata("beta").await.unwrap().uid(),
        api.get("beta").await.unwrap().uid()
    );

    // All-namespaces list and a different namespace.
    let elsewhere: Api<StatefulSet> = Api::namespaced(server.client(), "team-b");
    elsewhere
        .create(&PostParams::default(), &statefulset("gamma"))
        .await
        .unwrap();
    assert_eq!(
        elsewhere
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let everywhere: Api<StatefulSet> = Api::all(server.client());
    assert_eq!(
        everywhere
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        3
    );
    assert_eq!(server.write_count(), 3);
    assert_eq!(server.writes_by().get("POST statefulsets"), Some(&3));
}

#[tokio::test]
async fn fake_kube_already_exists_and_not_found_are_kubernetes_statuses() {
    let server = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &config_map("cfg", json!({})))
        .await
        .unwrap();
    let status = api_error(
        api.create(&PostParams::default(), &config_map("cfg", json!({})))
            .await,
    );
    assert_eq!(
        (status.code, status.reason.as_str()),
        (409, "AlreadyExists")
    );
    assert_eq!(status.message, "configmaps \"cfg\" already exists");

    let status = api_error(api.get("missing").await);
    assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));
    assert_eq!(
        status.details.as_ref().map(|d| d.name.as_str()),
        Some("missing")
    );
    assert!(api.get_opt("missing").await.unwrap().is_none());
    let status = api_error(api.delete("missing", &DeleteParams::default()).await);
    assert_eq!(status.code, 404);

    // generateName picks a fresh name.
    let generated: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "cfg-"}})).unwrap();
    let created = api
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    assert!(
        created.name_any().starts_with("cfg-") && created.name_any().len() == 9,
        "{}",
        created.name_any()
    );
}

#[tokio::test]
async fn fake_kube_stale_resource_version_is_a_conflict() {
    let server = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let created = api
        .create(&PostParams::default(), &config_map("cfg", json!({})))
        .await
        .unwrap();
    let mut first = created.clone();
    first.data = Some([("k".to_string(), "first".to_string())].into());
    let updated = api
        .replace("cfg", &PostParams::default(), &first)
        .await
        .unwrap();
    assert_ne!(updated.resource_version(), created.resource_version());

    let mut second = created.clone();
    second.data = Some([("k".to_string(), "second".to_string())].into());
    let status = api_error(api.replace("cfg", &PostParams::default(), &second).await);
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert!(
        status.message.contains("the object has been modified"),
        "{}",
        status.message
    );
    assert_eq!(api.get("cfg").await.unwrap().data.unwrap()["k"], "first");

    // A merge patch carrying a stale resourceVersion is refused the same way.
    let patch = json!({"metadata": {"resourceVersion": created.resource_version()}, "data": {"k": "third"}});
    let status = api_error(
        api.patch("cfg", &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    );
    assert_eq!(status.code, 409);
}

#[tokio::test]
async fn fake_kube_patch_formats_follow_their_rfcs_and_strategic_merge_keys() {
    let server = start().await;
    let api: Api<StatefulSet> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &statefulset("nb"))
        .await
        .unwrap();

    // Strategic merge: containers merge by name, so this adds an env var to the one container.
    let strategic = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "nb", "env": [{"name": "NB_PREFIX", "value": "/notebook/default/nb"}]}
    ]}}}});
    let patched = api
        .patch("nb", &PatchParams::default(), &Patch::Strategic(&strategic))
        .await
        .unwrap();
    let containers = patched.spec.unwrap().template.spec.unwrap().containers;
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0].image.as_deref(), Some("jupyter:latest"));
    assert_eq!(containers[0].env.as_ref().unwrap()[0].name, "NB_PREFIX");

    // A merge patch replaces the list instead; here that drops the image, which is allowed.
    let merge = json!({"spec": {"template": {"spec": {"containers": [{"name": "nb"}]}}}});
    let merged = api
        .patch("nb", &PatchParams::default(), &Patch::Merge(&merge))
        .await
        .unwrap();
    assert!(
        merged.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .is_none()
    );

    // JSON patch (sent raw: kube's typed JSON patch needs a feature we do not build), with a
    // failing `test` operation refusing the whole patch.
    let http = reqwest::Client::new();
    let url = format!(
        "{}/apis/apps/v1/namespaces/default/statefulsets/nb",
        server.url()
    );
    let operations = json!([
        {"op": "test", "path": "/spec/replicas", "value": 1},
        {"op": "replace", "path": "/spec/replicas", "value": 0},
    ]);
    let send = || {
        http.patch(&url)
            .header("content-type", "application/json-patch+json")
            .body(operations.to_string())
            .send()
    };
    assert_eq!(send().await.unwrap().status(), 200);
    assert_eq!(api.get("nb").await.unwrap().spec.unwrap().replicas, Some(0));
    let refused = send().await.unwrap();
    assert_eq!(refused.status(), 422);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(
        (body["kind"].as_str(), body["reason"].as_str()),
        (Some("Status"), Some("Invalid"))
    );

    // Custom resources take no strategic merge patch, as on a real server.
    let nbs = notebooks(server.client(), "v1");
    nbs.create(&PostParams::default(), &notebook("nb"))
        .await
        .unwrap();
    let label = json!({"metadata": {"labels": {"a": "b"}}});
    let status = api_error(
        nbs.patch("nb", &PatchParams::default(), &Patch::Strategic(&label))
            .await,
    );
    assert_eq!(status.code, 415);
}

#[tokio::test]
async fn fake_kube_server_side_apply_creates_merges_and_is_free_when_unchanged() {
    let server = start().await;
    let api: Api<StatefulSet> = Api::default_namespaced(server.client());
    let apply = PatchParams::apply("labforge-controller").force();
    let desired = statefulset_json("nb", "jupyter:1");
    let created = api
        .patch("nb", &apply, &Patch::Apply(&desired))
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(server.writes_by().get("PATCH statefulsets"), Some(&1));

    // Identical apply: nothing written, same resourceVersion.
    let writes = server.write_count();
    let again = api
        .patch("nb", &apply, &Patch::Apply(&desired))
        .await
        .unwrap();
    assert_eq!(again.resource_version(), created.resource_version());
    assert_eq!(server.write_count(), writes);

    // Another manager adds a label; the next apply changes the image, keeps the label.
    let label = json!({"metadata": {"labels": {"team": "data"}}});
    api.patch("nb", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let changed = api
        .patch(
            "nb",
            &apply,
            &Patch::Apply(&statefulset_json("nb", "jupyter:2")),
        )
        .await
        .unwrap();
    assert_eq!(changed.metadata.generation, Some(2));
    assert_eq!(
        changed.labels().get("team").map(String::as_str),
        Some("data")
    );
    let containers = &changed
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers;
    assert_eq!(
        (containers.len(), containers[0].image.as_deref()),
        (1, Some("jupyter:2"))
    );

    // Fields the applier stops sending are removed.
    let mut without_limits = statefulset_json("nb", "jupyter:2");
    without_limits["spec"]["template"]["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("resources");
    let pruned = api
        .patch("nb", &apply, &Patch::Apply(&without_limits))
        .await
        .unwrap();
    let container = &pruned.spec.unwrap().template.spec.unwrap().containers[0];
    assert!(container.resources.is_none(), "{:?}", container.resources);

    // Apply needs a field manager, as on a real server.
    let status = api_error(
        api.patch("nb", &PatchParams::default(), &Patch::Apply(&desired))
            .await,
    );
    assert_eq!(status.code, 422);

    // Apply also works for custom resources, and a no-op merge patch is free too.
    let nbs = notebooks(server.client(), "v1");
    let nb = serde_json::to_value(notebook("nb")).unwrap();
    let first = nbs.patch("nb", &apply, &Patch::Apply(&nb)).await.unwrap();
    let writes = server.write_count();
    let noop = json!({"metadata": {"labels": null}});
    let same = nbs
        .patch("nb", &PatchParams::default(), &Patch::Merge(&noop))
        .await
        .unwrap();
    assert_eq!(same.resource_version(), first.resource_version());
    assert_eq!(server.write_count(), writes);
}

#[tokio::test]
async fn fake_kube_status_subresource_changes_only_status() {
    let server = start().await;
    let api = notebooks(server.client(), "v1");
    let created = api
        .create(&PostParams::default(), &notebook("nb"))
        .await
        .unwrap();
    let status = json!({"status": {
        "readyReplicas": 1,
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerState": {"running": {"startedAt": "2025-01-01T00:00:00Z"}},
    }, "spec": {"template": {"spec": {"containers": [{"name": "nb", "image": "changed:by-status"}]}}}});
    let patched = api
        .patch_status("nb", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    assert_eq!(patched.data["status"]["readyReplicas"], 1);
    assert_eq!(
        patched.data["spec"], created.data["spec"],
        "status writes leave the spec alone"
    );
    assert_eq!(
        patched.metadata.generation,
        Some(1),
        "status changes do not bump generation"
    );
    assert_eq!(server.writes_by().get("PATCH notebooks/status"), Some(&1));

    // Writes to the main resource ignore status.
    let main = json!({"status": {"readyReplicas": 0}, "metadata": {"labels": {"x": "y"}}});
    let updated = api
        .patch("nb", &PatchParams::default(), &Patch::Merge(&main))
        .await
        .unwrap();
    assert_eq!(updated.data["status"]["readyReplicas"], 1);
    assert_eq!(updated.labels().get("x").map(String::as_str), Some("y"));

    // Writing the same status again is a no-op; an invalid status is refused.
    let writes = server.write_count();
    api.patch_status("nb", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    assert_eq!(server.write_count(), writes);
    let bad = json!({"status": {"readyReplicas": "one"}});
    let error = api_error(
        api.patch_status("nb", &PatchParams::default(), &Patch::Merge(&bad))
            .await,
    );
    assert_eq!((error.code, error.reason.as_str()), (422, "Invalid"));
    assert!(
        error.message.contains("status.readyReplicas"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn fake_kube_finalizer_keeps_a_deleted_object_until_removed() {
    let server = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let mut cm = config_map("guarded", json!({}));
    cm.metadata.finalizers = Some(vec!["labforge.dev/cleanup".into()]);
    api.create(&PostParams::default(), &cm).await.unwrap();

    let deleted = api
        .delete("guarded", &DeleteParams::default())
        .await
        .unwrap();
    let pending = deleted
        .left()
        .expect("the object is kept while a finalizer is present");
    assert!(pending.metadata.deletion_timestamp.is_some());
    let still_there = api.get("guarded").await.unwrap();
    assert!(still_there.metadata.deletion_timestamp.is_some());

    let add = json!({"metadata": {"finalizers": ["labforge.dev/cleanup", "labforge.dev/other"]}});
    let status = api_error(
        api.patch("guarded", &PatchParams::default(), &Patch::Merge(&add))
            .await,
    );
    assert_eq!(status.code, 422);

    let remove = json!({"metadata": {"finalizers": null}});
    api.patch("guarded", &PatchParams::default(), &Patch::Merge(&remove))
        .await
        .unwrap();
    assert!(api.get_opt("guarded").await.unwrap().is_none());
}

#[tokio::test]
async fn fake_kube_owner_reference_cascade_deletes_a_statefulset_owned_by_a_notebook() {
    let server = start().await;
    let nbs = notebooks(server.client(), "v1");
    let nb = nbs
        .create(&PostParams::default(), &notebook("nb"))
        .await
        .unwrap();
    let owner = json!({
        "apiVersion": "kubeflow.org/v1", "kind": "Notebook", "name": "nb",
        "uid": nb.uid().unwrap(), "controller": true, "blockOwnerDeletion": true,
    });
    let mut sts_json = statefulset_json("nb", "jupyter:1");
    sts_json["metadata"]["ownerReferences"] = json!([owner]);
    let sts: Api<StatefulSet> = Api::default_namespaced(server.client());
    let created = sts
        .create(
            &PostParams::default(),
            &serde_json::from_value(sts_json).unwrap(),
        )
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "nb-0", "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "nb", "uid": created.uid().unwrap(),
        }]},
        "spec": {"containers": [{"name": "nb", "image": "jupyter:1"}]},
    }))
    .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let unrelated = sts
        .create(&PostParams::default(), &statefulset("other"))
        .await
        .unwrap();

    let result = nbs.delete("nb", &DeleteParams::background()).await.unwrap();
    assert!(
        result.is_right(),
        "an object without finalizers is removed at once"
    );
    assert!(sts.get_opt("nb").await.unwrap().is_none());
    assert!(
        pods.get_opt("nb-0").await.unwrap().is_none(),
        "the cascade is recursive"
    );
    assert_eq!(sts.get("other").await.unwrap().uid(), unrelated.uid());
}

/// Foreground deletion as the garbage collector does it: the Notebook stays (deletionTimestamp,
/// `foregroundDeletion`) while a dependent that blocks owner deletion is held, down the tree;
/// a dependent that does not block is deleted but does not hold it.
#[tokio::test]
async fn fake_kube_foreground_deletion_waits_for_blocking_dependents() {
    let server = start().await;
    let nbs = notebooks(server.client(), "v1");
    let nb = nbs
        .create(&PostParams::default(), &notebook("nb"))
        .await
        .unwrap();
    let owned_by = |kind: &str, name: &str, uid: String, blocks: bool| {
        json!([{ "apiVersion": if kind == "Notebook" { "kubeflow.org/v1" } else { "apps/v1" },
                 "kind": kind, "name": name, "uid": uid, "controller": true,
                 "blockOwnerDeletion": blocks }])
    };
    let mut sts_json = statefulset_json("nb", "jupyter:1");
    sts_json["metadata"]["ownerReferences"] = owned_by("Notebook", "nb", nb.uid().unwrap(), true);
    let sts: Api<StatefulSet> = Api::default_namespaced(server.client());
    let created = sts
        .create(
            &PostParams::default(),
            &serde_json::from_value(sts_json).unwrap(),
        )
        .await
        .unwrap();
    // The pod, held by a finalizer, blocks its StatefulSet, which blocks the Notebook.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "nb-0", "finalizers": ["example.com/drain"],
                     "ownerReferences": owned_by("StatefulSet", "nb", created.uid().unwrap(), true)},
        "spec": {"containers": [{"name": "nb", "image": "jupyter:1"}]},
    }))
    .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let configs: Api<ConfigMap> = Api::default_namespaced(server.client());
    let mut loose = config_map("nb-loose", json!({}));
    loose.metadata.owner_references =
        serde_json::from_value(owned_by("Notebook", "nb", nb.uid().unwrap(), false)).unwrap();
    loose.metadata.finalizers = Some(vec!["example.com/keep".into()]);
    configs
        .create(&PostParams::default(), &loose)
        .await
        .unwrap();

    let result = nbs.delete("nb", &DeleteParams::foreground()).await.unwrap();
    let held = result
        .left()
        .expect("the Notebook is kept while its dependents go");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(held.finalizers(), ["foregroundDeletion"]);
    let sts_held = sts.get("nb").await.unwrap();
    assert!(
        sts_held.metadata.deletion_timestamp.is_some(),
        "the StatefulSet is being deleted"
    );
    assert_eq!(sts_held.finalizers(), ["foregroundDeletion"]);
    assert!(
        pods.get("nb-0")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    assert!(
        configs
            .get("nb-loose")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );

    // The pod's finalizer goes: the pod, then the StatefulSet, then the Notebook. The loose
    // dependent, still held by its own finalizer, never held the Notebook.
    let release = json!({"metadata": {"finalizers": null}});
    pods.patch("nb-0", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    assert!(pods.get_opt("nb-0").await.unwrap().is_none());
    assert!(sts.get_opt("nb").await.unwrap().is_none());
    assert!(nbs.get_opt("nb").await.unwrap().is_none());
    assert!(configs.get_opt("nb-loose").await.unwrap().is_some());
}

#[tokio::test]
async fn fake_kube_invalid_statefulset_is_rejected_and_not_stored() {
    let server = start().await;
    let api: Api<StatefulSet> = Api::default_namespaced(server.client());
    let mut bad = statefulset_json("bad", "jupyter:1");
    bad["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] =
        json!("1GB");
    let status = api_error(
        api.create(
            &PostParams::default(),
            &serde_json::from_value(bad).unwrap(),
        )
        .await,
    );
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    let causes = status.details.unwrap().causes;
    assert_eq!(
        causes[0].field,
        "spec.template.spec.containers[0].resources.limits[memory]"
    );
    assert!(
        status
            .message
            .starts_with("StatefulSet.apps \"bad\" is invalid"),
        "{}",
        status.message
    );

    // Unknown fields (as a typo in a builder would produce) are rejected too.
    let mut typo = statefulset_json("typo", "jupyter:1");
    typo["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = json!("Always");
    let post = kube::core::Request::new("/apis/apps/v1/namespaces/default/statefulsets")
        .create(&PostParams::default(), serde_json::to_vec(&typo).unwrap())
        .unwrap();
    let status = api_error(server.client().request::<StatefulSet>(post).await);
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains("imagePullPolicyy"),
        "{}",
        status.message
    );

    assert!(
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert_eq!(server.write_count(), 0);
    assert_eq!(server.rejected().len(), 2);
}

#[tokio::test]
async fn fake_kube_watcher_sees_added_modified_deleted() {
    let server = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let mut events = watcher(api.clone(), watcher::Config::default().labels("app=web")).boxed();
    assert!(matches!(
        next_event(&mut events).await.unwrap(),
        watcher::Event::Init
    ));
    assert!(matches!(
        next_event(&mut events).await.unwrap(),
        watcher::Event::InitDone
    ));

    api.create(
        &PostParams::default(),
        &config_map("web", json!({"app": "web"})),
    )
    .await
    .unwrap();
    api.create(
        &PostParams::default(),
        &config_map("db", json!({"app": "db"})),
    )
    .await
    .unwrap();
    match next_event(&mut events).await.unwrap() {
        watcher::Event::Apply(cm) => assert_eq!(cm.name_any(), "web"),
        other => panic!("expected Apply(web), got {other:?}"),
    }
    let patch = json!({"data": {"k": "changed"}});
    api.patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    match next_event(&mut events).await.unwrap() {
        watcher::Event::Apply(cm) => assert_eq!(cm.data.unwrap()["k"], "changed"),
        other => panic!("expected Apply(modified web), got {other:?}"),
    }
    api.delete("web", &DeleteParams::default()).await.unwrap();
    match next_event(&mut events).await.unwrap() {
        watcher::Event::Delete(cm) => assert_eq!(cm.name_any(), "web"),
        other => panic!("expected Delete(web), got {other:?}"),
    }

    // The raw watch stream carries the event types themselves, resumed from a resourceVersion.
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &config_map("new", json!({})))
        .await
        .unwrap();
    let relabel = json!({"metadata": {"labels": {"app": "web"}}});
    api.patch("db", &PatchParams::default(), &Patch::Merge(&relabel))
        .await
        .unwrap();
    api.delete("new", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push(match event {
            WatchEvent::Added(cm) => format!("ADDED {}", cm.name_any()),
            WatchEvent::Modified(cm) => format!("MODIFIED {}", cm.name_any()),
            WatchEvent::Deleted(cm) => format!("DELETED {}", cm.name_any()),
            // Idle watches get bookmarks (allowWatchBookmarks is kube's default).
            WatchEvent::Bookmark(_) => continue,
            other => format!("{other:?}"),
        });
    }
    assert_eq!(seen, ["ADDED new", "MODIFIED db", "DELETED new"]);
}

#[tokio::test]
async fn fake_kube_watch_from_a_too_old_resource_version_gets_410_and_the_watcher_relists() {
    let server = start_with(FakeApiServerOptions {
        watch_history: 3,
        ..FakeApiServerOptions::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &config_map("first", json!({})))
        .await
        .unwrap();
    let old = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    for n in 0..5 {
        api.create(
            &PostParams::default(),
            &config_map(&format!("more-{n}"), json!({})),
        )
        .await
        .unwrap();
    }
    let mut stream = api
        .watch(&WatchParams::default(), &old)
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(WAIT, stream.next()).await.unwrap() {
        Some(Ok(WatchEvent::Error(status))) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }

    // A live watcher that falls behind the history (one deletecollection of more objects than
    // the history keeps) is told 410, re-lists, and carries on.
    let selector = "burst=yes";
    let mut events = watcher(api.clone(), watcher::Config::default().labels(selector)).boxed();
    assert!(matches!(
        next_event(&mut events).await,
        Ok(watcher::Event::Init)
    ));
    assert!(matches!(
        next_event(&mut events).await,
        Ok(watcher::Event::InitDone)
    ));
    for n in 0..6 {
        api.create(
            &PostParams::default(),
            &config_map(&format!("burst-{n}"), json!({"burst": "yes"})),
        )
        .await
        .unwrap();
    }
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 6 {
        if let Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) =
            next_event(&mut events).await
        {
            seen.insert(cm.name_any());
        }
    }
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(selector),
    )
    .await
    .unwrap();
    let mut expired = false;
    loop {
        match next_event(&mut events).await {
            Err(watcher::Error::WatchError(status)) if status.code == 410 => expired = true,
            Ok(watcher::Event::InitDone) if expired => break,
            Ok(watcher::Event::Delete(cm)) => panic!(
                "{} should not arrive: the events were compacted",
                cm.name_any()
            ),
            _ => {}
        }
    }
    api.create(
        &PostParams::default(),
        &config_map("after", json!({"burst": "yes"})),
    )
    .await
    .unwrap();
    match next_event(&mut events).await {
        Ok(watcher::Event::Apply(cm)) => assert_eq!(cm.name_any(), "after"),
        other => panic!("expected Apply(after), got {other:?}"),
    }

    // Compaction also expires older resourceVersions.
    server.compact_history();
    let mut stream = api
        .watch(&WatchParams::default(), &old)
        .await
        .unwrap()
        .boxed();
    let event = tokio::time::timeout(WAIT, stream.next()).await.unwrap();
    assert!(
        matches!(event, Some(Ok(WatchEvent::Error(ref status))) if status.code == 410),
        "{event:?}"
    );
}

#[tokio::test]
async fn fake_kube_virtual_services_are_served_in_every_version() {
    let server = start().await;
    let v1 = virtual_services(server.client(), "v1");
    let vs = dynamic(json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "notebook-default-nb"},
        "spec": {
            "hosts": ["*"],
            "gateways": ["kubeflow/kubeflow-gateway"],
            "http": [{
                "match": [{"uri": {"prefix": "/notebook/default/nb/"}}],
                "rewrite": {"uri": "/notebook/default/nb/"},
                "route": [{"destination": {"host": "nb.default.svc.cluster.local", "port": {"number": 80}}}],
            }],
        },
    }));
    v1.create(&PostParams::default(), &vs).await.unwrap();
    for version in ["v1beta1", "v1alpha3"] {
        let api = virtual_services(server.client(), version);
        let listed = api.list(&ListParams::default()).await.unwrap();
        assert_eq!(listed.items.len(), 1);
        let got = api.get("notebook-default-nb").await.unwrap();
        assert_eq!(
            got.types.as_ref().map(|t| t.api_version.clone()),
            Some(format!("networking.istio.io/{version}"))
        );
    }
    let mut both = serde_json::to_value(&vs).unwrap();
    both["metadata"]["name"] = json!("bad");
    both["spec"]["http"][0]["match"][0]["uri"]["exact"] = json!("/x");
    let status = api_error(v1.create(&PostParams::default(), &dynamic(both)).await);
    assert_eq!(status.code, 422);
}

#[tokio::test]
async fn fake_kube_subject_access_reviews_follow_the_access_rule() {
    let server = start().await;
    server.set_access_rule(|spec| spec["user"] == "alice");
    let api: Api<SubjectAccessReview> = Api::all(server.client());
    let review = |user: &str| -> SubjectAccessReview {
        serde_json::from_value(json!({
            "spec": {"user": user, "resourceAttributes": {"namespace": "default", "verb": "get", "resource": "notebooks"}},
        }))
        .unwrap()
    };
    let allowed = api
        .create(&PostParams::default(), &review("alice"))
        .await
        .unwrap();
    assert!(allowed.status.unwrap().allowed);
    let denied = api
        .create(&PostParams::default(), &review("mallory"))
        .await
        .unwrap();
    assert!(!denied.status.unwrap().allowed);
    assert_eq!(server.write_count(), 0, "reviews are not stored");
}

#[tokio::test]
async fn fake_kube_streaming_list_watch_and_bookmarks() {
    let server = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &config_map("existing", json!({})))
        .await
        .unwrap();

    // sendInitialEvents=true: the initial state arrives as events, closed by a bookmark.
    let config = watcher::Config::default().streaming_lists();
    let mut events: Events<ConfigMap> = watcher(api.clone(), config).boxed();
    assert!(matches!(
        next_event(&mut events).await,
        Ok(watcher::Event::Init)
    ));
    match next_event(&mut events).await {
        Ok(watcher::Event::InitApply(cm)) => assert_eq!(cm.name_any(), "existing"),
        other => panic!("expected InitApply(existing), got {other:?}"),
    }
    assert!(matches!(
        next_event(&mut events).await,
        Ok(watcher::Event::InitDone)
    ));
    api.create(&PostParams::default(), &config_map("later", json!({})))
        .await
        .unwrap();
    match next_event(&mut events).await {
        Ok(watcher::Event::Apply(cm)) => assert_eq!(cm.name_any(), "later"),
        other => panic!("expected Apply(later), got {other:?}"),
    }

    // An idle watch that allows bookmarks gets them, at the current resourceVersion.
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(WAIT, stream.next()).await.unwrap() {
        Some(Ok(WatchEvent::Bookmark(bookmark))) => {
            assert_eq!(bookmark.metadata.resource_version, rv);
            assert_eq!(bookmark.types.kind, "ConfigMap");
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }
}

/// `pods/exec` speaks remotecommand as kube-client expects it: stdin reaches the process and
/// its close ends it, stdout and stderr arrive on their channels, a non-zero exit is a Failure
/// status with the code; a pod that does not exist is 404 and a refused container an error.
#[tokio::test]
async fn pod_exec_relays_streams_and_the_exit_code() {
    use kube::api::AttachParams;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "shell"},
        "spec": {"containers": [{"name": "main", "image": "debian"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    server.set_exec_runner(|request| {
        (request.container.as_deref() == Some("main")).then(|| {
            let mut command = std::process::Command::new(&request.command[0]);
            command.args(&request.command[1..]);
            command
        })
    });
    let params = AttachParams::default().container("main").stdin(true);
    let mut process = pods
        .exec(
            "shell",
            ["sh", "-c", "tr a-z A-Z; echo to stderr >&2; exit 3"],
            &params,
        )
        .await
        .unwrap();
    let mut stdin = process.stdin().unwrap();
    let mut stdout = process.stdout().unwrap();
    let mut stderr = process.stderr().unwrap();
    let status = process.take_status().unwrap();
    stdin.write_all(b"hello exec\n").await.unwrap();
    stdin.shutdown().await.unwrap();
    let (mut out, mut err) = (String::new(), String::new());
    let (read_out, read_err, status) = tokio::join!(
        stdout.read_to_string(&mut out),
        stderr.read_to_string(&mut err),
        status
    );
    read_out.unwrap();
    read_err.unwrap();
    assert_eq!(out, "HELLO EXEC\n");
    assert_eq!(err, "to stderr\n");
    let status = status.expect("a status");
    assert_eq!(status.status.as_deref(), Some("Failure"));
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
    let causes = status.details.unwrap().causes.unwrap();
    assert_eq!(causes[0].reason.as_deref(), Some("ExitCode"));
    assert_eq!(causes[0].message.as_deref(), Some("3"));

    let mut ok = pods
        .exec(
            "shell",
            ["true"],
            &AttachParams::default().container("main"),
        )
        .await
        .unwrap();
    let status = ok.take_status().unwrap().await.unwrap();
    assert_eq!(status.status.as_deref(), Some("Success"));

    let missing = pods
        .exec("nope", ["true"], &AttachParams::default())
        .await
        .err()
        .expect("no such pod");
    assert!(missing.to_string().contains("not found"), "{missing}");
    let refused = pods
        .exec(
            "shell",
            ["true"],
            &AttachParams::default().container("other"),
        )
        .await
        .err()
        .expect("a container that is not running");
    assert!(refused.to_string().contains("not running"), "{refused}");
}

/// A client acting as a service account gets what the stored RBAC grants it, through a
/// RoleBinding in one namespace to an aggregated ClusterRole, and Kubernetes' 403 elsewhere.
#[tokio::test]
async fn fake_kube_rbac_allows_what_the_bindings_grant_and_nothing_else() {
    let server = start().await;
    let admin = server.client();
    let user = "system:serviceaccount:team:reader";
    let reader = server.client_as(user).unwrap();
    let configs = |client: &Client, ns: &str| Api::<ConfigMap>::namespaced(client.clone(), ns);
    configs(&admin, "team")
        .create(&PostParams::default(), &config_map("settings", json!({})))
        .await
        .unwrap();
    let refused = api_error(configs(&reader, "team").get("settings").await);
    assert_eq!((refused.code, refused.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        refused.message,
        format!(
            "configmaps \"settings\" is forbidden: User \"{user}\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"team\""
        )
    );

    let rbac = |kind: &str| {
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "rbac.authorization.k8s.io",
            "v1",
            kind,
        ))
    };
    let cluster_roles: Api<DynamicObject> = Api::all_with(admin.clone(), &rbac("ClusterRole"));
    for role in [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "view"},
               "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.com/view": "true"}}]},
               "rules": []}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "view-configmaps", "labels": {"example.com/view": "true"}},
               "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}),
    ] {
        cluster_roles
            .create(&PostParams::default(), &dynamic(role))
            .await
            .unwrap();
    }
    let bindings: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), "team", &rbac("RoleBinding"));
    bindings
        .create(
            &PostParams::default(),
            &dynamic(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "reader", "namespace": "team"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "team"}]})),
        )
        .await
        .unwrap();
    assert_eq!(
        configs(&reader, "team")
            .get("settings")
            .await
            .unwrap()
            .name_any(),
        "settings"
    );
    assert_eq!(
        configs(&reader, "team")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let write = configs(&reader, "team")
        .create(&PostParams::default(), &config_map("mine", json!({})))
        .await;
    assert_eq!(api_error(write).code, 403, "view grants no create");
    let other = configs(&reader, "elsewhere")
        .list(&ListParams::default())
        .await;
    assert_eq!(
        api_error(other).code,
        403,
        "the binding holds in its namespace only"
    );
}

/// `pods/<name>/log` as the kubelet answers it through the API server: the named container's
/// log, its last lines when asked, and Kubernetes' refusals when the container is unnamed or
/// unknown.
#[tokio::test]
async fn fake_kube_pod_logs_come_from_the_named_container() {
    use kube::api::LogParams;
    let server = start().await;
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "nb-0"},
        "spec": {"containers": [{"name": "nb", "image": "jupyter:1"}, {"name": "sidecar", "image": "proxy:1"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    server.set_log_source(|_, _, container| Some(format!("one {container}\ntwo {container}\n")));
    let of = |container: Option<&str>, tail_lines: Option<i64>| LogParams {
        container: container.map(str::to_owned),
        tail_lines,
        ..LogParams::default()
    };
    assert_eq!(
        pods.logs("nb-0", &of(Some("nb"), None)).await.unwrap(),
        "one nb\ntwo nb\n"
    );
    assert_eq!(
        pods.logs("nb-0", &of(Some("sidecar"), Some(1)))
            .await
            .unwrap(),
        "two sidecar\n"
    );
    let unnamed = api_error(pods.logs("nb-0", &of(None, None)).await);
    assert_eq!(unnamed.code, 400);
    assert_eq!(
        unnamed.message,
        "a container name must be specified for pod nb-0, choose one of: [nb sidecar]"
    );
    let unknown = api_error(pods.logs("nb-0", &of(Some("other"), None)).await);
    assert_eq!(unknown.message, "container other is not valid for pod nb-0");
    assert_eq!(
        api_error(pods.logs("gone-0", &of(Some("nb"), None)).await).code,
        404
    );
}
