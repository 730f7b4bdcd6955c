//! The API of teams: namespaces and their members ([`crate::namespaces`], the embedded mode's;
//! in a cluster they are Kubeflow Profiles and their contributors), and notebooks shared with
//! named users (on the Notebook, in both modes).

use crate::api::extract::{NamespacePath, NotebookPath};
use crate::api::{ApiResult, ApiState, Failure, SignedIn};
use crate::namespaces::{Action, NamespaceError, NamespaceView, Role};
use crate::users::LocalAuth;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use labforge_crds::notebook::{Notebook, SHARED_WITH_ANNOTATION};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The routes, for [`crate::api::router`] to merge.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/api/namespaces", post(add_namespace))
        .route("/api/namespaces/{ns}/members", get(members))
        .route(
            "/api/namespaces/{ns}/members/{user}",
            put(set_member).delete(remove_member),
        )
        .route("/api/namespaces/{ns}/notebooks/{name}/shares", post(share))
        .route(
            "/api/namespaces/{ns}/notebooks/{name}/shares/{user}",
            axum::routing::delete(unshare),
        )
        .route("/api/shared", get(shared_with_me))
}

/// A team namespace to add.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewNamespace {
    pub name: String,
    /// The user who owns it and manages its members.
    pub owner: String,
}

/// A member's role.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemberRole {
    /// `edit` or `view`.
    pub role: String,
}

/// Whom to share a notebook with.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShareRequest {
    pub user: String,
}

/// Whom a notebook is shared with now.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Shares {
    pub shared_with: Vec<String>,
}

/// The local users and namespaces, which only the embedded mode keeps.
fn local(state: &ApiState) -> ApiResult<&Arc<LocalAuth>> {
    state.local_users.as_ref().ok_or_else(|| {
        Failure::new(
            StatusCode::NOT_IMPLEMENTED,
            "in a cluster, namespaces and their members are Kubeflow Profiles and their \
             contributors: manage them in Kubeflow's dashboard or with kubectl",
        )
    })
}

impl From<NamespaceError> for Failure {
    fn from(err: NamespaceError) -> Self {
        let status = match &err {
            NamespaceError::NotFound(_) | NamespaceError::NotAMember { .. } => {
                StatusCode::NOT_FOUND
            }
            NamespaceError::Exists(_) => StatusCode::CONFLICT,
            NamespaceError::File(_) => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::UNPROCESSABLE_ENTITY,
        };
        match err.field() {
            Some(field) => Failure::for_field(status, field, err.to_string()),
            None => Failure::new(status, err.to_string()),
        }
    }
}

/// A namespace as the user is shown it, or 404 when they are not in it.
fn view_of(auth: &LocalAuth, user: &SignedIn, ns: &str) -> ApiResult<NamespaceView> {
    auth.namespaces
        .view(&user.0, &auth.users, ns)
        .ok_or_else(|| Failure::new(StatusCode::NOT_FOUND, format!("no namespace {ns} of yours")))
}

