//! The web UI: pages rendered here (layout, navigation, the user menu, and the spawner form built
//! from the catalog), with small JavaScript modules in `web/ui/` that fill in live data from the
//! JSON API. Everything is compiled into the binary: no front-end build step, nothing to deploy
//! besides `labforge`. Pages are `maud` templates, so names, namespaces, images and messages from
//! users and the catalog are escaped wherever they land, with nothing to remember per field.

mod tokens;

use crate::api::ApiState;
use crate::backend::Verb;
use crate::base_path::BasePath;
use crate::config::SpawnerConfig;
use crate::model::{SavedImage, ServerType};
use crate::namespaces::Action;
use crate::users::User;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use labforge_crds::notebook::Notebook;
use maud::{DOCTYPE, Markup, html};
use serde::Deserialize;
use std::collections::BTreeSet;

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

/// The longest path a notebook sign-in brings its visitor back to.
const MAX_RETURN: usize = 4096;

#[derive(Deserialize)]
struct NotebookSignInQuery {
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
fn sign_in_link_problem(query: &NotebookSignInQuery) -> Option<String> {
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
async fn notebook_sign_in(
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
fn not_a_tab_navigation(headers: &HeaderMap) -> Option<String> {
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
struct LoginQuery {
    #[serde(default)]
    next: Option<String>,
}

/// The notebook (namespace, name) a sign-in that comes back to `next` is for: a notebook's own
/// sign-in sends its visitor here on the way.
fn notebook_signing_in(next: &str) -> Option<(String, String)> {
    let (path, query) = next.split_once('?')?;
    if !path.ends_with(labforge_proxy::notebook_host::WEB_SIGN_IN_PATH) {
        return None;
    }
    let pairs: std::collections::HashMap<String, String> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    Some((pairs.get("namespace")?.clone(), pairs.get("name")?.clone()))
}

async fn login_page(State(state): State<ApiState>, Query(query): Query<LoginQuery>) -> Markup {
    let notebook = query.next.as_deref().and_then(notebook_signing_in);
    page(
        &state.base_path,
        "Sign in",
        None,
        login_main(notebook),
        Some("login.js"),
    )
}

fn login_main(notebook: Option<(String, String)>) -> Markup {
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

async fn notebooks_page(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<NamespaceQuery>,
) -> Response {
    let Some(user) = state.access.identify(&headers).await else {
        return to_login(&state.base_path);
    };
    let namespace = match chosen_namespace(&state, &user, query.ns).await {
        Ok(namespace) => namespace,
        Err(refused) => return refused,
    };
    page(
        &state.base_path,
        "Notebooks",
        Some(Viewer {
            user: &user,
            namespace: &namespace,
        }),
        notebooks_main(&namespace, &namespace_query(&user, &namespace)),
        Some("notebooks.js"),
    )
    .into_response()
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

/// The list of notebooks and volumes in `namespace`; `query` keeps it chosen in links.
fn notebooks_main(namespace: &str, query: &str) -> Markup {
    html! {
        div.title-row {
            h1 { "Notebooks in " code { (namespace) } }
            a.button href={ "new" (query) } { "New notebook" }
        }
        p.live #live aria-live="polite" { "Connecting…" }
        div.table-wrap {
            table #notebooks aria-describedby="live" {
                (column_headings(&[
                    "Name", "State", "Type", "Image", "CPU", "Memory", "GPU", "Last activity", "Actions",
                ]))
                tbody {}
            }
        }
        p.empty #empty hidden {
            "No notebooks yet. "
            a href={ "new" (query) } { "Create one" }
            " to get JupyterLab or VSCode in your browser."
        }
        h2 { "Volumes" }
        div.table-wrap {
            table #volumes {
                (column_headings(&["Name", "Mounted by", "Actions"]))
                tbody {}
            }
        }
        p.empty #volumes-empty hidden { "No volumes." }
        h2 { "Shared with me" }
        div.table-wrap {
            table #shared {
                (column_headings(&["Name", "Namespace", "State", "Actions"]))
                tbody {}
            }
        }
        p.empty #shared-empty hidden { "No one has shared a notebook with you." }
        section #members-section hidden {
            h2 { "Members of " code { (namespace) } }
            p.hint #members-owner {}
            ul #members {}
            form.inline #add-member novalidate hidden {
                label for="member-user" { "User" }
                input #member-user name="user" autocomplete="off";
                label for="member-role" { "Role" }
                select #member-role name="role" {
                    option value="edit" { "edit: create, start, stop, save and open" }
                    option value="view" { "view: see status, events and logs" }
                }
                button type="submit" { "Add member" }
            }
            p.error data-error-for="member" {}
        }
    }
}

