//! Saving a running notebook's environment as an image, and following a save's progress.

use crate::api::extract::{Allowed, NotebookPath, verb};
use crate::saves::StartSaveError;
use crate::validate::FieldError;
use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Deserialize;
use std::convert::Infallible;
use std::time::Duration;

use super::notebooks::find;
use super::{ApiResult, ApiState, Failure};

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
    summary = "Save the environment as an image (one new layer on the image it runs)", params(NotebookPath), request_body = SaveRequest,
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
pub(crate) async fn start_save(
    Allowed { ns, .. }: Allowed<verb::Update>,
    State(state): State<ApiState>,
    Path(NotebookPath { name, .. }): Path<NotebookPath>,
    body: Result<Json<SaveRequest>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<crate::saves::SaveStatus>)> {
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
/// A save named by the path.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct SavePath {
    /// Its namespace.
    #[allow(dead_code, reason = "the namespace is checked by `Allowed`")]
    ns: String,
    /// The save's id.
    id: String,
}

#[utoipa::path(
    get, path = "/api/namespaces/{ns}/saves/{id}",
    summary = "Server-sent events: `progress` with a SaveStatus until done or failed", params(SavePath),
    responses(
        (status = 200, description = "event stream", body = inline(crate::openapi::ProgressEvent), content_type = "text/event-stream"),
        (status = 404, description = "no such save", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn follow_save(
    Allowed { ns, .. }: Allowed<verb::Get>,
    State(state): State<ApiState>,
    Path(SavePath { id, .. }): Path<SavePath>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
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
