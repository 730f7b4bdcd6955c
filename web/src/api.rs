//! The JSON API (`/api/...`), documented in `openapi.json`. Paths follow Kubeflow's jupyter web
//! app where they fit (`/api/namespaces/<ns>/notebooks...`).
//!
//! Every route but login, health and the OpenAPI document needs a signed-in user; a namespace's
//! routes need its owner or an admin. Bad input is answered 4xx with an [`ApiError`] naming the
//! field, before anything is stored. Requests that change something must be JSON, which a
//! cross-site form cannot send: that and the SameSite session cookie keep other sites out.

use crate::config::SpawnerConfig;
use crate::model::{
    ApiError, GpuView, NotebookPatch, NotebookRequest, NotebookState, NotebookView,
    SERVER_TYPE_ANNOTATION, ServerType,
};
use crate::runtime::{Engine, container_name};
use crate::saves::{SaveJobs, StartSaveError};
use crate::store::{Change, Store, StoreError};
use crate::users::{LocalAuth, SESSION_COOKIE, User, session_token};
use crate::validate::{FieldError, image_reference, notebook_from_request};
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
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
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 64 * 1024;
/// Set on a notebook stopped by the culler, so users see "culled" rather than "stopped".
pub const STOPPED_BY_ANNOTATION: &str = "labforge.dev/stopped-by";

#[derive(Clone)]
pub struct ApiState {
    pub store: Arc<Store>,
    pub auth: Arc<LocalAuth>,
    pub saves: Arc<SaveJobs>,
    pub config: Arc<SpawnerConfig>,
    pub engine: Engine,
    pub activity: Arc<Activity>,
    /// Mark cookies `Secure` (served over TLS).
    pub secure_cookies: bool,
}

/// An error answer.
pub struct Failure(StatusCode, ApiError);

impl Failure {
    fn new(status: StatusCode, error: impl Into<String>) -> Self {
        Self(
            status,
            ApiError {
                error: error.into(),
                field: None,
            },
        )
    }
    fn field(status: StatusCode, error: FieldError) -> Self {
        Self(
            status,
            ApiError {
                error: error.to_string(),
                field: Some(error.field),
            },
        )
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(self.1)).into_response()
    }
}

impl From<JsonRejection> for Failure {
    fn from(rejection: JsonRejection) -> Self {
        Self::new(rejection.status(), rejection.body_text())
    }
}

impl From<StoreError> for Failure {
    fn from(err: StoreError) -> Self {
        match &err {
            StoreError::AlreadyExists { .. } => Self::field(
                StatusCode::CONFLICT,
                FieldError::new("name", err.to_string()),
            ),
            StoreError::NotFound { .. } => Self::new(StatusCode::NOT_FOUND, err.to_string()),
            _ => {
                tracing::error!(error = %err, "store");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the store failed; see the server log",
                )
            }
        }
    }
}

type ApiResult<T> = Result<T, Failure>;

/// The signed-in user of a request.
pub struct SignedIn(pub User);

impl FromRequestParts<ApiState> for SignedIn {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Failure> {
        state
            .auth
            .user_of(&parts.headers)
            .map(SignedIn)
            .ok_or_else(|| Failure::new(StatusCode::UNAUTHORIZED, "sign in first"))
    }
}

