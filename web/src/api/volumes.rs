//! A namespace's volume claims: what an existing workspace may name, and deleting unused ones.

use crate::api::extract::{Allowed, NamespacePath, verb};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use labforge_crds::notebook::Notebook;

use super::{ApiResult, ApiState, Failure};

/// The volume claims of namespace `ns`: what "existing workspace" and data volumes may name.
pub(crate) async fn claims(state: &ApiState, ns: &str) -> ApiResult<Vec<String>> {
    let claims = state.workloads.claims(ns).await?;
    Ok(claims.into_iter().map(|claim| claim.name).collect())
}

/// The names of those of `notebooks` that mount claim `claim`.
pub(crate) fn notebooks_using(notebooks: &[Notebook], claim: &str) -> Vec<String> {
    notebooks
        .iter()
        .filter(|notebook| notebook.claim_names().any(|mounted| mounted == claim))
        .filter_map(|notebook| notebook.metadata.name.clone())
        .collect()
}

#[utoipa::path(
    get, path = "/api/namespaces/{ns}/volumes", summary = "Volume claims of a namespace: what an existing workspace may name", params(NamespacePath),
    responses((status = 200, description = "the namespace's volume claims, sorted by name", body = inline(crate::openapi::VolumesAnswer)), crate::openapi::PlatformErrors)
)]
pub(crate) async fn list_volumes(
    Allowed { ns, .. }: Allowed<verb::List>,
    State(state): State<ApiState>,
) -> ApiResult<Json<serde_json::Value>> {
    // The namespace's notebooks are listed once, not once per volume.
    let notebooks = state.backend.list(Some(&ns)).await?;
    let mut volumes = Vec::new();
    for name in claims(&state, &ns).await? {
        let used_by = notebooks_using(&notebooks, &name);
        volumes.push(serde_json::json!({ "name": name, "usedBy": used_by }));
    }
    Ok(Json(serde_json::json!({ "volumes": volumes })))
}

/// A volume named by the path.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct VolumePath {
    /// Its namespace.
    #[allow(dead_code, reason = "the namespace is checked by `Allowed`")]
    ns: String,
    /// The volume claim's name.
    name: String,
}

/// Deletes a volume (a workspace a deleted notebook kept, say) and its files; refused while a
/// notebook mounts it.
#[utoipa::path(
    delete, path = "/api/namespaces/{ns}/volumes/{name}",
    summary = "Delete a volume and its files (never one a notebook mounts)", params(VolumePath),
    responses(
        (status = 204, description = "deleted"),
        (status = 404, description = "no such volume", body = crate::openapi::ApiErrorBody),
        (status = 409, description = "a notebook mounts it, or a container still uses it", body = crate::openapi::ApiErrorBody),
        (status = 501, description = "in a cluster: claims are deleted with kubectl", body = crate::openapi::ApiErrorBody),
        (status = 503, description = "the engine or cluster could not delete it", body = crate::openapi::ApiErrorBody),
        crate::openapi::SignedInErrors,
    )
)]
pub(crate) async fn delete_volume(
    Allowed { ns, .. }: Allowed<verb::Delete>,
    State(state): State<ApiState>,
    Path(VolumePath { name, .. }): Path<VolumePath>,
) -> ApiResult<StatusCode> {
    if !claims(&state, &ns).await?.contains(&name) {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!("namespace {ns} has no volume {name:?}"),
        ));
    }
    let used_by = notebooks_using(&state.backend.list(Some(&ns)).await?, &name);
    if !used_by.is_empty() {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            format!(
                "volume {name} is mounted by notebook {}: delete that notebook first",
                used_by.join(", ")
            ),
        ));
    }
    state.workloads.remove_claim(&ns, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
