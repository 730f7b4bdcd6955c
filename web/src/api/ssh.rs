//! SSH into a notebook through the web app's one door: a websocket at
//! `/api/namespaces/{ns}/notebooks/{name}/ssh` carries one SSH connection, byte for byte, to
//! the SSH server the agent runs in the notebook's container ([`crate::workloads::Workloads::ssh`]).
//! `labforge ssh` speaks it, and `labforge ssh --stdio` hands it to OpenSSH as a
//! `ProxyCommand`.
//!
//! It is let in exactly like opening the notebook (its owner, an `edit` member, a user it is
//! shared with, an admin), with a session or an API token; no port is published. While it is
//! open, the traffic counts as the notebook's activity for culling, and the access is asked
//! again every few seconds: a revoked token, an ended session or a removed member closes it.

use crate::api::extract::NotebookPath;
use crate::api::{ApiResult, ApiState, Failure, SignedIn, state_of};
use crate::model::NotebookState;
use crate::namespaces::Action;
use crate::workloads::SshStream;
use axum::Router;
use axum::extract::ws::{
    Message, WebSocket, WebSocketUpgrade, rejection::WebSocketUpgradeRejection,
};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use futures::{SinkExt as _, StreamExt as _};
use labforge_proxy::activity::ActivityCell;
use labforge_proxy::routes::activity_key;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// How often an open connection's access is asked again.
const RECHECK: Duration = Duration::from_secs(5);

/// The routes, for [`crate::api::router`] to merge.
pub fn routes() -> Router<ApiState> {
    Router::new().route("/api/namespaces/{ns}/notebooks/{name}/ssh", get(ssh))
}

/// Why a notebook in `state` takes no SSH connection now, if it does not.
fn not_ready(ns: &str, name: &str, state: NotebookState, reason: &str) -> Option<String> {
    let why = match state {
        NotebookState::Ready => return None,
        NotebookState::Stopped | NotebookState::Culled => format!(
            "notebook {ns}/{name} is stopped: start it first (its Start button in the web \
             app), then connect"
        ),
        NotebookState::Starting => {
            format!("notebook {ns}/{name} is starting: connect when it is ready")
        }
        NotebookState::Stopping => format!("notebook {ns}/{name} is stopping"),
        NotebookState::Error => format!("notebook {ns}/{name} is not running: {reason}"),
    };
    Some(why)
}

/// Opens an SSH connection to a running notebook.
#[utoipa::path(
    get, path = "/api/namespaces/{ns}/notebooks/{name}/ssh",
    summary = "SSH into the notebook: a websocket carrying one SSH connection (labforge ssh)",
    params(NotebookPath),
    responses(
        (status = 101, description = "switched to a websocket; its binary messages are the SSH connection's bytes"),
        (status = 400, description = "not a websocket request", body = crate::openapi::ApiErrorBody),
        (status = 403, description = "the caller may not open this notebook", body = crate::openapi::ApiErrorBody),
        (status = 409, description = "the notebook is not running (stopped, starting, failed)", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn ssh(
    user: SignedIn,
    State(state): State<ApiState>,
    Path(NotebookPath { ns, name }): Path<NotebookPath>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    // Browsers send a session cookie with a websocket a page of any host of the site opens, a
    // notebook's page among them: only the app's own pages, and clients that are no browser's
    // page (the CLI), may open one, as for any change.
    if let Some(why) = crate::same_origin::other_origin(&axum::http::Method::POST, &headers) {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            format!("refused: {why}; SSH connections open only from labforge's own clients"),
        ));
    }
    let notebook = user.notebook(&state, Action::Open, &ns, &name).await?;
    let (notebook_state, reason) = state_of(&notebook);
    if let Some(refusal) = not_ready(&ns, &name, notebook_state, &reason) {
        return Err(Failure::new(StatusCode::CONFLICT, refusal));
    }
    let upgrade = upgrade.map_err(|_| {
        Failure::new(
            StatusCode::BAD_REQUEST,
            "this path carries SSH over a websocket: connect with `labforge ssh NS/NAME`, or \
             give OpenSSH `ProxyCommand labforge ssh --stdio NS/NAME`",
        )
    })?;
    let stream = state.workloads.ssh(&ns, &name).await?;
    let (_, activity) = state.activity.cell(&activity_key(&ns, &name));
    tracing::info!(user = %user.0.name, namespace = %ns, notebook = %name, "SSH connection opened");
    let still_allowed = move || {
        let (state, headers, ns, name) = (state.clone(), headers.clone(), ns.clone(), name.clone());
        async move {
            let Some(user) = state.access.identify(&headers).await else {
                return false;
            };
            SignedIn(user)
                .notebook(&state, Action::Open, &ns, &name)
                .await
                .is_ok()
        }
    };
    Ok(upgrade.on_upgrade(move |socket| carry(socket, stream, activity, still_allowed)))
}

/// Carries bytes between the websocket and the SSH server until either side ends, or the access
/// is taken away.
async fn carry<F, Fut>(
    socket: WebSocket,
    stream: SshStream,
    activity: Arc<ActivityCell>,
    still_allowed: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let (mut to_client, mut from_client) = socket.split();
    let (mut from_server, mut to_server) = tokio::io::split(stream);
    let upstream = async {
        while let Some(Ok(message)) = from_client.next().await {
            match message {
                Message::Binary(bytes) => {
                    activity.touch();
                    if to_server.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = to_server.shutdown().await;
    };
    let downstream = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match from_server.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let bytes = axum::body::Bytes::copy_from_slice(&buf[..n]);
                    if to_client.send(Message::Binary(bytes)).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to_client.close().await;
    };
    let watch = async {
        let mut every = tokio::time::interval(RECHECK);
        every.tick().await;
        loop {
            every.tick().await;
            if !still_allowed().await {
                tracing::info!("SSH connection closed: its access was taken away");
                return;
            }
        }
    };
    let ended_by_access = tokio::select! {
        () = upstream => false,
        () = downstream => false,
        () = watch => true,
    };
    if ended_by_access {
        // The client says why rather than only that the session ended.
        let frame = axum::extract::ws::CloseFrame {
            code: axum::extract::ws::close_code::POLICY,
            reason: ACCESS_ENDED.into(),
        };
        let _ = to_client.send(Message::Close(Some(frame))).await;
    }
}

/// The close reason of a connection whose access was taken away.
const ACCESS_ENDED: &str =
    "access to this notebook ended (token revoked or expired, signed out, or no longer allowed)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_ready_notebook_takes_ssh_and_the_refusal_says_why() {
        assert!(not_ready("alice", "nb", NotebookState::Ready, "").is_none());
        for (state, words) in [
            (NotebookState::Stopped, "is stopped: start it first"),
            (NotebookState::Culled, "is stopped"),
            (NotebookState::Starting, "is starting"),
            (NotebookState::Error, "not running: image missing"),
        ] {
            let why = not_ready("alice", "nb", state, "image missing").unwrap();
            assert!(why.contains(words), "{why}");
        }
    }
}
