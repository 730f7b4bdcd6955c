//! The REST surface: Kubernetes paths parsed by hand (one fallback handler, because the same path
//! shape means different things per resource scope), query parameters as kube-client sends them,
//! and write accounting for tests.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::catalog::ResourceId;
use super::discovery;
use super::rbac;
use super::selector::{FieldSelector, LabelSelector};
use super::status::{self, ApiError};
use super::store::{
    DeleteOptions, Deletion, Filter, PatchKind, Propagation, Store, Target, WriteOptions,
};
use super::watch::{self, View, WatchRequest, WatchStart};

/// The rule answering SubjectAccessReviews, given the review's `spec`.
pub(crate) type AccessRule = dyn Fn(&Value) -> bool + Send + Sync;
/// What a container has logged, by namespace, pod and container (the kubelet's part).
pub(crate) type LogSource = dyn Fn(&str, &str, &str) -> Option<String> + Send + Sync;

/// Counters tests read back.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub writes: u64,
    pub writes_by: BTreeMap<String, u64>,
    /// Successful mutating requests, including no-ops that changed nothing.
    pub write_requests: u64,
    /// Every resource request by verb and resource (`get pods`, `patch notebooks/status`).
    pub requests_by: BTreeMap<String, u64>,
    pub rejected: Vec<String>,
}

/// Shared state of one fake server.
pub(crate) struct App {
    pub store: Arc<Store>,
    pub stats: Mutex<Stats>,
    pub access_rule: RwLock<Arc<AccessRule>>,
    pub exec_runner: RwLock<super::exec::SharedRunner>,
    pub log_source: RwLock<Option<Arc<LogSource>>>,
    /// What `metrics.k8s.io` serves.
    pub pod_metrics: RwLock<super::metrics::PodSamples>,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    pub address: String,
    /// Bearer tokens of [`super::FakeApiServer::client_as`]'s clients, and their users.
    pub tokens: RwLock<HashMap<String, String>>,
}

impl App {
    pub(crate) fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Largest request body accepted (a real API server takes 3 MiB).
const BODY_LIMIT: usize = 16 * 1024 * 1024;

pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .fallback(handle)
        .with_state(app)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
}

async fn handle(State(app): State<Arc<App>>, mut request: axum::extract::Request) -> Response {
    let method = request.method().clone();
    let uri = request.uri().clone();
    if let Some((namespace, pod)) = log_target(&uri)
        && method == Method::GET
    {
        return match pod_log(&app, request.headers(), &namespace, &pod, &uri) {
            Ok(response) => response,
            Err(error) => error.into_response(),
        };
    }
    let answer = match exec_target(&uri) {
        Some((namespace, pod)) if matches!(method, Method::GET | Method::POST) => {
            // A websocket exec is a GET, which Kubernetes authorizes as `get` and, since the
            // websocket upgrade permission check, as `create` too; both are asked here.
            let verbs: &[&str] = if method == Method::GET {
                &["get", "create"]
            } else {
                &["create"]
            };
            let allowed = verbs.iter().try_for_each(|verb| {
                authorize(&app, request.headers(), |user| rbac::Request {
                    user,
                    verb,
                    group: "",
                    resource: "pods/exec".into(),
                    namespace: Some(&namespace),
                    name: Some(&pod),
                })
            });
            match allowed {
                Ok(()) => super::exec::serve(&app, &namespace, &pod, &uri, &mut request),
                Err(error) => Err(error),
            }
        }
        _ => {
            let (parts, body) = request.into_parts();
            match axum::body::to_bytes(body, BODY_LIMIT).await {
                Ok(body) => route(&app, &method, &uri, &parts.headers, &body),
                Err(err) => Err(ApiError::bad_request(format!("reading the body: {err}"))),
            }
        }
    };
    match answer {
        Ok(response) => response,
        Err(error) => {
            if matches!(error.code, 400 | 422) {
                app.stats().rejected.push(error.message.clone());
            }
            tracing::debug!(%method, %uri, code = error.code, message = %error.message, "fake kube rejected a request");
            error.into_response()
        }
    }
}

/// `(namespace, pod)` of `/api/v1/namespaces/{namespace}/pods/{pod}/exec`.
fn exec_target(uri: &Uri) -> Option<(String, String)> {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["api", "v1", "namespaces", namespace, "pods", pod, "exec"] => {
            Some((namespace.to_string(), pod.to_string()))
        }
        _ => None,
    }
}

