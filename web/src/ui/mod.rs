//! The web UI: pages rendered here (layout, navigation, the user menu, and the spawner form built
//! from the catalog), with small JavaScript modules in `web/ui/` that fill in live data from the
//! JSON API. Everything is compiled into the binary: no front-end build step, nothing to deploy
//! besides `labforge`. Pages are `maud` templates, so names, namespaces, images and messages from
//! users and the catalog are escaped wherever they land, with nothing to remember per field.

mod admin;
mod notebooks;
mod sign_in;
mod spawner;
mod tokens;

use crate::api::ApiState;
use crate::base_path::BasePath;
use crate::users::User;
use admin::admin_page;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use maud::{DOCTYPE, Markup, html};
use notebooks::{notebook_page, notebooks_page};
use serde::Deserialize;
use sign_in::{login_page, notebook_sign_in};
use spawner::new_page;

const STYLE: &str = include_str!("../../ui/style.css");

fn asset(name: &str) -> Option<(&'static str, &'static str)> {
    Some(match name {
        "style.css" => ("text/css; charset=utf-8", STYLE),
        "icon.svg" => ("image/svg+xml", include_str!("../../ui/icon.svg")),
        "common.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../../ui/common.js"),
        ),
        "login.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../../ui/login.js"),
        ),
        "notebooks.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../../ui/notebooks.js"),
        ),
        "new.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../../ui/new.js"),
        ),
        "notebook.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../../ui/notebook.js"),
        ),
        "admin.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../../ui/admin.js"),
        ),
        "tokens.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../../ui/tokens.js"),
        ),
        _ => return None,
    })
}

async fn static_file(Path(name): Path<String>) -> Response {
    match asset(&name) {
        Some((content_type, body)) => (
            [
                (header::CONTENT_TYPE, content_type),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}

/// Who a page is for and which namespace it shows (the user's own unless `?ns=` chose another, as
/// Kubeflow's dashboard passes its namespace selector).
struct Viewer<'a> {
    user: &'a User,
    namespace: &'a str,
}

impl<'a> From<&'a User> for Viewer<'a> {
    fn from(user: &'a User) -> Self {
        Self {
            user,
            namespace: &user.namespace,
        }
    }
}

/// A whole page: header with navigation and user menu, then `main`. Every link in it is relative
/// to `<base href>`, the app's base path.
fn page(
    base: &BasePath,
    title: &str,
    viewer: Option<Viewer<'_>>,
    main: Markup,
    script: Option<&str>,
) -> Markup {
    let content = html! {
        header {
            a.brand href="./" { "labforge" }
            @if let Some(viewer) = &viewer {
                (navigation(viewer))
            }
        }
        main #main { (main) }
        script type="module" src="static/common.js" {}
        @if let Some(script) = script {
            script type="module" src={ "static/" (script) } {}
        }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                base href=(base.as_str());
                title { (title) " · labforge" }
                link rel="icon" href="static/icon.svg" type="image/svg+xml";
                link rel="stylesheet" href="static/style.css";
            }
            @match viewer {
                // The page's scripts read who is looking, and at which namespace, from here.
                Some(Viewer { user, namespace }) => {
                    body
                        data-user=(user.name)
                        data-namespace=(namespace)
                        data-own-namespace=(user.namespace)
                        data-admin=(user.admin.to_string())
                        data-page=(script.map_or("", |s| s.trim_end_matches(".js")))
                    { (content) }
                }
                None => {
                    body { (content) }
                }
            }
        }
    }
}

/// The header's links and the user menu.
fn navigation(&Viewer { user, namespace }: &Viewer<'_>) -> Markup {
    // Another namespace than the user's own stays chosen from page to page.
    let query = namespace_query(user, namespace);
    html! {
        nav aria-label="Main" {
            a href={ "./" (query) } { "Notebooks" }
            a href={ "new" (query) } { "New notebook" }
            @if user.admin {
                a href="admin" { "Admin" }
            }
        }
        details.user-menu {
            summary aria-label="User menu" { (user.name) }
            div {
                p {
                    label for="namespace-picker" { "Namespace " }
                    // The namespaces the user is in fill it (common.js); choosing one shows it.
                    select #namespace-picker {
                        option value=(namespace) selected { (namespace) }
                    }
                    @if user.admin { " · admin" }
                }
                p { a href="tokens" { "API tokens" } }
                button #logout type="button" { "Sign out" }
            }
        }
    }
}

