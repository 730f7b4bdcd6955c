//! The JSON API (`/api/...`), documented by the OpenAPI document utoipa generates from these
//! handlers and their types ([`crate::openapi`]). Paths follow Kubeflow's jupyter web
//! app where they fit (`/api/namespaces/<ns>/notebooks...`).
//!
//! Every route but login, health and the OpenAPI document needs a signed-in user; a namespace's
//! routes need its owner or an admin. Bad input is answered 4xx with an [`ApiError`] naming the
//! field, before anything is stored. Requests that change something must be JSON, which a
//! cross-site form cannot send, and come from the app's own pages ([`crate::same_origin`]),
//! which keeps out the pages of notebooks that share its site.

use crate::backend::Change;
use crate::backend::{Access, Backend, BackendError, Verb};
use crate::config::SpawnerConfig;
use crate::kubeflow;
use crate::model::{
    AUTO_SAVE_ANNOTATION, ApiError, FieldMessage, GpuView, NotebookPatch, NotebookRequest,
    NotebookState, NotebookView, SERVER_TYPE_ANNOTATION, ServerType, WorkspaceRequest,
};
use crate::namespaces::Action;
use crate::saves::{Saves, StartSaveError};
use crate::sign_in::{SignIn, SignInError};
use crate::users::{LocalAuth, SessionCookie, User};
use crate::validate::{FieldError, FieldErrors, image_reference, notebook_from_request};
use crate::workloads::{WorkloadError, Workloads};
use axum::body::Body;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header, request::Parts};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::{Stream, StreamExt};
use labforge_crds::notebook::{
    CREATOR_ANNOTATION, LAST_ACTIVITY_ANNOTATION, Notebook, STOP_ANNOTATION,
};
use labforge_notebook_controller::builders::route_prefix;
use labforge_proxy::activity::Activity;
use labforge_proxy::routes::activity_key;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 64 * 1024;
/// Set on a notebook stopped by the culler, so users see "culled" rather than "stopped".
pub const STOPPED_BY_ANNOTATION: &str = "labforge.dev/stopped-by";

#[derive(Clone)]
pub struct ApiState {
    pub backend: Arc<dyn Backend>,
    pub access: Arc<dyn Access>,
    /// Local users (embedded mode); `None` where an auth proxy signs users in.
    pub local_users: Option<Arc<LocalAuth>>,
    /// Password checks for [`Self::local_users`].
    pub sign_in: Option<Arc<SignIn>>,
    /// Saves: run here (embedded mode) or as ImageBuilds (a cluster with `--save-registry`);
    /// `None` where saving is not set up.
    pub saves: Option<Arc<dyn Saves>>,
    pub config: Arc<SpawnerConfig>,
    /// Where notebooks run: their logs and volumes are read there.
    pub workloads: Arc<dyn Workloads>,
    pub activity: Arc<Activity>,
    /// Mark cookies `Secure` (served over TLS).
    pub secure_cookies: bool,
    /// Each notebook on its own host; `None`: on the web app's host, under its path.
    pub notebook_links: Option<crate::notebook_sign_in::NotebookLinks>,
    /// Checks an image a user names (neither in the catalog nor saved) before a notebook is made
    /// or moved onto it; `None`: not checked.
    pub image_check: Option<Arc<dyn crate::image_check::ImageCheck>>,
    /// The running notebooks' last sampled resource use; `None`: not measured here.
    pub usage: Option<Arc<crate::usage::UsageBoard>>,
    /// How long without activity a notebook counts as idle (the culling idle time).
    pub idle_after: std::time::Duration,
    /// The path the app is served under; pages link relative to it.
    pub base_path: crate::base_path::BasePath,
    /// Where saves push, `<registry>/<namespace>/…`: an image there belongs to its namespace
    /// ([`crate::image_access`]); `None`: saving is not set up, and no image is anyone's.
    pub saves_registry: Option<crate::image_access::SavesRegistry>,
    /// The catalog's images not ready to run here yet.
    pub preparing: Arc<crate::preparing::ImagesBeingPrepared>,
    /// Where every change and notebook sign-in is recorded ([`crate::audit`]).
    pub audit: Arc<dyn crate::audit::AuditSink>,
}

/// Images shared with a namespace, as its users see them: whom else each is shared with is its
/// owner's business.
fn shared_for_viewer(mut images: Vec<crate::model::SavedImage>) -> Vec<crate::model::SavedImage> {
    for image in &mut images {
        image.shared_with.clear();
    }
    images
}

/// The images a namespace may pick besides the catalog's: its own saves, and those other
/// namespaces shared with it.
struct Runnable {
    shared: Vec<crate::model::SavedImage>,
    /// Every one of them, own and shared.
    images: Vec<String>,
    /// Their manifest digests.
    digests: Vec<String>,
}

impl ApiState {
    async fn runnable_images(&self, ns: &str) -> ApiResult<Runnable> {
        let own = self.backend.saved_images(ns).await?;
        let shared = self.backend.images_shared_with(ns).await?;
        let images = own.iter().chain(&shared).map(|i| i.image.clone()).collect();
        let digests = own
            .iter()
            .chain(&shared)
            .map(|i| i.digest.clone())
            .collect();
        Ok(Runnable {
            shared,
            images,
            digests,
        })
    }

    /// `image` as the engine is to be given it: a catalog image, or one of the namespace's own or
    /// shared saves, as it is; any other fully qualified (`python:3` is
    /// `docker.io/library/python:3`). podman looks a short name or an image ID prefix up among
    /// its local images, another namespace's saves among them, before any registry.
    fn qualified_image(&self, image: &str, runnable: &Runnable) -> String {
        if self.config.in_catalog(image) || runnable.images.iter().any(|i| i == image) {
            return image.to_owned();
        }
        crate::validate::qualified_image(image)
    }

    /// Why `user` may not run `image` in namespace `ns` because it is another namespace's
    /// saved image, not shared with `ns`; asked before anything is asked of the registry, so
    /// the answer is the same whether or not the image exists.
    async fn foreign_image_refusal(
        &self,
        user: &User,
        ns: &str,
        image: &str,
        runnable: &Runnable,
    ) -> ApiResult<Option<FieldError>> {
        let request = crate::image_access::ImageRequest {
            image,
            namespace: ns,
            admin: user.admin,
            in_catalog: self.config.in_catalog(image),
        };
        if request.admin || request.in_catalog {
            return Ok(None);
        }
        let Some(owner) =
            crate::image_access::foreign_owner(self.saves_registry.as_ref(), &request)
        else {
            return Ok(self
                .foreign_digest_owner(ns, image, runnable)
                .await?
                .map(|owner| crate::image_access::refusal(image, &owner, ns)));
        };
        let shared = runnable
            .shared
            .iter()
            .any(|s| s.namespace == owner && s.image == image);
        if shared || !self.keeps_saves(&owner) {
            return Ok(None);
        }
        Ok(Some(crate::image_access::refusal(image, &owner, ns)))
    }

    /// Whether `namespace`'s repositories in the saves registry are that namespace's. In a
    /// cluster, every repository below the saves prefix is. On one machine the registry also
    /// holds the platform's images, under `labforge/` (no user has that name; the catalog's
    /// images elsewhere there pass as the catalog's): every other name is a namespace's, whether
    /// or not such a user exists, so that the answer tells nobody which users do.
    fn keeps_saves(&self, namespace: &str) -> bool {
        self.local_users.is_none() || namespace != crate::users::RESERVED_NAMESPACE
    }

