//! SSH to a notebook through its server: a websocket at
//! `/api/namespaces/{ns}/notebooks/{name}/ssh`, signed in with the API token, whose binary
//! messages are the SSH connection's bytes. [`stdio`] hands them to OpenSSH (its
//! `ProxyCommand`); [`run`] is `labforge ssh`'s own client on top of them.

use crate::RemoteError;
use crate::api::{Api, refusal};
use futures::{SinkExt as _, StreamExt as _};
use reqwest::header::{CONNECTION, UPGRADE};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::protocol::Role;

/// A notebook named on the command line: `NS/NAME`, or the `NAME.NS.labforge` host name
/// `labforge config-ssh` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub namespace: String,
    pub name: String,
}

/// The domain of the host names `labforge config-ssh` writes.
pub const HOST_SUFFIX: &str = ".labforge";

impl std::str::FromStr for Target {
    type Err = RemoteError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parts = match text.strip_suffix(HOST_SUFFIX) {
            Some(host) => host.split_once('.').map(|(name, ns)| (ns, name)),
            None => text.split_once('/'),
        };
        let label = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        match parts {
            Some((namespace, name)) if label(namespace) && label(name) => Ok(Self {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }),
            _ => Err(RemoteError::Usage(format!(
                "{text:?} names no notebook: give NAMESPACE/NAME (e.g. alice/lab) or NAME.NAMESPACE{HOST_SUFFIX}"
            ))),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Opens the websocket to `target`'s SSH server; the server's refusal (signed out, not yours,
/// stopped) is the error, with its words.
pub async fn connect(
    api: &Api,
    target: &Target,
) -> Result<WebSocketStream<reqwest::Upgraded>, RemoteError> {
    let path = format!(
        "/api/namespaces/{}/notebooks/{}/ssh",
        target.namespace, target.name
    );
    let response = api
        .request(reqwest::Method::GET, &path)
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", generate_key())
        .send()
        .await
        .map_err(|source| RemoteError::Unreachable {
            url: api.url.clone(),
            source,
        })?;
    if response.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
        return Err(refusal(response).await);
    }
    let upgraded = response
        .upgrade()
        .await
        .map_err(|source| RemoteError::Unreachable {
            url: api.url.clone(),
            source,
        })?;
    Ok(WebSocketStream::from_raw_socket(upgraded, Role::Client, None).await)
}

/// Carries bytes between `socket` and `input`/`output` until either side ends; answers the
/// reason the server gave when it closed the connection with one.
pub async fn carry<S, R, W>(
    socket: WebSocketStream<S>,
    mut input: R,
    mut output: W,
) -> Result<Option<String>, RemoteError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (mut to_server, mut from_server) = socket.split();
    let upstream = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = input.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            to_server
                .send(Message::Binary(buf[..n].to_vec().into()))
                .await?;
        }
        let _ = to_server.send(Message::Close(None)).await;
        Ok::<_, RemoteError>(None)
    };
    let downstream = async {
        while let Some(message) = from_server.next().await {
            match message? {
                Message::Binary(bytes) => {
                    output.write_all(&bytes).await?;
                    output.flush().await?;
                }
                Message::Close(frame) => {
                    return Ok(frame
                        .map(|f| f.reason.to_string())
                        .filter(|r| !r.is_empty()));
                }
                _ => {}
            }
        }
        Ok::<_, RemoteError>(None)
    };
    tokio::select! {
        done = upstream => done,
        done = downstream => done,
    }
}

/// `labforge ssh --stdio`: the SSH connection on this process's stdin and stdout, for OpenSSH.
pub async fn stdio(api: &Api, target: &Target) -> Result<(), RemoteError> {
    let socket = connect(api, target).await?;
    match carry(socket, tokio::io::stdin(), tokio::io::stdout()).await? {
        Some(reason) => Err(RemoteError::Closed(reason)),
        None => Ok(()),
    }
}

/// `labforge ssh`: runs `command` (a shell when `None`) in `target` and returns its exit status.
pub async fn run(api: &Api, target: &Target, command: Option<&str>) -> Result<u32, RemoteError> {
    let socket = connect(api, target).await?;
    let (near, far) = tokio::io::duplex(256 * 1024);
    let (far_read, far_write) = tokio::io::split(far);
    let carrying = tokio::spawn(async move { carry(socket, far_read, far_write).await });
    let terminal = command.is_none() && labforge_ssh::client::interactive();
    let status = labforge_ssh::client::run(near, command, terminal).await;
    if status.is_err() {
        // The server may have said why it closed the connection.
        let reason = tokio::time::timeout(std::time::Duration::from_secs(1), carrying).await;
        if let Ok(Ok(Ok(Some(reason)))) = reason {
            return Err(RemoteError::Closed(reason));
        }
    } else {
        carrying.abort();
    }
    Ok(status?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notebook_is_named_as_ns_slash_name_or_as_its_ssh_host() {
        let lab = Target {
            namespace: "alice".into(),
            name: "lab".into(),
        };
        assert_eq!("alice/lab".parse::<Target>().unwrap(), lab);
        assert_eq!("lab.alice.labforge".parse::<Target>().unwrap(), lab);
        for bad in [
            "alice",
            "alice/",
            "/lab",
            "Alice/lab",
            "lab.labforge",
            "a/b c",
        ] {
            let err = bad.parse::<Target>().unwrap_err().to_string();
            assert!(err.contains("names no notebook"), "{bad}: {err}");
        }
    }
}