/// Adds a team namespace (admins only).
#[utoipa::path(
    post, path = "/api/namespaces", summary = "Add a team namespace with its owner (admins only)",
    request_body = NewNamespace,
    responses(
        (status = 201, description = "the namespace", body = NamespaceView),
        (status = 409, description = "a namespace or user of that name exists", body = crate::openapi::ApiErrorBody),
        (status = 422, description = "a name that is not one, or an owner who is no user", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn add_namespace(
    user: SignedIn,
    State(state): State<ApiState>,
    body: Result<Json<NewNamespace>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<NamespaceView>)> {
    user.must_be_admin(&state).await?;
    let auth = local(&state)?;
    let Json(new) = body?;
    auth.namespaces.add(&new.name, &new.owner, &auth.users)?;
    Ok((StatusCode::CREATED, Json(view_of(auth, &user, &new.name)?)))
}

/// A namespace's owner and members, for whoever is in it.
#[utoipa::path(
    get, path = "/api/namespaces/{ns}/members", summary = "The namespace's owner, members and the caller's role", params(NamespacePath),
    responses(
        (status = 200, description = "the namespace", body = NamespaceView),
        (status = 404, description = "not a namespace the caller is in", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn members(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
) -> ApiResult<Json<NamespaceView>> {
    let auth = local(&state)?;
    Ok(Json(view_of(auth, &user, &ns)?))
}

/// The namespace, if the user may manage its members.
fn managed(auth: &LocalAuth, user: &SignedIn, ns: &str) -> ApiResult<NamespaceView> {
    let view = view_of(auth, user, ns)?;
    if crate::namespaces::allows(user.0.admin, Some(view.role), false, Action::Manage) {
        Ok(view)
    } else {
        Err(Failure::new(
            StatusCode::FORBIDDEN,
            format!(
                "{} may not manage namespace {ns}'s members: its owner {} may",
                user.0.name, view.owner
            ),
        ))
    }
}

/// Lets a user into a namespace as `edit` or `view` (its owner or an admin).
#[utoipa::path(
    put, path = "/api/namespaces/{ns}/members/{user}", summary = "Make a user a member as edit or view (the namespace's owner or an admin)", params(NamespacePath, ("user" = String, Path)),
    request_body = MemberRole,
    responses(
        (status = 200, description = "the namespace", body = NamespaceView),
        (status = 403, description = "not the namespace's owner", body = crate::openapi::ApiErrorBody),
        (status = 422, description = "no such user, the owner, or a role that is not edit or view", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn set_member(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, member)): Path<(String, String)>,
    body: Result<Json<MemberRole>, JsonRejection>,
) -> ApiResult<Json<NamespaceView>> {
    let auth = local(&state)?;
    managed(auth, &user, &ns)?;
    let Json(MemberRole { role }) = body?;
    let role: Role = role.parse()?;
    auth.namespaces
        .set_member(&ns, &member, role, &auth.users)?;
    if role == Role::View {
        end_grants_no_longer_allowed(&state).await;
    }
    Ok(Json(view_of(auth, &user, &ns)?))
}

/// Takes a user out of a namespace: their notebook websockets there close at once.
#[utoipa::path(
    delete, path = "/api/namespaces/{ns}/members/{user}", summary = "Take a member out (the namespace's owner or an admin)", params(NamespacePath, ("user" = String, Path)),
    responses(
        (status = 200, description = "the namespace", body = NamespaceView),
        (status = 403, description = "not the namespace's owner", body = crate::openapi::ApiErrorBody),
        (status = 404, description = "not a member", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn remove_member(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, member)): Path<(String, String)>,
) -> ApiResult<Json<NamespaceView>> {
    let auth = local(&state)?;
    managed(auth, &user, &ns)?;
    auth.namespaces.remove_member(&ns, &member)?;
    end_grants_no_longer_allowed(&state).await;
    Ok(Json(view_of(auth, &user, &ns)?))
}

/// Ends the notebook sign-ins no longer allowed, at once rather than at the next sweep of
/// `labforge up`: their websockets close.
async fn end_grants_no_longer_allowed(state: &ApiState) {
    let (Some(auth), Some(sign_in)) = (
        state.local_users.as_ref(),
        state
            .notebook_links
            .as_ref()
            .and_then(|l| l.sign_in.as_ref()),
    ) else {
        return;
    };
    // Every namespace's: a grant held through a share elsewhere must find its notebook.
    let Ok(notebooks) = state.backend.list(None).await else {
        return;
    };
    auth.end_grants_no_longer_allowed(sign_in, |namespace, name| {
        notebooks
            .iter()
            .find(|nb| {
                nb.metadata.namespace.as_deref() == Some(namespace)
                    && nb.metadata.name.as_deref() == Some(name)
            })
            .map(shares_of)
            .unwrap_or_default()
    });
}

fn shares_of(notebook: &Notebook) -> Vec<String> {
    notebook
        .shared_with()
        .into_iter()
        .map(String::from)
        .collect()
}

/// Sets the notebook's shares to `users`.
async fn write_shares(
    state: &ApiState,
    ns: &str,
    name: &str,
    users: Vec<String>,
) -> ApiResult<Shares> {
    let value = users.join(",");
    let updated = state
        .backend
        .update(ns, name, &|notebook| {
            let annotations = notebook.metadata.annotations.get_or_insert_default();
            if value.is_empty() {
                annotations.remove(SHARED_WITH_ANNOTATION);
            } else {
                annotations.insert(SHARED_WITH_ANNOTATION.into(), value.clone());
            }
        })
        .await?;
    Ok(Shares {
        shared_with: shares_of(&updated),
    })
}

/// Shares a notebook with a user: they see it under "Shared with me" and may open it, working
/// as its owner there (its environment variables and files included).
#[utoipa::path(
    post, path = "/api/namespaces/{ns}/notebooks/{name}/shares", summary = "Share the notebook with a user, who may then open it and works there as its owner", params(NotebookPath),
    request_body = ShareRequest,
    responses(
        (status = 201, description = "whom it is shared with now", body = Shares),
        (status = 403, description = "not allowed to change the notebook", body = crate::openapi::ApiErrorBody),
        (status = 404, description = "no such notebook", body = crate::openapi::ApiErrorBody),
        (status = 422, description = "no such user", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn share(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(NotebookPath { ns, name }): Path<NotebookPath>,
    body: Result<Json<ShareRequest>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<Shares>)> {
    let notebook = user.notebook(&state, Action::Change, &ns, &name).await?;
    let Json(ShareRequest { user: with }) = body?;
    let known = match &state.local_users {
        Some(auth) => auth.users.get(&with).is_some(),
        // A cluster's users are whoever its auth proxy says: any name without separators.
        None => !with.is_empty() && !with.contains([',', ' ']),
    };
    if !known {
        return Err(Failure::for_field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "user",
            format!("no user {with:?}"),
        ));
    }
    let mut users = shares_of(&notebook);
    if !users.contains(&with) {
        users.push(with);
    }
    let shares = write_shares(&state, &ns, &name, users).await?;
    Ok((StatusCode::CREATED, Json(shares)))
}

/// Stops sharing a notebook with a user: their sign-in on its host ends and their websockets
/// there close at once.
#[utoipa::path(
    delete, path = "/api/namespaces/{ns}/notebooks/{name}/shares/{user}", summary = "Stop sharing the notebook with a user; their open connections close", params(NotebookPath, ("user" = String, Path)),
    responses(
        (status = 200, description = "whom it is shared with now", body = Shares),
        (status = 403, description = "not allowed to change the notebook", body = crate::openapi::ApiErrorBody),
        (status = 404, description = "no such notebook, or not shared with that user", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn unshare(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name, with)): Path<(String, String, String)>,
) -> ApiResult<Json<Shares>> {
    let notebook = user.notebook(&state, Action::Change, &ns, &name).await?;
    let mut users = shares_of(&notebook);
    let before = users.len();
    users.retain(|u| *u != with);
    if users.len() == before {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!("notebook {ns}/{name} is not shared with {with}"),
        ));
    }
    let shares = write_shares(&state, &ns, &name, users).await?;
    end_grants_no_longer_allowed(&state).await;
    Ok(Json(shares))
}

/// The notebooks others shared with the caller.
#[utoipa::path(
    get, path = "/api/shared", summary = "Notebooks shared with the caller",
    responses(
        (status = 200, description = "the notebooks", body = inline(crate::openapi::SharedAnswer)),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn shared_with_me(
    user: SignedIn,
    State(state): State<ApiState>,
) -> ApiResult<Json<serde_json::Value>> {
    let notebooks: Vec<crate::model::NotebookView> = state
        .backend
        .list(None)
        .await?
        .iter()
        .filter(|nb| nb.shared_with().contains(&user.0.name.as_str()))
        .map(|nb| crate::api::view(nb, &state))
        .collect();
    Ok(Json(serde_json::json!({ "notebooks": notebooks })))
}
