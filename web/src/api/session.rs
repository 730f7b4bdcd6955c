//! Signing in and out, who one is, and what the spawner offers: the routes every page starts with.

use crate::kubeflow;
use crate::sign_in::SignInError;
use crate::users::{LocalAuth, SessionCookie, User};
use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::images::shared_for_viewer;
use super::{ApiResult, ApiState, Failure, SignedIn};

#[utoipa::path(
    get, path = "/api/healthz", summary = "Health",
    responses((status = 200, description = "serving", body = String, content_type = "text/plain"))
)]
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

#[utoipa::path(
    get, path = "/api/openapi.json", summary = "This document",
    responses((status = 200, description = "this document", body = Object))
)]
pub(crate) async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::openapi::DOCUMENT.as_str(),
    )
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Login {
    username: String,
    password: String,
}

#[utoipa::path(
    post, path = "/api/login", summary = "Sign in", request_body = Login,
    responses(
        (status = 200, description = "signed in; sets the session cookie (`__Host-labforge_session`, or `labforge_session` over plain HTTP on a host other than localhost)", body = crate::openapi::Whoami),
        (status = 400, response = crate::openapi::BadRequest),
        (status = 401, description = "wrong user name or password", body = crate::openapi::ApiErrorBody),
        (status = 403, description = "sent by a page of another origin", body = crate::openapi::ApiErrorBody),
        (status = 415, response = crate::openapi::UnsupportedMediaType),
        (status = 422, description = "a body whose fields have the wrong types", body = crate::openapi::ApiErrorBody),
        crate::openapi::SignInWaits,
    )
)]
pub(crate) async fn login(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Result<Json<Login>, JsonRejection>,
) -> Result<Response, Response> {
    let Json(login) = body.map_err(|e| Failure::from(e).into_response())?;
    // Whatever name was typed, up to a length a name can have: the trail is not for storing
    // what a client sends.
    let attempt = crate::audit::SignInAttempt(login.username.chars().take(128).collect());
    let with_attempt = |mut response: Response| {
        response.extensions_mut().insert(attempt.clone());
        response
    };
    let (Some(auth), Some(sign_in)) = (&state.local_users, &state.sign_in) else {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            "users sign in through the cluster's auth proxy",
        )
        .into_response());
    };
    let user = sign_in
        .check(
            &auth.users,
            &login.username,
            &login.password,
            client_address(&headers),
        )
        .await
        .map_err(|e| with_attempt(sign_in_failure(e)))?;
    let token = auth.sessions.sign_in(&user).map_err(|e| {
        Failure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
    })?;
    let mut response = Json(whoami_body(&user)).into_response();
    set_session_cookie(&mut response, &state, auth, token, None);
    Ok(with_attempt(response))
}

/// Sets the session cookie to `token` (`HttpOnly`, `SameSite=Lax`, `Secure` over TLS, the app's
/// path), for `max_age` or the browser's session. A `__Host-` cookie is `Secure` and for `/`
/// wherever it is served, as its prefix requires.
pub(crate) fn set_session_cookie(
    response: &mut Response,
    state: &ApiState,
    auth: &LocalAuth,
    token: String,
    max_age: Option<cookie::time::Duration>,
) {
    let host_only = auth.cookie.starts_with("__Host-");
    let path = if host_only {
        "/".to_owned()
    } else {
        state.base_path.as_str().to_owned()
    };
    let mut cookie = cookie::Cookie::build((auth.cookie, token))
        .path(path)
        .http_only(true)
        .same_site(cookie::SameSite::Lax)
        .secure(state.secure_cookies || host_only);
    if let Some(max_age) = max_age {
        cookie = cookie.max_age(max_age);
    }
    if let Ok(value) = HeaderValue::from_str(&cookie.build().to_string()) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
}

#[utoipa::path(
    post, path = "/api/logout", summary = "Sign out",
    responses((status = 204, description = "signed out"), crate::openapi::SignedInErrors)
)]
pub(crate) async fn logout(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Some(auth) = &state.local_users {
        // Only the browser's own session: of several values, which is its own is not known.
        if let SessionCookie::One(token) = auth.session_cookie(&headers) {
            auth.sessions.end(token);
        }
        set_session_cookie(
            &mut response,
            &state,
            auth,
            String::new(),
            Some(cookie::time::Duration::ZERO),
        );
    }
    response
}

/// The client's address as the proxy in front saw it: the last `X-Forwarded-For` entry, which
/// is the proxy's own (the embedded web app listens on loopback behind it).
pub(crate) fn client_address(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all("x-forwarded-for")
        .iter()
        .next_back()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

pub(crate) fn sign_in_failure(error: SignInError) -> Response {
    match error {
        SignInError::Wrong => {
            Failure::new(StatusCode::UNAUTHORIZED, error.to_string()).into_response()
        }
        SignInError::Busy => {
            let mut response =
                Failure::new(StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
        SignInError::Throttled(wait) => {
            let mut response =
                Failure::new(StatusCode::TOO_MANY_REQUESTS, error.to_string()).into_response();
            if let Ok(seconds) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, seconds);
            }
            response
        }
    }
}

pub(crate) fn whoami_body(user: &User) -> serde_json::Value {
    serde_json::json!({ "name": user.name, "namespace": user.namespace, "admin": user.admin })
}

#[utoipa::path(
    get, path = "/api/whoami", summary = "The signed-in user",
    responses((status = 200, description = "the user", body = crate::openapi::Whoami), crate::openapi::SignedInErrors)
)]
pub(crate) async fn whoami(user: SignedIn) -> Json<serde_json::Value> {
    Json(whoami_body(&user.0))
}

/// The spawner's configuration, plus the images the user saved (choices for them only).
#[utoipa::path(
    get, path = "/api/config",
    summary = "Spawner configuration: image catalog, the user's saved images, GPU vendors available here, defaults and bounds (incl. autoSave, keepSavedImages); Kubeflow's spawnerFormDefaults as `config`",
    responses((status = 200, description = "configuration", body = inline(crate::openapi::ConfigAnswer)), crate::openapi::SignedInErrors)
)]
pub(crate) async fn config(
    user: SignedIn,
    State(state): State<ApiState>,
) -> ApiResult<Json<serde_json::Value>> {
    let mut config = serde_json::to_value(&*state.config).unwrap_or_default();
    config["savedImages"] =
        serde_json::to_value(state.backend.saved_images(&user.0.namespace).await?)
            .unwrap_or_default();
    config["sharedImages"] = serde_json::to_value(shared_for_viewer(
        state.backend.images_shared_with(&user.0.namespace).await?,
    ))
    .unwrap_or_default();
    config["imagesBeingPrepared"] =
        serde_json::to_value(state.preparing.images()).unwrap_or_default();
    // Kubeflow's clients read its spawnerFormDefaults here.
    config["config"] = kubeflow::form_defaults(&state.config);
    Ok(Json(kubeflow::envelope(&user.0, StatusCode::OK, config)))
}