/// `(namespace, pod)` of `/api/v1/namespaces/{namespace}/pods/{pod}/log`.
fn log_target(uri: &Uri) -> Option<(String, String)> {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["api", "v1", "namespaces", namespace, "pods", pod, "log"] => {
            Some((namespace.to_string(), pod.to_string()))
        }
        _ => None,
    }
}

/// `pods/log`: the container's log from the test's log source (empty without one), its last
/// `tailLines` lines when asked; the container must be named when the pod has several, as in
/// Kubernetes. A followed log ends with what was logged.
fn pod_log(
    app: &App,
    headers: &HeaderMap,
    namespace: &str,
    pod: &str,
    uri: &Uri,
) -> Result<Response, ApiError> {
    authorize(app, headers, |user| rbac::Request {
        user,
        verb: "get",
        group: "",
        resource: "pods/log".into(),
        namespace: Some(namespace),
        name: Some(pod),
    })?;
    let catalog = &app.store.schemas().catalog;
    let pods = catalog
        .by_plural("", "v1", "pods")
        .ok_or_else(ApiError::path_not_found)?;
    let target = Target {
        resource: pods,
        version: "v1",
        namespace: Some(namespace),
    };
    let object = app.store.get(target, pod)?;
    let names: Vec<&str> = object
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let query = Query::<HashMap<String, String>>::try_from_uri(uri)
        .map(|Query(query)| query)
        .map_err(|err| ApiError::bad_request(format!("invalid query: {err}")))?;
    let container = match query.get("container") {
        Some(name) if names.contains(&name.as_str()) => name.clone(),
        Some(name) => {
            return Err(ApiError::bad_request(format!(
                "container {name} is not valid for pod {pod}"
            )));
        }
        None if names.len() == 1 => names[0].to_string(),
        None => {
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {pod}, choose one of: [{}]",
                names.join(" ")
            )));
        }
    };
    let source = app
        .log_source
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let text = source
        .and_then(|source| source(namespace, pod, &container))
        .unwrap_or_default();
    let text = match query.get("tailLines").and_then(|n| n.parse::<usize>().ok()) {
        Some(n) => {
            let lines: Vec<&str> = text.lines().collect();
            let kept = &lines[lines.len().saturating_sub(n)..];
            kept.iter().map(|line| format!("{line}\n")).collect()
        }
        None => text,
    };
    Ok(([(header::CONTENT_TYPE, "text/plain")], text).into_response())
}

fn json_response(code: StatusCode, value: &Value) -> Response {
    (code, axum::Json(value)).into_response()
}