/// `text` as a URL query value.
fn query_value(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

fn to_login(base: &BasePath) -> Response {
    Redirect::to(&base.join("login")).into_response()
}

/// No page of the web app may be framed by another origin: a notebook's page could lay it under
/// its own and have its visitor click there.
pub async fn deny_framing(response: Response) -> Response {
    framed_by(response, "DENY", "frame-ancestors 'none'")
}

/// Under a base path the app is framed by Kubeflow's central dashboard, which shares its origin:
/// framing is allowed to that origin only. Notebooks there are served on hosts of their own, or
/// share the origin already.
pub async fn same_origin_framing_only(response: Response) -> Response {
    framed_by(response, "SAMEORIGIN", "frame-ancestors 'self'")
}

fn framed_by(mut response: Response, options: &'static str, ancestors: &'static str) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::X_FRAME_OPTIONS,
        axum::http::HeaderValue::from_static(options),
    );
    headers
        .entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(axum::http::HeaderValue::from_static(ancestors));
    response
}

/// Where a notebook is opened: its own host when notebooks have one, else its path here.
pub fn notebook_url(state: &ApiState, headers: &HeaderMap, ns: &str, name: &str) -> String {
    let path = format!(
        "{}/",
        labforge_notebook_controller::builders::route_prefix(ns, name)
    );
    match &state.notebook_links {
        Some(links) => {
            let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
            format!("{}{path}", links.origin(ns, name, host))
        }
        None => path,
    }
}

/// The sign-in page, coming back to `next` (a path of the web app) afterwards.
fn to_login_then(base: &BasePath, next: &str) -> Response {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("next", next)
        .finish();
    Redirect::to(&format!("{}?{query}", base.join("login"))).into_response()
}

#[derive(Deserialize, Default)]
struct NamespaceQuery {
    #[serde(default)]
    ns: Option<String>,
}

/// The namespace a page shows: `ns` (from `?ns=`) when given, else the user's own. A namespace
/// the user may not list gets the page that says so.
async fn chosen_namespace(
    state: &ApiState,
    user: &User,
    ns: Option<String>,
) -> Result<String, Response> {
    let Some(ns) = ns.filter(|ns| *ns != user.namespace) else {
        return Ok(user.namespace.clone());
    };
    if state
        .access
        .may(user, crate::backend::Verb::List, Some(&ns))
        .await
    {
        Ok(ns)
    } else {
        Err(error_page(
            &state.base_path,
            StatusCode::FORBIDDEN,
            "Not yours",
            &format!("{} may not list notebooks in namespace {ns}.", user.name),
            Some(user),
        ))
    }
}

/// `?ns=<namespace>` for links that keep a chosen namespace; nothing for the user's own.
fn namespace_query(user: &User, namespace: &str) -> String {
    if namespace == user.namespace {
        String::new()
    } else {
        format!("?ns={}", query_value(namespace))
    }
}

/// A table's head: one row of column headings.
fn column_headings(headings: &[&str]) -> Markup {
    html! {
        thead {
            tr {
                @for heading in headings {
                    th scope="col" { (heading) }
                }
            }
        }
    }
}

fn error_page(
    base: &BasePath,
    status: StatusCode,
    title: &str,
    message: &str,
    user: Option<&User>,
) -> Response {
    (
        status,
        page(
            base,
            title,
            user.map(Viewer::from),
            error_main(title, message),
            None,
        ),
    )
        .into_response()
}