    /// In embedded mode, the namespace whose saved image has the manifest digest `image` is
    /// pinned to, when it is not `ns`'s and was not shared with it: podman runs
    /// `any/name@sha256:<digest>` from whichever local image has that digest.
    async fn foreign_digest_owner(
        &self,
        ns: &str,
        image: &str,
        runnable: &Runnable,
    ) -> ApiResult<Option<String>> {
        let Some((_, digest)) = image.split_once('@') else {
            return Ok(None);
        };
        if self.local_users.is_none() || runnable.digests.iter().any(|d| d == digest) {
            return Ok(None);
        }
        Ok(self
            .backend
            .saved_image_namespaces_with_digest(digest)
            .await?
            .into_iter()
            .find(|owner| owner != ns))
    }

    /// Why `image`, named by a user of `ns`, cannot be run, when the check can tell; catalog
    /// images and the namespace's own and shared saves are trusted.
    async fn image_refusal(&self, image: &str, saved: &[String]) -> Option<FieldError> {
        let check = self.image_check.as_ref()?;
        if self.config.in_catalog(image) || saved.iter().any(|s| s == image) {
            return None;
        }
        check
            .refusal(image)
            .await
            .map(|why| FieldError::new("image", why))
    }
}

/// An error answer.
pub struct Failure(StatusCode, ApiError);

impl Failure {
    pub(crate) fn new(status: StatusCode, error: impl Into<String>) -> Self {
        Self(
            status,
            ApiError {
                error: error.into(),
                field: None,
                errors: Vec::new(),
            },
        )
    }
    /// An error about one field of the request.
    pub(crate) fn for_field(status: StatusCode, field: &str, message: String) -> Self {
        Self::field(status, FieldError::new(field, message))
    }
    fn field(status: StatusCode, error: FieldError) -> Self {
        Self::fields(status, &FieldErrors::from(error))
    }
    /// Every wrong field; `error` and `field` tell the first.
    fn fields(status: StatusCode, errors: &FieldErrors) -> Self {
        let first = errors.as_slice().first();
        Self(
            status,
            ApiError {
                error: first.map(ToString::to_string).unwrap_or_default(),
                field: first.map(|e| e.field.clone()),
                errors: errors
                    .as_slice()
                    .iter()
                    .map(|e| FieldMessage {
                        field: e.field.clone(),
                        message: e.message.clone(),
                    })
                    .collect(),
            },
        )
    }
}

impl IntoResponse for Failure {
    /// The error with Kubeflow's failure envelope beside it (`success: false`, `status`, and the
    /// message as `log`), which clients written for its web app read.
    fn into_response(self) -> Response {
        let Self(status, error) = self;
        let mut body = serde_json::to_value(&error).unwrap_or_default();
        if let Some(fields) = body.as_object_mut() {
            fields.insert("success".into(), false.into());
            fields.insert("status".into(), status.as_u16().into());
            fields.insert("log".into(), error.error.into());
        }
        (status, Json(body)).into_response()
    }
}

impl From<JsonRejection> for Failure {
    fn from(rejection: JsonRejection) -> Self {
        Self::new(rejection.status(), rejection.body_text())
    }
}

impl From<QueryRejection> for Failure {
    fn from(rejection: QueryRejection) -> Self {
        Self::new(StatusCode::BAD_REQUEST, rejection.body_text())
    }
}

/// A query string read into `T`; one that cannot be is refused in the API's error shape.
struct ApiQuery<T>(T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Failure> {
        let Query(query) = Query::<T>::from_request_parts(parts, state).await?;
        Ok(Self(query))
    }
}

impl From<BackendError> for Failure {
    fn from(err: BackendError) -> Self {
        match &err {
            BackendError::AlreadyExists { .. } => Self::field(
                StatusCode::CONFLICT,
                FieldError::new("name", err.to_string()),
            ),
            BackendError::NotFound { .. } => Self::new(StatusCode::NOT_FOUND, err.to_string()),
            BackendError::Invalid(message) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, message.clone())
            }
            BackendError::OverQuota(exceeded) => {
                Self::new(StatusCode::FORBIDDEN, exceeded.to_string())
            }
            BackendError::Unavailable(message) => {
                tracing::error!(error = %message, "backend");
                Self::new(StatusCode::SERVICE_UNAVAILABLE, message.clone())
            }
        }
    }
}

impl From<WorkloadError> for Failure {
    fn from(error: WorkloadError) -> Self {
        let status = match &error {
            WorkloadError::NotFound(_) => StatusCode::NOT_FOUND,
            WorkloadError::Conflict(_) => StatusCode::CONFLICT,
            WorkloadError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
            WorkloadError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self::new(status, error.to_string())
    }
}

pub(crate) type ApiResult<T> = Result<T, Failure>;

/// The signed-in user of a request.
pub struct SignedIn(pub User);

impl FromRequestParts<ApiState> for SignedIn {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Failure> {
        if crate::tokens::bearer(&parts.headers).is_some() {
            return state
                .access
                .identify(&parts.headers)
                .await
                .map(SignedIn)
                .ok_or_else(|| {
                    Failure::new(
                        StatusCode::UNAUTHORIZED,
                        "this API token is revoked, expired or unknown: make a new one on the \
                         Tokens page or with `labforge login`",
                    )
                });
        }
        let several = state
            .local_users
            .as_ref()
            .is_some_and(|auth| auth.session_cookie(&parts.headers) == SessionCookie::Several);
        if several {
            return Err(Failure::new(
                StatusCode::UNAUTHORIZED,
                "this request carried more than one session cookie, and which one is yours \
                 cannot be told (a page of another host may have set one): sign in again",
            ));
        }
        state
            .access
            .identify(&parts.headers)
            .await
            .map(SignedIn)
            .ok_or_else(|| Failure::new(StatusCode::UNAUTHORIZED, "sign in first"))
    }
}

impl SignedIn {
    pub(crate) async fn may(&self, state: &ApiState, verb: Verb, namespace: &str) -> ApiResult<()> {
        if state.access.may(&self.0, verb, Some(namespace)).await {
            Ok(())
        } else {
            Err(self.refused(verb, namespace))
        }
    }

    fn refused(&self, verb: Verb, namespace: &str) -> Failure {
        Failure::new(
            StatusCode::FORBIDDEN,
            format!(
                "{} may not {} notebooks in namespace {namespace}",
                self.0.name,
                verb.as_str()
            ),
        )
    }

    /// Notebook `namespace/name`, if the user may do `action` to it: by their role in its
    /// namespace, or because it is shared with them. Who may not learns nothing of whether it
    /// exists.
    pub(crate) async fn notebook(
        &self,
        state: &ApiState,
        action: Action,
        namespace: &str,
        name: &str,
    ) -> ApiResult<Notebook> {
        let verb = match action {
            Action::View => Verb::Get,
            // Opening runs code as the owner: asked as a change (a viewer does not open).
            Action::Open | Action::Change | Action::Manage => Verb::Update,
        };
        if state.access.may(&self.0, verb, Some(namespace)).await {
            return find(state, namespace, name).await;
        }
        match state.backend.get(namespace, name).await? {
            Some(notebook) if state.access.may_on(&self.0, action, &notebook).await => Ok(notebook),
            _ => Err(self.refused(verb, namespace)),
        }
    }

