//! `Connection: close` on an answer given before the request's body was read to its end.
//!
//! Unless the rest of the body is already in its buffer, hyper's server closes such a connection
//! once it has answered (what is left of the body would be read as the next request), without
//! saying so. A client that keeps connections, as the
//! proxy in front of the app does, could send its next request on that connection just as it
//! closes, and get no answer. With the header, the client knows not to reuse it.

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

/// Middleware: runs the request and marks its answer `Connection: close` when the handler left
/// part of the request's body unread.
pub async fn close_if_body_unread(request: Request, next: Next) -> Response {
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let read_to_end = Arc::new(AtomicBool::new(false));
    let (parts, body) = request.into_parts();
    let body = Body::new(Watched {
        inner: body,
        read_to_end: read_to_end.clone(),
    });
    let mut response = next.run(Request::from_parts(parts, body)).await;
    if !read_to_end.load(Ordering::Acquire) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body that records when it has been read to its end.
struct Watched {
    inner: Body,
    read_to_end: Arc<AtomicBool>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read_to_end.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::routing::post;
    use tower::ServiceExt as _;

    fn app() -> Router {
        Router::new()
            .route(
                "/reads",
                post(|body: String| async move { body.len().to_string() }),
            )
            .route("/ignores", post(|| async { "answered first" }))
            .layer(axum::middleware::from_fn(close_if_body_unread))
    }

    async fn connection_header(path: &str, body: &'static str) -> Option<HeaderValue> {
        let request = axum::http::Request::post(path)
            .header(header::CONTENT_LENGTH, body.len())
            .body(Body::from(body))
            .unwrap();
        let response = app().oneshot(request).await.unwrap();
        response.headers().get(header::CONNECTION).cloned()
    }

    #[tokio::test]
    async fn an_answer_before_the_body_is_read_closes_the_connection() {
        assert_eq!(
            connection_header("/ignores", "a body nobody reads").await,
            Some(HeaderValue::from_static("close"))
        );
    }

    #[tokio::test]
    async fn a_body_read_to_its_end_or_none_keeps_it() {
        assert_eq!(connection_header("/reads", "a body read whole").await, None);
        assert_eq!(connection_header("/ignores", "").await, None);
    }
}
