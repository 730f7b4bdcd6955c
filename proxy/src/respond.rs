//! The one place where the proxy's own failures become responses: an HTML page for browsers,
//! JSON for API clients (an `Accept` that prefers JSON, or a Jupyter `/api/` path without an
//! HTML `Accept`), both with the same status and message.

use crate::normalize::PathError;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::Full;
use maud::{DOCTYPE, PreEscaped, html};

/// What went wrong before or while reaching the upstream.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("{0}")]
    BadPath(#[from] PathError),
    #[error("the request has no host")]
    NoHost,
    #[error("authentication required")]
    Unauthenticated,
    #[error("you do not have access to this notebook")]
    Forbidden,
    #[error("access to this notebook could not be checked just now; try again")]
    AccessUnknown,
    #[error("no route for this address")]
    NoRoute,
    /// A request to a notebook's host from a page of another origin (another notebook's).
    #[error("a page of another origin may not use this notebook")]
    CrossOrigin,
    /// A notebook sign-in code that was used already, expired, is for another notebook, or
    /// came from another browser than the one sent to sign in.
    #[error("this sign-in link is used, expired or not yours; open the notebook again")]
    CodeRefused,
    #[error("the notebook server is not reachable (it may be stopped or starting)")]
    UpstreamUnavailable(#[source] crate::upstream::UpstreamError),
    #[error("the notebook server failed to answer")]
    UpstreamFailed(#[source] crate::upstream::UpstreamError),
    /// The route's `timeout` passed before the response head came; the message is Envoy's.
    #[error("upstream request timeout")]
    UpstreamTimeout,
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BadPath(_) | ProxyError::NoHost => StatusCode::BAD_REQUEST,
            ProxyError::Unauthenticated => StatusCode::UNAUTHORIZED,
            ProxyError::Forbidden | ProxyError::CrossOrigin | ProxyError::CodeRefused => {
                StatusCode::FORBIDDEN
            }
            ProxyError::AccessUnknown => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::NoRoute => StatusCode::NOT_FOUND,
            ProxyError::UpstreamUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::UpstreamFailed(_) => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }
}

/// Whether the client wants JSON rather than a page.
pub fn wants_json(headers: &HeaderMap, path: &str) -> bool {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("text/html") {
        return false;
    }
    accept.contains("json") || path.contains("/api/")
}

/// The look of the web app's pages, inline: an error page may be on a notebook's host, where
/// the app's stylesheet is not served.
const PAGE_STYLE: &str = "body{margin:0;font-family:system-ui,-apple-system,'Segoe UI',sans-serif;\
color:#1d2330;background:#f5f6f8}header{padding:.6rem 1.2rem;background:#1d2330}\
header a{color:#fff;font-weight:700;text-decoration:none}main{padding:1.2rem}\
section{max-width:30rem;margin:2rem auto;background:#fff;border:1px solid #d9dde5;\
border-radius:8px;padding:1rem 1.2rem}h1{font-size:1.4rem;margin:.3rem 0 1rem}a{color:#2457c5}";

/// The response for `error`, as JSON or as a page in the web app's look that links back to
/// `app` (the app's root).
pub fn error_response(error: &ProxyError, json: bool, app: &str) -> Response<Full<Bytes>> {
    let status = error.status();
    let message = error.to_string();
    let mut response = if json {
        // Jupyter's clients read `message`; the web app's read its own error shape.
        let mut body = labforge_messages::kubeflow_failure(status.as_u16(), &message);
        body.insert("message".into(), message.as_str().into());
        body.insert("error".into(), message.as_str().into());
        answer(
            status,
            "application/json",
            serde_json::Value::Object(body).to_string(),
        )
    } else {
        page(status, &message, app)
    };
    if status == StatusCode::UNAUTHORIZED {
        // Not a Basic challenge: the login happens in front of the proxy (the auth proxy or the
        // web app); the header only says which kind of credentials are missing.
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"labforge\""),
        );
    }
    response
}

/// A page in the web app's look saying `message`, linking back to `app`; both are escaped.
pub fn page(status: StatusCode, message: &str, app: &str) -> Response<Full<Bytes>> {
    let code = status.as_u16();
    let reason = status.canonical_reason().unwrap_or("Error");
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (code) " " (reason) " · labforge" }
                style { (PreEscaped(PAGE_STYLE)) }
            }
            body {
                header { a href=(app) { "labforge" } }
                main {
                    section {
                        h1 { (code) " " (reason) }
                        p { (message) }
                        p { a href=(app) { "Back to your notebooks" } }
                    }
                }
            }
        }
    };
    answer(status, "text/html; charset=utf-8", markup.into_string())
}

fn answer(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    #[test]
    fn api_clients_get_json_and_browsers_get_a_page() {
        let mut headers = HeaderMap::new();
        assert!(wants_json(&headers, "/notebook/a/b/api/kernels"));
        assert!(!wants_json(&headers, "/notebook/a/b/lab"));
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        assert!(wants_json(&headers, "/notebook/a/b/lab"));
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/html,application/xhtml+xml,*/*;q=0.8"),
        );
        assert!(!wants_json(&headers, "/notebook/a/b/api/kernels"));
    }

    #[tokio::test]
    async fn pages_carry_status_and_message() {
        let page = error_response(&ProxyError::NoRoute, false, "//lab.example:8080/jupyter/");
        assert_eq!(page.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            page.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        let json = error_response(&ProxyError::Forbidden, true, "/");
        assert_eq!(json.status(), StatusCode::FORBIDDEN);
        assert_eq!(json.headers()[header::CONTENT_TYPE], "application/json");
        let body = json.into_body().collect().await.unwrap().to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["status"], 403);
        assert_eq!(body["success"], false);
        assert_eq!(body["message"], body["error"]);
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("do not have access"))
        );
        let unauthenticated = error_response(&ProxyError::Unauthenticated, true, "/");
        assert!(
            unauthenticated
                .headers()
                .contains_key(header::WWW_AUTHENTICATE)
        );
    }

    #[tokio::test]
    async fn a_page_escapes_its_message_and_link() {
        let page = page(
            StatusCode::BAD_GATEWAY,
            "nothing listens on <script>alert('x')</script> & more",
            "/app/\"><script>",
        );
        assert_eq!(page.status(), StatusCode::BAD_GATEWAY);
        let body = page.into_body().collect().await.unwrap().to_bytes();
        let body = std::str::from_utf8(&body).unwrap();
        assert!(!body.contains("<script>"), "{body}");
        assert!(
            body.contains(
                "<p>nothing listens on &lt;script&gt;alert('x')&lt;/script&gt; &amp; more</p>"
            ),
            "{body}"
        );
        assert!(
            body.contains(r#"<a href="/app/&quot;&gt;&lt;script&gt;">Back to your notebooks</a>"#),
            "{body}"
        );
        assert!(body.contains("<h1>502 Bad Gateway</h1>"), "{body}");
        assert!(
            body.contains("<title>502 Bad Gateway · labforge</title>"),
            "{body}"
        );
    }
}
