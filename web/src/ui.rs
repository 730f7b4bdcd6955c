//! The web UI: pages rendered here (layout, navigation, the user menu, and the spawner form built
//! from the catalog), with small JavaScript modules in `web/ui/` that fill in live data from the
//! JSON API. Everything is compiled into the binary: no front-end build step, nothing to deploy
//! besides `labforge`.

use crate::api::ApiState;
use crate::base_path::BasePath;
use crate::config::SpawnerConfig;
use crate::model::{SavedImage, ServerType};
use crate::users::User;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use serde::Deserialize;

/// HTML-escapes text for element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = include_str!("../ui/style.css");

fn asset(name: &str) -> Option<(&'static str, &'static str)> {
    Some(match name {
        "style.css" => ("text/css; charset=utf-8", STYLE),
        "icon.svg" => ("image/svg+xml", include_str!("../ui/icon.svg")),
        "common.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../ui/common.js"),
        ),
        "login.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../ui/login.js"),
        ),
        "notebooks.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../ui/notebooks.js"),
        ),
        "new.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../ui/new.js"),
        ),
        "notebook.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../ui/notebook.js"),
        ),
        "admin.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../ui/admin.js"),
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
    main: &str,
    script: Option<&str>,
) -> Html<String> {
    let nav = match &viewer {
        Some(Viewer { user, namespace }) => {
            // Another namespace than the user's own stays chosen from page to page.
            let query = escape(&namespace_query(user, namespace));
            let admin = if user.admin {
                r#"<a href="admin">Admin</a>"#
            } else {
                ""
            };
            format!(
                r#"<nav aria-label="Main"><a href="./{query}">Notebooks</a><a href="new{query}">New notebook</a>{admin}</nav>
<details class="user-menu"><summary aria-label="User menu">{name}</summary>
<div><p>Namespace <code>{ns}</code>{role}</p><button type="button" id="logout">Sign out</button></div></details>"#,
                name = escape(&user.name),
                ns = escape(namespace),
                role = if user.admin { " · admin" } else { "" },
            )
        }
        None => String::new(),
    };
    let script_tag = script
        .map(|s| format!(r#"<script type="module" src="static/{s}"></script>"#))
        .unwrap_or_default();
    let body_data = viewer
        .map(|Viewer { user, namespace }| {
            format!(
                r#" data-user="{}" data-namespace="{}" data-own-namespace="{}" data-admin="{}" data-page="{}""#,
                escape(&user.name),
                escape(namespace),
                escape(&user.namespace),
                user.admin,
                escape(script.map_or("", |s| s.trim_end_matches(".js"))),
            )
        })
        .unwrap_or_default();
    Html(format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<base href="{base}"><title>{title} · labforge</title><link rel="icon" href="static/icon.svg" type="image/svg+xml">
<link rel="stylesheet" href="static/style.css"></head>
<body{body_data}><header><a class="brand" href="./">labforge</a>{nav}</header>
<main id="main">{main}</main>
<script type="module" src="static/common.js"></script>{script_tag}</body></html>"#,
        base = escape(base.as_str()),
        title = escape(title),
    ))
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
}

/// What is wrong with a notebook sign-in link, if anything: `return` must be a path below the
/// notebook's prefix, short and printable, and `state` the hex the proxy chose.
fn sign_in_link_problem(query: &NotebookSignInQuery) -> Option<String> {
    let prefix =
        labforge_notebook_controller::builders::route_prefix(&query.namespace, &query.name);
    let below_prefix = query
        .return_to
        .strip_prefix(&prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['/', '?']));
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
    if !state
        .access
        .may(&user, crate::backend::Verb::Get, Some(&query.namespace))
        .await
    {
        return error_page(
            &state.base_path,
            StatusCode::FORBIDDEN,
            "Not yours",
            &format!(
                "{} may not open notebooks in namespace {}.",
                user.name, query.namespace
            ),
            Some(&user),
        );
    }
    // Codes only for notebooks that exist: each grant is one per session and notebook.
    if !matches!(
        state.backend.get(&query.namespace, &query.name).await,
        Ok(Some(_))
    ) {
        return error_page(
            &state.base_path,
            StatusCode::NOT_FOUND,
            "No such notebook",
            &format!(
                "There is no notebook {} in namespace {}.",
                query.name, query.namespace
            ),
            Some(&user),
        );
    }
    let code = match sign_in.issue(
        session,
        &user.name,
        &query.namespace,
        &query.name,
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
    let origin = links.origin(&query.namespace, &query.name, host);
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

async fn login_page(State(state): State<ApiState>) -> Html<String> {
    page(
        &state.base_path,
        "Sign in",
        None,
        r#"<section class="card narrow"><h1>Sign in</h1>
<form id="login" novalidate>
<label for="username">User name</label><input id="username" name="username" autocomplete="username" required autofocus>
<label for="password">Password</label><input id="password" name="password" type="password" autocomplete="current-password" required>
<p class="error" id="login-error" role="alert"></p>
<button type="submit">Sign in</button></form>
<p class="hint">No account yet? Ask whoever runs labforge here to add you.</p></section>"#,
        Some("login.js"),
    )
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
        &format!(
            r#"<div class="title-row"><h1>Notebooks in <code>{ns}</code></h1><a class="button" href="new{query}">New notebook</a></div>
<p class="live" id="live" aria-live="polite">Connecting…</p>
<div class="table-wrap"><table id="notebooks" aria-describedby="live"><thead><tr>
<th scope="col">Name</th><th scope="col">State</th><th scope="col">Type</th><th scope="col">Image</th><th scope="col">CPU</th><th scope="col">Memory</th><th scope="col">GPU</th><th scope="col">Last activity</th><th scope="col">Actions</th>
</tr></thead><tbody></tbody></table></div>
<p class="empty" id="empty" hidden>No notebooks yet. <a href="new{query}">Create one</a> to get JupyterLab or VSCode in your browser.</p>
<h2>Volumes</h2>
<div class="table-wrap"><table id="volumes"><thead><tr>
<th scope="col">Name</th><th scope="col">Mounted by</th><th scope="col">Actions</th>
</tr></thead><tbody></tbody></table></div>
<p class="empty" id="volumes-empty" hidden>No volumes.</p>"#,
            ns = escape(&namespace),
            query = escape(&namespace_query(&user, &namespace)),
        ),
        Some("notebooks.js"),
    )
    .into_response()
}

#[derive(Deserialize, Default)]
struct NewQuery {
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    ns: Option<String>,
}

/// The image choices for `server_type`: the catalog's (its default selected unless an image is
/// preset), then the user's saved images for that server.
fn image_options(
    config: &SpawnerConfig,
    saved: &[SavedImage],
    preset_image: Option<&str>,
    server_type: ServerType,
) -> String {
    let saved_options: String = saved
        .iter()
        .filter(|i| i.server_type.is_none_or(|t| t == server_type))
        .map(|i| {
            format!(
                r#"<option value="{v}">{v} — saved from {nb}</option>"#,
                v = escape(&i.image),
                nb = escape(&i.notebook)
            )
        })
        .collect();
    let saved_group = if saved_options.is_empty() {
        String::new()
    } else {
        format!(r#"<optgroup label="Your saved images">{saved_options}</optgroup>"#)
    };
    let catalog: String = config
        .images
        .iter()
        .filter(|i| i.server_type == server_type)
        .map(|i| {
            let selected = if preset_image.is_none() && i.default {
                " selected"
            } else {
                ""
            };
            format!(
                r#"<option value="{v}"{selected}>{v}{d}</option>"#,
                v = escape(&i.image),
                d = if i.description.is_empty() {
                    String::new()
                } else {
                    format!(" — {}", escape(&i.description))
                }
            )
        })
        .collect();
    format!(r#"<optgroup label="Catalog">{catalog}</optgroup>{saved_group}"#)
}

/// The custom image field where the admin allows one (holding `preset_image`), else only the
/// place where the image's error shows.
fn custom_image_field(config: &SpawnerConfig, preset_image: Option<&str>) -> String {
    if config.allow_custom_images {
        format!(
            r#"<label for="customImage">Custom image <span class="hint">(instead of the list)</span></label>
<input id="customImage" name="customImage" placeholder="registry.example.com/team/image:tag" value="{}">
<p class="error" data-error-for="image" data-input="customImage"></p>"#,
            escape(preset_image.unwrap_or_default())
        )
    } else {
        r#"<p class="error" data-error-for="image"></p>"#.to_owned()
    }
}

/// The GPU vendor and count, or a line saying there are none here.
fn gpu_fields(config: &SpawnerConfig) -> String {
    if config.gpu_vendors.is_empty() {
        return r#"<p class="hint">No GPUs are available here.</p>"#.to_owned();
    }
    let vendors: String = config
        .gpu_vendors
        .iter()
        .map(|v| {
            format!(
                r#"<option value="{}">{}</option>"#,
                escape(&v.limits_key),
                escape(&v.name)
            )
        })
        .collect();
    format!(
        r#"<div class="pair"><div><label for="gpuVendor">GPU vendor</label><select id="gpuVendor" name="gpuVendor"><option value="">None</option>{vendors}</select>
<p class="error" data-error-for="gpus.vendor"></p></div>
<div><label for="gpuCount">GPUs</label><input id="gpuCount" name="gpuCount" type="number" min="0" max="{max}" value="0">
<p class="error" data-error-for="gpus.count"></p></div></div>"#,
        max = config.defaults.max_gpus
    )
}

fn spawner_form(
    config: &SpawnerConfig,
    saved: &[SavedImage],
    preset_image: Option<&str>,
) -> String {
    let options = |server_type| image_options(config, saved, preset_image, server_type);
    let custom = custom_image_field(config, preset_image);
    let gpus = gpu_fields(config);
    // RStudio only where the catalog has an image for it.
    let offers_rstudio = config.default_image(ServerType::Rstudio).is_some();
    let d = &config.defaults;
    format!(
        r#"<form id="spawner" class="card" novalidate>
<fieldset><legend>Notebook</legend>
<label for="name">Name</label>
<input id="name" name="name" required maxlength="63" pattern="[a-z0-9]([a-z0-9\-]*[a-z0-9])?" autocomplete="off" aria-describedby="name-hint">
<p class="hint" id="name-hint">Lowercase letters, digits and '-'.</p>
<p class="error" data-error-for="name" data-input="name"></p>
<span class="label" id="type-label">Server type</span>
<div class="radios" role="radiogroup" aria-labelledby="type-label">
<label><input type="radio" name="serverType" value="jupyter" checked> JupyterLab</label>
<label><input type="radio" name="serverType" value="vscode"> VSCode</label>{rstudio_radio}</div>
<label for="image-jupyter" data-type="jupyter">Image</label><select id="image-jupyter" name="image-jupyter" data-type="jupyter">{jupyter}</select>
<label for="image-vscode" data-type="vscode" hidden>Image</label><select id="image-vscode" name="image-vscode" data-type="vscode" hidden>{vscode}</select>
{rstudio_select}
{custom}
<label for="imagePullPolicy">Image pull policy</label><select id="imagePullPolicy" name="imagePullPolicy"><option selected>IfNotPresent</option><option>Always</option><option>Never</option></select>
<p class="error" data-error-for="imagePullPolicy"></p>
</fieldset>
<fieldset><legend>Resources</legend>
<div class="pair"><div><label for="cpu">CPU request</label><input id="cpu" name="cpu" value="{cpu}"><p class="error" data-error-for="cpu"></p></div>
<div><label for="cpuLimit">CPU limit</label><input id="cpuLimit" name="cpuLimit" placeholder="same as request"><p class="error" data-error-for="cpuLimit"></p></div></div>
<div class="pair"><div><label for="memory">Memory request</label><input id="memory" name="memory" value="{memory}"><p class="error" data-error-for="memory"></p></div>
<div><label for="memoryLimit">Memory limit</label><input id="memoryLimit" name="memoryLimit" placeholder="same as request"><p class="error" data-error-for="memoryLimit"></p></div></div>
{gpus}
<label for="shmSize">Shared memory (/dev/shm)</label><input id="shmSize" name="shmSize" value="{shm}"><p class="error" data-error-for="shmSize"></p>
</fieldset>
<fieldset><legend>Storage</legend>
<span class="label" id="ws-label">Workspace (/home/jovyan)</span>
<div class="radios" role="radiogroup" aria-labelledby="ws-label">
<label><input type="radio" name="workspace" value="new" checked> New</label>
<label><input type="radio" name="workspace" value="existing"> Existing</label>
<label><input type="radio" name="workspace" value="none"> None</label></div>
<label for="workspaceSize">Size</label><input id="workspaceSize" name="workspaceSize" value="{ws}"><p class="error" data-error-for="workspace.size"></p>
<label for="workspaceName" hidden>Existing volume name</label><input id="workspaceName" name="workspaceName" list="workspace-volumes" hidden><datalist id="workspace-volumes"></datalist><p class="error" data-error-for="workspace.name" data-input="workspaceName"></p>
<div id="volumes"></div>
<button type="button" class="secondary" id="add-volume">Add a data volume</button>
</fieldset>
<fieldset><legend>Environment</legend>
<label><input type="checkbox" id="autoSave" name="autoSave"{auto_save}> Save the environment before each stop, so installed packages survive stops and culling</label>
</fieldset>
<fieldset><legend>Environment variables</legend>
<div id="envs"></div>
<button type="button" class="secondary" id="add-env">Add a variable</button>
<p class="error" data-error-for="environment"></p>
</fieldset>
<p class="error" id="form-error" role="alert"></p>
<button type="submit" id="create">Create notebook</button>
</form>"#,
        jupyter = options(ServerType::Jupyter),
        vscode = options(ServerType::Vscode),
        rstudio_radio = if offers_rstudio {
            r#"
<label><input type="radio" name="serverType" value="rstudio"> RStudio</label>"#
        } else {
            ""
        },
        rstudio_select = if offers_rstudio {
            format!(
                r#"<label for="image-rstudio" data-type="rstudio" hidden>Image</label><select id="image-rstudio" name="image-rstudio" data-type="rstudio" hidden>{}</select>"#,
                options(ServerType::Rstudio)
            )
        } else {
            String::new()
        },
        cpu = escape(&d.cpu),
        memory = escape(&d.memory),
        shm = escape(&d.shm_size),
        ws = escape(&d.workspace_size),
        auto_save = if d.auto_save { " checked" } else { "" },
    )
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
    page(
        &state.base_path,
        "New notebook",
        Some(Viewer {
            user: &user,
            namespace: &namespace,
        }),
        &format!(
            "<h1>New notebook</h1>{}",
            spawner_form(
                &state.config,
                &state
                    .backend
                    .saved_images(&namespace)
                    .await
                    .unwrap_or_default(),
                query.image.as_deref()
            )
        ),
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
    if !state
        .access
        .may(&user, crate::backend::Verb::Get, Some(&ns))
        .await
    {
        return error_page(
            &state.base_path,
            StatusCode::FORBIDDEN,
            "Not yours",
            &format!("{} may not open notebooks in namespace {ns}.", user.name),
            Some(&user),
        );
    }
    if !matches!(state.backend.get(&ns, &name).await, Ok(Some(_))) {
        return error_page(
            &state.base_path,
            StatusCode::NOT_FOUND,
            "No such notebook",
            &format!("There is no notebook {name} in namespace {ns}."),
            Some(&user),
        );
    }
    let connect = escape(&notebook_url(&state, &headers, &ns, &name));
    page(
        &state.base_path,
        &name,
        Some(Viewer {
            user: &user,
            namespace: &ns,
        }),
        &format!(
            r#"<div class="title-row" data-ns="{ns}" data-name="{name}" id="notebook"><h1>{name} <span class="state" id="state">…</span></h1>
<div class="actions"><a class="button" id="connect" href="{connect}" target="_blank" rel="noopener">Connect</a>
<button type="button" class="secondary" id="toggle">…</button></div></div>
<p id="reason" class="hint"></p>
<p class="warning" id="memory-warning" role="alert" hidden>This notebook uses over 90 % of its memory limit: at the limit its kernel is stopped. Free memory, or stop it and start it with a higher limit.</p>
<section class="card"><h2>Save environment as image</h2>
<p class="hint">Packages you installed (pip, conda, apt) become one new image layer on the image this notebook runs. Your workspace is not part of it.</p>
<form id="save" class="inline" novalidate><label for="tag">Tag</label><input id="tag" name="tag">
<button type="submit" id="save-button">Save environment</button></form>
<p class="error" data-error-for="tag"></p>
<label><input type="checkbox" id="auto-save"> Save the environment before each stop (and start on it next time)</label>
<div id="save-progress" hidden><progress id="save-bar" max="100" value="0" aria-label="Save progress"></progress> <span id="save-text" aria-live="polite"></span></div>
<p class="error" id="save-error" role="alert"></p>
<h3>Saved images</h3><div class="table-wrap"><table id="images"><thead><tr><th scope="col">Image</th><th scope="col">Digest</th><th scope="col">Layer</th><th scope="col">Changes</th><th scope="col">Saved</th><th scope="col">Use</th></tr></thead><tbody></tbody></table></div>
<p class="empty" id="images-empty">No saved images yet.</p></section>
<section class="card"><h2>Status</h2><dl id="details"></dl><h3>Conditions</h3><ul id="conditions"></ul></section>
<section class="card"><h2>Events</h2><div class="table-wrap"><table id="events"><thead><tr><th scope="col">Time</th><th scope="col">Type</th><th scope="col">Reason</th><th scope="col">Message</th></tr></thead><tbody></tbody></table></div></section>
<section class="card"><h2>Logs</h2><label><input type="checkbox" id="follow" checked> Follow</label><pre id="logs" tabindex="0" aria-label="Container logs"></pre></section>"#,
            ns = escape(&ns),
            name = escape(&name)
        ),
        Some("notebook.js"),
    )
    .into_response()
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
        r#"<h1>All notebooks</h1>
<section class="totals" id="totals" aria-live="polite"></section>
<form id="filters" class="inline"><div><label for="f-user">User</label><input id="f-user" name="user"></div>
<div><label for="f-namespace">Namespace</label><input id="f-namespace" name="namespace"></div>
<div><label for="f-state">State</label><select id="f-state" name="state"><option value="">Any</option><option>ready</option><option>starting</option><option>stopped</option><option>culled</option><option>error</option></select></div>
<div><label for="f-sort">Sort by</label><select id="f-sort" name="sort"><option value="activity">Last activity</option><option value="cpuUsed">CPU in use</option><option value="memoryUsed">Memory in use</option><option value="cpu">CPU limit</option><option value="memory">Memory limit</option><option value="gpu">GPUs held</option><option value="name">Name</option></select></div>
<div><label><input type="checkbox" id="f-idle-gpus" name="idleGpus"> Idle but holding GPUs</label></div>
<button type="button" class="secondary" id="bulk-stop" disabled>Stop selected</button></form>
<div class="table-wrap"><table id="all"><thead><tr><th scope="col"><input type="checkbox" id="select-all" aria-label="Select all"></th><th scope="col">Namespace</th><th scope="col">Name</th><th scope="col">Owner</th><th scope="col">State</th><th scope="col">Image</th><th scope="col">CPU</th><th scope="col">Memory</th><th scope="col">GPU</th><th scope="col">Last activity</th></tr></thead><tbody></tbody></table></div>
<p class="empty" id="empty" hidden>No notebook matches.</p>"#,
        Some("admin.js"),
    )
    .into_response()
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
            &format!(
                r#"<section class="card narrow"><h1>{}</h1><p>{}</p><p><a href="./">Back to your notebooks</a></p></section>"#,
                escape(title),
                escape(message)
            ),
            None,
        ),
    )
        .into_response()
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
        .merge(router(state))
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
    fn a_sign_in_link_returns_below_its_notebook_with_the_proxys_state() {
        let link = |return_to: &str, state: &str| NotebookSignInQuery {
            namespace: "alice".into(),
            name: "lab".into(),
            state: state.into(),
            return_to: return_to.into(),
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
    }

    #[test]
    fn text_cannot_break_out_of_markup() {
        assert_eq!(
            escape(r#"<img src=x onerror="a">&'"#),
            "&lt;img src=x onerror=&quot;a&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn the_form_offers_the_catalog_and_only_available_gpus() {
        let mut config = crate::config::default_spawner("registry.local");
        let form = spawner_form(&config, &[], None);
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
        let form = spawner_form(&config, &[saved, code, unknown], None);
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