/// A resource path: `/api/v1/namespaces/ns/pods/name/status` and its variants.
struct ResourcePath {
    resource: ResourceId,
    version: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn route(
    app: &App,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let catalog = &app.store.schemas().catalog;
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let get_only = |value: Option<Value>| -> Result<Response, ApiError> {
        if method != Method::GET {
            return Err(ApiError::method_not_allowed(method.as_str()));
        }
        value
            .map(|value| json_response(StatusCode::OK, &value))
            .ok_or_else(ApiError::path_not_found)
    };
    let (group, version, rest) = match segments.as_slice() {
        ["version"] => return get_only(Some(discovery::version())),
        ["healthz" | "livez" | "readyz"] => return Ok((StatusCode::OK, "ok").into_response()),
        ["api"] => return get_only(Some(discovery::api_versions(&app.address))),
        ["apis"] => return get_only(Some(discovery::group_list(catalog))),
        ["apis", group] => return get_only(discovery::group(catalog, group)),
        ["api", version] => return get_only(discovery::resource_list(catalog, "", version)),
        ["apis", group, version] => {
            return get_only(discovery::resource_list(catalog, group, version));
        }
        [
            "apis",
            super::metrics::GROUP,
            super::metrics::VERSION,
            rest @ ..,
        ] => {
            return pod_metrics(app, method, uri, headers, rest);
        }
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(ApiError::path_not_found()),
    };
    let path = parse_resource_path(app, group, version, rest)?;
    let query = Query::<HashMap<String, String>>::try_from_uri(uri)
        .map(|Query(query)| query)
        .map_err(|err| ApiError::bad_request(format!("invalid query: {err}")))?;
    let verb = match *method {
        Method::GET if path.name.is_some() => "get",
        Method::GET if truthy(&query, "watch") => "watch",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if path.name.is_some() => "delete",
        Method::DELETE => "deletecollection",
        _ => "",
    };
    let info = app.store.schemas().catalog.get(path.resource);
    let resource = match &path.subresource {
        Some(sub) => format!("{}/{sub}", info.plural),
        None => info.plural.clone(),
    };
    *app.stats()
        .requests_by
        .entry(format!("{verb} {resource}"))
        .or_default() += 1;
    authorize(app, headers, |user| rbac::Request {
        user,
        verb,
        group,
        resource: resource.clone(),
        namespace: path.namespace.as_deref(),
        name: path.name.as_deref(),
    })?;
    // A server-side apply that creates the object is a create too.
    let applies = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/apply-patch"));
    if verb == "patch"
        && applies
        && let Some(name) = &path.name
    {
        let target = Target {
            resource: path.resource,
            version: &path.version,
            namespace: path.namespace.as_deref(),
        };
        if app.store.get(target, name).is_err() {
            authorize(app, headers, |user| rbac::Request {
                user,
                verb: "create",
                group,
                resource: resource.clone(),
                namespace: path.namespace.as_deref(),
                name: Some(name),
            })?;
        }
    }
    if matches!(verb, "create" | "update" | "patch") {
        authorize_blocking_owners(app, headers, &path, body)?;
    }
    serve(app, method, &path, &query, headers, body)
}

/// The OwnerReferencesPermissionEnforcement admission plugin: an owner reference that blocks its
/// owner's deletion may only be set by who may update the owner's finalizers.
fn authorize_blocking_owners(
    app: &App,
    headers: &HeaderMap,
    path: &ResourcePath,
    body: &Bytes,
) -> Result<(), ApiError> {
    let Ok(object) = serde_json::from_slice::<Value>(body) else {
        return Ok(());
    };
    let catalog = &app.store.schemas().catalog;
    let owners = object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|owner| owner["blockOwnerDeletion"] == Value::Bool(true));
    for owner in owners {
        let api_version = owner["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let kind = owner["kind"].as_str().unwrap_or_default();
        let Some(id) = catalog.by_kind(group, version, kind) else {
            continue;
        };
        let plural = catalog.get(id).plural.clone();
        authorize(app, headers, |user| rbac::Request {
            user,
            verb: "update",
            group,
            resource: format!("{plural}/finalizers"),
            namespace: path.namespace.as_deref(),
            name: owner["name"].as_str(),
        })
        .map_err(|refused| {
            ApiError::forbidden(format!(
                "cannot set blockOwnerDeletion if an ownerReference refers to a resource you \
                 can't set finalizers on: {}",
                refused.message
            ))
        })?;
    }
    Ok(())
}

/// `metrics.k8s.io/v1beta1` PodMetrics: what the test set, read only.
fn pod_metrics(
    app: &App,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    rest: &[&str],
) -> Result<Response, ApiError> {
    let (namespace, name) = match rest {
        ["pods"] => (None, None),
        ["namespaces", ns, "pods"] => (Some(*ns), None),
        ["namespaces", ns, "pods", name] => (Some(*ns), Some(*name)),
        _ => return Err(ApiError::path_not_found()),
    };
    if method != Method::GET {
        return Err(ApiError::method_not_allowed(method.as_str()));
    }
    let verb = if name.is_some() { "get" } else { "list" };
    *app.stats()
        .requests_by
        .entry(format!("{verb} pods.{}", super::metrics::GROUP))
        .or_default() += 1;
    authorize(app, headers, |user| rbac::Request {
        user,
        verb,
        group: super::metrics::GROUP,
        resource: "pods".into(),
        namespace,
        name,
    })?;
    let samples = app
        .pod_metrics
        .read()
        .unwrap_or_else(PoisonError::into_inner);
    let body = match (namespace, name) {
        (Some(ns), Some(name)) => {
            let sample = samples
                .get(&(ns.to_owned(), name.to_owned()))
                .ok_or_else(|| ApiError::named_not_found("podmetrics.metrics.k8s.io", name))?;
            super::metrics::pod_metrics(ns, name, sample)
        }
        (namespace, _) => {
            let query = Query::<HashMap<String, String>>::try_from_uri(uri)
                .map(|Query(query)| query)
                .map_err(|err| ApiError::bad_request(format!("invalid query: {err}")))?;
            let labels =
                LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
                    .map_err(ApiError::bad_request)?;
            let mut list = super::metrics::list(&samples, namespace);
            if let Some(items) = list["items"].as_array_mut() {
                items.retain(|item| labels.matches(item));
            }
            list
        }
    };
    Ok(json_response(StatusCode::OK, &body))
}

/// Lets a request through when it carries no token (the admin's), or when RBAC allows what
/// `request` describes for the token's user; 401 for an unknown token, 403 with Kubernetes'
/// message otherwise.
fn authorize<'a>(
    app: &App,
    headers: &HeaderMap,
    request: impl FnOnce(String) -> rbac::Request<'a>,
) -> Result<(), ApiError> {
    let Some(token) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return Ok(());
    };
    let user = app
        .tokens
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(token)
        .cloned()
        .ok_or_else(ApiError::unauthorized)?;
    let request = request(user);
    if rbac::allows(&app.store, &request) {
        Ok(())
    } else {
        Err(ApiError::forbidden(request.refusal()))
    }
}

