//! The API of API tokens ([`crate::tokens`]): a user makes, lists and revokes their own; an
//! admin sees and revokes everyone's. Tokens are the embedded mode's: in a cluster the auth
//! proxy in front of the web app decides who a request is, with tokens of its own.

use crate::api::{ApiResult, ApiState, Failure, SignedIn};
use crate::tokens::{DEFAULT_LIFETIME, TokenError, TokenRecord};
use crate::users::LocalAuth;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The routes, for [`crate::api::router`] to merge.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/api/tokens", get(list_tokens).post(create_token))
        .route("/api/tokens/{id}", delete(revoke_token))
        .route("/api/admin/tokens", get(all_tokens))
}

/// A token to make.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewTokenRequest {
    /// What the token is for ("laptop", "CI"): unique among the user's tokens.
    pub name: String,
    /// How long it lasts: minutes, hours or days (`90m`, `12h`, `30d`), up to `366d`; `30d`
    /// when left out.
    #[serde(default)]
    pub expires_in: Option<String>,
}

/// A token as listed: never its secret.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenView {
    pub id: String,
    pub user: String,
    pub name: String,
    pub created: String,
    pub expires: String,
    /// When it last signed a request in, since the server started; absent: not since then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_used: Option<String>,
}

/// A token just made, with its secret: shown this once.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedToken {
    #[serde(flatten)]
    pub view: TokenView,
    /// Send it as `Authorization: Bearer <token>`. It is not shown again.
    pub token: String,
}

fn view(auth: &LocalAuth, record: &TokenRecord) -> TokenView {
    TokenView {
        id: record.id.clone(),
        user: record.user.clone(),
        name: record.name.clone(),
        created: record.created.to_string(),
        expires: record.expires.to_string(),
        last_used: auth.tokens.last_used(&record.id).map(|t| t.to_string()),
    }
}

fn local(state: &ApiState) -> ApiResult<&Arc<LocalAuth>> {
    state.local_users.as_ref().ok_or_else(|| {
        Failure::new(
            StatusCode::NOT_IMPLEMENTED,
            "API tokens are labforge up's; in a cluster the auth proxy in front of the web app \
             signs requests in, with tokens of its own",
        )
    })
}

impl From<TokenError> for Failure {
    fn from(err: TokenError) -> Self {
        match &err {
            TokenError::Invalid(field, message) => {
                Failure::for_field(StatusCode::UNPROCESSABLE_ENTITY, field, message.clone())
            }
            TokenError::NameTaken(message) => {
                Failure::for_field(StatusCode::CONFLICT, "name", message.clone())
            }
            TokenError::NotFound(_) => Failure::new(StatusCode::NOT_FOUND, err.to_string()),
            TokenError::File(_) | TokenError::Random(_) => {
                tracing::error!(error = %err, "API tokens");
                Failure::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string())
            }
        }
    }
}

/// Makes a token for the signed-in user.
#[utoipa::path(
    post, path = "/api/tokens", summary = "Make an API token (its secret is answered this once)",
    request_body = NewTokenRequest,
    responses(
        (status = 201, description = "the token, with its secret", body = CreatedToken),
        (status = 403, description = "asked with a token rather than a signed-in session", body = crate::openapi::ApiErrorBody),
        (status = 409, description = "the user has a token of that name", body = crate::openapi::ApiErrorBody),
        (status = 422, description = "a name or lifetime that is not one; `field` names it", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn create_token(
    user: SignedIn,
    State(state): State<ApiState>,
    headers: axum::http::HeaderMap,
    body: Result<Json<NewTokenRequest>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    let auth = local(&state)?;
    // A token that leaked must not outlive its own expiry by minting others.
    if crate::tokens::bearer(&headers).is_some() {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "a token cannot make tokens: sign in (the Tokens page, or `labforge login`)",
        ));
    }
    let Json(request) = body?;
    let lifetime = request.expires_in.as_deref().unwrap_or(DEFAULT_LIFETIME);
    let made = auth.tokens.create(&user.0.name, &request.name, lifetime)?;
    tracing::info!(user = %user.0.name, id = %made.record.id, name = %made.record.name, "API token made");
    Ok((
        StatusCode::CREATED,
        Json(CreatedToken {
            view: view(auth, &made.record),
            token: made.token,
        }),
    ))
}

/// The signed-in user's tokens.
#[utoipa::path(
    get, path = "/api/tokens", summary = "The caller's API tokens (never their secrets)",
    responses(
        (status = 200, description = "the tokens that have not expired", body = Vec<TokenView>),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn list_tokens(
    user: SignedIn,
    State(state): State<ApiState>,
) -> ApiResult<Json<Vec<TokenView>>> {
    let auth = local(&state)?;
    let records = auth.tokens.list(Some(&user.0.name));
    Ok(Json(records.iter().map(|r| view(auth, r)).collect()))
}

/// Every user's tokens (admins only).
#[utoipa::path(
    get, path = "/api/admin/tokens", summary = "Every user's API tokens (admins only)",
    responses(
        (status = 200, description = "the tokens that have not expired", body = Vec<TokenView>),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn all_tokens(
    user: SignedIn,
    State(state): State<ApiState>,
) -> ApiResult<Json<Vec<TokenView>>> {
    user.must_be_admin(&state).await?;
    let auth = local(&state)?;
    let records = auth.tokens.list(None);
    Ok(Json(records.iter().map(|r| view(auth, r)).collect()))
}

/// Revokes a token: the caller's own, or anyone's for an admin.
#[utoipa::path(
    delete, path = "/api/tokens/{id}", summary = "Revoke an API token (one's own; an admin, anyone's)",
    params(("id" = String, Path, description = "the token's id")),
    responses(
        (status = 204, description = "revoked: requests with it are refused from now on"),
        (status = 404, description = "no such token of the caller's", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn revoke_token(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let auth = local(&state)?;
    let admin = state
        .access
        .may(&user.0, crate::backend::Verb::List, None)
        .await;
    let revoked = auth
        .tokens
        .revoke(&id, |record| admin || record.user == user.0.name)?;
    tracing::info!(by = %user.0.name, user = %revoked.user, id = %revoked.id, "API token revoked");
    Ok(StatusCode::NO_CONTENT)
}
