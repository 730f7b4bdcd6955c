//! The `/metrics` route each of labforge's servers mounts (the controller's and the proxy's admin
//! listeners, the embedded mode's metrics listener): its Prometheus registry as OpenMetrics text,
//! as Prometheus scrapes it.

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// The content type of OpenMetrics' text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `GET /metrics`, answered from `registry`; merge it into a server's router.
pub fn router<S: Clone + Send + Sync + 'static>(registry: Arc<Registry>) -> Router<S> {
    Router::new().route(
        "/metrics",
        get(move || {
            let registry = registry.clone();
            async move { encoded(&registry) }
        }),
    )
}

/// The registry's metrics as an answer; a collector that fails to encode is a 500.
fn encoded(registry: &Registry) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt as _;
    use prometheus_client::metrics::counter::Counter;
    use tower::ServiceExt as _;

    #[tokio::test]
    async fn metrics_are_served_as_openmetrics_text() {
        let mut registry = Registry::default();
        let saves: Counter = Counter::default();
        registry.register("saves", "Saves finished", saves.clone());
        saves.inc_by(3);
        let app: Router = router(Arc::new(registry));

        let answer = app
            .oneshot(
                Request::get("/metrics")
                    .body(Body::empty())
                    .expect("request"),
            )
            .await
            .expect("answer");
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(answer.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        let body = answer.into_body().collect().await.expect("body").to_bytes();
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("saves_total 3"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
