//! Signing in: the login page, and the sign-in link that hands a notebook's host a one-time code
//! for its visitor.

use super::notebooks::notebook_for_page;
use super::{error_page, page, to_login_then};
use crate::api::ApiState;
use crate::namespaces::Action;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde::Deserialize;

/// The longest path a notebook sign-in brings its visitor back to.
pub(super) const MAX_RETURN: usize = 4096;

#[derive(Deserialize)]
pub(super) struct NotebookSignInQuery {
    namespace: String,
    name: String,
    state: String,
    #[serde(rename = "return")]
    return_to: String,
    /// For one of the notebook's ports' hosts, which serve any path.
    #[serde(default)]
    port: Option<u16>,
}

/// What is wrong with a notebook sign-in link, if anything: `return` must be a path below the
/// notebook's prefix, short and printable, and `state` the hex the proxy chose.
pub(super) fn sign_in_link_problem(query: &NotebookSignInQuery) -> Option<String> {
    // A notebook's host serves its prefix; a port's host serves any path of its own.
    let prefix = match query.port {
        Some(_) => String::new(),
        None => labforge_notebook_controller::builders::route_prefix(&query.namespace, &query.name),
    };
    let below_prefix = !query.return_to.starts_with("//")
        && query.return_to.strip_prefix(&prefix).is_some_and(|rest| {
            rest.starts_with('/')
                || (query.port.is_none() && (rest.is_empty() || rest.starts_with('?')))
        });
    if !below_prefix
        || query.return_to.len() > MAX_RETURN
        || query
            .return_to
            .bytes()
            .any(|b| b.is_ascii_control() || b == b' ')
    {
        return Some(format!(
            "return must be a path below {prefix}/ of at most {MAX_RETURN} bytes, without spaces or control characters."
        ));
    }
    if query.state.is_empty()
        || query.state.len() > 64
        || !query.state.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Some("state must be the hex the proxy chose.".to_owned());
    }
    None
}

