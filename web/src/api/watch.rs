//! Server-sent events with a namespace's notebooks, now and on every change.

use crate::api::extract::{Allowed, NamespacePath, verb};
use crate::backend::Change;
use crate::model::NotebookView;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use std::convert::Infallible;

use super::views::view;
use super::{ApiResult, ApiState};

/// Server-sent events: the namespace's notebooks whenever one of them changes.
#[utoipa::path(
    get, path = "/api/namespaces/{ns}/watch",
    summary = "Server-sent events: `notebooks` with the namespace's notebooks, now and on every change", params(NamespacePath),
    responses(
        (status = 200, description = "event stream", body = inline(crate::openapi::NotebooksEvent), content_type = "text/event-stream"),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn watch_namespace(
    Allowed { ns, .. }: Allowed<verb::List>,
    State(state): State<ApiState>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
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
pub(crate) async fn notebooks_event(state: &ApiState, ns: &str) -> Event {
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