    /// Admins only: whoever may list notebooks in every namespace.
    pub(crate) async fn must_be_admin(&self, state: &ApiState) -> ApiResult<()> {
        if state.access.may(&self.0, Verb::List, None).await {
            Ok(())
        } else {
            Err(Failure::new(StatusCode::FORBIDDEN, "admins only"))
        }
    }
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/api/healthz", get(healthz))
        .route("/api/openapi.json", get(openapi))
        .route("/api/login", post(login))
        .route("/api/logout", post(logout))
        .route("/api/whoami", get(whoami))
        .route("/api/config", get(config))
        .route("/api/admin/notebooks", get(admin_notebooks))
        .route("/api/admin/quotas", get(admin_quotas))
        .route("/api/admin/audit", get(admin_audit))
        .route(
            "/api/namespaces/{ns}/notebooks",
            get(list_notebooks).post(create_notebook),
        )
        .route("/api/namespaces/{ns}/watch", get(watch_namespace))
        .route(
            "/api/namespaces/{ns}/notebooks/{name}",
            get(get_notebook)
                .patch(patch_notebook)
                .delete(delete_notebook),
        )
        .route("/api/namespaces/{ns}/notebooks/{name}/events", get(events))
        .route("/api/namespaces/{ns}/notebooks/{name}/logs", get(logs))
        .route(
            "/api/namespaces/{ns}/notebooks/{name}/saves",
            post(start_save),
        )
        .route("/api/namespaces/{ns}/saves/{id}", get(follow_save))
        .route(
            "/api/namespaces/{ns}/images",
            get(saved_images).delete(delete_saved_image),
        )
        .route(
            "/api/namespaces/{ns}/images/sharing",
            axum::routing::put(share_saved_image),
        )
        .route("/api/namespaces/{ns}/volumes", get(list_volumes))
        .route("/api/namespaces/{ns}/quota", get(get_quota).put(put_quota))
        .route(
            "/api/namespaces/{ns}/volumes/{name}",
            axum::routing::delete(delete_volume),
        )
        .merge(crate::kubeflow_api::routes())
        .merge(crate::team_api::routes())
        .merge(crate::token_api::routes())
        .merge(crate::ssh_api::routes())
        .merge(crate::ports::routes())
        .route(
            "/api/{*rest}",
            axum::routing::any(|| async {
                Failure::new(StatusCode::NOT_FOUND, "no such API path")
            }),
        )
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

#[utoipa::path(
    get, path = "/api/healthz", summary = "Health",
    responses((status = 200, description = "serving", body = String, content_type = "text/plain"))
)]
async fn healthz() -> &'static str {
    "ok"
}

#[utoipa::path(
    get, path = "/api/openapi.json", summary = "This document",
    responses((status = 200, description = "this document", body = Object))
)]
async fn openapi() -> impl IntoResponse {
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
async fn login(
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
fn set_session_cookie(
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
async fn logout(State(state): State<ApiState>, headers: HeaderMap) -> Response {
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

fn sign_in_failure(error: SignInError) -> Response {
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

fn whoami_body(user: &User) -> serde_json::Value {
    serde_json::json!({ "name": user.name, "namespace": user.namespace, "admin": user.admin })
}

#[utoipa::path(
    get, path = "/api/whoami", summary = "The signed-in user",
    responses((status = 200, description = "the user", body = crate::openapi::Whoami), crate::openapi::SignedInErrors)
)]
async fn whoami(user: SignedIn) -> Json<serde_json::Value> {
    Json(whoami_body(&user.0))
}

/// The spawner's configuration, plus the images the user saved (choices for them only).
#[utoipa::path(
    get, path = "/api/config",
    summary = "Spawner configuration: image catalog, the user's saved images, GPU vendors available here, defaults and bounds (incl. autoSave, keepSavedImages); Kubeflow's spawnerFormDefaults as `config`",
    responses((status = 200, description = "configuration", body = inline(crate::openapi::ConfigAnswer)), crate::openapi::SignedInErrors)
)]
async fn config(
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

/// Why a starting notebook is not ready when nothing more is known yet.
pub const WAITING_TO_START: &str = "waiting for the notebook server to start";

/// Where the notebook is, as users see it, and why when that needs saying.
pub fn state_of(notebook: &Notebook) -> (NotebookState, String) {
    let status = notebook.status.as_ref();
    let waiting = status.and_then(|s| s.container_state.waiting.as_ref());
    if notebook.is_stopped() {
        if status.is_some_and(|s| s.container_state.running.is_some()) {
            (NotebookState::Stopping, String::new())
        } else if notebook.annotation(STOPPED_BY_ANNOTATION) == Some("culler") {
            (NotebookState::Culled, "stopped after being idle".to_owned())
        } else {
            (NotebookState::Stopped, String::new())
        }
    } else if status.is_some_and(|s| s.ready_replicas > 0) {
        (NotebookState::Ready, String::new())
    } else if let Some(waiting) = waiting
        && matches!(
            waiting.reason.as_deref(),
            Some("ErrImagePull" | "FailedCreate" | "InvalidSpec" | "Unschedulable")
        )
    {
        (
            NotebookState::Error,
            waiting.message.clone().unwrap_or_default(),
        )
    } else {
        // Why it is not ready yet: the container's waiting reason, or what its server answered.
        let not_ready = status
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .and_then(|c| c.message.clone());
        // Before the runtime or controller has said anything (just made, or started), as
        // Kubeflow's web app says it: a starting notebook always has a reason.
        (
            NotebookState::Starting,
            waiting
                .and_then(|w| w.message.clone())
                .or(not_ready)
                .filter(|reason| !reason.is_empty())
                .unwrap_or_else(|| WAITING_TO_START.to_owned()),
        )
    }
}

/// The devices in `limits`: extended resources (`vendor/name`), each named by the spawner's
/// vendor name where it has one.
fn gpu_view(
    limits: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    vendors: &[crate::config::GpuVendor],
) -> GpuView {
    let mut view = GpuView::default();
    let mut parts = Vec::new();
    for (key, count) in limits.into_iter().flatten() {
        let Some(count) = count.0.parse::<u32>().ok().filter(|_| key.contains('/')) else {
            continue;
        };
        let name = vendors
            .iter()
            .find(|v| v.limits_key == *key)
            .map_or(key.as_str(), |v| v.name.as_str());
        if view.vendor.is_empty() {
            view.vendor = key.clone();
        }
        view.count += count;
        parts.push(format!("{count} {name}"));
    }
    view.message = parts.join(", ");
    view
}

/// The whole address a browser opens notebook `ns/name` at, as this request reached the web
/// app: its scheme (the auth proxy's `X-Forwarded-Proto`, else TLS or not) and port, on the
/// notebook's own host or the app's.
fn address_of(state: &ApiState, headers: &HeaderMap, ns: &str, name: &str) -> Option<String> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .filter(|p| matches!(*p, "http" | "https"))
        .unwrap_or(if state.secure_cookies {
            "https"
        } else {
            "http"
        });
    let path = format!("{}/", route_prefix(ns, name));
    Some(match &state.notebook_links {
        Some(links) => format!("{scheme}:{}{path}", links.origin(ns, name, Some(host))),
        None => format!("{scheme}://{host}{path}"),
    })
}

/// [`view`] with the address the request's client opens it at.
fn view_for(notebook: &Notebook, api: &ApiState, headers: &HeaderMap) -> NotebookView {
    let mut seen = view(notebook, api);
    seen.address = address_of(api, headers, &seen.namespace, &seen.name);
    seen
}

/// The notebook as users see it.
pub fn view(notebook: &Notebook, api: &ApiState) -> NotebookView {
    let activity = &api.activity;
    let namespace = notebook.metadata.namespace.clone().unwrap_or_default();
    let name = notebook.metadata.name.clone().unwrap_or_default();
    let container = notebook.container();
    let resources = container.and_then(|c| c.resources.as_ref());
    let quantity = |limits: bool, key: &str| {
        resources
            .and_then(|r| {
                if limits {
                    r.limits.as_ref()
                } else {
                    r.requests.as_ref()
                }
            })
            .and_then(|m| m.get(key))
            .map(|q| q.0.clone())
            .unwrap_or_default()
    };
    let gpus = gpu_view(
        resources.and_then(|r| r.limits.as_ref()),
        &api.config.gpu_vendors,
    );
    let (state, reason) = state_of(notebook);
    let stored_activity = notebook
        .annotation(LAST_ACTIVITY_ANNOTATION)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let seen = activity.get(&activity_key(&namespace, &name));
    let last_activity = stored_activity.max(seen).map(|t| t.to_string());
    NotebookView {
        owner: notebook
            .annotation(CREATOR_ANNOTATION)
            .unwrap_or_default()
            .to_owned(),
        server_type: ServerType::from_annotation(notebook.annotation(SERVER_TYPE_ANNOTATION)),
        image: container.and_then(|c| c.image.clone()).unwrap_or_default(),
        cpu: quantity(false, "cpu"),
        cpu_limit: quantity(true, "cpu"),
        memory: quantity(false, "memory"),
        memory_limit: quantity(true, "memory"),
        gpus,
        state,
        reason,
        last_activity,
        created: notebook
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string()),
        url: format!("{}/", route_prefix(&namespace, &name)),
        host: api
            .notebook_links
            .as_ref()
            .map(|links| labforge_crds::host::notebook_host(&namespace, &name, &links.domain)),
        address: None,
        auto_save: notebook.annotation(AUTO_SAVE_ANNOTATION) == Some("true"),
        shared_with: notebook
            .shared_with()
            .into_iter()
            .map(String::from)
            .collect(),
        resource_version: notebook
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default(),
        // Only a ready notebook's: a sample taken before a stop or restart is not shown after it.
        usage: api
            .usage
            .as_ref()
            .filter(|_| state == NotebookState::Ready)
            .and_then(|board| board.get(&namespace, &name))
            .map(|usage| {
                let limit = labforge_crds::quantity::value(&quantity(true, "memory"))
                    .ok()
                    .filter(|bytes| *bytes > 0.0);
                usage.within(limit.map(|bytes| bytes as u64))
            }),
        name,
        namespace,
    }
}