#[derive(Deserialize, Default)]
struct NewQuery {
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    ns: Option<String>,
}

/// The saved images a spawner form offers: the namespace's own, and those other namespaces
/// shared with it.
#[derive(Clone, Copy, Default)]
struct SavedChoices<'a> {
    own: &'a [SavedImage],
    shared: &'a [SavedImage],
}

/// The image choices for `server_type`: the catalog's (its default selected unless an image is
/// preset; those `preparing` said so), then the user's saved images for that server, then those
/// shared with them.
fn image_options(
    config: &SpawnerConfig,
    choices: SavedChoices<'_>,
    preset_image: Option<&str>,
    preparing: &BTreeSet<String>,
    server_type: ServerType,
) -> Markup {
    let for_this_server = |images: &'_ [SavedImage]| -> Vec<SavedImage> {
        images
            .iter()
            .filter(|i| i.server_type.is_none_or(|t| t == server_type))
            .cloned()
            .collect()
    };
    let saved = for_this_server(choices.own);
    let shared = for_this_server(choices.shared);
    html! {
        optgroup label="Catalog" {
            @for image in config.images.iter().filter(|i| i.server_type == server_type) {
                option value=(image.image) selected[preset_image.is_none() && image.default] {
                    (image.image)
                    @if !image.description.is_empty() {
                        " — " (image.description)
                    }
                    @if preparing.contains(&image.image) {
                        " (being prepared)"
                    }
                }
            }
        }
        @if !saved.is_empty() {
            optgroup label="Your saved images" {
                @for image in &saved {
                    option value=(image.image) {
                        (image.image) " — saved from " (image.notebook)
                    }
                }
            }
        }
        @if !shared.is_empty() {
            optgroup label="Shared with you" {
                @for image in &shared {
                    option value=(image.image) {
                        (image.image) " — shared by " (image.namespace)
                    }
                }
            }
        }
    }
}

/// The image select for one server type (as the form's `serverType` values name it); only the
/// checked type's shows. `preparing`: its default image is not ready to run here yet.
fn image_select(server_type: &str, shown: bool, options: Markup, preparing: bool) -> Markup {
    let id = format!("image-{server_type}");
    html! {
        label for=(id) data-type=(server_type) hidden[!shown] { "Image" }
        select id=(id) name=(id) data-type=(server_type) hidden[!shown] { (options) }
        @if preparing {
            p.hint.preparing data-type=(server_type) hidden[!shown] {
                "This image is being prepared on this machine: a notebook made now starts once it is ready, in a few minutes."
            }
        }
    }
}

/// The custom image field where the admin allows one (holding `preset_image`), else only the
/// place where the image's error shows.
fn custom_image_field(config: &SpawnerConfig, preset_image: Option<&str>) -> Markup {
    html! {
        @if config.allow_custom_images {
            label for="customImage" {
                "Custom image " span.hint { "(instead of the list)" }
            }
            input
                #customImage
                name="customImage"
                placeholder="registry.example.com/team/image:tag"
                value=(preset_image.unwrap_or_default());
            p.error data-error-for="image" data-input="customImage" {}
        } @else {
            p.error data-error-for="image" {}
        }
    }
}

/// The GPU vendor and count, or a line saying there are none here.
fn gpu_fields(config: &SpawnerConfig) -> Markup {
    if config.gpu_vendors.is_empty() {
        return html! { p.hint { "No GPUs are available here." } };
    }
    html! {
        div.pair {
            div {
                label for="gpuVendor" { "GPU vendor" }
                select #gpuVendor name="gpuVendor" {
                    option value="" { "None" }
                    @for vendor in &config.gpu_vendors {
                        option value=(vendor.limits_key) { (vendor.name) }
                    }
                }
                p.error data-error-for="gpus.vendor" {}
            }
            div {
                label for="gpuCount" { "GPUs" }
                input
                    #gpuCount
                    name="gpuCount"
                    type="number"
                    min="0"
                    max=(config.defaults.max_gpus)
                    value="0";
                p.error data-error-for="gpus.count" {}
            }
        }
    }
}