/// Signs a visitor in to a notebook's own host (the proxy sent them here): access checked, a
/// one-time code for that notebook and browser, and back to the notebook's host with it.
pub(super) async fn notebook_sign_in(
    State(state): State<ApiState>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    query: Result<Query<NotebookSignInQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let user = state.access.identify(&headers).await;
    let Some((links, sign_in)) = state
        .notebook_links
        .as_ref()
        .and_then(|links| Some((links, links.sign_in.as_ref()?)))
    else {
        return error_page(
            &state.base_path,
            StatusCode::NOT_FOUND,
            "Not found",
            "Notebooks are not served on hosts of their own here.",
            user.as_ref(),
        );
    };
    // Codes go only to a tab's own navigation: a page's images, fetches and frames (a notebook's
    // page on the same site sends the visitor's cookie with them) get none.
    if let Some(why) = not_a_tab_navigation(&headers) {
        return error_page(
            &state.base_path,
            StatusCode::FORBIDDEN,
            "Not signed in",
            &format!("Notebook sign-in happens only when a tab opens a notebook ({why})."),
            user.as_ref(),
        );
    }
    let Ok(Query(query)) = query else {
        return error_page(
            &state.base_path,
            StatusCode::BAD_REQUEST,
            "Bad sign-in link",
            "The link needs namespace, name, state and return.",
            user.as_ref(),
        );
    };
    let session = state
        .local_users
        .as_ref()
        .and_then(|auth| auth.session_of(&headers));
    let (Some(user), Some(session)) = (user, session) else {
        let next = uri.path_and_query().map_or("/", |p| p.as_str());
        return to_login_then(&state.base_path, next);
    };
    if let Some(problem) = sign_in_link_problem(&query) {
        return error_page(
            &state.base_path,
            StatusCode::BAD_REQUEST,
            "Bad sign-in link",
            &problem,
            Some(&user),
        );
    }
    // Codes only for notebooks that exist: each grant is one per session and notebook. A port
    // is let in as its owner shared it.
    let notebook = match &query.port {
        Some(_) => state
            .backend
            .get(&query.namespace, &query.name)
            .await
            .ok()
            .flatten(),
        None => match notebook_for_page(&state, &user, Action::Open, &query.namespace, &query.name)
            .await
        {
            Ok(notebook) => Some(notebook),
            Err(refused) => return refused,
        },
    };
    if let Some(port) = query.port {
        let allowed = notebook
            .as_ref()
            .zip(state.local_users.as_ref())
            .is_some_and(|(notebook, auth)| auth.may_open_port(&user.name, notebook, port));
        if !allowed {
            return error_page(
                &state.base_path,
                StatusCode::FORBIDDEN,
                "Not yours",
                &format!(
                    "{} may not open port {port} of notebook {} in namespace {}: its owner has \
                     not shared it with you.",
                    user.name, query.name, query.namespace
                ),
                Some(&user),
            );
        }
    }
    let code = match sign_in.issue_for(
        session,
        &user.name,
        (&query.namespace, &query.name, query.port),
        &query.state,
        &query.return_to,
    ) {
        Ok(code) => code,
        Err(err) => {
            return error_page(
                &state.base_path,
                StatusCode::SERVICE_UNAVAILABLE,
                "Busy",
                &err.to_string(),
                Some(&user),
            );
        }
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin = match query.port {
        Some(port) => links.port_origin(&query.namespace, &query.name, port, host),
        None => links.origin(&query.namespace, &query.name, host),
    };
    let location = format!(
        "{origin}{}/{}?code={code}",
        labforge_proxy::notebook_host::SIGN_IN_PATH,
        query.state
    );
    (
        StatusCode::FOUND,
        [
            (header::LOCATION, location),
            (header::CACHE_CONTROL, "no-store".to_owned()),
        ],
    )
        .into_response()
}

/// Why a request is not a browser tab's own navigation, when its Fetch Metadata says so; a
/// request without it is not a page's and passes.
pub(super) fn not_a_tab_navigation(headers: &HeaderMap) -> Option<String> {
    [
        ("sec-fetch-mode", "navigate"),
        ("sec-fetch-dest", "document"),
    ]
    .into_iter()
    .find_map(|(name, wanted)| {
        let value = headers.get(name)?;
        (value.as_bytes() != wanted.as_bytes())
            .then(|| format!("{name}: {}", String::from_utf8_lossy(value.as_bytes())))
    })
}

#[derive(Deserialize, Default)]
pub(super) struct LoginQuery {
    #[serde(default)]
    next: Option<String>,
}

/// The notebook (namespace, name) a sign-in that comes back to `next` is for: a notebook's own
/// sign-in sends its visitor here on the way.
pub(super) fn notebook_signing_in(next: &str) -> Option<(String, String)> {
    let (path, query) = next.split_once('?')?;
    if !path.ends_with(labforge_proxy::notebook_host::WEB_SIGN_IN_PATH) {
        return None;
    }
    let pairs: std::collections::HashMap<String, String> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    Some((pairs.get("namespace")?.clone(), pairs.get("name")?.clone()))
}

pub(super) async fn login_page(
    State(state): State<ApiState>,
    Query(query): Query<LoginQuery>,
) -> Markup {
    let notebook = query.next.as_deref().and_then(notebook_signing_in);
    page(
        &state.base_path,
        "Sign in",
        None,
        login_main(notebook),
        Some("login.js"),
    )
}

pub(super) fn login_main(notebook: Option<(String, String)>) -> Markup {
    html! {
        section.card.narrow {
            h1 { "Sign in" }
            @if let Some((namespace, name)) = &notebook {
                p #signing-in-to { "Sign in to open notebook " strong { (name) } " of " strong { (namespace) } "." }
            }
            form #login novalidate {
                label for="username" { "User name" }
                input #username name="username" autocomplete="username" required autofocus;
                label for="password" { "Password" }
                input #password name="password" type="password" autocomplete="current-password" required;
                p.error #login-error role="alert" {}
                button type="submit" { "Sign in" }
            }
            p.hint { "No account yet? Ask whoever runs labforge here to add you." }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_in_codes_go_only_to_a_tabs_navigation() {
        let headers = |pairs: &[(&'static str, &'static str)]| -> HeaderMap {
            pairs
                .iter()
                .map(|(n, v)| (n.parse().unwrap(), v.parse().unwrap()))
                .collect()
        };
        let tab = [
            ("sec-fetch-mode", "navigate"),
            ("sec-fetch-dest", "document"),
        ];
        assert_eq!(not_a_tab_navigation(&headers(&tab)), None);
        assert_eq!(not_a_tab_navigation(&HeaderMap::new()), None, "no page");
        for page_request in [
            [("sec-fetch-mode", "no-cors"), ("sec-fetch-dest", "image")],
            [("sec-fetch-mode", "cors"), ("sec-fetch-dest", "empty")],
            [("sec-fetch-mode", "navigate"), ("sec-fetch-dest", "iframe")],
        ] {
            assert!(not_a_tab_navigation(&headers(&page_request)).is_some());
        }
    }

    #[test]
    fn a_sign_in_link_returns_below_its_notebook_with_the_proxys_state() {
        let link = |return_to: &str, state: &str| NotebookSignInQuery {
            namespace: "alice".into(),
            name: "lab".into(),
            state: state.into(),
            return_to: return_to.into(),
            port: None,
        };
        assert_eq!(
            sign_in_link_problem(&link("/notebook/alice/lab/tree?x=1", "0af3")),
            None
        );
        assert_eq!(
            sign_in_link_problem(&link("/notebook/alice/lab", "0af3")),
            None
        );
        for (return_to, state) in [
            ("/notebook/alice/lab2/", "0af3"),
            ("/notebook/bob/lab/", "0af3"),
            ("https://evil.example/notebook/alice/lab/", "0af3"),
            ("/notebook/alice/lab/a b", "0af3"),
            ("/notebook/alice/lab/\r\nSet-Cookie: x", "0af3"),
            ("/notebook/alice/lab/", ""),
            ("/notebook/alice/lab/", "not-hex"),
        ] {
            assert!(
                sign_in_link_problem(&link(return_to, state)).is_some(),
                "{return_to:?} with state {state:?} was taken"
            );
        }
        let long = format!("/notebook/alice/lab/{}", "a".repeat(MAX_RETURN));
        assert!(sign_in_link_problem(&link(&long, "0af3")).is_some());
        // A port's host serves any path of its own, and nothing else.
        let port_link = |return_to: &str| NotebookSignInQuery {
            port: Some(8050),
            ..link(return_to, "0af3")
        };
        for taken in ["/", "/app/page?x=1"] {
            assert_eq!(sign_in_link_problem(&port_link(taken)), None, "{taken}");
        }
        for refused in [
            "",
            "//evil.example/",
            "https://evil.example/",
            "?x=1",
            "/a b",
        ] {
            assert!(
                sign_in_link_problem(&port_link(refused)).is_some(),
                "{refused:?} was taken"
            );
        }
    }
}