fn parse_resource_path(
    app: &App,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<ResourcePath, ApiError> {
    let catalog = &app.store.schemas().catalog;
    let namespaced = |plural: &str| {
        catalog
            .by_plural(group, version, plural)
            .filter(|id| catalog.get(*id).namespaced)
    };
    let (namespace, resource, tail) = match rest {
        ["namespaces", namespace, plural, tail @ ..] if namespaced(plural).is_some() => {
            (Some(namespace.to_string()), namespaced(plural), tail)
        }
        [plural, tail @ ..] => (None, catalog.by_plural(group, version, plural), tail),
        [] => (None, None, rest),
    };
    let resource = resource.ok_or_else(ApiError::path_not_found)?;
    let info = catalog.get(resource);
    let (name, subresource) = match tail {
        [] => (None, None),
        // A namespaced resource's objects are only reachable inside their namespace.
        [_, ..] if info.namespaced && namespace.is_none() => return Err(ApiError::path_not_found()),
        [name] => (Some(name.to_string()), None),
        [name, "status"] if info.has_status => (Some(name.to_string()), Some("status".to_string())),
        _ => return Err(ApiError::path_not_found()),
    };
    Ok(ResourcePath {
        resource,
        version: version.to_string(),
        namespace,
        name,
        subresource,
    })
}

fn truthy(query: &HashMap<String, String>, key: &str) -> bool {
    matches!(query.get(key).map(String::as_str), Some("true" | "1"))
}

fn filter(query: &HashMap<String, String>, namespace: Option<&str>) -> Result<Filter, ApiError> {
    Ok(Filter {
        namespace: namespace.map(str::to_string),
        labels: LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
            .map_err(ApiError::bad_request)?,
        fields: FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))
            .map_err(ApiError::bad_request)?,
    })
}

