//! The proxy's admin endpoints, on their own listener: `/metrics`, `/healthz`, `/readyz` (ready
//! once the first complete route list is in), and the activity the culler and web app read:
//! `/activity` (`{"<ns>/<name>": "<RFC 3339>"}` for every route with activity) and
//! `/activity/<ns>/<name>` (`{"last_activity": "<RFC 3339>" | null}`, 404 for an unknown route).

use crate::activity::Activity;
use crate::routes::activity_key;
use crate::source::RouteStore;
use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[derive(Clone)]
pub struct AdminState {
    pub registry: Arc<Registry>,
    pub routes: Arc<RouteStore>,
    pub activity: Arc<Activity>,
}

pub fn router(state: AdminState) -> Router {
    labforge_metrics::router(state.registry.clone())
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/activity", get(all_activity))
        .route("/activity/{namespace}/{name}", get(one_activity))
        .with_state(state)
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    if state.routes.is_ready() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "waiting for routes")
    }
}

async fn all_activity(State(state): State<AdminState>) -> impl IntoResponse {
    let snapshot: serde_json::Map<String, serde_json::Value> = state
        .activity
        .snapshot()
        .into_iter()
        .map(|(key, at)| (key, at.to_string().into()))
        .collect();
    Json(snapshot)
}

async fn one_activity(
    State(state): State<AdminState>,
    Path((namespace, name)): Path<(String, String)>,
) -> impl IntoResponse {
    let key = activity_key(&namespace, &name);
    if !state.activity.contains(&key) {
        return (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({ "last_activity": null })),
        );
    }
    let last = state.activity.get(&key).map(|t| t.to_string());
    (
        StatusCode::OK,
        Json(serde_json::json!({ "last_activity": last })),
    )
}
