//! The admin page: every user's notebooks, namespaces, quotas and the audit trail.

use super::{Viewer, column_headings, error_page, page, to_login};
use crate::api::ApiState;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

pub(super) async fn admin_page(State(state): State<ApiState>, headers: HeaderMap) -> Response {
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
pub(super) fn admin_main() -> Markup {
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