impl SignedIn {
    fn may_use(&self, namespace: &str) -> ApiResult<()> {
        if self.0.admin || self.0.namespace == namespace {
            Ok(())
        } else {
            Err(Failure::new(
                StatusCode::FORBIDDEN,
                format!("{} may not use namespace {namespace}", self.0.name),
            ))
        }
    }
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/api/healthz", get(|| async { "ok" }))
        .route("/api/openapi.json", get(openapi))
        .route("/api/login", post(login))
        .route("/api/logout", post(logout))
        .route("/api/whoami", get(whoami))
        .route("/api/config", get(config))
        .route("/api/admin/notebooks", get(admin_notebooks))
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
        .route("/api/namespaces/{ns}/images", get(saved_images))
        .route(
            "/api/{*rest}",
            axum::routing::any(|| async {
                Failure::new(StatusCode::NOT_FOUND, "no such API path")
            }),
        )
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("../openapi.json"),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Login {
    username: String,
    password: String,
}

async fn login(
    State(state): State<ApiState>,
    body: Result<Json<Login>, JsonRejection>,
) -> ApiResult<Response> {
    let Json(login) = body?;
    // Checked off the async threads: argon2 is slow on purpose.
    let auth = state.auth.clone();
    let user =
        tokio::task::spawn_blocking(move || auth.users.verify(&login.username, &login.password))
            .await
            .ok()
            .flatten()
            .ok_or_else(|| Failure::new(StatusCode::UNAUTHORIZED, "wrong user name or password"))?;
    let token = state
        .auth
        .sessions
        .start(&user.name)
        .map_err(|e| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let secure = if state.secure_cookies { "; Secure" } else { "" };
    let cookie = format!("{SESSION_COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax{secure}");
    let mut response = Json(whoami_body(&user)).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    Ok(response)
}

async fn logout(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    if let Some(token) = session_token(&headers) {
        state.auth.sessions.end(token);
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("labforge_session=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0"),
    );
    response
}

fn whoami_body(user: &User) -> serde_json::Value {
    serde_json::json!({ "name": user.name, "namespace": user.namespace, "admin": user.admin })
}

async fn whoami(user: SignedIn) -> Json<serde_json::Value> {
    Json(whoami_body(&user.0))
}

async fn config(_user: SignedIn, State(state): State<ApiState>) -> Json<SpawnerConfig> {
    Json((*state.config).clone())
}

/// The notebook as users see it.
pub fn view(notebook: &Notebook, activity: &Activity) -> NotebookView {
    let namespace = notebook.metadata.namespace.clone().unwrap_or_default();
    let name = notebook.metadata.name.clone().unwrap_or_default();
    let container = notebook
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.containers.first());
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
    let gpus = resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|limits| limits.iter().find(|(k, _)| k.contains('/')))
        .map(|(vendor, count)| GpuView {
            vendor: vendor.clone(),
            count: count.0.clone(),
        });
    let status = notebook.status.as_ref();
    let waiting = status.and_then(|s| s.container_state.waiting.as_ref());
    let (state, reason) = if notebook.is_stopped() {
        if notebook.annotation(STOPPED_BY_ANNOTATION) == Some("culler") {
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
        (
            NotebookState::Starting,
            waiting.and_then(|w| w.message.clone()).unwrap_or_default(),
        )
    };
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
        resource_version: notebook
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default(),
        name,
        namespace,
    }
}

async fn list_notebooks(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    user.may_use(&ns)?;
    let notebooks: Vec<NotebookView> = state
        .store
        .list(Some(&ns))
        .iter()
        .map(|nb| view(nb, &state.activity))
        .collect();
    Ok(Json(serde_json::json!({ "notebooks": notebooks })))
}

async fn create_notebook(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
    body: Result<Json<NotebookRequest>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<NotebookView>)> {
    user.may_use(&ns)?;
    let Json(request) = body?;
    let notebook = notebook_from_request(&request, &ns, &user.0.name, &state.config)
        .map_err(|e| Failure::field(StatusCode::UNPROCESSABLE_ENTITY, e))?;
    let created = state.store.create(notebook)?;
    state.store.record_event(
        &ns,
        &request.name,
        "Normal",
        "Created",
        &format!("created by {}", user.0.name),
    );
    Ok((StatusCode::CREATED, Json(view(&created, &state.activity))))
}

fn find(state: &ApiState, ns: &str, name: &str) -> ApiResult<Notebook> {
    state.store.get(ns, name).ok_or_else(|| {
        Failure::new(
            StatusCode::NOT_FOUND,
            format!("notebook {ns}/{name} not found"),
        )
    })
}

async fn get_notebook(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    user.may_use(&ns)?;
    let notebook = find(&state, &ns, &name)?;
    Ok(Json(serde_json::json!({
        "notebook": view(&notebook, &state.activity),
        "status": notebook.status,
    })))
}

