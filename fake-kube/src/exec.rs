//! `pods/<name>/exec`: the API server's half of `kubectl exec`, with a runner the test sets doing
//! the kubelet's half (a real podman container stands in for the pod's container).
//!
//! The wire protocol is Kubernetes' remotecommand over a websocket: `v5.channel.k8s.io` (or
//! `v4`), binary frames whose first byte is the channel (0 stdin, 1 stdout, 2 stderr, 3 the final
//! `Status`, 255 "close this channel", v5 only), the process's output before its status.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_util::io::ReaderStream;

use super::http::App;
use super::status::ApiError;
use super::store::Target;

/// What a client asked to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecRequest {
    pub namespace: String,
    pub pod: String,
    pub container: Option<String>,
    pub command: Vec<String>,
}

/// Turns an exec into a process on this machine; `None` refuses it (as a kubelet would when the
/// container is not running).
pub(crate) type ExecRunner = dyn Fn(&ExecRequest) -> Option<std::process::Command> + Send + Sync;

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
const CLOSE: u8 = 255;

/// Answers `GET|POST /api/v1/namespaces/{namespace}/pods/{pod}/exec?…`.
pub(crate) fn serve(
    app: &App,
    namespace: &str,
    pod: &str,
    uri: &Uri,
    request: &mut axum::extract::Request,
) -> Result<Response, ApiError> {
    let store = &app.store;
    let catalog = &store.schemas().catalog;
    let pods = catalog
        .by_plural("", "v1", "pods")
        .ok_or_else(ApiError::path_not_found)?;
    store.get(
        Target {
            resource: pods,
            version: "v1",
            namespace: Some(namespace),
        },
        pod,
    )?;
    let mut exec = ExecRequest {
        namespace: namespace.to_owned(),
        pod: pod.to_owned(),
        container: None,
        command: Vec::new(),
    };
    let mut stdin = false;
    for (key, value) in form_pairs(uri) {
        match key.as_str() {
            "command" => exec.command.push(value),
            "container" => exec.container = Some(value),
            "stdin" => stdin = value == "true",
            _ => {}
        }
    }
    if exec.command.is_empty() {
        return Err(ApiError::bad_request(
            "you must specify at least 1 command".into(),
        ));
    }
    let protocol = chosen_protocol(request.headers()).ok_or_else(|| {
        ApiError::bad_request(
            "exec needs a websocket upgrade offering v5.channel.k8s.io or v4.channel.k8s.io".into(),
        )
    })?;
    let key = request
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| ApiError::bad_request("no Sec-WebSocket-Key".into()))?
        .as_bytes()
        .to_vec();
    let runner = app
        .exec_runner
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
        .ok_or_else(|| ApiError::bad_request("this fake API server runs no exec".into()))?;
    let command = runner(&exec).ok_or_else(|| {
        ApiError::bad_request(format!(
            "container {:?} of pod {pod} is not running",
            exec.container
        ))
    })?;
    let upgrade = hyper::upgrade::on(request);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let socket =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None)
                        .await;
                run(socket, command, stdin).await;
            }
            Err(err) => tracing::warn!(error = %err, "exec upgrade"),
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&derive_accept_key(&key))
            .map_err(|_| ApiError::bad_request("bad Sec-WebSocket-Key".into()))?,
    );
    headers.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(protocol),
    );
    Ok(response.into_response())
}

/// Query pairs in order, repeated keys kept (`command` repeats once per argument).
fn form_pairs(uri: &Uri) -> Vec<(String, String)> {
    axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri)
        .map(|axum::extract::Query(pairs)| pairs)
        .unwrap_or_default()
}

fn chosen_protocol(headers: &HeaderMap) -> Option<&'static str> {
    let upgrade = headers.get(header::UPGRADE).and_then(|v| v.to_str().ok())?;
    if !upgrade.eq_ignore_ascii_case("websocket") {
        return None;
    }
    let offered: Vec<&str> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    ["v5.channel.k8s.io", "v4.channel.k8s.io"]
        .into_iter()
        .find(|p| offered.contains(p))
}

/// Runs `command` with the socket as its standard streams, then sends its exit as a `Status`.
async fn run(
    socket: WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>,
    command: std::process::Command,
    want_stdin: bool,
) {
    let (mut sink, mut incoming) = socket.split();
    let mut command = tokio::process::Command::from(command);
    command
        .stdin(if want_stdin {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => {
            let _ = sink
                .send(frame(STATUS, &failure(&format!("starting: {err}"), None)))
                .await;
            return;
        }
    };
    let stdin = child.stdin.take();
    let stdin_pump = tokio::spawn(async move {
        let Some(mut stdin) = stdin else { return };
        while let Some(Ok(message)) = incoming.next().await {
            match message {
                Message::Binary(data) => match data.first() {
                    Some(&STDIN) if stdin.write_all(&data[1..]).await.is_err() => return,
                    Some(&CLOSE) if data.get(1) == Some(&STDIN) => return,
                    _ => {}
                },
                Message::Close(_) => return,
                _ => {}
            }
        }
    });
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return;
    };
    let mut output = futures::stream::select(
        ReaderStream::with_capacity(stdout, 256 * 1024).map(|chunk| (STDOUT, chunk)),
        ReaderStream::new(stderr).map(|chunk| (STDERR, chunk)),
    );
    while let Some((channel, chunk)) = output.next().await {
        let Ok(chunk) = chunk else { break };
        let mut data = Vec::with_capacity(chunk.len() + 1);
        data.push(channel);
        data.extend_from_slice(&chunk);
        if sink.send(Message::binary(data)).await.is_err() {
            // The client went away: so does the process (kill on drop).
            stdin_pump.abort();
            return;
        }
    }
    let status = match child.wait().await {
        Ok(exit) if exit.success() => json!({"metadata": {}, "status": "Success"}),
        Ok(exit) => failure(
            &format!("command terminated with non-zero exit code: {exit}"),
            exit.code(),
        ),
        Err(err) => failure(&err.to_string(), None),
    };
    stdin_pump.abort();
    let _ = sink.send(frame(STATUS, &status)).await;
    let _ = sink.close().await;
}

fn failure(message: &str, code: Option<i32>) -> Value {
    let mut status = json!({
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "InternalError",
    });
    if let Some(code) = code {
        status["reason"] = "NonZeroExitCode".into();
        status["details"] =
            json!({"causes": [{"reason": "ExitCode", "message": code.to_string()}]});
    }
    status
}

fn frame(channel: u8, status: &Value) -> Message {
    let mut data = vec![channel];
    data.extend_from_slice(status.to_string().as_bytes());
    Message::binary(data)
}

/// Shared form of the runner as the server keeps it.
pub(crate) type SharedRunner = Option<Arc<ExecRunner>>;
