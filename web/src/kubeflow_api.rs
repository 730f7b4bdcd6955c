//! The routes only Kubeflow's jupyter web app has: GPU vendors, namespaces, storage classes, a
//! namespace's claims and PodDefaults, a notebook's pod and its logs. Each answers in Kubeflow's
//! envelope; where labforge runs notebooks without Kubernetes (embedded), the answer is what
//! stands for it there (no storage classes, no PodDefaults, the container as the pod).

use crate::api::{ApiState, Failure, SignedIn, Workloads, find};
use crate::backend::Verb;
use crate::kubeflow::envelope;
use crate::runtime::container_name;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DynamicObject, ListParams, LogParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

type Answer = Result<Json<Value>, Failure>;

/// The routes, for [`crate::api::router`] to merge.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/info", get(info))
        .route("/api/gpus", get(gpu_vendors))
        .route("/api/namespaces", get(namespaces))
        .route("/api/storageclasses", get(storage_classes))
        .route("/api/storageclasses/default", get(default_storage_class))
        .route("/api/namespaces/{ns}/pvcs", get(claims))
        .route("/api/namespaces/{ns}/poddefaults", get(pod_defaults))
        .route("/api/namespaces/{ns}/notebooks/{name}/pod", get(pod))
        .route(
            "/api/namespaces/{ns}/notebooks/{name}/pod/{pod}/logs",
            get(pod_logs),
        )
}

fn answer(user: &SignedIn, body: Value) -> Answer {
    Ok(Json(envelope(&user.0, StatusCode::OK, body)))
}

fn unavailable(what: &str, error: impl std::fmt::Display) -> Failure {
    Failure::new(StatusCode::SERVICE_UNAVAILABLE, format!("{what}: {error}"))
}

/// Who is signed in (`user`), as Kubeflow's client library asks.
async fn info(user: SignedIn) -> Answer {
    answer(&user, json!({ "info": {} }))
}

/// The GPU vendors offered: in a cluster, those some node has (read at start).
async fn gpu_vendors(user: SignedIn, State(state): State<ApiState>) -> Answer {
    let vendors: Vec<&str> = state
        .config
        .gpu_vendors
        .iter()
        .map(|v| v.limits_key.as_str())
        .collect();
    answer(&user, json!({ "vendors": vendors }))
}

/// The namespaces the user works in: their own, and for admins every namespace with notebooks.
async fn namespaces(user: SignedIn, State(state): State<ApiState>) -> Answer {
    let mut namespaces = vec![user.0.namespace.clone()];
    if state.access.may(&user.0, Verb::List, None).await {
        for notebook in state.backend.list(None).await? {
            if let Some(ns) = notebook.metadata.namespace {
                namespaces.push(ns);
            }
        }
    }
    namespaces.sort();
    namespaces.dedup();
    answer(&user, json!({ "namespaces": namespaces }))
}

/// The cluster's storage classes, and the default one (Kubernetes' annotation); none embedded.
async fn storage_class_names(state: &ApiState) -> Result<(Vec<String>, String), Failure> {
    let Workloads::Kubernetes(client) = &state.workloads else {
        return Ok((Vec::new(), String::new()));
    };
    let classes: kube::Api<StorageClass> = kube::Api::all(client.clone());
    let list = classes
        .list(&ListParams::default())
        .await
        .map_err(|e| unavailable("listing storage classes", e))?;
    let is_default = |class: &StorageClass| {
        class.metadata.annotations.as_ref().is_some_and(|a| {
            [
                "storageclass.kubernetes.io/is-default-class",
                "storageclass.beta.kubernetes.io/is-default-class",
            ]
            .iter()
            .any(|key| a.get(*key).is_some_and(|v| v == "true"))
        })
    };
    let default = list
        .items
        .iter()
        .find(|c| is_default(c))
        .and_then(|c| c.metadata.name.clone())
        .unwrap_or_default();
    let names = list
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    Ok((names, default))
}

