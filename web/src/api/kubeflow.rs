//! The routes only Kubeflow's jupyter web app has: GPU vendors, namespaces, storage classes, a
//! namespace's claims and PodDefaults, a notebook's pod and its logs. Each answers in Kubeflow's
//! envelope; where labforge runs notebooks without Kubernetes (embedded), the answer is what
//! stands for it there (no storage classes, no PodDefaults, the container as the pod).

use crate::api::extract::{Allowed, NamespacePath, NotebookPath, verb};
use crate::api::{ApiState, Failure, SignedIn, find};
use crate::backend::Verb;
use crate::kubeflow::envelope;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
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

/// Who is signed in (`user`), as Kubeflow's client library asks.
#[utoipa::path(
    get, path = "/info", summary = "who is signed in (Kubeflow's client library asks here)",
    responses((status = 200, description = "who is signed in (Kubeflow's client library asks here)", body = inline(crate::openapi::InfoAnswer)), crate::openapi::SignedInErrors)
)]
async fn info(user: SignedIn) -> Answer {
    answer(&user, json!({ "info": {} }))
}

/// The GPU vendors offered: in a cluster, those some node has (read at start).
#[utoipa::path(
    get, path = "/api/gpus", summary = "the GPU vendors offered (in a cluster, those some node has)",
    responses((status = 200, description = "the GPU vendors offered (in a cluster, those some node has)", body = inline(crate::openapi::VendorsAnswer)), crate::openapi::SignedInErrors)
)]
async fn gpu_vendors(user: SignedIn, State(state): State<ApiState>) -> Answer {
    let vendors: Vec<&str> = state
        .config
        .gpu_vendors
        .iter()
        .map(|v| v.limits_key.as_str())
        .collect();
    answer(&user, json!({ "vendors": vendors }))
}

/// The namespaces the user works in: their own, those they are a member of, and for admins
/// every namespace with notebooks; with the members of each where labforge keeps them.
#[utoipa::path(
    get, path = "/api/namespaces", summary = "the user's namespaces (their own, those they are a member of; for admins, every one), with roles and members",
    responses((status = 200, description = "the user's namespaces (their own, those they are a member of; for admins, every one), with roles and members", body = inline(crate::openapi::NamespacesAnswer)), crate::openapi::PlatformErrors)
)]
async fn namespaces(user: SignedIn, State(state): State<ApiState>) -> Answer {
    let memberships = state
        .local_users
        .as_ref()
        .map(|auth| auth.namespaces.of(&user.0, &auth.users))
        .unwrap_or_default();
    // A cluster's memberships are Kubeflow's profile RoleBindings: their roles, not their lists.
    let bound = state.access.bound_namespaces(&user.0).await;
    let mut namespaces = vec![user.0.namespace.clone()];
    namespaces.extend(memberships.iter().map(|ns| ns.name.clone()));
    namespaces.extend(bound.iter().map(|(ns, _)| ns.clone()));
    let roles: std::collections::BTreeMap<&str, crate::namespaces::Role> = memberships
        .iter()
        .map(|ns| (ns.name.as_str(), ns.role))
        .chain(bound.iter().map(|(ns, role)| (ns.as_str(), *role)))
        .collect();
    if state.access.may(&user.0, Verb::List, None).await {
        for notebook in state.backend.list(None).await? {
            if let Some(ns) = notebook.metadata.namespace {
                namespaces.push(ns);
            }
        }
    }
    namespaces.sort();
    namespaces.dedup();
    answer(
        &user,
        json!({ "namespaces": namespaces, "memberships": memberships, "roles": roles }),
    )
}

#[utoipa::path(
    get, path = "/api/storageclasses", summary = "the cluster's storage classes (none embedded)",
    responses((status = 200, description = "the cluster's storage classes (none embedded)", body = inline(crate::openapi::StorageClassesAnswer)), crate::openapi::PlatformErrors)
)]
async fn storage_classes(user: SignedIn, State(state): State<ApiState>) -> Answer {
    let classes = state.workloads.storage_classes().await?;
    answer(&user, json!({ "storageClasses": classes.names }))
}

#[utoipa::path(
    get, path = "/api/storageclasses/default", summary = "the default storage class, or empty",
    responses((status = 200, description = "the default storage class, or empty", body = inline(crate::openapi::DefaultStorageClassAnswer)), crate::openapi::PlatformErrors)
)]
async fn default_storage_class(user: SignedIn, State(state): State<ApiState>) -> Answer {
    let classes = state.workloads.storage_classes().await?;
    answer(&user, json!({ "defaultStorageClass": classes.default }))
}

