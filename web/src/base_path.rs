//! Serving the web app under a path prefix (`labforge web --base-path /jupyter/`), where Kubeflow's
//! central dashboard embeds its notebooks app. Pages carry `<base href>` and link relatively, so
//! the one setting reaches every page, script, API call and redirect.

use axum::Router;
use axum::http::{Request, Uri};
use axum::response::Redirect;
use std::sync::Arc;

/// `/`, or an absolute path ending in `/` with nothing a link could be broken out of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BasePath(Arc<str>);

#[derive(Debug, thiserror::Error)]
#[error(
    "{0:?} is not a path like /jupyter/ (starting and ending with '/', letters, digits, '-', '.', '_', '~')"
)]
pub struct BasePathError(String);

impl Default for BasePath {
    fn default() -> Self {
        Self("/".into())
    }
}

impl BasePath {
    pub fn parse(text: &str) -> Result<Self, BasePathError> {
        let ok = text.starts_with('/')
            && text.ends_with('/')
            && !text.starts_with("//")
            && !text
                .split('/')
                .any(|segment| segment == "." || segment == "..")
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/-._~".contains(&b));
        if ok {
            Ok(Self(text.into()))
        } else {
            Err(BasePathError(text.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_root(&self) -> bool {
        &*self.0 == "/"
    }

    /// The absolute path of `relative` (a path of the app, with or without its leading `/`).
    pub fn join(&self, relative: &str) -> String {
        format!("{}{}", self.0, relative.trim_start_matches('/'))
    }

    /// The app's path for `path` as a request names it: the prefix taken off when present.
    fn strip<'a>(&self, path: &'a str) -> Option<&'a str> {
        path.strip_prefix(self.0.trim_end_matches('/'))
            .filter(|rest| rest.starts_with('/'))
    }
}

/// `app` served under `base`: a request under the prefix reaches `app` without it, and the prefix
/// alone is redirected to the prefix with its `/`. Requests without the prefix reach `app` as
/// they are, so a gateway that rewrites the prefix away (as Kubeflow's own VirtualService for its
/// notebooks app does) and probes at `/api/healthz` keep working.
pub fn serve_under(base: BasePath, app: Router) -> Router {
    if base.is_root() {
        return app;
    }
    let bare = base.as_str().trim_end_matches('/').to_owned();
    let target = base.as_str().to_owned();
    let strip = tower::util::MapRequestLayer::new(move |mut request: Request<axum::body::Body>| {
        if let Some(rest) = base.strip(request.uri().path()) {
            let path_and_query = match request.uri().query() {
                Some(query) => format!("{rest}?{query}"),
                None => rest.to_owned(),
            };
            let mut parts = request.uri().clone().into_parts();
            if let Ok(path_and_query) = path_and_query.parse() {
                parts.path_and_query = Some(path_and_query);
                if let Ok(uri) = Uri::from_parts(parts) {
                    *request.uri_mut() = uri;
                }
            }
        }
        request
    });
    Router::new()
        .route(
            &bare,
            axum::routing::any(move || async move { Redirect::permanent(&target) }),
        )
        .fallback_service(tower::Layer::layer(&strip, app))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_path_is_a_plain_directory_path() {
        for good in ["/", "/jupyter/", "/a/b-c_d.e~f/"] {
            assert_eq!(
                BasePath::parse(good)
                    .map(|b| b.as_str().to_owned())
                    .ok()
                    .as_deref(),
                Some(good)
            );
        }
        for bad in [
            "",
            "jupyter/",
            "/jupyter",
            "//evil.example/",
            "/a b/",
            "/a\"/",
            "/../",
            "/a/./",
        ] {
            let error = BasePath::parse(bad).unwrap_err().to_string();
            assert!(error.contains("/jupyter/"), "{bad:?}: {error}");
        }
    }

    #[test]
    fn joins_and_strips_at_segment_boundaries() {
        let base = BasePath::parse("/jupyter/").unwrap();
        assert_eq!(base.join("/api/config"), "/jupyter/api/config");
        assert_eq!(base.join("new"), "/jupyter/new");
        assert_eq!(base.strip("/jupyter/api/x"), Some("/api/x"));
        assert_eq!(base.strip("/jupyter/"), Some("/"));
        assert_eq!(base.strip("/jupyterlab/x"), None);
        assert_eq!(base.strip("/api/x"), None);
    }
}