async fn storage_classes(user: SignedIn, State(state): State<ApiState>) -> Answer {
    let (names, _) = storage_class_names(&state).await?;
    answer(&user, json!({ "storageClasses": names }))
}

async fn default_storage_class(user: SignedIn, State(state): State<ApiState>) -> Answer {
    let (_, default) = storage_class_names(&state).await?;
    answer(&user, json!({ "defaultStorageClass": default }))
}

/// The namespace's volume claims with size and access mode.
async fn claims(user: SignedIn, State(state): State<ApiState>, Path(ns): Path<String>) -> Answer {
    user.may(&state, Verb::List, &ns).await?;
    let pvcs: Vec<Value> = match &state.workloads {
        Workloads::Kubernetes(client) => {
            let claims: kube::Api<PersistentVolumeClaim> =
                kube::Api::namespaced(client.clone(), &ns);
            claims
                .list(&ListParams::default())
                .await
                .map_err(|e| unavailable(&format!("listing the volumes of {ns}"), e))?
                .items
                .into_iter()
                .map(|claim| {
                    let spec = claim.spec.unwrap_or_default();
                    json!({
                        "name": claim.metadata.name.unwrap_or_default(),
                        "size": spec.resources.and_then(|r| r.requests)
                            .and_then(|r| r.get("storage").map(|q| q.0.clone()))
                            .unwrap_or_default(),
                        "mode": spec.access_modes.and_then(|m| m.into_iter().next())
                            .unwrap_or_default(),
                    })
                })
                .collect()
        }
        // Engine volumes have no size of their own; one container mounts them at a time.
        Workloads::Engine(_) => crate::api::claims(&state, &ns)
            .await?
            .into_iter()
            .map(|name| json!({ "name": name, "size": "", "mode": "ReadWriteOnce" }))
            .collect(),
    };
    answer(&user, json!({ "pvcs": pvcs }))
}

/// Kubeflow's PodDefault resource (`kubeflow.org/v1alpha1`).
fn pod_default_resource() -> ApiResource {
    ApiResource {
        group: "kubeflow.org".into(),
        version: "v1alpha1".into(),
        api_version: "kubeflow.org/v1alpha1".into(),
        kind: "PodDefault".into(),
        plural: "poddefaults".into(),
    }
}

/// The namespace's PodDefaults, each with its selector's label and description, as the form
/// offers them as configurations; none where PodDefaults are not installed.
async fn pod_defaults(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
) -> Answer {
    user.may(&state, Verb::List, &ns).await?;
    let Workloads::Kubernetes(client) = &state.workloads else {
        return answer(&user, json!({ "poddefaults": [] }));
    };
    let api: kube::Api<DynamicObject> =
        kube::Api::namespaced_with(client.clone(), &ns, &pod_default_resource());
    let items = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        // No PodDefault CRD in this cluster.
        Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
        Err(e) => return Err(unavailable(&format!("listing the PodDefaults of {ns}"), e)),
    };
    let poddefaults: Vec<Value> = items
        .into_iter()
        .map(|item| {
            let name = item.metadata.name.clone().unwrap_or_default();
            let mut value = serde_json::to_value(&item).unwrap_or_default();
            let label = value
                .pointer("/spec/selector/matchLabels")
                .and_then(Value::as_object)
                .and_then(|labels| labels.keys().next().cloned())
                .unwrap_or_default();
            let desc = value
                .pointer("/spec/desc")
                .and_then(Value::as_str)
                .map_or(name, str::to_owned);
            value["label"] = label.into();
            value["desc"] = desc.into();
            // What it sets, by name: a value may be a credential.
            if let Some(env) = value.pointer_mut("/spec/env").and_then(Value::as_array_mut) {
                for var in env {
                    let name = var["name"].clone();
                    *var = json!({ "name": name });
                }
            }
            value
        })
        .collect();
    answer(&user, json!({ "poddefaults": poddefaults }))
}