/// The notebook's name, server type and image.
fn notebook_fields(
    config: &SpawnerConfig,
    saved: SavedChoices<'_>,
    preset_image: Option<&str>,
    preparing: &BTreeSet<String>,
) -> Markup {
    let options = |server_type| image_options(config, saved, preset_image, preparing, server_type);
    let being_prepared = |server_type| {
        config
            .default_image(server_type)
            .is_some_and(|image| preparing.contains(image))
    };
    // RStudio only where the catalog has an image for it.
    let offers_rstudio = config.default_image(ServerType::Rstudio).is_some();
    html! {
        fieldset {
            legend { "Notebook" }
            label for="name" { "Name" }
            input
                #name
                name="name"
                required
                maxlength="63"
                pattern=r"[a-z0-9]([a-z0-9\-]*[a-z0-9])?"
                autocomplete="off"
                aria-describedby="name-hint";
            p.hint #name-hint { "Lowercase letters, digits and '-'." }
            p.error data-error-for="name" data-input="name" {}
            span.label #type-label { "Server type" }
            div.radios role="radiogroup" aria-labelledby="type-label" {
                @for (value, label, server_type) in [("jupyter", "JupyterLab", ServerType::Jupyter), ("vscode", "VSCode", ServerType::Vscode)] {
                    (server_radio(value, label, value == "jupyter", being_prepared(server_type)))
                }
                @if offers_rstudio {
                    (server_radio("rstudio", "RStudio", false, being_prepared(ServerType::Rstudio)))
                }
            }
            (image_select("jupyter", true, options(ServerType::Jupyter), being_prepared(ServerType::Jupyter)))
            (image_select("vscode", false, options(ServerType::Vscode), being_prepared(ServerType::Vscode)))
            @if offers_rstudio {
                (image_select("rstudio", false, options(ServerType::Rstudio), being_prepared(ServerType::Rstudio)))
            }
            (custom_image_field(config, preset_image))
            label for="imagePullPolicy" { "Image pull policy" }
            select #imagePullPolicy name="imagePullPolicy" {
                option selected { "IfNotPresent" }
                option { "Always" }
                option { "Never" }
            }
            p.error data-error-for="imagePullPolicy" {}
        }
    }
}

/// One server type's radio button; `preparing`: its default image is not ready here yet.
fn server_radio(value: &str, label: &str, checked: bool, preparing: bool) -> Markup {
    html! {
        label {
            input type="radio" name="serverType" value=(value) checked[checked];
            " " (label)
            @if preparing {
                " " span.hint { "(being prepared)" }
            }
        }
    }
}

/// CPU, memory, GPUs and shared memory, starting from the admin's defaults.
fn resource_fields(config: &SpawnerConfig) -> Markup {
    let d = &config.defaults;
    html! {
        fieldset {
            legend { "Resources" }
            (request_and_limit("cpu", "CPU", &d.cpu))
            (request_and_limit("memory", "Memory", &d.memory))
            p.hint #quota-use hidden {}
            (gpu_fields(config))
            label for="shmSize" { "Shared memory (/dev/shm)" }
            input #shmSize name="shmSize" value=(d.shm_size);
            p.error data-error-for="shmSize" {}
        }
    }
}

/// A resource's request, from the admin's default, beside its limit (`<field>Limit`), which is
/// the request unless set.
fn request_and_limit(field: &str, label: &str, request: &str) -> Markup {
    let limit = format!("{field}Limit");
    html! {
        div.pair {
            div {
                label for=(field) { (label) " request" }
                input id=(field) name=(field) value=(request);
                p.error data-error-for=(field) {}
            }
            div {
                label for=(limit) { (label) " limit" }
                input id=(limit) name=(limit) placeholder="same as request";
                p.error data-error-for=(limit) {}
            }
        }
    }
}

/// The workspace volume (new, existing or none) and the data volumes.
fn storage_fields(defaults: &crate::config::Defaults) -> Markup {
    html! {
        fieldset {
            legend { "Storage" }
            span.label #ws-label { "Workspace (/home/jovyan)" }
            div.radios role="radiogroup" aria-labelledby="ws-label" {
                label { input type="radio" name="workspace" value="new" checked; " New" }
                label { input type="radio" name="workspace" value="existing"; " Existing" }
                label { input type="radio" name="workspace" value="none"; " None" }
            }
            label for="workspaceSize" { "Size" }
            input #workspaceSize name="workspaceSize" value=(defaults.workspace_size);
            p.error data-error-for="workspace.size" {}
            label for="workspaceName" hidden { "Existing volume name" }
            input #workspaceName name="workspaceName" list="workspace-volumes" hidden;
            datalist #workspace-volumes {}
            p.error data-error-for="workspace.name" data-input="workspaceName" {}
            div #volumes {}
            button.secondary #add-volume type="button" { "Add a data volume" }
        }
    }
}

