//! Watch streams: newline-delimited `{"type":..,"object":..}` events over a chunked response,
//! replayed from the store's history after a resourceVersion, then live.
//!
//! As on a real server, a resourceVersion older than the kept history is answered with HTTP 200
//! and one `ERROR` event carrying a 410 `Expired` Status: that is what makes kube-runtime's
//! watcher drop its state and re-list (an HTTP 410 on the watch request would only be retried).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use futures::Stream;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::catalog::ResourceId;
use super::status::ApiError;
use super::store::{Event, EventType, Filter, Store};

/// How objects are shown to one request: in the requested version, or as
/// `PartialObjectMetadata` when the client asked for metadata only.
#[derive(Debug, Clone)]
pub(crate) struct View {
    pub api_version: String,
    pub kind: String,
    pub partial: bool,
}

impl View {
    pub(crate) fn render(&self, object: &Value) -> Value {
        if self.partial {
            return json!({
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadata",
                "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
            });
        }
        let mut object = object.clone();
        object["apiVersion"] = Value::from(self.api_version.as_str());
        object
    }
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WatchStart {
    /// Synthetic ADDED events for the current objects first (`resourceVersion` "" or "0", or
    /// `sendInitialEvents=true`, which also ends them with an `initial-events-end` bookmark).
    Snapshot { initial_events_end: bool },
    /// Events after this resourceVersion.
    After(u64),
}

/// A parsed watch request.
#[derive(Debug, Clone)]
pub(crate) struct WatchRequest {
    pub resource: ResourceId,
    pub filter: Filter,
    pub start: WatchStart,
    pub bookmarks: bool,
    pub timeout: Duration,
    pub view: View,
}

/// How often an idle watch with `allowWatchBookmarks=true` gets a BOOKMARK.
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);

struct WatchState {
    store: Arc<Store>,
    request: WatchRequest,
    last_rv: u64,
    pending: VecDeque<Bytes>,
    done: bool,
    deadline: Instant,
    changes: tokio::sync::watch::Receiver<u64>,
    shutdown: tokio::sync::watch::Receiver<bool>,
}

fn line(kind: &str, object: Value) -> Bytes {
    let mut text = json!({"type": kind, "object": object}).to_string();
    text.push('\n');
    Bytes::from(text)
}

/// The event type a watcher with this filter sees for `event`, if any: a modification that moves
/// an object into or out of the selection is an ADDED or a DELETED.
fn visible(filter: &Filter, event: &Event) -> Option<&'static str> {
    let now = filter.matches(&event.object);
    match event.kind {
        EventType::Added => now.then_some("ADDED"),
        EventType::Deleted => now.then_some("DELETED"),
        EventType::Modified => {
            let before = event.old.as_ref().is_some_and(|old| filter.matches(old));
            match (before, now) {
                (true, true) => Some("MODIFIED"),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            }
        }
    }
}

impl WatchState {
    fn bookmark(&self, annotations: Value) -> Bytes {
        let kind = if self.request.view.partial {
            "PartialObjectMetadata"
        } else {
            self.request.view.kind.as_str()
        };
        let api_version = if self.request.view.partial {
            "meta.k8s.io/v1"
        } else {
            self.request.view.api_version.as_str()
        };
        line(
            "BOOKMARK",
            json!({
                "kind": kind,
                "apiVersion": api_version,
                "metadata": {"resourceVersion": self.last_rv.to_string(), "annotations": annotations},
            }),
        )
    }

    /// Queues every kept event after `last_rv`, or the 410 error when some are gone.
    fn poll_events(&mut self) {
        self.changes.borrow_and_update();
        match self.store.events_after(self.last_rv) {
            Err(compacted) => {
                let error = ApiError::expired(format!(
                    "too old resource version: {} ({compacted})",
                    self.last_rv
                ));
                self.pending.push_back(line("ERROR", error.status_json()));
                self.done = true;
            }
            Ok((events, current)) => {
                for event in events
                    .iter()
                    .filter(|event| event.resource == self.request.resource)
                {
                    if let Some(kind) = visible(&self.request.filter, event) {
                        self.pending
                            .push_back(line(kind, self.request.view.render(&event.object)));
                    }
                }
                self.last_rv = self.last_rv.max(current);
            }
        }
    }

    async fn wait(&mut self) {
        let bookmarks = self.request.bookmarks;
        tokio::select! {
            changed = self.changes.changed() => {
                if changed.is_err() {
                    self.done = true;
                }
            }
            () = tokio::time::sleep_until(self.deadline) => self.done = true,
            () = tokio::time::sleep(BOOKMARK_INTERVAL), if bookmarks => {
                let bookmark = self.bookmark(json!({}));
                self.pending.push_back(bookmark);
            }
            _ = self.shutdown.changed() => self.done = true,
        }
    }
}

async fn next(mut state: WatchState) -> Option<(Result<Bytes, Infallible>, WatchState)> {
    loop {
        if let Some(bytes) = state.pending.pop_front() {
            return Some((Ok(bytes), state));
        }
        if state.done || *state.shutdown.borrow() {
            return None;
        }
        state.poll_events();
        if state.pending.is_empty() && !state.done {
            state.wait().await;
        }
    }
}

/// The body of a watch response.
pub(crate) fn stream(
    store: Arc<Store>,
    request: WatchRequest,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let changes = store.subscribe();
    let mut state = WatchState {
        deadline: Instant::now() + request.timeout,
        store,
        request,
        last_rv: 0,
        pending: VecDeque::new(),
        done: false,
        changes,
        shutdown,
    };
    match state.request.start {
        WatchStart::After(rv) => state.last_rv = rv,
        WatchStart::Snapshot { initial_events_end } => {
            let (items, rv) = state
                .store
                .list(state.request.resource, &state.request.filter);
            for item in items {
                state
                    .pending
                    .push_back(line("ADDED", state.request.view.render(&item)));
            }
            state.last_rv = rv;
            if initial_events_end {
                let bookmark = state.bookmark(json!({"k8s.io/initial-events-end": "true"}));
                state.pending.push_back(bookmark);
            }
        }
    }
    futures::stream::unfold(state, next)
}
