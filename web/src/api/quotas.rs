//! A namespace's quota: read and set, and the one check every create and start passes.

use crate::api::extract::{Allowed, NamespacePath, verb};
use crate::backend::BackendError;
use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use labforge_crds::notebook::Notebook;

use super::{ApiResult, ApiState, Failure, SignedIn};

/// What a change to a notebook asks of its namespace's quota.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuotaAsk {
    /// A new notebook: its new volumes, and what it holds if it is to run.
    Create,
    /// A start, or a resize of a notebook that runs: what it holds while it runs.
    Run,
}

/// Whether `notebook` (as it is to be) fits in namespace `ns`'s quota beside the rest of the
/// namespace: the one check every create, start and resize goes through. A refusal is a 403, as
/// Kubernetes refuses a pod over its namespace's ResourceQuota, naming the quota, what is in use
/// and what was asked.
pub(crate) async fn admitted_by_quota(
    state: &ApiState,
    ns: &str,
    notebook: &Notebook,
    ask: QuotaAsk,
) -> ApiResult<()> {
    let Some(quota) = state.backend.quota(ns).await? else {
        return Ok(());
    };
    let notebooks = state.backend.list(Some(ns)).await?;
    let name = notebook.metadata.name.as_deref().unwrap_or_default();
    let mut in_use = crate::quota::Held::running(&notebooks, name);
    let mut asked = if ask == QuotaAsk::Run || !notebook.is_stopped() {
        crate::quota::Held::of(notebook)
    } else {
        crate::quota::Held::default()
    };
    if ask == QuotaAsk::Create && quota.storage.is_some() {
        let claims = state.workloads.claims(ns).await?;
        in_use = in_use + crate::quota::Held::claims(&claims, &notebooks);
        asked = asked + crate::quota::Held::new_volumes(notebook, &claims);
    }
    quota
        .admits(ns, in_use, asked)
        .map_err(|exceeded| BackendError::from(exceeded).into())
}

/// A namespace's quota and what its running notebooks hold: for its members and admins.
#[utoipa::path(
    get, path = "/api/namespaces/{ns}/quota", summary = "The namespace's quota (null: none) and what its running notebooks hold", params(NamespacePath),
    responses((status = 200, description = "quota and use", body = inline(crate::openapi::QuotaAnswer)), crate::openapi::PlatformErrors)
)]
pub(crate) async fn get_quota(
    Allowed { ns, .. }: Allowed<verb::List>,
    State(state): State<ApiState>,
) -> ApiResult<Json<serde_json::Value>> {
    let notebooks = state.backend.list(Some(&ns)).await?;
    Ok(Json(quota_and_use(&state, &ns, &notebooks).await?))
}

/// Namespace `ns`'s quota and what it holds (its `notebooks` and volumes), as `GET …/quota`
/// answers.
pub(crate) async fn quota_and_use(
    state: &ApiState,
    ns: &str,
    notebooks: &[Notebook],
) -> ApiResult<serde_json::Value> {
    let quota = state.backend.quota(ns).await?;
    let claims = state.workloads.claims(ns).await?;
    Ok(serde_json::json!({
        "namespace": ns,
        "quota": quota,
        "inUse": crate::quota::Held::running(notebooks, "")
            + crate::quota::Held::claims(&claims, notebooks),
    }))
}

/// Every namespace's quota and use in one answer, for the admin page: each user's namespace,
/// each team namespace and each namespace with notebooks.
#[utoipa::path(
    get, path = "/api/admin/quotas", summary = "Every namespace's quota (null: none) and what it holds (admins only)",
    responses((status = 200, description = "quota and use per namespace", body = inline(crate::openapi::QuotasAnswer)), crate::openapi::PlatformErrors)
)]
pub(crate) async fn admin_quotas(
    user: SignedIn,
    State(state): State<ApiState>,
) -> ApiResult<Json<serde_json::Value>> {
    user.must_be_admin(&state).await?;
    let notebooks = state.backend.list(None).await?;
    let mut namespaces: Vec<String> = notebooks
        .iter()
        .filter_map(|nb| nb.metadata.namespace.clone())
        .collect();
    if let Some(auth) = &state.local_users {
        namespaces.extend(auth.users.list().into_iter().map(|u| u.namespace));
        namespaces.extend(
            auth.namespaces
                .list(&auth.users)
                .into_iter()
                .map(|ns| ns.name),
        );
    }
    namespaces.sort();
    namespaces.dedup();
    let mut answers = Vec::with_capacity(namespaces.len());
    for ns in &namespaces {
        let theirs: Vec<Notebook> = notebooks
            .iter()
            .filter(|nb| nb.metadata.namespace.as_deref() == Some(ns.as_str()))
            .cloned()
            .collect();
        answers.push(quota_and_use(&state, ns, &theirs).await?);
    }
    Ok(Json(serde_json::json!({ "namespaces": answers })))
}

/// Sets a namespace's quota (admins only); `null` removes it.
#[utoipa::path(
    put, path = "/api/namespaces/{ns}/quota", summary = "Set the namespace's quota: cpu, memory (quantities), gpus, notebooks running at once; null removes it (admins only)", params(NamespacePath),
    request_body = Option<crate::quota::Quota>,
    responses(
        (status = 200, description = "the quota set", body = inline(crate::openapi::QuotaAnswer)),
        (status = 422, description = "a field that is not a quantity, or a namespace that is not a name", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn put_quota(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(NamespacePath { ns }): Path<NamespacePath>,
    body: Result<Json<Option<crate::quota::Quota>>, JsonRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    user.must_be_admin(&state).await?;
    crate::validate::dns_label("namespace", &ns)
        .map_err(|e| Failure::field(StatusCode::UNPROCESSABLE_ENTITY, e))?;
    let Json(quota) = body?;
    if let Some(quota) = &quota {
        let problems = quota.problems();
        if !problems.is_empty() {
            return Err(Failure::fields(StatusCode::UNPROCESSABLE_ENTITY, &problems));
        }
    }
    state.backend.set_quota(&ns, quota).await?;
    let notebooks = state.backend.list(Some(&ns)).await?;
    Ok(Json(quota_and_use(&state, &ns, &notebooks).await?))
}
