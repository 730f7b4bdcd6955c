//! The controller's admin endpoints: `/metrics` (Prometheus text), `/healthz` and `/readyz`.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Clone)]
pub struct AdminState {
    pub registry: Arc<Registry>,
    /// Set once the process serves.
    pub ready: Arc<AtomicBool>,
}

pub fn router(state: AdminState) -> Router {
    labforge_metrics::router(state.registry.clone())
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    if state.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}