async fn patch_notebook(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
    body: Result<Json<NotebookPatch>, JsonRejection>,
) -> ApiResult<Json<NotebookView>> {
    user.may_use(&ns)?;
    let Json(patch) = body?;
    find(&state, &ns, &name)?;
    if let Some(image) = &patch.image {
        image_reference("image", image)
            .map_err(|e| Failure::field(StatusCode::UNPROCESSABLE_ENTITY, e))?;
        let saved = state
            .store
            .saved_images(&ns)
            .iter()
            .any(|s| &s.image == image);
        if !state.config.allow_custom_images && !state.config.in_catalog(image) && !saved {
            return Err(Failure::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                FieldError::new(
                    "image",
                    format!("{image} is neither in the catalog nor saved in {ns}"),
                ),
            ));
        }
    }
    let now = jiff::Timestamp::now().to_string();
    let updated = state.store.update(&ns, &name, |nb| {
        if let Some(image) = &patch.image
            && let Some(container) = nb
                .spec
                .template
                .spec
                .as_mut()
                .and_then(|s| s.containers.first_mut())
        {
            container.image = Some(image.clone());
        }
        let annotations = nb.metadata.annotations.get_or_insert_with(Default::default);
        match patch.stopped {
            Some(true) if !annotations.contains_key(STOP_ANNOTATION) => {
                annotations.insert(STOP_ANNOTATION.to_owned(), now.clone());
                annotations.remove(LAST_ACTIVITY_ANNOTATION);
            }
            Some(false) => {
                annotations.remove(STOP_ANNOTATION);
                annotations.remove(STOPPED_BY_ANNOTATION);
            }
            _ => {}
        }
    })?;
    match patch.stopped {
        Some(true) => state.store.record_event(
            &ns,
            &name,
            "Normal",
            "Stopping",
            &format!("stopped by {}", user.0.name),
        ),
        Some(false) => state.store.record_event(
            &ns,
            &name,
            "Normal",
            "Starting",
            &format!("started by {}", user.0.name),
        ),
        None => {}
    }
    Ok(Json(view(&updated, &state.activity)))
}

async fn delete_notebook(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    user.may_use(&ns)?;
    state.store.delete(&ns, &name)?;
    Ok(StatusCode::NO_CONTENT)
}

async fn events(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    user.may_use(&ns)?;
    find(&state, &ns, &name)?;
    Ok(Json(
        serde_json::json!({ "events": state.store.events(&ns, &name) }),
    ))
}

#[derive(Deserialize)]
struct LogQuery {
    #[serde(default)]
    follow: bool,
    #[serde(default = "default_tail")]
    tail: u32,
}

fn default_tail() -> u32 {
    500
}

async fn logs(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
    Query(query): Query<LogQuery>,
) -> ApiResult<Response> {
    user.may_use(&ns)?;
    let notebook = find(&state, &ns, &name)?;
    if notebook.is_stopped() {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            format!("notebook {ns}/{name} is stopped: it has no logs"),
        ));
    }
    let mut child = state
        .engine
        .logs(
            &container_name(&ns, &name),
            query.follow,
            query.tail.min(10_000),
        )
        .map_err(|e| {
            Failure::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading logs: {e}"),
            )
        })?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "no log stream"))?;
    // The child lives as long as the stream: a client that goes away kills it.
    let stream = tokio_util::io::ReaderStream::new(stdout).map(move |chunk| {
        let _keep = &child;
        chunk
    });
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(stream),
    )
        .into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SaveRequest {
    #[serde(default)]
    tag: Option<String>,
}