fn spawner_form(
    config: &SpawnerConfig,
    saved: SavedChoices<'_>,
    preset_image: Option<&str>,
    preparing: &BTreeSet<String>,
) -> Markup {
    html! {
        form.card #spawner novalidate {
            (notebook_fields(config, saved, preset_image, preparing))
            (resource_fields(config))
            (storage_fields(&config.defaults))
            fieldset {
                legend { "Environment" }
                label {
                    input #autoSave name="autoSave" type="checkbox" checked[config.defaults.auto_save];
                    " Save the environment before each stop, so installed packages survive stops and culling"
                }
            }
            fieldset {
                legend { "Environment variables" }
                div #envs {}
                button.secondary #add-env type="button" { "Add a variable" }
                p.error data-error-for="environment" {}
            }
            p.error #form-error role="alert" {}
            button #create type="submit" { "Create notebook" }
        }
    }
}

async fn new_page(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<NewQuery>,
) -> Response {
    let Some(user) = state.access.identify(&headers).await else {
        return to_login(&state.base_path);
    };
    let namespace = match chosen_namespace(&state, &user, query.ns).await {
        Ok(namespace) => namespace,
        Err(refused) => return refused,
    };
    let saved = state
        .backend
        .saved_images(&namespace)
        .await
        .unwrap_or_default();
    let shared = state
        .backend
        .images_shared_with(&namespace)
        .await
        .unwrap_or_default();
    page(
        &state.base_path,
        "New notebook",
        Some(Viewer {
            user: &user,
            namespace: &namespace,
        }),
        html! {
            h1 { "New notebook" }
            (spawner_form(
                &state.config,
                SavedChoices {
                    own: &saved,
                    shared: &shared,
                },
                query.image.as_deref(),
                &state.preparing.images(),
            ))
        },
        Some("new.js"),
    )
    .into_response()
}

async fn notebook_page(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    let Some(user) = state.access.identify(&headers).await else {
        return to_login(&state.base_path);
    };
    if let Err(refused) = notebook_for_page(&state, &user, Action::View, &ns, &name).await {
        return refused;
    }
    let connect = notebook_url(&state, &headers, &ns, &name);
    page(
        &state.base_path,
        &name,
        Some(Viewer {
            user: &user,
            namespace: &ns,
        }),
        notebook_main(&ns, &name, &connect),
        Some("notebook.js"),
    )
    .into_response()
}

/// Notebook `ns/name`, if `user` may do `action` to it (by their role in its namespace, or a
/// share), or the page that says why not. Who may not learns nothing of whether it exists.
async fn notebook_for_page(
    state: &ApiState,
    user: &User,
    action: Action,
    ns: &str,
    name: &str,
) -> Result<Notebook, Response> {
    let notebook = state.backend.get(ns, name).await.ok().flatten();
    let allowed = match &notebook {
        Some(notebook) => state.access.may_on(user, action, notebook).await,
        None => state.access.may(user, Verb::Get, Some(ns)).await,
    };
    let refusal = |status, title, message: String| {
        error_page(&state.base_path, status, title, &message, Some(user))
    };
    match notebook {
        _ if !allowed => Err(refusal(
            StatusCode::FORBIDDEN,
            "Not yours",
            match action {
                Action::Open => format!(
                    "{} may not open notebook {name} in namespace {ns}.",
                    user.name
                ),
                _ => format!(
                    "{} may not see notebook {name} in namespace {ns}.",
                    user.name
                ),
            },
        )),
        None => Err(refusal(
            StatusCode::NOT_FOUND,
            "No such notebook",
            format!("There is no notebook {name} in namespace {ns}."),
        )),
        Some(notebook) => Ok(notebook),
    }
}