/// A notebook's pod named by the path, as Kubeflow's web app names it.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
struct PodPath {
    /// Its namespace.
    #[allow(dead_code, reason = "the namespace is checked by `Allowed`")]
    ns: String,
    /// The notebook's name.
    name: String,
    /// `<name>-0`.
    pod: String,
}

/// The namespace's volume claims with size and access mode.
#[utoipa::path(
    get, path = "/api/namespaces/{ns}/pvcs", summary = "the namespace's volume claims", params(NamespacePath),
    responses((status = 200, description = "the namespace's volume claims", body = inline(crate::openapi::ClaimsAnswer)), crate::openapi::PlatformErrors)
)]
async fn claims(
    Allowed { user, ns, .. }: Allowed<verb::List>,
    State(state): State<ApiState>,
) -> Answer {
    let pvcs: Vec<Value> = state
        .workloads
        .claims(&ns)
        .await?
        .into_iter()
        .map(|claim| json!({ "name": claim.name, "size": claim.size, "mode": claim.mode }))
        .collect();
    answer(&user, json!({ "pvcs": pvcs }))
}

/// The namespace's PodDefaults, each with its selector's label and description, as the form
/// offers them as configurations; none where PodDefaults are not installed.
#[utoipa::path(
    get, path = "/api/namespaces/{ns}/poddefaults",
    summary = "the namespace's PodDefaults, each with its selector label and description (none where PodDefaults are not installed)", params(NamespacePath),
    responses((status = 200, description = "the namespace's PodDefaults, each with its selector label and description (none where PodDefaults are not installed)", body = inline(crate::openapi::PodDefaultsAnswer)), crate::openapi::PlatformErrors)
)]
async fn pod_defaults(
    Allowed { user, ns, .. }: Allowed<verb::List>,
    State(state): State<ApiState>,
) -> Answer {
    let poddefaults = state.workloads.pod_defaults(&ns).await?;
    answer(&user, json!({ "poddefaults": poddefaults }))
}

/// The pod a notebook runs in, `<name>-0`. Embedded, the container stands for it: its name, the
/// `notebook-name` label and the notebook's container spec.
#[utoipa::path(
    get, path = "/api/namespaces/{ns}/notebooks/{name}/pod",
    summary = "the notebook's pod <name>-0; embedded, its container in a pod's shape", params(NotebookPath),
    responses(
        (status = 200, description = "the notebook's pod <name>-0; embedded, its container in a pod's shape", body = inline(crate::openapi::PodAnswer)),
        (status = 404, description = "no pod (the notebook is stopped, or not scheduled yet)", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
async fn pod(
    Allowed { user, ns, .. }: Allowed<verb::Get>,
    State(state): State<ApiState>,
    Path(NotebookPath { name, .. }): Path<NotebookPath>,
) -> Answer {
    let notebook = find(&state, &ns, &name).await?;
    let state_shown = crate::api::view(&notebook, &state).state;
    let pod = state.workloads.pod(&notebook, state_shown).await?;
    answer(&user, json!({ "pod": pod }))
}

/// The most log lines one answer carries.
const LOG_LINES: u32 = 10_000;

/// The notebook container's log, as lines.
#[utoipa::path(
    get, path = "/api/namespaces/{ns}/notebooks/{name}/pod/{pod}/logs",
    summary = "the notebook container's log, as lines (the last 10,000)",
    params(PodPath),
    responses(
        (status = 200, description = "the notebook container's log, as lines (the last 10,000)", body = inline(crate::openapi::PodLogsAnswer)),
        (status = 404, description = "not the notebook's pod, or no pod", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
async fn pod_logs(
    Allowed { user, ns, .. }: Allowed<verb::Get>,
    State(state): State<ApiState>,
    Path(PodPath { name, pod, .. }): Path<PodPath>,
) -> Answer {
    find(&state, &ns, &name).await?;
    if pod != format!("{name}-0") {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!("{pod} is not the pod of notebook {ns}/{name} ({name}-0)"),
        ));
    }
    let text = state.workloads.recent_logs(&ns, &name, LOG_LINES).await?;
    let lines: Vec<&str> = text.split('\n').collect();
    answer(&user, json!({ "logs": lines }))
}