/// The pod a notebook runs in, `<name>-0`. Embedded, the container stands for it: its name, the
/// `notebook-name` label and the notebook's container spec.
async fn pod(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
) -> Answer {
    user.may(&state, Verb::Get, &ns).await?;
    let notebook = find(&state, &ns, &name).await?;
    let no_pod = || Failure::new(StatusCode::NOT_FOUND, "No pod detected.");
    let pod = match &state.workloads {
        Workloads::Kubernetes(client) => {
            let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &ns);
            let found = pods
                .get_opt(&format!("{name}-0"))
                .await
                .map_err(|e| unavailable(&format!("reading the pod of {ns}/{name}"), e))?;
            // Only the notebook's own pod: another pod labelled the same is not it.
            let found = found.filter(|p| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("notebook-name"))
                    == Some(&name)
            });
            let mut pod = serde_json::to_value(found.ok_or_else(no_pod)?).unwrap_or_default();
            redact_secret(&mut pod);
            pod
        }
        Workloads::Engine(_) => {
            if notebook.is_stopped() {
                return Err(no_pod());
            }
            let view = crate::api::view(&notebook, &state);
            let phase = match view.state {
                crate::model::NotebookState::Ready => "Running",
                crate::model::NotebookState::Error => "Failed",
                _ => "Pending",
            };
            json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": format!("{name}-0"),
                    "namespace": ns,
                    "labels": { "notebook-name": name },
                    "annotations": { "labforge.dev/container": container_name(&ns, &name) },
                },
                "spec": { "containers": notebook.container().into_iter().collect::<Vec<_>>() },
                "status": { "phase": phase },
            })
        }
    };
    answer(&user, json!({ "pod": pod }))
}

/// The notebook's own secret (what its route presents to its server) out of a pod's containers:
/// a viewer of the namespace may read the pod, not open its server past the proxy.
fn redact_secret(pod: &mut Value) {
    let containers = pod
        .pointer_mut("/spec/containers")
        .and_then(Value::as_array_mut);
    for container in containers.into_iter().flatten() {
        if let Some(env) = container.get_mut("env").and_then(Value::as_array_mut) {
            env.retain(|var| var["name"] != labforge_notebook_controller::secret::SECRET_ENV);
        }
    }
}

/// The most log lines one answer carries.
const LOG_LINES: u32 = 10_000;

/// The notebook container's log, as lines.
async fn pod_logs(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name, pod)): Path<(String, String, String)>,
) -> Answer {
    user.may(&state, Verb::Get, &ns).await?;
    find(&state, &ns, &name).await?;
    if pod != format!("{name}-0") {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!("{pod} is not the pod of notebook {ns}/{name} ({name}-0)"),
        ));
    }
    let text = match &state.workloads {
        Workloads::Kubernetes(client) => {
            let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &ns);
            let params = LogParams {
                container: Some(name.clone()),
                tail_lines: Some(i64::from(LOG_LINES)),
                ..Default::default()
            };
            pods.logs(&pod, &params).await.map_err(|e| match e {
                kube::Error::Api(status) if matches!(status.code, 400 | 404) => Failure::new(
                    StatusCode::from_u16(status.code).unwrap_or(StatusCode::NOT_FOUND),
                    status.message,
                ),
                e => Failure::new(
                    StatusCode::BAD_GATEWAY,
                    format!("reading the logs of pod {ns}/{pod}: {e}"),
                ),
            })?
        }
        Workloads::Engine(engine) => {
            let reading = |e: std::io::Error| {
                Failure::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("reading logs: {e}"),
                )
            };
            let child = engine
                .logs(&container_name(&ns, &name), false, LOG_LINES)
                .map_err(reading)?;
            let output = child.wait_with_output().await.map_err(reading)?;
            if !output.status.success() {
                return Err(Failure::new(StatusCode::NOT_FOUND, "No pod detected."));
            }
            String::from_utf8_lossy(&output.stdout).into_owned()
        }
    };
    let lines: Vec<&str> = text.split('\n').collect();
    answer(&user, json!({ "logs": lines }))
}