async fn start_save(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
    body: Result<Json<SaveRequest>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<crate::saves::SaveStatus>)> {
    user.may_use(&ns)?;
    let Json(request) = body?;
    find(&state, &ns, &name)?;
    let status = state
        .saves
        .start(&ns, &name, request.tag.as_deref())
        .map_err(|e| match e {
            StartSaveError::BadTag(_) => Failure::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                FieldError::new("tag", e.to_string()),
            ),
            StartSaveError::NotRunning(_) | StartSaveError::Busy(_) => {
                Failure::new(StatusCode::CONFLICT, e.to_string())
            }
        })?;
    state.store.record_event(
        &ns,
        &name,
        "Normal",
        "Saving",
        &format!("saving the environment as {}", status.target),
    );
    Ok((StatusCode::ACCEPTED, Json(status)))
}

/// Server-sent events of a save's progress, ending with its last state.
async fn follow_save(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, id)): Path<(String, String)>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    user.may_use(&ns)?;
    let receiver = state
        .saves
        .follow(&id)
        .filter(|r| r.borrow().namespace == ns)
        .ok_or_else(|| Failure::new(StatusCode::NOT_FOUND, format!("no save {id} in {ns}")))?;
    let stream = futures::stream::unfold(Some(receiver), |receiver| async move {
        let mut receiver = receiver?;
        let status = receiver.borrow_and_update().clone();
        let event = Event::default().event("progress").json_data(&status).ok()?;
        if status.finished() {
            return Some((Ok(event), None));
        }
        // Progress comes fast; a browser needs a few updates a second at most.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let next = receiver.changed().await.ok().map(|()| receiver);
        Some((Ok(event), next))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

async fn saved_images(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    user.may_use(&ns)?;
    Ok(Json(
        serde_json::json!({ "images": state.store.saved_images(&ns) }),
    ))
}

/// Server-sent events: the namespace's notebooks whenever one of them changes.
async fn watch_namespace(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(ns): Path<String>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    user.may_use(&ns)?;
    let changes = tokio_stream::wrappers::BroadcastStream::new(state.store.subscribe());
    let snapshot = move |state: &ApiState| {
        let notebooks: Vec<NotebookView> = state
            .store
            .list(Some(&ns))
            .iter()
            .map(|nb| view(nb, &state.activity))
            .collect();
        Event::default()
            .event("notebooks")
            .json_data(serde_json::json!({ "notebooks": notebooks }))
            .unwrap_or_default()
    };
    let first = snapshot(&state);
    let wanted = {
        let ns_filter = user.0.namespace.clone();
        let admin = user.0.admin;
        move |change: &Change| match change {
            Change::Notebook { namespace, .. } => admin || *namespace == ns_filter,
            _ => false,
        }
    };
    let rest = changes.filter_map(move |change| {
        let state = state.clone();
        let wanted = wanted.clone();
        let snapshot = snapshot.clone();
        async move {
            match change {
                Ok(change) if wanted(&change) => Some(Ok(snapshot(&state))),
                // Lagged behind: send the whole list again.
                Err(_) => Some(Ok(snapshot(&state))),
                Ok(_) => None,
            }
        }
    });
    Ok(
        Sse::new(futures::stream::once(async move { Ok(first) }).chain(rest))
            .keep_alive(KeepAlive::default()),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdminQuery {
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    state: Option<NotebookState>,
}

/// Every user's notebooks in one answer (Kubeflow's web app asks namespace by namespace).
async fn admin_notebooks(
    user: SignedIn,
    State(state): State<ApiState>,
    query: Result<Query<AdminQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    if !user.0.admin {
        return Err(Failure::new(StatusCode::FORBIDDEN, "admins only"));
    }
    let Query(query) = query.map_err(|e| Failure::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let notebooks: Vec<NotebookView> = state
        .store
        .list(query.namespace.as_deref())
        .iter()
        .map(|nb| view(nb, &state.activity))
        .filter(|v| query.user.as_ref().is_none_or(|u| &v.owner == u))
        .filter(|v| query.state.is_none_or(|s| v.state == s))
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
        "gpus": sum(&|v| v.gpus.as_ref().map(|g| g.count.clone()).unwrap_or_default(), "gpus"),
    });
    Ok(Json(
        serde_json::json!({ "notebooks": notebooks, "totals": totals }),
    ))
}