#[utoipa::path(
    get, path = "/api/namespaces/{ns}/notebooks", summary = "Notebooks of a namespace", params(("ns" = String, Path)),
    responses((status = 200, description = "the namespace's notebooks", body = inline(crate::openapi::NotebooksAnswer)), crate::openapi::PlatformErrors)
)]
async fn list_notebooks(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<serde_json::Value>> {
    user.may(&state, Verb::List, &ns).await?;
    let notebooks: Vec<serde_json::Value> = state
        .backend
        .list(Some(&ns))
        .await?
        .iter()
        .map(|nb| crate::kubeflow::list_item(nb, &view_for(nb, &state, &headers)))
        .collect();
    Ok(Json(kubeflow::envelope(
        &user.0,
        StatusCode::OK,
        serde_json::json!({ "notebooks": notebooks }),
    )))
}

#[utoipa::path(
    post, path = "/api/namespaces/{ns}/notebooks",
    summary = "Create a notebook, from labforge's request or Kubeflow's spawner form", params(("ns" = String, Path)),
    request_body = inline(crate::openapi::CreateBody),
    responses(
        (status = 201, description = "created", body = inline(crate::openapi::CreatedAnswer)),
        (status = 400, description = "not JSON", body = crate::openapi::ApiErrorBody),
        (status = 401, description = "not signed in", body = crate::openapi::ApiErrorBody),
        (status = 403, description = "not allowed in this namespace", body = crate::openapi::ApiErrorBody),
        (status = 409, description = "the name is taken", body = crate::openapi::ApiErrorBody),
        (status = 413, description = "body too large", body = crate::openapi::ApiErrorBody),
        (status = 415, description = "not application/json", body = crate::openapi::ApiErrorBody),
        (status = 422, description = "a field is invalid or unknown (named in `field`); nothing was created", body = crate::openapi::ApiErrorBody),
        (status = 503, response = crate::openapi::Unavailable),
    )
)]
async fn create_notebook(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
    headers: HeaderMap,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<serde_json::Value>)> {
    user.may(&state, Verb::Create, &ns).await?;
    let Json(body) = body?;
    let unreadable =
        |e: serde_json::Error| Failure::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string());
    // Kubeflow's form, read into labforge's request; what that has no field for comes after.
    let (request, extras) = if kubeflow::is_kubeflow_form(&body) {
        let form: kubeflow::KubeflowForm = serde_json::from_value(body).map_err(unreadable)?;
        kubeflow::request_from_form(form, &ns, &state.config)
            .map_err(|errors| Failure::fields(StatusCode::UNPROCESSABLE_ENTITY, &errors))?
    } else {
        let request: NotebookRequest = serde_json::from_value(body).map_err(unreadable)?;
        let extras = kubeflow::own_request_extras(&request, &state.config)
            .map_err(|errors| Failure::fields(StatusCode::UNPROCESSABLE_ENTITY, &errors))?;
        (request, extras)
    };
    let runnable = state.runnable_images(&ns).await?;
    let saved = &runnable.images;
    let mut request = request;
    if !request.image.trim().is_empty() {
        request.image = state.qualified_image(request.image.trim(), &runnable);
    }
    let named = request.image.as_str();
    let foreign = if named.is_empty() {
        None
    } else {
        state
            .foreign_image_refusal(&user.0, &ns, named, &runnable)
            .await?
    };
    let built = notebook_from_request(&request, &ns, &user.0.name, &state.config, saved);
    let mut errors = built.as_ref().err().cloned().unwrap_or_default();
    if let Some(foreign) = foreign {
        // First, and alone for the field: nothing else about another namespace's image is told.
        errors.replace(foreign);
    } else if !named.is_empty()
        && !errors.as_slice().iter().any(|e| e.field == "image")
        && let Some(refused) = state.image_refusal(named, saved).await
    {
        errors.push(refused);
    }
    // An existing workspace, or a data volume without a size, is one of this namespace's
    // volumes: named, not guessed.
    let existing = match &request.workspace {
        Some(WorkspaceRequest::Existing { name, .. }) => Some(("workspace.name".to_owned(), name)),
        _ => None,
    }
    .into_iter()
    .chain(
        request
            .data_volumes
            .iter()
            .enumerate()
            .filter(|(_, volume)| volume.size.trim().is_empty())
            .map(|(i, volume)| (format!("dataVolumes[{i}].name"), &volume.name)),
    );
    let mut own: Option<Vec<String>> = None;
    for (field, name) in existing {
        let own = match &mut own {
            Some(own) => own,
            None => own.insert(claims(&state, &ns).await?),
        };
        if !own.contains(name) {
            errors.push(FieldError::new(
                field,
                format!(
                    "namespace {ns} has no volume {name:?} (its volumes: {})",
                    if own.is_empty() {
                        "none".to_owned()
                    } else {
                        own.join(", ")
                    }
                ),
            ));
        }
    }
    let mut notebook = match built {
        Ok(notebook) if errors.is_empty() => notebook,
        _ => return Err(Failure::fields(StatusCode::UNPROCESSABLE_ENTITY, &errors)),
    };
    kubeflow::apply_extras(&mut notebook, extras);
    admitted_by_quota(&state, &ns, &notebook, QuotaAsk::Create).await?;
    let created = state.backend.create(notebook).await?;
    state
        .backend
        .record_event(
            &ns,
            &request.name,
            "Normal",
            "Created",
            &format!("created by {}", user.0.name),
        )
        .await;
    let mut answer = serde_json::to_value(view_for(&created, &state, &headers)).unwrap_or_default();
    answer["message"] = "Notebook created successfully.".into();
    Ok((
        StatusCode::CREATED,
        Json(kubeflow::envelope(&user.0, StatusCode::CREATED, answer)),
    ))
}

/// What a change to a notebook asks of its namespace's quota.
#[derive(Clone, Copy, PartialEq, Eq)]
enum QuotaAsk {
    /// A new notebook: its new volumes, and what it holds if it is to run.
    Create,
    /// A start, or a resize of a notebook that runs: what it holds while it runs.
    Run,
}

