//! A notebook's ports: list those something listens on, and change whom each is shared with.

use crate::api::extract::NotebookPath;
use crate::api::{ApiResult, ApiState, Failure, SignedIn, state_of};
use crate::model::NotebookState;
use crate::namespaces::Action;
use crate::ports::{PORT_SHARING_ANNOTATION, PortSharing, port_sharings};
use crate::workloads::AgentCommand;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt as _;

/// The routes, for [`crate::api::router`] to merge.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route(
            "/api/namespaces/{ns}/notebooks/{name}/ports",
            get(list_ports),
        )
        .route(
            "/api/namespaces/{ns}/notebooks/{name}/ports/{port}",
            put(share_port),
        )
}

/// A port something listens on in a notebook, as the API lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListenedPort {
    pub port: u16,
    pub sharing: PortSharing,
    /// Where a browser opens it.
    pub address: String,
}

/// The ports of a notebook.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Ports {
    pub ports: Vec<ListenedPort>,
}

/// Lists the ports something listens on in the running notebook (its own server's left out),
/// with their sharing and the address a browser opens.
#[utoipa::path(
    get, path = "/api/namespaces/{ns}/notebooks/{name}/ports",
    summary = "The ports something listens on in the notebook, each at a host of its own",
    params(NotebookPath),
    responses(
        (status = 200, description = "the ports", body = Ports),
        (status = 403, description = "the caller may not open this notebook", body = crate::openapi::ApiErrorBody),
        (status = 409, description = "the notebook is not running", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn list_ports(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(NotebookPath { ns, name }): Path<NotebookPath>,
    headers: HeaderMap,
) -> ApiResult<Json<Ports>> {
    let notebook = user.notebook(&state, Action::Open, &ns, &name).await?;
    // Ports are served by `labforge up`'s proxy, which signs visitors in on each host itself.
    let links = state
        .notebook_links
        .as_ref()
        .filter(|links| links.sign_in.is_some())
        .ok_or_else(|| {
            Failure::new(
                StatusCode::NOT_IMPLEMENTED,
                "ports of notebooks are served by labforge up only, not in a cluster yet: use \
                 `labforge ssh NS/NAME` with `ssh -L` there",
            )
        })?;
    if state_of(&notebook).0 != NotebookState::Ready {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            format!("notebook {ns}/{name} is not running: start it to see its ports"),
        ));
    }
    let mut stream = state
        .workloads
        .agent(&ns, &name, AgentCommand::Ports)
        .await?;
    let mut out = String::new();
    let listening = match stream.read_to_string(&mut out).await {
        Ok(_) => serde_json::from_str::<Vec<u16>>(out.trim()).ok(),
        Err(_) => None,
    };
    let listening = listening.ok_or_else(|| {
        Failure::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the agent in notebook {ns}/{name} listed no ports (is it running?)"),
        )
    })?;
    let own = u16::try_from(labforge_notebook_controller::builders::container_port(
        &notebook,
    ))
    .ok();
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok());
    let scheme = if state.secure_cookies {
        "https"
    } else {
        "http"
    };
    let sharings = port_sharings(&notebook);
    let ports = listening
        .into_iter()
        .filter(|port| Some(*port) != own)
        .map(|port| ListenedPort {
            port,
            sharing: sharings.get(&port).copied().unwrap_or_default(),
            address: format!("{scheme}:{}/", links.port_origin(&ns, &name, port, host)),
        })
        .collect();
    Ok(Json(Ports { ports }))
}

/// Whom a port is open to.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SharePort {
    pub sharing: PortSharing,
}

/// Sets whom a port is open to: those who may open the notebook (`private`, the default), the
/// namespace's members (`namespace`), or every signed-in user (`all`). Those who may change the
/// notebook decide.
#[utoipa::path(
    put, path = "/api/namespaces/{ns}/notebooks/{name}/ports/{port}",
    summary = "Share a notebook's port with its namespace or every signed-in user, or make it private again",
    params(NotebookPath, ("port" = String, Path)),
    request_body = SharePort,
    responses(
        (status = 200, description = "the port's sharing now", body = SharePort),
        (status = 403, description = "not allowed to change the notebook", body = crate::openapi::ApiErrorBody),
        (status = 422, description = "not a port, or no such sharing", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn share_port(
    user: SignedIn,
    State(state): State<ApiState>,
    Path((ns, name, port)): Path<(String, String, String)>,
    body: Result<Json<SharePort>, JsonRejection>,
) -> ApiResult<Json<SharePort>> {
    let port = port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
        Failure::for_field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "port",
            format!("{port:?} is not a TCP port (1 to 65535)"),
        )
    })?;
    let Json(SharePort { sharing }) = body.map_err(|_| {
        Failure::for_field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "sharing",
            "sharing is one of \"private\", \"namespace\" and \"all\"".into(),
        )
    })?;
    user.notebook(&state, Action::Change, &ns, &name).await?;
    state
        .backend
        .update(&ns, &name, &|notebook| {
            let mut sharings = port_sharings(notebook);
            if sharing == PortSharing::Private {
                sharings.remove(&port);
            } else {
                sharings.insert(port, sharing);
            }
            let annotations = notebook.metadata.annotations.get_or_insert_default();
            if sharings.is_empty() {
                annotations.remove(PORT_SHARING_ANNOTATION);
            } else {
                let json = serde_json::to_string(&sharings).unwrap_or_default();
                annotations.insert(PORT_SHARING_ANNOTATION.into(), json);
            }
        })
        .await?;
    Ok(Json(SharePort { sharing }))
}
