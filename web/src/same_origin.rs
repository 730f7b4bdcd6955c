//! Changes come only from the web app's own pages.
//!
//! On a team's domain every notebook's host is the same *site* as the web app, so `SameSite`
//! cookies go with requests that a notebook's page sends to it: a form posting to `/api/logout`
//! would sign its visitor out, and a JSON-less request is all a form needs. Browsers say who
//! sent a request (`Sec-Fetch-Site`, and `Origin` on every request that is not a GET or HEAD):
//! a request that changes something is refused unless that says it came from the web app's own
//! origin or from the user (a typed URL, a bookmark). A request that says neither is not a
//! browser's page and passes: command-line clients and tests.

use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Middleware: refuses, 403, a request that changes something when the browser says a page of
/// another origin sent it.
pub async fn refuse_other_origins(request: Request, next: Next) -> Response {
    if let Some(why) = other_origin(request.method(), request.headers()) {
        tracing::info!(method = %request.method(), path = request.uri().path(), %why, "refused a change from another origin");
        return crate::api::Failure::new(
            StatusCode::FORBIDDEN,
            format!("refused: {why}; the web app takes changes only from its own pages"),
        )
        .into_response();
    }
    next.run(request).await
}

/// Why a request of `method` with `headers` came from a page of another origin, if it did.
/// Reads never change anything and are not asked.
pub fn other_origin(method: &Method, headers: &HeaderMap) -> Option<String> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        return match site.as_bytes() {
            b"same-origin" | b"none" => None,
            other => Some(format!(
                "the browser says a page of another origin sent it (Sec-Fetch-Site: {})",
                String::from_utf8_lossy(other)
            )),
        };
    }
    // Browsers without Fetch Metadata still send Origin with every request but GET and HEAD.
    let origin = headers.get(header::ORIGIN)?;
    let own = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(|h| without_default_port(&h.to_ascii_lowercase()));
    let from = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, authority)| without_default_port(&authority.to_ascii_lowercase()));
    match (from, own) {
        (Some(from), Some(own)) if from == own => None,
        _ => Some(format!(
            "it came from a page of {}",
            String::from_utf8_lossy(origin.as_bytes())
        )),
    }
}

fn without_default_port(authority: &str) -> String {
    authority
        .strip_suffix(":443")
        .or_else(|| authority.strip_suffix(":80"))
        .unwrap_or(authority)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| (name.parse().unwrap(), value.parse().unwrap()))
            .collect()
    }

    #[test]
    fn changes_from_other_origins_are_refused_and_reads_are_not_asked() {
        let post = Method::POST;
        // The web app's own pages, the user's own navigation, and clients that are no page.
        for allowed in [
            headers(&[("sec-fetch-site", "same-origin"), ("host", "lab.example")]),
            headers(&[("sec-fetch-site", "none")]),
            headers(&[("origin", "https://lab.example"), ("host", "lab.example")]),
            headers(&[
                ("origin", "https://lab.example:443"),
                ("host", "LAB.example"),
            ]),
            headers(&[
                ("origin", "http://localhost:8080"),
                ("host", "localhost:8080"),
            ]),
            headers(&[("host", "lab.example")]),
        ] {
            assert_eq!(other_origin(&post, &allowed), None, "{allowed:?}");
        }
        // A notebook's page on the same site, another site, a sandboxed frame, a lying port.
        for refused in [
            headers(&[
                ("sec-fetch-site", "same-site"),
                ("origin", "https://lab.example"),
                ("host", "lab.example"),
            ]),
            headers(&[("sec-fetch-site", "cross-site")]),
            headers(&[
                ("origin", "https://nb--bob.lab.example"),
                ("host", "lab.example"),
            ]),
            headers(&[("origin", "null"), ("host", "lab.example")]),
            headers(&[
                ("origin", "http://localhost:9999"),
                ("host", "localhost:8080"),
            ]),
            headers(&[("origin", "https://lab.example")]),
        ] {
            assert!(other_origin(&post, &refused).is_some(), "{refused:?}");
            for method in [Method::PUT, Method::PATCH, Method::DELETE] {
                assert!(other_origin(&method, &refused).is_some(), "{method}");
            }
            assert_eq!(other_origin(&Method::GET, &refused), None);
        }
    }
}