/// A notebook's page: its state and actions, saving its environment, status, events and logs.
fn notebook_main(ns: &str, name: &str, connect: &str) -> Markup {
    html! {
        div.title-row #notebook data-ns=(ns) data-name=(name) {
            h1 { (name) " " span.state #state { "…" } }
            div.actions {
                a.button #connect href=(connect) target="_blank" rel="noopener" { "Connect" }
                button.secondary #toggle type="button" { "…" }
            }
        }
        p.hint #reason {}
        p.warning #memory-warning role="alert" hidden {
            "This notebook uses over 90 % of its memory limit: at the limit its kernel is stopped. "
            "Free memory, or stop it and start it with a higher limit."
        }
        section.card {
            h2 { "Save environment as image" }
            p.hint {
                "Packages you installed (pip, conda, apt) become one new image layer on the image "
                "this notebook runs. Your workspace is not part of it."
            }
            form.inline #save novalidate {
                label for="tag" { "Tag" }
                input #tag name="tag";
                button #save-button type="submit" { "Save environment" }
            }
            p.error data-error-for="tag" {}
            label {
                input #auto-save type="checkbox";
                " Save the environment before each stop (and start on it next time)"
            }
            div #save-progress hidden {
                progress #save-bar max="100" value="0" aria-label="Save progress" {}
                " "
                span #save-text aria-live="polite" {}
            }
            p.error #save-error role="alert" {}
            h3 { "Saved images" }
            div.table-wrap {
                table #images {
                    (column_headings(&["Image", "Layer", "Changes", "Saved", "Use"]))
                    tbody {}
                }
            }
            p.empty #images-empty { "No saved images yet." }
        }
        section.card #resources {
            h2 { "Resources" }
            p.hint { "A running notebook restarts with the new amounts; its workspace stays. A limit that was equal to its request follows it." }
            form.inline #resize novalidate {
                div {
                    label for="resize-cpu" { "CPU" }
                    input #resize-cpu name="cpu" size="6";
                    p.error data-error-for="cpu" {}
                }
                div {
                    label for="resize-memory" { "Memory" }
                    input #resize-memory name="memory" size="7";
                    p.error data-error-for="memory" {}
                }
                button #resize-button type="submit" { "Resize" }
            }
            p.error #resize-error role="alert" {}
            p.hint #quota-use hidden {}
        }
        section.card #sharing {
            h2 { "Share" }
            p.warning {
                "Whoever you share this notebook with opens it as you: they work as its owner, "
                "with its environment variables, secrets and files, and can do all you can there."
            }
            form.inline #share novalidate {
                label for="share-user" { "User" }
                input #share-user name="user" autocomplete="off";
                button #share-button type="submit" { "Share" }
            }
            p.error data-error-for="user" {}
            ul #shares {}
        }
        section.card #ports-card {
            h2 { "Ports" }
            p.hint {
                "A web app you start in this notebook (Dash, Streamlit, TensorBoard, "
                code { "python3 -m http.server 8050" } ") is served at an address of its own. "
                "Only those who may open this notebook can open it, unless you share it."
            }
            table #ports {
                thead { tr { th { "Port" } th { "Address" } th { "Open to" } th { "Use" } } }
                tbody {}
            }
            p.hint #ports-empty { "Nothing listens in this notebook besides its own server." }
            p.error #ports-error role="alert" {}
        }
        section.card {
            h2 { "Status" }
            dl #details {}
            h3 { "Conditions" }
            ul #conditions {}
        }
        section.card {
            h2 { "Events" }
            div.table-wrap {
                table #events {
                    (column_headings(&["Time", "Type", "Reason", "Message"]))
                    tbody {}
                }
            }
        }
        section.card {
            h2 { "Logs" }
            label { input #follow type="checkbox" checked; " Follow" }
            pre #logs tabindex="0" aria-label="Container logs" {}
        }
    }
}

async fn admin_page(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let Some(user) = state.access.identify(&headers).await else {
        return to_login(&state.base_path);
    };
    if !user.admin {
        return error_page(
            &state.base_path,
            StatusCode::FORBIDDEN,
            "Admins only",
            "This page shows every user's notebooks; it is for admins.",
            Some(&user),
        );
    }
    page(
        &state.base_path,
        "Admin",
        Some(Viewer::from(&user)),
        admin_main(),
        Some("admin.js"),
    )
    .into_response()
}