fn write_options(query: &HashMap<String, String>, headers: &HeaderMap) -> WriteOptions {
    let manager = query
        .get("fieldManager")
        .filter(|m| !m.is_empty())
        .cloned()
        .or_else(|| {
            headers
                .get(header::USER_AGENT)
                .and_then(|ua| ua.to_str().ok())
                .and_then(|ua| ua.split('/').next())
                .filter(|product| !product.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".to_string());
    WriteOptions {
        dry_run: query.get("dryRun").is_some_and(|v| v == "All"),
        manager,
        force: truthy(query, "force"),
    }
}

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|err| {
        ApiError::bad_request(format!(
            "the request body could not be decoded as JSON: {err}"
        ))
    })
}

fn serve(
    app: &App,
    method: &Method,
    path: &ResourcePath,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let store = &app.store;
    let info = store.schemas().resource(path.resource);
    let target = Target {
        resource: path.resource,
        version: &path.version,
        namespace: path.namespace.as_deref(),
    };
    let partial = headers
        .get(header::ACCEPT)
        .and_then(|accept| accept.to_str().ok())
        .is_some_and(|accept| accept.contains("as=PartialObjectMetadata"));
    let view = View {
        api_version: info.api_version(&path.version),
        kind: info.kind.clone(),
        partial,
    };
    if !info.stored {
        return match (method, &path.name) {
            (&Method::POST, None) => review(app, path, body),
            _ => Err(ApiError::method_not_allowed(method.as_str())),
        };
    }
    if info.namespaced && path.namespace.is_none() && method != Method::GET {
        // Writes to a namespaced resource name their namespace; only reads span all of them.
        return Err(ApiError::method_not_allowed(method.as_str()));
    }
    let sub = path.subresource.as_deref();
    let options = write_options(query, headers);
    let outcome = match (method, path.name.as_deref()) {
        (&Method::GET, None) => {
            let filter = filter(query, path.namespace.as_deref())?;
            if truthy(query, "watch") {
                return watch_response(app, path, query, filter, view);
            }
            let (items, rv) = store.list(path.resource, &filter);
            let items: Vec<Value> = items.iter().map(|item| view.render(item)).collect();
            let (api_version, kind) = if partial {
                (
                    "meta.k8s.io/v1".to_string(),
                    "PartialObjectMetadataList".to_string(),
                )
            } else {
                (view.api_version.clone(), info.list_kind.clone())
            };
            let list = json!({
                "apiVersion": api_version,
                "kind": kind,
                "metadata": {"resourceVersion": rv.to_string()},
                "items": items,
            });
            return Ok(json_response(StatusCode::OK, &list));
        }
        (&Method::GET, Some(name)) => {
            let object = store.get(target, name)?;
            return Ok(json_response(StatusCode::OK, &view.render(&object)));
        }
        (&Method::POST, None) => store.create(target, parse_json(body)?, &options)?,
        (&Method::PUT, Some(name)) => {
            store.update(target, name, sub, parse_json(body)?, &options)?
        }
        (&Method::PATCH, Some(name)) => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default();
            let kind = match content_type.split(';').next().unwrap_or_default().trim() {
                "application/merge-patch+json" => PatchKind::Merge,
                "application/strategic-merge-patch+json" => PatchKind::Strategic,
                "application/json-patch+json" => PatchKind::Json,
                "application/apply-patch+yaml" | "application/apply-patch+json" => PatchKind::Apply,
                other => {
                    return Err(ApiError::unsupported_media_type(
                        other,
                        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json",
                    ));
                }
            };
            let patch = if kind == PatchKind::Apply {
                if query.get("fieldManager").is_none_or(|m| m.is_empty()) {
                    return Err(ApiError::invalid_options(
                        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                    ));
                }
                serde_yaml_ng::from_slice::<Value>(body)
                    .map_err(|err| ApiError::bad_request(format!("error decoding YAML: {err}")))?
            } else {
                if truthy(query, "force") {
                    return Err(ApiError::invalid_options(
                        "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch",
                    ));
                }
                parse_json(body)?
            };
            store.patch(target, name, sub, kind, &patch, &options)?
        }
        (&Method::DELETE, name) => return delete(app, path, target, name, query, body, &view),
        _ => return Err(ApiError::method_not_allowed(method.as_str())),
    };
    if outcome.changed {
        count_write(app, method, info.plural.as_str(), sub);
    } else {
        app.stats().write_requests += 1;
    }
    let code = if outcome.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json_response(code, &view.render(&outcome.object)))
}

fn count_write(app: &App, method: &Method, plural: &str, subresource: Option<&str>) {
    let key = match subresource {
        Some(sub) => format!("{method} {plural}/{sub}"),
        None => format!("{method} {plural}"),
    };
    let mut stats = app.stats();
    stats.writes += 1;
    stats.write_requests += 1;
    *stats.writes_by.entry(key).or_default() += 1;
}