/// Whether `notebook` (as it is to be) fits in namespace `ns`'s quota beside the rest of the
/// namespace: the one check every create, start and resize goes through. A refusal is a 403, as
/// Kubernetes refuses a pod over its namespace's ResourceQuota, naming the quota, what is in use
/// and what was asked.
async fn admitted_by_quota(
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
    get, path = "/api/namespaces/{ns}/quota", summary = "The namespace's quota (null: none) and what its running notebooks hold", params(("ns" = String, Path)),
    responses((status = 200, description = "quota and use", body = inline(crate::openapi::QuotaAnswer)), crate::openapi::PlatformErrors)
)]
async fn get_quota(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    user.may(&state, Verb::List, &ns).await?;
    let notebooks = state.backend.list(Some(&ns)).await?;
    Ok(Json(quota_and_use(&state, &ns, &notebooks).await?))
}

/// Namespace `ns`'s quota and what it holds (its `notebooks` and volumes), as `GET …/quota`
/// answers.
async fn quota_and_use(
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
async fn admin_quotas(
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
    put, path = "/api/namespaces/{ns}/quota", summary = "Set the namespace's quota: cpu, memory (quantities), gpus, notebooks running at once; null removes it (admins only)", params(("ns" = String, Path)),
    request_body = Option<crate::quota::Quota>,
    responses(
        (status = 200, description = "the quota set", body = inline(crate::openapi::QuotaAnswer)),
        (status = 422, description = "a field that is not a quantity, or a namespace that is not a name", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
async fn put_quota(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
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
    get_quota(user, State(state), Path(ns)).await
}

pub(crate) async fn find(state: &ApiState, ns: &str, name: &str) -> ApiResult<Notebook> {
    state.backend.get(ns, name).await?.ok_or_else(|| {
        Failure::new(
            StatusCode::NOT_FOUND,
            format!("notebook {ns}/{name} not found"),
        )
    })
}

#[utoipa::path(
    get, path = "/api/namespaces/{ns}/notebooks/{name}",
    summary = "A notebook: the object itself, its Kubeflow status and labforge's view", params(("ns" = String, Path), ("name" = String, Path)),
    responses(
        (status = 200, description = "the notebook", body = inline(crate::openapi::NotebookAnswer)),
        (status = 404, description = "no such notebook", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
async fn get_notebook(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<serde_json::Value>> {
    let notebook = user.notebook(&state, Action::View, &ns, &name).await?;
    // Kubeflow's client reads the object itself and its `processed_status`; labforge's view of
    // it is beside them, under names the object does not use.
    let view = view_for(&notebook, &state, &headers);
    let mut answer = serde_json::to_value(&notebook).unwrap_or_default();
    if let (Some(fields), serde_json::Value::Object(view_fields)) = (
        answer.as_object_mut(),
        serde_json::to_value(&view).unwrap_or_default(),
    ) {
        fields.extend(view_fields);
        fields.insert(
            "processed_status".into(),
            kubeflow::processed_status(&notebook, &view),
        );
    }
    Ok(Json(kubeflow::envelope(
        &user.0,
        StatusCode::OK,
        serde_json::json!({ "notebook": answer }),
    )))
}

#[utoipa::path(
    patch, path = "/api/namespaces/{ns}/notebooks/{name}",
    summary = "Stop, start, or move to another image", params(("ns" = String, Path), ("name" = String, Path)), request_body = NotebookPatch,
    responses(
        (status = 200, description = "changed", body = inline(crate::openapi::PatchedAnswer)),
        (status = 404, description = "no such notebook", body = crate::openapi::ApiErrorBody),
        (status = 415, response = crate::openapi::UnsupportedMediaType),
        (status = 422, description = "invalid image", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
async fn patch_notebook(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
    body: Result<Json<NotebookPatch>, JsonRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    user.may(&state, Verb::Update, &ns).await?;
    let Json(mut patch) = body?;
    let current = find(&state, &ns, &name).await?;
    let resources = if patch.resizes() {
        Some(
            crate::validate::resized(&current, &patch, &state.config)
                .map_err(|errors| Failure::fields(StatusCode::UNPROCESSABLE_ENTITY, &errors))?,
        )
    } else {
        None
    };
    let starts = patch.stopped == Some(false) && current.is_stopped();
    let runs = starts || (!current.is_stopped() && patch.stopped != Some(true));
    if runs && (starts || resources.is_some()) {
        let mut to_be = current.clone();
        if let (Some(resources), Some(container)) = (&resources, to_be.container_mut()) {
            container.resources = Some(resources.clone());
        }
        admitted_by_quota(&state, &ns, &to_be, QuotaAsk::Run).await?;
    }
    if let Some(image) = &mut patch.image {
        image_reference("image", image)
            .map_err(|e| Failure::field(StatusCode::UNPROCESSABLE_ENTITY, e))?;
        let runnable = state.runnable_images(&ns).await?;
        *image = state.qualified_image(image, &runnable);
        let image = &*image;
        if let Some(foreign) = state
            .foreign_image_refusal(&user.0, &ns, image, &runnable)
            .await?
        {
            return Err(Failure::field(StatusCode::UNPROCESSABLE_ENTITY, foreign));
        }
        let saved = runnable.images;
        if !state.config.allow_custom_images
            && !state.config.in_catalog(image)
            && !saved.contains(image)
        {
            return Err(Failure::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                FieldError::new(
                    "image",
                    format!("{image} is neither in the catalog nor saved in {ns}"),
                ),
            ));
        }
        if let Some(refused) = state.image_refusal(image, &saved).await {
            return Err(Failure::field(StatusCode::UNPROCESSABLE_ENTITY, refused));
        }
    }
    let now = jiff::Timestamp::now().to_string();
    let updated = state
        .backend
        .update(&ns, &name, &|nb| {
            if let Some(image) = &patch.image
                && let Some(container) = nb.container_mut()
            {
                container.image = Some(image.clone());
            }
            if let (Some(resources), Some(container)) = (&resources, nb.container_mut()) {
                container.resources = Some(resources.clone());
            }
            let annotations = nb.metadata.annotations.get_or_insert_with(Default::default);
            if let Some(auto_save) = patch.auto_save {
                annotations.insert(AUTO_SAVE_ANNOTATION.to_owned(), auto_save.to_string());
            }
            match patch.stopped {
                // The last activity stays for the lists to show; a start renews it, so that the
                // culler gives the new run its whole idle time.
                Some(true) if !annotations.contains_key(STOP_ANNOTATION) => {
                    annotations.insert(STOP_ANNOTATION.to_owned(), now.clone());
                }
                Some(false) => {
                    // What the status said belongs to the last run: "ready" only once this one answers.
                    if annotations.remove(STOP_ANNOTATION).is_some() {
                        nb.status = None;
                        annotations.insert(LAST_ACTIVITY_ANNOTATION.to_owned(), now.clone());
                    }
                    annotations.remove(STOPPED_BY_ANNOTATION);
                }
                _ => {}
            }
        })
        .await?;
    let change = match (patch.stopped, &patch.image) {
        (Some(true), _) => Some(("Stopping", "stopped".to_owned())),
        (Some(false), Some(image)) => Some(("Starting", format!("started on {image}"))),
        (Some(false), None) => Some(("Starting", "started".to_owned())),
        // A running notebook moved onto another image restarts on it; a stopped one starts on
        // it next time.
        (None, Some(image)) if updated.is_stopped() => {
            Some(("ImageChanged", format!("set to start on {image}")))
        }
        (None, Some(image)) => Some(("Restarting", format!("restarting on {image}"))),
        (None, None) => None,
    };
    let resize = resources.as_ref().map(|resources| {
        let of = |key: &str| {
            resources
                .limits
                .as_ref()
                .and_then(|limits| limits.get(key))
                .map(|q| q.0.as_str())
                .unwrap_or("?")
                .to_owned()
        };
        (
            "Resized",
            format!("resized to {} CPU, {} memory", of("cpu"), of("memory")),
        )
    });
    for (reason, done) in change.into_iter().chain(resize) {
        state
            .backend
            .record_event(
                &ns,
                &name,
                "Normal",
                reason,
                &format!("{done} by {}", user.0.name),
            )
            .await;
    }
    Ok(Json(kubeflow::envelope(
        &user.0,
        StatusCode::OK,
        serde_json::to_value(view(&updated, &state)).unwrap_or_default(),
    )))
}

#[utoipa::path(
    delete, path = "/api/namespaces/{ns}/notebooks/{name}",
    summary = "Delete a notebook (its workspace volume is kept)", params(("ns" = String, Path), ("name" = String, Path)),
    responses(
        (status = 200, description = "deleted", body = inline(crate::openapi::DeletedAnswer)),
        (status = 404, description = "no such notebook", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
async fn delete_notebook(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    user.may(&state, Verb::Delete, &ns).await?;
    state.backend.delete(&ns, &name).await?;
    Ok(Json(kubeflow::envelope(
        &user.0,
        StatusCode::OK,
        serde_json::json!({ "message": format!("Notebook {name} successfully deleted.") }),
    )))
}

#[utoipa::path(
    get, path = "/api/namespaces/{ns}/notebooks/{name}/events", summary = "Events of a notebook", params(("ns" = String, Path), ("name" = String, Path)),
    responses(
        (status = 200, description = "the newest events", body = inline(crate::openapi::EventsAnswer)),
        (status = 404, description = "no such notebook", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
async fn events(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    user.notebook(&state, Action::View, &ns, &name).await?;
    let events: Vec<serde_json::Value> = state
        .backend
        .events(&ns, &name)
        .await?
        .iter()
        .map(|event| kubeflow::event_item(event, &ns, &name))
        .collect();
    Ok(Json(kubeflow::envelope(
        &user.0,
        StatusCode::OK,
        serde_json::json!({ "events": events }),
    )))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct LogQuery {
    #[serde(default)]
    follow: bool,
    #[serde(default = "default_tail")]
    #[param(default = 500)]
    tail: u32,
}

fn default_tail() -> u32 {
    500
}

#[utoipa::path(
    get, path = "/api/namespaces/{ns}/notebooks/{name}/logs", summary = "Container logs", params(("ns" = String, Path), ("name" = String, Path), LogQuery),
    responses(
        (status = 200, description = "log text, streamed while following", body = String, content_type = "text/plain"),
        (status = 404, description = "no such notebook", body = crate::openapi::ApiErrorBody),
        (status = 409, description = "the notebook is stopped", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
async fn logs(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<LogQuery>,
) -> ApiResult<Response> {
    let notebook = user.notebook(&state, Action::View, &ns, &name).await?;
    if notebook.is_stopped() {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            format!("notebook {ns}/{name} is stopped: it has no logs"),
        ));
    }
    let tail = query.tail.min(10_000);
    let stream = state
        .workloads
        .logs(&ns, &name, query.follow, tail)
        .await
        .map_err(|e| match e {
            // No pod yet, or its container not started: a state that passes.
            WorkloadError::NotFound(message) => {
                Failure::new(StatusCode::CONFLICT, format!("no logs yet: {message}"))
            }
            other => other.into(),
        })?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(stream),
    )
        .into_response())
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SaveRequest {
    /// Default saved-<date>-<time>.
    #[serde(default)]
    #[schema(nullable = false)]
    tag: Option<String>,
}

#[utoipa::path(
    post, path = "/api/namespaces/{ns}/notebooks/{name}/saves",
    summary = "Save the environment as an image (one new layer on the image it runs)", params(("ns" = String, Path), ("name" = String, Path)), request_body = SaveRequest,
    responses(
        (status = 202, description = "started; follow it at /api/namespaces/{ns}/saves/{id}", body = crate::saves::SaveStatus),
        (status = 404, description = "no such notebook", body = crate::openapi::ApiErrorBody),
        (status = 409, description = "not running, or a save is under way", body = crate::openapi::ApiErrorBody),
        (status = 415, response = crate::openapi::UnsupportedMediaType),
        (status = 422, description = "invalid tag", body = crate::openapi::ApiErrorBody),
        (status = 501, description = "saving is not set up (labforge web without --save-registry)", body = crate::openapi::ApiErrorBody),
        (status = 502, description = "the Kubernetes API could not be asked (cluster mode)", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
async fn start_save(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
    body: Result<Json<SaveRequest>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<crate::saves::SaveStatus>)> {
    user.may(&state, Verb::Update, &ns).await?;
    let Json(request) = body?;
    find(&state, &ns, &name).await?;
    let Some(saves) = &state.saves else {
        return Err(Failure::new(
            StatusCode::NOT_IMPLEMENTED,
            "saving environments is not set up here: `labforge web` needs --save-registry",
        ));
    };
    let status = saves
        .start(&ns, &name, request.tag.as_deref())
        .await
        .map_err(|e| match e {
            StartSaveError::BadTag(_) => Failure::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                FieldError::new("tag", e.to_string()),
            ),
            StartSaveError::NotRunning(_) | StartSaveError::Busy(_) => {
                Failure::new(StatusCode::CONFLICT, e.to_string())
            }
            StartSaveError::Unavailable(_) => Failure::new(StatusCode::BAD_GATEWAY, e.to_string()),
        })?;
    state
        .backend
        .record_event(
            &ns,
            &name,
            "Normal",
            "Saving",
            &format!("saving the environment as {}", status.target),
        )
        .await;
    Ok((StatusCode::ACCEPTED, Json(status)))
}

/// Server-sent events of a save's progress, ending with its last state.
#[utoipa::path(
    get, path = "/api/namespaces/{ns}/saves/{id}",
    summary = "Server-sent events: `progress` with a SaveStatus until done or failed", params(("ns" = String, Path), ("id" = String, Path)),
    responses(
        (status = 200, description = "event stream", body = inline(crate::openapi::ProgressEvent), content_type = "text/event-stream"),
        (status = 404, description = "no such save", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
async fn follow_save(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, id)): Path<(String, String)>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    user.may(&state, Verb::Get, &ns).await?;
    let receiver = match &state.saves {
        Some(saves) => saves.follow(&ns, &id).await,
        None => None,
    }
    .ok_or_else(|| Failure::new(StatusCode::NOT_FOUND, format!("no save {id} in {ns}")))?;
    // Each state goes out as soon as it is known; only the wait for the next one is paced.
    let stream = futures::stream::unfold(Some((receiver, true)), |state| async move {
        let (mut receiver, first) = state?;
        if !first {
            // Progress comes fast; a browser needs a few updates a second at most.
            tokio::time::sleep(Duration::from_millis(200)).await;
            receiver.changed().await.ok()?;
        }
        let status = receiver.borrow_and_update().clone();
        let event = Event::default().event("progress").json_data(&status).ok()?;
        let next = (!status.finished()).then_some((receiver, false));
        Some((Ok(event), next))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// The volume claims of namespace `ns`: what "existing workspace" and data volumes may name.
pub(crate) async fn claims(state: &ApiState, ns: &str) -> ApiResult<Vec<String>> {
    let claims = state.workloads.claims(ns).await?;
    Ok(claims.into_iter().map(|claim| claim.name).collect())
}

/// The names of those of `notebooks` that mount claim `claim`.
fn notebooks_using(notebooks: &[Notebook], claim: &str) -> Vec<String> {
    notebooks
        .iter()
        .filter(|notebook| notebook.claim_names().any(|mounted| mounted == claim))
        .filter_map(|notebook| notebook.metadata.name.clone())
        .collect()
}

#[utoipa::path(
    get, path = "/api/namespaces/{ns}/volumes", summary = "Volume claims of a namespace: what an existing workspace may name", params(("ns" = String, Path)),
    responses((status = 200, description = "the namespace's volume claims, sorted by name", body = inline(crate::openapi::VolumesAnswer)), crate::openapi::PlatformErrors)
)]
async fn list_volumes(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    user.may(&state, Verb::List, &ns).await?;
    // The namespace's notebooks are listed once, not once per volume.
    let notebooks = state.backend.list(Some(&ns)).await?;
    let mut volumes = Vec::new();
    for name in claims(&state, &ns).await? {
        let used_by = notebooks_using(&notebooks, &name);
        volumes.push(serde_json::json!({ "name": name, "usedBy": used_by }));
    }
    Ok(Json(serde_json::json!({ "volumes": volumes })))
}

/// Deletes a volume (a workspace a deleted notebook kept, say) and its files; refused while a
/// notebook mounts it.
#[utoipa::path(
    delete, path = "/api/namespaces/{ns}/volumes/{name}",
    summary = "Delete a volume and its files (never one a notebook mounts)", params(("ns" = String, Path), ("name" = String, Path)),
    responses(
        (status = 204, description = "deleted"),
        (status = 404, description = "no such volume", body = crate::openapi::ApiErrorBody),
        (status = 409, description = "a notebook mounts it, or a container still uses it", body = crate::openapi::ApiErrorBody),
        (status = 501, description = "in a cluster: claims are deleted with kubectl", body = crate::openapi::ApiErrorBody),
        (status = 503, description = "the engine or cluster could not delete it", body = crate::openapi::ApiErrorBody),
        crate::openapi::SignedInErrors,
    )
)]
async fn delete_volume(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    user.may(&state, Verb::Delete, &ns).await?;
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

/// Most namespaces one saved image may be shared with.
const MAX_SHARED_WITH: usize = 100;

/// Shares one of the namespace's saved images with exactly the namespaces named: their
/// notebooks may then run it. Only the namespace's owners (and admins) may.
#[utoipa::path(
    put, path = "/api/namespaces/{ns}/images/sharing",
    summary = "Share a saved image with exactly the namespaces named (none: with no one)", params(("ns" = String, Path)),
    request_body = crate::model::ImageSharing,
    responses(
        (status = 200, description = "the saved image, with whom it is shared now", body = crate::model::SavedImage),
        (status = 404, description = "no such saved image in this namespace", body = crate::openapi::ApiErrorBody),
        (status = 415, response = crate::openapi::UnsupportedMediaType),
        (status = 422, description = "a namespace named is not a namespace name, or is this one", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
async fn share_saved_image(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
    body: Result<Json<crate::model::ImageSharing>, JsonRejection>,
) -> ApiResult<Json<crate::model::SavedImage>> {
    user.may(&state, Verb::Update, &ns).await?;
    let Json(sharing) = body?;
    let mut errors = FieldErrors::default();
    let mut with: Vec<String> = Vec::new();
    if sharing.shared_with.len() > MAX_SHARED_WITH {
        errors.push(FieldError::new(
            "sharedWith",
            format!("at most {MAX_SHARED_WITH} namespaces"),
        ));
    }
    for (i, namespace) in sharing.shared_with.iter().enumerate() {
        let field = format!("sharedWith[{i}]");
        if let Err(err) = crate::validate::dns_label(&field, namespace) {
            errors.push(err);
        } else if *namespace == ns {
            errors.push(FieldError::new(
                field,
                format!("{ns} is the image's own namespace"),
            ));
        } else if !with.contains(namespace) {
            with.push(namespace.clone());
        }
    }
    if !errors.is_empty() {
        return Err(Failure::fields(StatusCode::UNPROCESSABLE_ENTITY, &errors));
    }
    let shared = state
        .backend
        .share_saved_image(&ns, &sharing.image, &with)
        .await?
        .ok_or_else(|| {
            Failure::field(
                StatusCode::NOT_FOUND,
                FieldError::new(
                    "image",
                    format!("namespace {ns} has no saved image {}", sharing.image),
                ),
            )
        })?;
    tracing::info!(namespace = %ns, image = %shared.image, shared_with = ?shared.shared_with, by = %user.0.name, "saved image sharing changed");
    Ok(Json(shared))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ImageQuery {
    /// The saved image, registry/repository:tag.
    image: String,
}

/// Deletes a saved image from its registry (never one a notebook runs on) and forgets it.
#[utoipa::path(
    delete, path = "/api/namespaces/{ns}/images",
    summary = "Delete a saved image from its registry and forget it (never one a notebook runs on)", params(("ns" = String, Path), ImageQuery),
    responses(
        (status = 204, description = "deleted"),
        (status = 404, description = "no such saved image in this namespace", body = crate::openapi::ApiErrorBody),
        (status = 409, description = "a notebook runs on it", body = crate::openapi::ApiErrorBody),
        (status = 501, description = "not possible on this platform (a cluster's registry is its admin's)", body = crate::openapi::ApiErrorBody),
        (status = 502, description = "the registry refused or failed", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
async fn delete_saved_image(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
    ApiQuery(query): ApiQuery<ImageQuery>,
) -> ApiResult<StatusCode> {
    use crate::saves::DeleteImageError;
    user.may(&state, Verb::Delete, &ns).await?;
    let saves = state
        .saves
        .as_ref()
        .ok_or_else(|| Failure::new(StatusCode::NOT_FOUND, "saving is not set up here"))?;
    saves.delete_image(&ns, &query.image).await.map_err(|err| {
        let status = match &err {
            DeleteImageError::NotFound { .. } => StatusCode::NOT_FOUND,
            DeleteImageError::InUse { .. } => StatusCode::CONFLICT,
            DeleteImageError::Registry { .. } => StatusCode::BAD_GATEWAY,
            DeleteImageError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
        };
        Failure::new(status, err.to_string())
    })?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    get, path = "/api/namespaces/{ns}/images", summary = "Images saved in a namespace, newest first", params(("ns" = String, Path)),
    responses((status = 200, description = "saved images", body = inline(crate::openapi::ImagesAnswer)), crate::openapi::PlatformErrors)
)]
async fn saved_images(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    user.may(&state, Verb::List, &ns).await?;
    Ok(Json(
        serde_json::json!({ "images": state.backend.saved_images(&ns).await? }),
    ))
}

/// Server-sent events: the namespace's notebooks whenever one of them changes.
#[utoipa::path(
    get, path = "/api/namespaces/{ns}/watch",
    summary = "Server-sent events: `notebooks` with the namespace's notebooks, now and on every change", params(("ns" = String, Path)),
    responses(
        (status = 200, description = "event stream", body = inline(crate::openapi::NotebooksEvent), content_type = "text/event-stream"),
        crate::openapi::PlatformErrors,
    )
)]
async fn watch_namespace(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    user.may(&state, Verb::List, &ns).await?;
    let changes = tokio_stream::wrappers::BroadcastStream::new(state.backend.changes());
    let first = notebooks_event(&state, &ns).await;
    let rest = changes.filter_map(move |change| {
        let state = state.clone();
        let ns = ns.clone();
        async move {
            match change {
                Ok(
                    Change::Notebook { namespace, .. }
                    | Change::Status { namespace, .. }
                    | Change::Usage { namespace },
                ) if namespace == ns => Some(Ok(notebooks_event(&state, &ns).await)),
                // Lagged behind: send the whole list again.
                Err(_) => Some(Ok(notebooks_event(&state, &ns).await)),
                Ok(_) => None,
            }
        }
    });
    Ok(
        Sse::new(futures::stream::once(async move { Ok(first) }).chain(rest))
            .keep_alive(KeepAlive::default()),
    )
}

/// A `notebooks` event with every notebook of `ns` (a comment event when they cannot be read).
async fn notebooks_event(state: &ApiState, ns: &str) -> Event {
    match state.backend.list(Some(ns)).await {
        Ok(list) => {
            let notebooks: Vec<NotebookView> = list.iter().map(|nb| view(nb, state)).collect();
            Event::default()
                .event("notebooks")
                .json_data(serde_json::json!({ "notebooks": notebooks }))
                .unwrap_or_default()
        }
        Err(err) => Event::default().comment(format!("listing notebooks: {err}")),
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct AdminQuery {
    #[serde(default)]
    #[param(nullable = false)]
    user: Option<String>,
    #[serde(default)]
    #[param(nullable = false)]
    namespace: Option<String>,
    #[serde(default)]
    #[param(nullable = false)]
    state: Option<NotebookState>,
    /// Only running notebooks that hold GPUs and saw no activity for the idle time.
    #[serde(default, rename = "idleHoldingGpus")]
    idle_holding_gpus: bool,
}

/// Running, holding GPUs, and no activity seen for `idle_after` (or ever).
fn idle_holding_gpus(view: &NotebookView, idle_after: std::time::Duration) -> bool {
    let holds = view.gpus.count > 0;
    let since = view
        .last_activity
        .as_deref()
        .or(view.created.as_deref())
        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let idle =
        since.is_none_or(|t| jiff::Timestamp::now().duration_since(t).unsigned_abs() >= idle_after);
    holds && view.state == NotebookState::Ready && idle
}

/// How many records one audit answer holds at most: the newest.
const AUDIT_ANSWER_LIMIT: usize = 1000;

/// The audit trail, newest last (admins only).
#[utoipa::path(
    get, path = "/api/admin/audit", summary = "The audit trail: every change and notebook sign-in, oldest first, the newest 1000 the filter keeps (admins only)", params(crate::audit::AuditFilter),
    responses(
        (status = 200, description = "the records", body = inline(crate::openapi::AuditAnswer)),
        (status = 400, description = "a filter that does not parse (since)", body = crate::openapi::ApiErrorBody),
        (status = 501, description = "the trail goes to the log here (a cluster)", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
async fn admin_audit(
    user: SignedIn,
    State(state): State<ApiState>,
    query: Result<Query<crate::audit::AuditFilter>, QueryRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    user.must_be_admin(&state).await?;
    let Query(filter) = query?;
    if let Err(problem) = filter.since() {
        return Err(Failure::new(StatusCode::BAD_REQUEST, problem));
    }
    let records = state
        .audit
        .read(&filter, AUDIT_ANSWER_LIMIT)
        .ok_or_else(|| {
            Failure::new(
                StatusCode::NOT_IMPLEMENTED,
                "the audit trail goes to the web app's log here, target \"audit\"",
            )
        })?;
    Ok(Json(serde_json::json!({ "records": records })))
}

/// Every user's notebooks in one answer (Kubeflow's web app asks namespace by namespace).
#[utoipa::path(
    get, path = "/api/admin/notebooks", summary = "Every user's notebooks (admins only)", params(AdminQuery),
    responses((status = 200, description = "notebooks and totals of running ones", body = inline(crate::openapi::AdminAnswer)), crate::openapi::PlatformErrors)
)]
async fn admin_notebooks(
    user: SignedIn,
    State(state): State<ApiState>,
    query: Result<Query<AdminQuery>, QueryRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    user.must_be_admin(&state).await?;
    let Query(query) = query?;
    let notebooks: Vec<NotebookView> = state
        .backend
        .list(query.namespace.as_deref())
        .await?
        .iter()
        .map(|nb| view(nb, &state))
        // Part of the owner's name, in any case: admins look people up by what they remember.
        .filter(|v| {
            query
                .user
                .as_ref()
                .is_none_or(|u| v.owner.to_lowercase().contains(&u.trim().to_lowercase()))
        })
        .filter(|v| query.state.is_none_or(|s| v.state == s))
        .filter(|v| !query.idle_holding_gpus || idle_holding_gpus(v, state.idle_after))
        .collect();
    let running: Vec<&NotebookView> = notebooks
        .iter()
        .filter(|v| matches!(v.state, NotebookState::Ready | NotebookState::Starting))
        .collect();
    let sum = |f: &dyn Fn(&NotebookView) -> String, field: &str| -> f64 {
        running
            .iter()
            .filter_map(|v| crate::validate::quantity(field, &f(v)).ok())
            .sum()
    };
    let totals = serde_json::json!({
        "notebooks": notebooks.len(),
        "running": running.len(),
        "cpu": sum(&|v| v.cpu_limit.clone(), "cpu"),
        "memoryBytes": sum(&|v| v.memory_limit.clone(), "memory"),
        "cpuRequested": sum(&|v| v.cpu.clone(), "cpu"),
        "memoryBytesRequested": sum(&|v| v.memory.clone(), "memory"),
        "gpus": running.iter().map(|v| u64::from(v.gpus.count)).sum::<u64>(),
        // Measured use, beside the limits above.
        "cpuUsed": running.iter().filter_map(|v| v.usage.as_ref()?.cpu_cores).sum::<f64>(),
        "memoryBytesUsed": running.iter().filter_map(|v| Some(v.usage.as_ref()?.memory_bytes)).sum::<u64>(),
    });
    Ok(Json(
        serde_json::json!({ "notebooks": notebooks, "totals": totals }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_starting_notebook_always_says_why() {
        let made = Notebook::new("lab", labforge_crds::notebook::NotebookSpec::default());
        assert_eq!(
            state_of(&made),
            (NotebookState::Starting, WAITING_TO_START.to_owned())
        );
    }

    fn notebook(state: &str, gpus: Option<&str>, last_activity: Option<&str>) -> NotebookView {
        serde_json::from_value(serde_json::json!({
            "name": "lab", "namespace": "alice", "owner": "alice", "serverType": "jupyter",
            "image": "lab:1", "cpu": "1", "cpuLimit": "1", "memory": "1Gi", "memoryLimit": "1Gi",
            "gpus": gpus.map_or(serde_json::json!({"count": 0, "message": "", "vendor": ""}),
                |count| serde_json::json!({"vendor": "nvidia.com/gpu", "count": count.parse::<u32>().unwrap(), "message": ""})),
            "state": state, "reason": "", "lastActivity": last_activity,
            "created": "2026-01-01T00:00:00Z", "url": "/notebook/alice/lab/",
            "resourceVersion": "1", "autoSave": false,
        }))
        .unwrap()
    }

    #[test]
    fn idle_and_holding_gpus_means_running_with_gpus_and_no_activity_for_the_idle_time() {
        let hour = Duration::from_secs(3600);
        let long_ago = "2026-01-01T00:00:00Z";
        let now = jiff::Timestamp::now().to_string();
        assert!(idle_holding_gpus(
            &notebook("ready", Some("1"), Some(long_ago)),
            hour
        ));
        // Never used: idle since it was made.
        assert!(idle_holding_gpus(&notebook("ready", Some("2"), None), hour));
        assert!(!idle_holding_gpus(
            &notebook("ready", Some("1"), Some(&now)),
            hour
        ));
        assert!(!idle_holding_gpus(
            &notebook("ready", None, Some(long_ago)),
            hour
        ));
        assert!(!idle_holding_gpus(
            &notebook("ready", Some("0"), Some(long_ago)),
            hour
        ));
        assert!(!idle_holding_gpus(
            &notebook("stopped", Some("1"), Some(long_ago)),
            hour
        ));
    }
}
