//! The web API in cluster mode, against the fake Kubernetes API server (which validates every
//! write against Kubeflow's Notebook CRD): users from the auth proxy's header, every decision a
//! SubjectAccessReview, Notebook CRs and their events through kube-rs.

use crate::support::cluster::WebApp;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::PostParams;
use labforge_crds::notebook::{Notebook, STOP_ANNOTATION};
use labforge_tests::eventually;
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
use serde_json::{Value, json};
use std::time::Duration;

const ALICE: &str = "alice@example.com";
const BOB: &str = "bob@example.com";
const ROOT: &str = "root@example.com";

#[tokio::test]
async fn the_web_api_serves_notebook_crs_with_rbac_decisions() {
    crate::init_crypto();
    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
    // RBAC as the cluster has it: alice edits her profile namespace, root is a cluster admin.
    server.set_access_rule(|spec| {
        let user = spec["user"].as_str().unwrap_or_default();
        let namespace = spec["resourceAttributes"]["namespace"].as_str();
        user == ROOT || (user == ALICE && namespace == Some("alice"))
    });
    let web = WebApp::start(&server, None, Some("nb.example.com")).await;
    let api = web.client();

    assert_eq!(
        api.get(None, "/api/namespaces/alice/notebooks").await.0,
        401
    );
    let (status, me) = api.get(Some(ALICE), "/api/whoami").await;
    assert_eq!(
        (status, me["namespace"].as_str(), me["admin"].as_bool()),
        (200, Some("alice"), Some(false))
    );
    let (_, root) = api.get(Some(ROOT), "/api/whoami").await;
    assert_eq!(
        root["admin"], true,
        "cluster-wide list access makes an admin"
    );

    // Bad input is refused before anything reaches the API server.
    let writes = server.write_requests();
    let (status, answer) = api
        .post(
            Some(ALICE),
            "/api/namespaces/alice/notebooks",
            json!({"name": "lab", "memory": "lots"}),
        )
        .await;
    assert_eq!((status, answer["field"].as_str()), (422, Some("memory")));
    assert_eq!(server.write_requests(), writes);

    // alice creates a notebook: a Notebook CR that Kubeflow's CRD accepts, with its event.
    let (status, created) = api
        .post(
            Some(ALICE),
            "/api/namespaces/alice/notebooks",
            json!({"name": "lab", "cpuLimit": "1"}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(
        (&created["host"], &created["url"]),
        (
            &json!("lab--alice.nb.example.com"),
            &json!("/notebook/alice/lab/")
        ),
        "opened on its own host, at its path"
    );
    assert!(server.rejected().is_empty(), "{:?}", server.rejected());
    // The namespace's PersistentVolumeClaims are what an existing workspace may name.
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(server.client(), "alice");
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "shared-data", "namespace": "alice"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let (status, volumes) = api.get(Some(ALICE), "/api/namespaces/alice/volumes").await;
    assert_eq!(status, 200, "{volumes}");
    assert_eq!(
        volumes["volumes"],
        json!([{"name": "lab-workspace", "usedBy": ["lab"]}, {"name": "shared-data", "usedBy": []}]),
        "the new notebook's workspace claim, and the one made by hand"
    );
    // A claim may be mounted by anything in the namespace, which the web app cannot see: it is
    // deleted with kubectl, by those RBAC lets, and the API says so.
    let (status, answer) = api
        .call(
            Some(ALICE),
            reqwest::Method::DELETE,
            "/api/namespaces/alice/volumes/shared-data",
            None,
        )
        .await;
    assert_eq!(status, 501, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("kubectl delete pvc shared-data"),
        "{answer}"
    );
    assert!(claims.get_opt("shared-data").await.unwrap().is_some());
    let (status, refused) = api
        .post(
            Some(ALICE),
            "/api/namespaces/alice/notebooks",
            json!({"name": "other", "workspace": {"existing": {"name": "bobs-workspace"}}}),
        )
        .await;
    assert_eq!(
        (status, &refused["field"]),
        (422, &json!("workspace.name")),
        "{refused}"
    );
    let notebooks: Api<Notebook> = Api::namespaced(server.client(), "alice");
    let stored = notebooks.get("lab").await.unwrap();
    assert_eq!(
        stored.spec.template.spec.as_ref().unwrap().containers[0]
            .image
            .as_deref(),
        Some("registry.example.com/labforge/jupyterlab:latest")
    );
    assert_eq!(
        stored.annotation("notebooks.kubeflow.org/creator"),
        Some(ALICE)
    );
    let (status, again) = api
        .post(
            Some(ALICE),
            "/api/namespaces/alice/notebooks",
            json!({"name": "lab"}),
        )
        .await;
    assert_eq!((status, again["field"].as_str()), (409, Some("name")));
    let (_, list) = api
        .get(Some(ALICE), "/api/namespaces/alice/notebooks")
        .await;
    assert_eq!(list["notebooks"][0]["name"], "lab");
    assert_eq!(list["notebooks"][0]["owner"], ALICE);
    let events: Api<Event> = Api::namespaced(server.client(), "alice");
    eventually("the Created event", Duration::from_secs(10), || async {
        let (_, answer) = api
            .get(Some(ALICE), "/api/namespaces/alice/notebooks/lab/events")
            .await;
        (answer["events"]
            .as_array()?
            .iter()
            .any(|e| e["reason"] == "Created"))
        .then_some(())
    })
    .await;
    assert!(
        !events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // The notebook's logs are its pod's notebook container's, read through pods/log with the web
    // app's own rights; before the pod exists, the answer says there are none yet.
    let (status, answer) = api
        .get(Some(ALICE), "/api/namespaces/alice/notebooks/lab/logs")
        .await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer.to_string().contains("no logs yet"), "{answer}");
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(server.client(), "alice");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "lab-0"},
            "spec": {"containers": [
                {"name": "lab", "image": "registry.example.com/labforge/jupyterlab:latest"},
                {"name": "istio-proxy", "image": "istio/proxyv2"}]}
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    server.set_log_source(|namespace, pod, container| {
        (namespace == "alice" && pod == "lab-0" && container == "lab")
            .then(|| "starting\nJupyter Server is running\nkernel started\n".to_owned())
    });
    let (status, log) = api
        .get(
            Some(ALICE),
            "/api/namespaces/alice/notebooks/lab/logs?tail=2",
        )
        .await;
    assert_eq!(
        (status, log),
        (200, json!("Jupyter Server is running\nkernel started\n")),
        "the notebook container's last two lines, not the sidecar's"
    );
    assert_eq!(
        api.get(Some(BOB), "/api/namespaces/alice/notebooks/lab/logs")
            .await
            .0,
        403
    );

    // bob has no access to alice's namespace, nor to the admin listing.
    assert_eq!(
        api.get(Some(BOB), "/api/namespaces/alice/notebooks")
            .await
            .0,
        403
    );
    assert_eq!(
        api.get(Some(BOB), "/api/namespaces/alice/notebooks/lab")
            .await
            .0,
        403
    );
    assert_eq!(api.get(Some(ALICE), "/api/admin/notebooks").await.0, 403);
    let (status, all) = api.get(Some(ROOT), "/api/admin/notebooks").await;
    assert_eq!(status, 200);
    assert_eq!(all["notebooks"].as_array().unwrap().len(), 1);

    // Stop: Kubeflow's annotation on the CR, which the controller turns into replicas 0.
    let (status, stopped) = api
        .patch(
            Some(ALICE),
            "/api/namespaces/alice/notebooks/lab",
            json!({"stopped": true}),
        )
        .await;
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(stopped["state"], "stopped");
    assert!(
        notebooks
            .get("lab")
            .await
            .unwrap()
            .annotation(STOP_ANNOTATION)
            .is_some()
    );

    // Without a registry to save to, saving is not offered: a clear answer, not a hang.
    let (status, answer) = api
        .post(
            Some(ALICE),
            "/api/namespaces/alice/notebooks/lab/saves",
            json!({}),
        )
        .await;
    assert_eq!(status, 501, "{answer}");
    assert_eq!(
        api.call(
            Some(ALICE),
            reqwest::Method::DELETE,
            "/api/namespaces/alice/notebooks/lab",
            None
        )
        .await
        .0,
        200
    );
    eventually("deleted", Duration::from_secs(10), || async {
        notebooks
            .get_opt("lab")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

/// Saves in a cluster: the web app writes an ImageBuild (target under --save-registry, owned by
/// the notebook), refuses a second one while the first runs, follows the build's status as the
/// save's progress stream until it ends, and lists the succeeded build as a saved image.
#[tokio::test]
async fn saves_in_a_cluster_are_image_builds_the_ui_follows() {
    use labforge_crds::imagebuild::ImageBuild;

    crate::init_crypto();
    let server = FakeApiServer::start(FakeApiServerOptions {
        extra_crds: vec![labforge_tests::repo_root().join("crds/imagebuilds.labforge.dev.yaml")],
        ..FakeApiServerOptions::default()
    })
    .await
    .unwrap();
    server.set_access_rule(|spec| {
        let namespace = &spec["resourceAttributes"]["namespace"];
        (spec["user"] == ALICE && namespace == "alice")
            || (spec["user"] == BOB && namespace == "bob")
    });
    let web = WebApp::start(&server, Some("registry.example.com/saved/"), None).await;
    let api = web.client();
    let post = |user, path: &'static str, body: Value| {
        let api = &api;
        async move { api.post(Some(user), path, body).await }
    };
    let (status, _) = post(
        ALICE,
        "/api/namespaces/alice/notebooks",
        json!({"name": "lab"}),
    )
    .await;
    assert_eq!(status, 201);
    let saves = "/api/namespaces/alice/notebooks/lab/saves";
    let (status, answer) = post(ALICE, saves, json!({"tag": "no spaces"})).await;
    assert_eq!(
        (status, answer["field"].as_str()),
        (422, Some("tag")),
        "{answer}"
    );
    assert_eq!(post(BOB, saves, json!({"tag": "v1"})).await.0, 403);

    let (status, started) = post(ALICE, saves, json!({"tag": "v1"})).await;
    assert_eq!(status, 202, "{started}");
    assert_eq!(started["target"], "registry.example.com/saved/alice/lab:v1");
    assert_eq!(started["phase"], "queued");
    let id = started["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("lab-save-"), "{id}");
    let builds: Api<ImageBuild> = Api::namespaced(server.client(), "alice");
    let build = builds.get(&id).await.unwrap();
    assert_eq!(build.spec.notebook, "lab");
    assert_eq!(
        build.metadata.owner_references.unwrap()[0].kind,
        "Notebook",
        "deleting the notebook deletes its builds"
    );
    let (status, busy) = post(ALICE, saves, json!({"tag": "v2"})).await;
    assert_eq!(status, 409, "{busy}");
    assert!(server.rejected().is_empty(), "{:?}", server.rejected());

    // Follow it while the reconciler (played here by status writes) moves it along.
    // Each status write waits until the stream has shown the state before it, so every phase
    // is seen however slowly the stream connects or polls on a busy machine.
    let follow = format!("{}/api/namespaces/alice/saves/{id}", web.base);
    let (chunks, received) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        let mut response = reqwest::Client::new()
            .get(follow)
            .header("kubeflow-userid", ALICE)
            .send()
            .await
            .unwrap();
        while let Some(chunk) = response.chunk().await.unwrap() {
            let _ = chunks.send(String::from_utf8_lossy(&chunk).into_owned());
        }
    });
    let mut stream = SaveStream {
        text: String::new(),
        received,
    };
    let set_status = |status: Value| {
        let builds = builds.clone();
        let id = id.clone();
        async move {
            builds
                .patch_status(
                    &id,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(json!({ "status": status })),
                )
                .await
                .unwrap();
        }
    };
    stream.until("\n\n").await;
    set_status(json!({"phase": "Running", "progress": {"stage": "writing",
        "filesScanned": 100, "bytesWritten": 2048, "bytesUploaded": 0}}))
    .await;
    stream.until("\"writing\"").await;
    set_status(
        json!({"phase": "Succeeded", "progress": null, "baseImage": "jupyter@sha256:0",
        "imageDigest": "sha256:feed", "layerDigest": "sha256:beef", "layerSize": 4096,
        "completionTime": "2026-11-22T08:00:00Z", "message": "saved"}),
    )
    .await;
    let text = stream.into_text().await;
    let phases: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| serde_json::from_str(d.trim()).unwrap())
        .collect();
    let names: Vec<&str> = phases
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(names.first(), Some(&"queued"), "{text}");
    assert!(names.contains(&"writing"), "{text}");
    let last = phases.last().unwrap();
    assert_eq!(
        (last["phase"].as_str(), last["digest"].as_str()),
        (Some("done"), Some("sha256:feed"))
    );

    let (status, images) = api.get(Some(ALICE), "/api/namespaces/alice/images").await;
    assert_eq!(status, 200);
    assert_eq!(
        images["images"][0]["image"],
        "registry.example.com/saved/alice/lab:v1"
    );
    assert_eq!(images["images"][0]["digest"], "sha256:feed");
    assert_eq!(images["images"][0]["base"], "jupyter@sha256:0");
    let (status, _) = api
        .get(Some(ALICE), "/api/namespaces/alice/saves/nope")
        .await;
    assert_eq!(status, 404);

    // A stopped notebook cannot be saved.
    let (status, _) = api
        .patch(
            Some(ALICE),
            "/api/namespaces/alice/notebooks/lab",
            json!({"stopped": true}),
        )
        .await;
    assert_eq!(status, 200);
    let (status, answer) = post(ALICE, saves, json!({"tag": "v3"})).await;
    assert_eq!(status, 409, "{answer}");

    // What alice saved is her namespace's: bob's notebooks may not run it, and the answer is
    // the same for a tag she does not have, until she shares it (an annotation on its build).
    let image = "registry.example.com/saved/alice/lab:v1";
    let bobs = "/api/namespaces/bob/notebooks";
    let mut refusals = Vec::new();
    for named in [image, "registry.example.com/saved/alice/lab:v9"] {
        let (status, refused) = api
            .post(Some(BOB), bobs, json!({"name": "borrowed", "image": named}))
            .await;
        assert_eq!((status, refused["field"].as_str()), (422, Some("image")));
        refusals.push(refused["error"].as_str().unwrap().replace(named, "<image>"));
    }
    assert_eq!(refusals[0], refusals[1]);
    let sharing = "/api/namespaces/alice/images/sharing";
    let share = |user, body| api.call(Some(user), reqwest::Method::PUT, sharing, Some(body));
    let (status, _) = share(BOB, json!({"image": image, "sharedWith": ["bob"]})).await;
    assert_eq!(status, 403, "only alice shares alice's");
    let (status, shared) = share(ALICE, json!({"image": image, "sharedWith": ["bob"]})).await;
    assert_eq!(status, 200, "{shared}");
    assert_eq!(shared["sharedWith"], json!(["bob"]));
    let annotations = builds.get(&id).await.unwrap().metadata.annotations.unwrap();
    assert_eq!(
        annotations[labforge_web::cluster::image_builds::SHARED_WITH_ANNOTATION],
        "bob"
    );
    let (_, config) = api.get(Some(BOB), "/api/config").await;
    assert_eq!(config["sharedImages"][0]["image"], image, "{config}");
    let (status, created) = api
        .post(Some(BOB), bobs, json!({"name": "borrowed", "image": image}))
        .await;
    assert_eq!(status, 201, "{created}");
    assert!(server.rejected().is_empty(), "{:?}", server.rejected());
}

/// A save's progress stream as it arrives, for tests that act between its events.
struct SaveStream {
    text: String,
    received: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl SaveStream {
    /// Reads until the stream has shown `wanted`.
    async fn until(&mut self, wanted: &str) {
        let read = async {
            while !self.text.contains(wanted) {
                match self.received.recv().await {
                    Some(chunk) => self.text.push_str(&chunk),
                    None => break,
                }
            }
        };
        let shown = tokio::time::timeout(Duration::from_secs(10), read).await;
        assert!(
            shown.is_ok() && self.text.contains(wanted),
            "the save stream shows {wanted:?}: {}",
            self.text
        );
    }

    /// Reads until the server ends the stream.
    async fn into_text(mut self) -> String {
        let read = async {
            while let Some(chunk) = self.received.recv().await {
                self.text.push_str(&chunk);
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("the stream ends once the build has");
        self.text
    }
}

/// What Kubeflow's web app does on create, in a cluster: the new workspace and data volumes
/// become PersistentVolumeClaims (not owned by the Notebook, so they outlive it), the pod runs
/// as the profile's `default-editor` where there is one, the image pull policy is the form's;
/// a refusal leaves no claim behind. A Notebook written with an integer GPU limit lists too.
#[tokio::test]
async fn a_new_notebook_gets_its_claims_service_account_and_pull_policy() {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, ServiceAccount};

    crate::init_crypto();
    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
    server.set_access_rule(|spec| {
        let namespace = spec["resourceAttributes"]["namespace"].as_str();
        spec["user"] == ALICE && matches!(namespace, Some("alice" | "lab-team"))
    });
    let accounts: Api<ServiceAccount> = Api::namespaced(server.client(), "alice");
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default-editor"}})).unwrap(),
        )
        .await
        .unwrap();
    let web = WebApp::start(&server, None, None).await;
    let api = web.client();
    let create = |namespace: &'static str, body: Value| {
        let api = &api;
        async move {
            api.post(
                Some(ALICE),
                &format!("/api/namespaces/{namespace}/notebooks"),
                body,
            )
            .await
        }
    };

    let (status, created) = create(
        "alice",
        json!({"name": "lab", "imagePullPolicy": "Always",
               "workspace": {"new": {"size": "3Gi"}},
               "dataVolumes": [{"name": "datasets", "size": "2Gi", "mountPath": "/data"}]}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(server.client(), "alice");
    for (claim, size) in [("lab-workspace", "3Gi"), ("datasets", "2Gi")] {
        let claim = claims.get(claim).await.unwrap();
        assert_eq!(
            claim.metadata.owner_references, None,
            "kept when the notebook goes"
        );
        let spec = claim.spec.unwrap();
        assert_eq!(spec.access_modes.unwrap(), ["ReadWriteOnce"]);
        assert_eq!(spec.resources.unwrap().requests.unwrap()["storage"].0, size);
    }
    let notebooks: Api<Notebook> = Api::namespaced(server.client(), "alice");
    let pod = notebooks
        .get("lab")
        .await
        .unwrap()
        .spec
        .template
        .spec
        .unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("default-editor"));
    assert_eq!(
        pod.containers[0].image_pull_policy.as_deref(),
        Some("Always")
    );

    // Refused before any claim is made: the name is taken (caught by the dry run), a data volume
    // without a size names no claim of the namespace, a pull policy Kubernetes does not have.
    let (status, answer) = create(
        "alice",
        json!({"name": "lab", "dataVolumes": [{"name": "fresh", "size": "1Gi", "mountPath": "/fresh"}]}),
    )
    .await;
    assert_eq!(
        (status, &answer["field"]),
        (409, &json!("name")),
        "{answer}"
    );
    let (status, answer) = create(
        "alice",
        json!({"name": "other", "dataVolumes": [{"name": "bobs-data", "mountPath": "/bob"}]}),
    )
    .await;
    assert_eq!(
        (status, &answer["field"]),
        (422, &json!("dataVolumes[0].name")),
        "{answer}"
    );
    let (status, answer) = create(
        "alice",
        json!({"name": "other", "imagePullPolicy": "Sometimes"}),
    )
    .await;
    assert!((400..500).contains(&status), "{status} {answer}");
    assert!(answer.to_string().contains("Sometimes"), "{answer}");
    assert!(claims.get_opt("fresh").await.unwrap().is_none());

    // A data volume without a size takes an existing claim; no default-editor in lab-team.
    let (status, created) =
        create("lab-team", json!({"name": "shared", "workspace": "none"})).await;
    assert_eq!(status, 201, "{created}");
    let team: Api<Notebook> = Api::namespaced(server.client(), "lab-team");
    let pod = team
        .get("shared")
        .await
        .unwrap()
        .spec
        .template
        .spec
        .unwrap();
    assert_eq!(pod.service_account_name, None);
    let (status, created) = create(
        "alice",
        json!({"name": "second", "workspace": "none",
               "dataVolumes": [{"name": "datasets", "mountPath": "/data"}]}),
    )
    .await;
    assert_eq!(status, 201, "{created}");

    // A Notebook written by another client with an integer GPU limit is listed with the rest.
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("kubeflow.org", "v1", "Notebook"),
        "notebooks",
    );
    let raw: Api<kube::api::DynamicObject> =
        Api::namespaced_with(server.client(), "alice", &resource);
    let gpu: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubeflow.org/v1", "kind": "Notebook",
        "metadata": {"name": "gpu", "namespace": "alice"},
        "spec": {"template": {"spec": {"containers": [{"name": "gpu", "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}
    }))
    .unwrap();
    raw.create(&PostParams::default(), &gpu).await.unwrap();
    let (status, list) = api
        .get(Some(ALICE), "/api/namespaces/alice/notebooks")
        .await;
    assert_eq!(status, 200, "{list}");
    let names: Vec<&str> = list["notebooks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.contains(&"gpu"), "{names:?}");
    assert!(server.rejected().is_empty(), "{:?}", server.rejected());
}

/// A profile's ResourceQuota, read by the web app as its quota: shown against use, and a create
/// past it refused before anything is made, in the same words as the embedded quota's.
#[tokio::test]
async fn a_namespaces_resource_quota_is_shown_and_checked_before_anything_is_made() {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;

    crate::init_crypto();
    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
    server.set_access_rule(|spec| {
        spec["user"] == ALICE && spec["resourceAttributes"]["namespace"] == "alice"
    });
    crate::cluster_flow::add_resource_quota(
        &server,
        "alice",
        json!({"limits.cpu": "1", "requests.storage": "5Gi", "count/pods": "4", "requests.cpu": "1"}),
    )
    .await;
    let web = WebApp::start(&server, None, None).await;
    let api = web.client();
    let notebooks = "/api/namespaces/alice/notebooks";

    let (status, answer) = api.get(Some(ALICE), "/api/namespaces/alice/quota").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["quota"],
        json!({"cpu": "1", "notebooks": 4, "storage": "5Gi"})
    );
    let (status, answer) = api
        .call(
            Some(ALICE),
            reqwest::Method::PUT,
            "/api/namespaces/alice/quota",
            Some(json!({"cpu": "9"})),
        )
        .await;
    assert_eq!(status, 403, "only admins set quotas: {answer}");

    let (status, answer) = api
        .post(
            Some(ALICE),
            notebooks,
            json!({"name": "big", "cpu": "2", "workspace": {"new": {"size": "1Gi"}}}),
        )
        .await;
    assert_eq!(status, 403, "{answer}");
    assert_eq!(
        answer["error"],
        "namespace alice's quota for cpu is 1: 0 in use, 2 asked; stop a notebook or ask an admin for more"
    );
    let (status, answer) = api
        .post(
            Some(ALICE),
            notebooks,
            json!({"name": "lab", "cpu": "0.5", "workspace": {"new": {"size": "4Gi"}}}),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = api
        .post(
            Some(ALICE),
            notebooks,
            json!({"name": "more", "cpu": "0.5", "workspace": {"new": {"size": "2Gi"}}}),
        )
        .await;
    assert_eq!(status, 403, "{answer}");
    assert_eq!(
        answer["error"],
        "namespace alice's quota for storage is 5Gi: 4.00Gi in use, 2.00Gi asked; delete a volume or ask an admin for more"
    );
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(server.client(), "alice");
    let names: Vec<String> = claims
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(
        names,
        ["lab-workspace"],
        "nothing made for the refused ones"
    );
    let (status, answer) = api.get(Some(ALICE), "/api/namespaces/alice/quota").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["inUse"]["cpu"], 0.5, "{answer}");
    assert_eq!(
        answer["inUse"]["storageBytes"],
        4.0 * f64::from(1u32 << 30),
        "{answer}"
    );
}

/// The namespace picker in a cluster: the user's own namespace and each one Kubeflow's profile
/// RoleBindings bind them in, with their role there.
#[tokio::test]
async fn the_namespace_picker_lists_the_profiles_a_user_is_bound_in() {
    use k8s_openapi::api::rbac::v1::RoleBinding;

    crate::init_crypto();
    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
    for (ns, role, user) in [
        ("team", "kubeflow-edit", ALICE),
        ("lab", "kubeflow-view", ALICE),
        ("other", "kubeflow-edit", BOB),
    ] {
        let bindings: Api<RoleBinding> = Api::namespaced(server.client(), ns);
        let binding = json!({
            "metadata": {"name": format!("user-{role}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        });
        bindings
            .create(
                &PostParams::default(),
                &serde_json::from_value(binding).unwrap(),
            )
            .await
            .unwrap();
    }
    let web = WebApp::start(&server, None, None).await;
    let (status, answer) = web.client().get(Some(ALICE), "/api/namespaces").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["namespaces"], json!(["alice", "lab", "team"]));
    assert_eq!(answer["roles"], json!({"lab": "view", "team": "edit"}));
}

/// A websocket to the web app's SSH path as `user` (the auth proxy's header), carrying a session
/// that runs `command`: its exit status and output, or the HTTP status of the refusal.
async fn ssh_through_the_web_app(
    web: &WebApp,
    user: &str,
    notebook: &str,
    command: &str,
) -> Result<(u32, String), u16> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let url = format!(
        "{}/api/namespaces/alice/notebooks/{notebook}/ssh",
        web.base.replacen("http", "ws", 1)
    );
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("kubeflow-userid", user.parse().unwrap());
    let socket = match tokio_tungstenite::connect_async(request).await {
        Ok((socket, _)) => socket,
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            return Err(response.status().as_u16());
        }
        Err(err) => panic!("{err}"),
    };
    let (near, far) = tokio::io::duplex(64 * 1024);
    let (far_read, far_write) = tokio::io::split(far);
    tokio::spawn(labforge_remote::tunnel::carry(socket, far_read, far_write));
    let mut out = Vec::new();
    let status = labforge_ssh::client::run_with(
        near,
        Some(command),
        None,
        (&b""[..], &mut out, tokio::io::sink()),
    )
    .await
    .unwrap();
    Ok((status, String::from_utf8_lossy(&out).into_owned()))
}

#[tokio::test]
async fn ssh_in_a_cluster_runs_the_agent_in_the_notebooks_container_through_pods_exec() {
    crate::init_crypto();
    let agent = crate::need(labforge_tests::agent::agent_binary());
    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
    server.set_access_rule(|spec| {
        let user = spec["user"].as_str().unwrap_or_default();
        user == ALICE && spec["resourceAttributes"]["namespace"].as_str() == Some("alice")
    });
    // The kubelet's part: the exec the web app asks for, in the notebook's container of its pod,
    // runs the agent here.
    let executed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = executed.clone();
    server.set_exec_runner(move |request| {
        seen.lock().unwrap().push(request.clone());
        let ours = request.pod == "lab-0" && request.container.as_deref() == Some("lab");
        (ours && request.command == ["/.labforge/agent/labforge-agent", "ssh"]).then(|| {
            let mut command = std::process::Command::new(&agent);
            command.arg("ssh");
            command
        })
    });
    let web = WebApp::start(&server, None, None).await;
    let api = web.client();
    let notebooks: Api<Notebook> = Api::namespaced(server.client(), "alice");
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(server.client(), "alice");
    for (name, with_agent) in [("lab", true), ("plain", false)] {
        let (status, answer) = api
            .post(
                Some(ALICE),
                "/api/namespaces/alice/notebooks",
                json!({"name": name, "workspace": "none"}),
            )
            .await;
        assert_eq!(status, 201, "{answer}");
        // The agent as the controller mounts it with LABFORGE_AGENT_IMAGE.
        let mounts = if with_agent {
            json!([{"name": "labforge-agent", "mountPath": "/.labforge/agent", "readOnly": true}])
        } else {
            json!([])
        };
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": format!("{name}-0"), "labels": {"notebook-name": name}},
                "spec": {
                    "containers": [{"name": name, "image": "jupyter", "volumeMounts": mounts}],
                    "volumes": [{"name": "labforge-agent", "emptyDir": {}}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    }

    // Not running yet: refused with the reason, before any exec.
    assert_eq!(
        ssh_through_the_web_app(&web, ALICE, "lab", "true").await,
        Err(409)
    );
    for name in ["lab", "plain"] {
        notebooks
            .patch_status(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"status": {
                    "readyReplicas": 1, "conditions": [], "containerState": {"running": {}}}})),
            )
            .await
            .unwrap();
    }
    let (status, out) = ssh_through_the_web_app(&web, ALICE, "lab", "echo in-the-pod; exit 4")
        .await
        .unwrap();
    assert_eq!((status, out.as_str()), (4, "in-the-pod\n"));
    assert_eq!(
        ssh_through_the_web_app(&web, BOB, "lab", "true").await,
        Err(403),
        "bob may not open alice's notebook"
    );
    assert_eq!(
        ssh_through_the_web_app(&web, ALICE, "plain", "true").await,
        Err(501),
        "a pod without the agent says so"
    );
    let (status, answer) = api
        .get(Some(ALICE), "/api/namespaces/alice/notebooks/plain/ssh")
        .await;
    assert_eq!(status, 400, "not a websocket: {answer}");
    let executed = executed.lock().unwrap();
    assert_eq!(
        executed.len(),
        1,
        "one exec, for alice's one session: {executed:?}"
    );
}
