//! The notebooks list and one notebook's page.

use super::{
    NamespaceQuery, Viewer, chosen_namespace, column_headings, error_page, namespace_query,
    notebook_url, page, to_login,
};
use crate::api::ApiState;
use crate::backend::Verb;
use crate::namespaces::Action;
use crate::users::User;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use labforge_crds::notebook::Notebook;
use maud::{Markup, html};

pub(super) async fn notebooks_page(
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

/// The list of notebooks and volumes in `namespace`; `query` keeps it chosen in links.
pub(super) fn notebooks_main(namespace: &str, query: &str) -> Markup {
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

pub(super) async fn notebook_page(
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
pub(super) async fn notebook_for_page(
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
pub(super) fn notebook_main(ns: &str, name: &str, connect: &str) -> Markup {
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