fn error_main(title: &str, message: &str) -> Markup {
    html! {
        section.card.narrow {
            h1 { (title) }
            p { (message) }
            p { a href="./" { "Back to your notebooks" } }
        }
    }
}

async fn not_found(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let user = state.access.identify(&headers).await;
    error_page(
        &state.base_path,
        StatusCode::NOT_FOUND,
        "Not found",
        "There is no page here.",
        user.as_ref(),
    )
}

/// The whole web app, as both modes serve it: the API and the pages.
pub fn app(state: ApiState) -> Router {
    crate::api::router(state.clone())
        .merge(router(state.clone()))
        .layer(axum::middleware::from_fn(
            crate::same_origin::refuse_other_origins,
        ))
        // Around the origin check: a change refused as cross-origin is recorded too.
        .layer(axum::middleware::from_fn_with_state(
            state,
            crate::audit::record_requests,
        ))
        .layer(axum::middleware::from_fn(
            crate::keep_alive::close_if_body_unread,
        ))
}

/// The pages and their assets.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/", get(notebooks_page))
        .route("/login", get(login_page))
        .route("/new", get(new_page))
        .route("/notebooks/{ns}/{name}", get(notebook_page))
        .route("/admin", get(admin_page))
        .route("/tokens", get(tokens::tokens_page))
        .route(
            labforge_proxy::notebook_host::WEB_SIGN_IN_PATH,
            get(notebook_sign_in),
        )
        .route("/static/{file}", get(static_file))
        .fallback(not_found)
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::notebooks::notebook_main;
    use super::spawner::{SavedChoices, spawner_form};
    use super::*;
    use std::collections::BTreeSet;

    /// Text from users, requests and the admin's catalog, as the pages render it.
    const HOSTILE: &str = r#"<img src=x onerror="a">&'"#;
    const ESCAPED: &str = "&lt;img src=x onerror=&quot;a&quot;&gt;&amp;'";

    #[test]
    fn text_cannot_break_out_of_markup() {
        let user = User {
            name: HOSTILE.into(),
            namespace: HOSTILE.into(),
            admin: true,
            password_hash: String::new(),
        };
        let viewer = Viewer {
            user: &user,
            namespace: HOSTILE,
        };
        let notebook = page(
            &BasePath::default(),
            HOSTILE,
            Some(viewer),
            notebook_main(HOSTILE, HOSTILE, HOSTILE),
            Some("notebook.js"),
        )
        .into_string();
        let error = error_main(HOSTILE, HOSTILE).into_string();
        let mut config = crate::config::default_spawner("registry.local");
        config.images[0].description = HOSTILE.into();
        config.defaults.cpu = HOSTILE.into();
        let form = spawner_form(
            &config,
            SavedChoices::default(),
            Some(HOSTILE),
            &BTreeSet::new(),
        )
        .into_string();
        for html in [&notebook, &error, &form] {
            assert!(
                !html.contains("<img") && !html.contains(r#"onerror="a""#),
                "{html}"
            );
        }
        for (html, rendered) in [
            (&notebook, format!("<title>{ESCAPED} · labforge</title>")),
            (&notebook, format!(r#"data-user="{ESCAPED}""#)),
            (
                &notebook,
                format!(r#"<summary aria-label="User menu">{ESCAPED}</summary>"#),
            ),
            (&notebook, format!(r#"data-name="{ESCAPED}""#)),
            (&notebook, format!(r#"<h1>{ESCAPED} <span"#)),
            (&notebook, format!(r#"href="{ESCAPED}""#)),
            (&error, format!("<h1>{ESCAPED}</h1><p>{ESCAPED}</p>")),
            (&form, format!(" — {ESCAPED}</option>")),
            (&form, format!(r#"name="cpu" value="{ESCAPED}""#)),
            (
                &form,
                format!(
                    r#"name="customImage" placeholder="registry.example.com/team/image:tag" value="{ESCAPED}""#
                ),
            ),
        ] {
            assert!(html.contains(&rendered), "{rendered} not in {html}");
        }
    }
}
