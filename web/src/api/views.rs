//! A notebook as the API shows it: its state and why, its GPUs, where a browser opens it.

use crate::model::{
    AUTO_SAVE_ANNOTATION, GpuView, NotebookState, NotebookView, SERVER_TYPE_ANNOTATION, ServerType,
};
use axum::http::{HeaderMap, header};
use labforge_crds::notebook::{CREATOR_ANNOTATION, LAST_ACTIVITY_ANNOTATION, Notebook};
use labforge_notebook_controller::builders::route_prefix;
use labforge_proxy::routes::activity_key;
use std::collections::BTreeMap;

use super::{ApiState, STOPPED_BY_ANNOTATION};

/// Why a starting notebook is not ready when nothing more is known yet.
pub const WAITING_TO_START: &str = "waiting for the notebook server to start";

/// Where the notebook is, as users see it, and why when that needs saying.
pub fn state_of(notebook: &Notebook) -> (NotebookState, String) {
    let status = notebook.status.as_ref();
    let waiting = status.and_then(|s| s.container_state.waiting.as_ref());
    if notebook.is_stopped() {
        if status.is_some_and(|s| s.container_state.running.is_some()) {
            (NotebookState::Stopping, String::new())
        } else if notebook.annotation(STOPPED_BY_ANNOTATION) == Some("culler") {
            (NotebookState::Culled, "stopped after being idle".to_owned())
        } else {
            (NotebookState::Stopped, String::new())
        }
    } else if status.is_some_and(|s| s.ready_replicas > 0) {
        (NotebookState::Ready, String::new())
    } else if let Some(waiting) = waiting
        && matches!(
            waiting.reason.as_deref(),
            Some("ErrImagePull" | "FailedCreate" | "InvalidSpec" | "Unschedulable")
        )
    {
        (
            NotebookState::Error,
            waiting.message.clone().unwrap_or_default(),
        )
    } else {
        // Why it is not ready yet: the container's waiting reason, or what its server answered.
        let not_ready = status
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .and_then(|c| c.message.clone());
        // Before the runtime or controller has said anything (just made, or started), as
        // Kubeflow's web app says it: a starting notebook always has a reason.
        (
            NotebookState::Starting,
            waiting
                .and_then(|w| w.message.clone())
                .or(not_ready)
                .filter(|reason| !reason.is_empty())
                .unwrap_or_else(|| WAITING_TO_START.to_owned()),
        )
    }
}

/// The devices in `limits`: extended resources (`vendor/name`), each named by the spawner's
/// vendor name where it has one.
pub(crate) fn gpu_view(
    limits: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    vendors: &[crate::config::GpuVendor],
) -> GpuView {
    let mut view = GpuView::default();
    let mut parts = Vec::new();
    for (key, count) in limits.into_iter().flatten() {
        let Some(count) = count.0.parse::<u32>().ok().filter(|_| key.contains('/')) else {
            continue;
        };
        let name = vendors
            .iter()
            .find(|v| v.limits_key == *key)
            .map_or(key.as_str(), |v| v.name.as_str());
        if view.vendor.is_empty() {
            view.vendor = key.clone();
        }
        view.count += count;
        parts.push(format!("{count} {name}"));
    }
    view.message = parts.join(", ");
    view
}

/// The whole address a browser opens notebook `ns/name` at, as this request reached the web
/// app: its scheme (the auth proxy's `X-Forwarded-Proto`, else TLS or not) and port, on the
/// notebook's own host or the app's.
pub(crate) fn address_of(
    state: &ApiState,
    headers: &HeaderMap,
    ns: &str,
    name: &str,
) -> Option<String> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .filter(|p| matches!(*p, "http" | "https"))
        .unwrap_or(if state.secure_cookies {
            "https"
        } else {
            "http"
        });
    let path = format!("{}/", route_prefix(ns, name));
    Some(match &state.notebook_links {
        Some(links) => format!("{scheme}:{}{path}", links.origin(ns, name, Some(host))),
        None => format!("{scheme}://{host}{path}"),
    })
}

/// [`view`] with the address the request's client opens it at.
pub(crate) fn view_for(notebook: &Notebook, api: &ApiState, headers: &HeaderMap) -> NotebookView {
    let mut seen = view(notebook, api);
    seen.address = address_of(api, headers, &seen.namespace, &seen.name);
    seen
}

/// The notebook as users see it.
pub fn view(notebook: &Notebook, api: &ApiState) -> NotebookView {
    let activity = &api.activity;
    let namespace = notebook.metadata.namespace.clone().unwrap_or_default();
    let name = notebook.metadata.name.clone().unwrap_or_default();
    let container = notebook.container();
    let resources = container.and_then(|c| c.resources.as_ref());
    let quantity = |limits: bool, key: &str| {
        resources
            .and_then(|r| {
                if limits {
                    r.limits.as_ref()
                } else {
                    r.requests.as_ref()
                }
            })
            .and_then(|m| m.get(key))
            .map(|q| q.0.clone())
            .unwrap_or_default()
    };
    let gpus = gpu_view(
        resources.and_then(|r| r.limits.as_ref()),
        &api.config.gpu_vendors,
    );
    let (state, reason) = state_of(notebook);
    let stored_activity = notebook
        .annotation(LAST_ACTIVITY_ANNOTATION)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let seen = activity.get(&activity_key(&namespace, &name));
    let last_activity = stored_activity.max(seen).map(|t| t.to_string());
    NotebookView {
        owner: notebook
            .annotation(CREATOR_ANNOTATION)
            .unwrap_or_default()
            .to_owned(),
        server_type: ServerType::from_annotation(notebook.annotation(SERVER_TYPE_ANNOTATION)),
        image: container.and_then(|c| c.image.clone()).unwrap_or_default(),
        cpu: quantity(false, "cpu"),
        cpu_limit: quantity(true, "cpu"),
        memory: quantity(false, "memory"),
        memory_limit: quantity(true, "memory"),
        gpus,
        state,
        reason,
        last_activity,
        created: notebook
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string()),
        url: format!("{}/", route_prefix(&namespace, &name)),
        host: api
            .notebook_links
            .as_ref()
            .map(|links| labforge_crds::host::notebook_host(&namespace, &name, &links.domain)),
        address: None,
        auto_save: notebook.annotation(AUTO_SAVE_ANNOTATION) == Some("true"),
        shared_with: notebook
            .shared_with()
            .into_iter()
            .map(String::from)
            .collect(),
        resource_version: notebook
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default(),
        // Only a ready notebook's: a sample taken before a stop or restart is not shown after it.
        usage: api
            .usage
            .as_ref()
            .filter(|_| state == NotebookState::Ready)
            .and_then(|board| board.get(&namespace, &name))
            .map(|usage| {
                let limit = labforge_crds::quantity::value(&quantity(true, "memory"))
                    .ok()
                    .filter(|bytes| *bytes > 0.0);
                usage.within(limit.map(|bytes| bytes as u64))
            }),
        name,
        namespace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_starting_notebook_always_says_why() {
        let made = Notebook::new("lab", labforge_crds::notebook::NotebookSpec::default());
        assert_eq!(
            state_of(&made),
            (NotebookState::Starting, WAITING_TO_START.to_owned())
        );
    }
}