fn delete_options(
    query: &HashMap<String, String>,
    body: &Bytes,
) -> Result<DeleteOptions, ApiError> {
    let body: Value = if body.is_empty() {
        json!({})
    } else {
        parse_json(body)?
    };
    let policy = body
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .or(query.get("propagationPolicy").map(String::as_str));
    let propagation = match policy {
        Some("Orphan") => Propagation::Orphan,
        Some("Foreground") => Propagation::Foreground,
        _ if body.get("orphanDependents").and_then(Value::as_bool) == Some(true) => {
            Propagation::Orphan
        }
        _ => Propagation::Background,
    };
    let dry_run = query.get("dryRun").is_some_and(|v| v == "All")
        || body
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|values| values.iter().any(|v| v == "All"));
    let precondition = |field: &str| {
        body.pointer(&format!("/preconditions/{field}"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Ok(DeleteOptions {
        dry_run,
        propagation,
        uid: precondition("uid"),
        resource_version: precondition("resourceVersion"),
    })
}

fn delete(
    app: &App,
    path: &ResourcePath,
    target: Target<'_>,
    name: Option<&str>,
    query: &HashMap<String, String>,
    body: &Bytes,
    view: &View,
) -> Result<Response, ApiError> {
    let options = delete_options(query, body)?;
    let info = app.store.schemas().resource(path.resource);
    let sub = path.subresource.as_deref();
    if sub.is_some() {
        return Err(ApiError::method_not_allowed("DELETE"));
    }
    let Some(name) = name else {
        let filter = filter(query, path.namespace.as_deref())?;
        let deleted = app
            .store
            .delete_collection(path.resource, &filter, &options);
        if !deleted.is_empty() && !options.dry_run {
            count_write(app, &Method::DELETE, &info.plural, None);
        }
        let items: Vec<Value> = deleted.iter().map(|item| view.render(item)).collect();
        let list = json!({
            "apiVersion": view.api_version,
            "kind": info.list_kind,
            "metadata": {},
            "items": items,
        });
        return Ok(json_response(StatusCode::OK, &list));
    };
    match app.store.delete(target, name, &options)? {
        Deletion::Removed(object) => {
            if !options.dry_run {
                count_write(app, &Method::DELETE, &info.plural, None);
            }
            let uid = object.pointer("/metadata/uid").and_then(Value::as_str);
            Ok(json_response(
                StatusCode::OK,
                &status::success(info, name, uid),
            ))
        }
        Deletion::Pending { object, changed } => {
            if changed {
                count_write(app, &Method::DELETE, &info.plural, None);
            }
            Ok(json_response(StatusCode::OK, &view.render(&object)))
        }
    }
}

fn watch_response(
    app: &App,
    path: &ResourcePath,
    query: &HashMap<String, String>,
    filter: Filter,
    view: View,
) -> Result<Response, ApiError> {
    let rv = query.get("resourceVersion").map_or("", String::as_str);
    let start = if truthy(query, "sendInitialEvents") {
        WatchStart::Snapshot {
            initial_events_end: true,
        }
    } else if rv.is_empty() || rv == "0" {
        WatchStart::Snapshot {
            initial_events_end: false,
        }
    } else {
        WatchStart::After(
            rv.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))?,
        )
    };
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .unwrap_or(1800);
    let request = WatchRequest {
        resource: path.resource,
        filter,
        start,
        bookmarks: truthy(query, "allowWatchBookmarks"),
        timeout: Duration::from_secs(timeout),
        view,
    };
    let body = Body::from_stream(watch::stream(
        app.store.clone(),
        request,
        app.shutdown.clone(),
    ));
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(body)
        .map_err(|err| ApiError::bad_request(format!("building the watch response: {err}")))
}

/// POST of a SubjectAccessReview: validated, answered by the test's access rule, not stored.
fn review(app: &App, path: &ResourcePath, body: &Bytes) -> Result<Response, ApiError> {
    let store = &app.store;
    let info = store.schemas().resource(path.resource);
    let mut review = parse_json(body)?;
    let api_version = info.api_version(&path.version);
    let Some(map) = review.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object".into(),
        ));
    };
    map.entry("apiVersion")
        .or_insert_with(|| Value::from(api_version.as_str()));
    map.entry("kind")
        .or_insert_with(|| Value::from(info.kind.as_str()));
    if let Err(errors) = store.schemas().validate(&api_version, &info.kind, &review) {
        return Err(ApiError::invalid(info, "", &errors));
    }
    let rule = app
        .access_rule
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let spec = review.get("spec").cloned().unwrap_or_else(|| json!({}));
    let allowed = rule(&spec);
    review["status"] = if allowed {
        json!({"allowed": true, "reason": "allowed by the fake API server's access rule"})
    } else {
        json!({"allowed": false, "reason": "denied by the fake API server's access rule"})
    };
    Ok(json_response(StatusCode::CREATED, &review))
}