/// Every user's notebooks, filtered and sorted by the page's script.
fn admin_main() -> Markup {
    const STATES: [&str; 5] = ["ready", "starting", "stopped", "culled", "error"];
    const SORTS: [(&str, &str); 7] = [
        ("activity", "Last activity"),
        ("cpuUsed", "CPU in use"),
        ("memoryUsed", "Memory in use"),
        ("cpu", "CPU limit"),
        ("memory", "Memory limit"),
        ("gpu", "GPUs held"),
        ("name", "Name"),
    ];
    const COLUMNS: [&str; 9] = [
        "Namespace",
        "Name",
        "Owner",
        "State",
        "Image",
        "CPU",
        "Memory",
        "GPU",
        "Last activity",
    ];
    html! {
        h1 { "All notebooks" }
        section.totals #totals aria-live="polite" {}
        form.inline #filters {
            div {
                label for="f-user" { "User" }
                input #f-user name="user";
            }
            div {
                label for="f-namespace" { "Namespace" }
                input #f-namespace name="namespace";
            }
            div {
                label for="f-state" { "State" }
                select #f-state name="state" {
                    option value="" { "Any" }
                    @for state in STATES {
                        option { (state) }
                    }
                }
            }
            div {
                label for="f-sort" { "Sort by" }
                select #f-sort name="sort" {
                    @for (value, label) in SORTS {
                        option value=(value) { (label) }
                    }
                }
            }
            div {
                label { input #f-idle-gpus type="checkbox" name="idleGpus"; " Idle but holding GPUs" }
            }
            button.secondary #bulk-stop type="button" disabled { "Stop selected" }
        }
        div.table-wrap {
            table #all {
                thead {
                    tr {
                        th scope="col" {
                            input #select-all type="checkbox" aria-label="Select all";
                        }
                        @for heading in COLUMNS {
                            th scope="col" { (heading) }
                        }
                    }
                }
                tbody {}
            }
        }
        p.empty #empty hidden { "No notebook matches." }
        section #namespaces-section hidden {
            h2 { "Namespaces" }
            div.table-wrap {
                table #namespaces {
                    (column_headings(&["Namespace", "Owner", "Members"]))
                    tbody {}
                }
            }
            form.inline #add-namespace novalidate {
                label for="ns-name" { "Team namespace" }
                input #ns-name name="name" autocomplete="off";
                label for="ns-owner" { "Owner" }
                input #ns-owner name="owner" autocomplete="off";
                button type="submit" { "Add namespace" }
            }
            p.error #namespace-error role="alert" {}
        }
        section #quotas-section {
            h2 { "Quotas" }
            p.hint { "What each namespace holds against its quota: CPU, memory and GPUs of its running notebooks, and the storage of all its volumes. Creates, starts and resizes past a quota are refused." }
            div.table-wrap {
                table #quotas {
                    (column_headings(&["Namespace", "CPU", "Memory", "GPUs", "Running notebooks", "Storage"]))
                    tbody {}
                }
            }
            form.inline #set-quota novalidate {
                div {
                    label for="q-namespace" { "Namespace" }
                    input #q-namespace name="namespace" list="quota-namespaces" autocomplete="off" required;
                    datalist #quota-namespaces {}
                }
                div {
                    label for="q-cpu" { "CPU" }
                    input #q-cpu name="cpu" placeholder="e.g. 4" size="6";
                }
                div {
                    label for="q-memory" { "Memory" }
                    input #q-memory name="memory" placeholder="e.g. 16Gi" size="7";
                }
                div {
                    label for="q-gpus" { "GPUs" }
                    input #q-gpus name="gpus" type="number" min="0" size="4";
                }
                div {
                    label for="q-notebooks" { "Running notebooks" }
                    input #q-notebooks name="notebooks" type="number" min="0" size="4";
                }
                div {
                    label for="q-storage" { "Storage" }
                    input #q-storage name="storage" placeholder="e.g. 100Gi" size="7";
                }
                button type="submit" { "Set quota" }
                button.secondary #clear-quota type="button" { "Remove quota" }
            }
            p.hint { "Empty fields are unlimited; setting a quota replaces the namespace's whole quota." }
            p.error #quota-error role="alert" {}
        }
        h2 { "Audit trail" }
        p.hint #audit-hint { "Every change and notebook sign-in, newest first (the newest 200; " code { "labforge audit" } " reads them all)." }
        form.inline #audit-filters {
            div {
                label for="a-user" { "Who" }
                input #a-user name="user";
            }
            div {
                label for="a-namespace" { "In namespace" }
                input #a-namespace name="namespace";
            }
        }
        div.table-wrap {
            table #audit {
                thead {
                    tr {
                        @for heading in ["When", "Who", "From", "What", "On", "Result"] {
                            th scope="col" { (heading) }
                        }
                    }
                }
                tbody {}
            }
        }
        p.empty #audit-empty hidden { "Nothing recorded yet." }
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

    #[test]
    fn the_form_says_which_catalog_images_are_being_prepared() {
        let config = crate::config::default_spawner("registry.local");
        let vscode = config
            .default_image(ServerType::Vscode)
            .expect("the default catalog has code-server")
            .to_owned();
        let ready =
            spawner_form(&config, SavedChoices::default(), None, &BTreeSet::new()).into_string();
        assert!(!ready.contains("being prepared"), "{ready}");
        let form = spawner_form(
            &config,
            SavedChoices::default(),
            None,
            &BTreeSet::from([vscode.clone()]),
        )
        .into_string();
        assert!(
            form.contains(r#"value="vscode"> VSCode <span class="hint">(being prepared)</span>"#),
            "{form}"
        );
        assert!(
            !form.contains(r#"JupyterLab <span class="hint">"#),
            "{form}"
        );
        let option = form
            .split(&format!(r#"<option value="{vscode}""#))
            .nth(1)
            .and_then(|rest| rest.split("</option>").next())
            .unwrap_or_else(|| panic!("no option for {vscode} in {form}"));
        assert!(option.ends_with(" (being prepared)"), "{option}");
        assert!(
            form.contains(r#"<p class="hint preparing" data-type="vscode" hidden>"#),
            "{form}"
        );
    }

    #[test]
    fn the_form_offers_the_catalog_and_only_available_gpus() {
        let mut config = crate::config::default_spawner("registry.local");
        let form =
            spawner_form(&config, SavedChoices::default(), None, &BTreeSet::new()).into_string();
        assert!(
            form.contains(r#"<option value="registry.local/labforge/jupyterlab:latest" selected>"#)
        );
        assert!(form.contains("No GPUs are available here."));
        config.gpu_vendors.push(crate::config::GpuVendor {
            limits_key: "nvidia.com/gpu".into(),
            name: "NVIDIA".into(),
            cdi_kind: None,
            smi: None,
        });
        config.allow_custom_images = false;
        let saved = crate::model::SavedImage {
            image: "registry.local/alice/lab:v1".into(),
            digest: "sha256:00".into(),
            notebook: "lab".into(),
            namespace: "alice".into(),
            base: String::new(),
            server_type: Some(crate::model::ServerType::Jupyter),
            layer_bytes: 1,
            files_changed: 1,
            files_deleted: 0,
            created: String::new(),
            summary: None,
            shared_with: Vec::new(),
        };
        let code = crate::model::SavedImage {
            image: "registry.local/alice/code:v1".into(),
            server_type: Some(crate::model::ServerType::Vscode),
            ..saved.clone()
        };
        let unknown = crate::model::SavedImage {
            image: "registry.local/alice/old:v1".into(),
            server_type: None,
            ..saved.clone()
        };
        let bobs = crate::model::SavedImage {
            image: "registry.local/bob/lab:v1".into(),
            namespace: "bob".into(),
            ..saved.clone()
        };
        let own = [saved, code, unknown];
        let choices = SavedChoices {
            own: &own,
            shared: std::slice::from_ref(&bobs),
        };
        let form = spawner_form(&config, choices, None, &BTreeSet::new()).into_string();
        assert!(form.contains(
            r#"<optgroup label="Shared with you"><option value="registry.local/bob/lab:v1">registry.local/bob/lab:v1 — shared by bob</option>"#
        ));
        assert!(form.contains(
            r#"<optgroup label="Your saved images"><option value="registry.local/alice/lab:v1">"#
        ));
        assert!(form.contains(r#"<option value="nvidia.com/gpu">NVIDIA</option>"#));
        assert!(!form.contains("customImage"));
        // Each select offers the saves of its server type, and those of unknown type.
        let select = |id: &str| {
            let start = form.find(&format!(r#"<select id="{id}""#)).unwrap();
            form[start..].split("</select>").next().unwrap().to_owned()
        };
        let (jupyter, vscode) = (select("image-jupyter"), select("image-vscode"));
        assert!(jupyter.contains("lab:v1") && !jupyter.contains("code:v1"));
        assert!(vscode.contains("code:v1") && !vscode.contains("lab:v1"));
        assert!(jupyter.contains("old:v1") && vscode.contains("old:v1"));
    }
}
