//! Notebooks: list, create, read, change (stop, start, resize, move to another image), delete,
//! and their events and logs.

use crate::api::extract::{Allowed, NamespacePath, NotebookPath, verb};
use crate::kubeflow;
use crate::model::{AUTO_SAVE_ANNOTATION, NotebookPatch, NotebookRequest, WorkspaceRequest};
use crate::namespaces::Action;
use crate::validate::{FieldError, image_reference, notebook_from_request};
use crate::workloads::WorkloadError;
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use labforge_crds::notebook::{LAST_ACTIVITY_ANNOTATION, Notebook, STOP_ANNOTATION};
use serde::Deserialize;

use super::quotas::{QuotaAsk, admitted_by_quota};
use super::views::{view, view_for};
use super::volumes::claims;
use super::{ApiQuery, ApiResult, ApiState, Failure, STOPPED_BY_ANNOTATION, SignedIn};

#[utoipa::path(
    get, path = "/api/namespaces/{ns}/notebooks", summary = "Notebooks of a namespace", params(NamespacePath),
    responses((status = 200, description = "the namespace's notebooks", body = inline(crate::openapi::NotebooksAnswer)), crate::openapi::PlatformErrors)
)]
pub(crate) async fn list_notebooks(
    Allowed { user, ns, .. }: Allowed<verb::List>,
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> ApiResult<Json<serde_json::Value>> {
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
    summary = "Create a notebook, from labforge's request or Kubeflow's spawner form", params(NamespacePath),
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
pub(crate) async fn create_notebook(
    Allowed { user, ns, .. }: Allowed<verb::Create>,
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<serde_json::Value>)> {
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
    summary = "A notebook: the object itself, its Kubeflow status and labforge's view", params(NotebookPath),
    responses(
        (status = 200, description = "the notebook", body = inline(crate::openapi::NotebookAnswer)),
        (status = 404, description = "no such notebook", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn get_notebook(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(NotebookPath { ns, name }): Path<NotebookPath>,
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
    summary = "Stop, start, or move to another image", params(NotebookPath), request_body = NotebookPatch,
    responses(
        (status = 200, description = "changed", body = inline(crate::openapi::PatchedAnswer)),
        (status = 404, description = "no such notebook", body = crate::openapi::ApiErrorBody),
        (status = 415, response = crate::openapi::UnsupportedMediaType),
        (status = 422, description = "invalid image", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn patch_notebook(
    Allowed { user, ns, .. }: Allowed<verb::Update>,
    State(state): State<ApiState>,
    Path(NotebookPath { name, .. }): Path<NotebookPath>,
    body: Result<Json<NotebookPatch>, JsonRejection>,
) -> ApiResult<Json<serde_json::Value>> {
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
    summary = "Delete a notebook (its workspace volume is kept)", params(NotebookPath),
    responses(
        (status = 200, description = "deleted", body = inline(crate::openapi::DeletedAnswer)),
        (status = 404, description = "no such notebook", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn delete_notebook(
    Allowed { user, ns, .. }: Allowed<verb::Delete>,
    State(state): State<ApiState>,
    Path(NotebookPath { name, .. }): Path<NotebookPath>,
) -> ApiResult<Json<serde_json::Value>> {
    state.backend.delete(&ns, &name).await?;
    Ok(Json(kubeflow::envelope(
        &user.0,
        StatusCode::OK,
        serde_json::json!({ "message": format!("Notebook {name} successfully deleted.") }),
    )))
}

#[utoipa::path(
    get, path = "/api/namespaces/{ns}/notebooks/{name}/events", summary = "Events of a notebook", params(NotebookPath),
    responses(
        (status = 200, description = "the newest events", body = inline(crate::openapi::EventsAnswer)),
        (status = 404, description = "no such notebook", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn events(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(NotebookPath { ns, name }): Path<NotebookPath>,
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
pub(crate) struct LogQuery {
    #[serde(default)]
    follow: bool,
    #[serde(default = "default_tail")]
    #[param(default = 500)]
    tail: u32,
}

pub(crate) fn default_tail() -> u32 {
    500
}

#[utoipa::path(
    get, path = "/api/namespaces/{ns}/notebooks/{name}/logs", summary = "Container logs", params(NotebookPath, LogQuery),
    responses(
        (status = 200, description = "log text, streamed while following", body = String, content_type = "text/plain"),
        (status = 404, description = "no such notebook", body = crate::openapi::ApiErrorBody),
        (status = 409, description = "the notebook is stopped", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn logs(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(NotebookPath { ns, name }): Path<NotebookPath>,
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
