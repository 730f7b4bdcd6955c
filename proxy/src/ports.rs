//! A web server a user runs inside a notebook (Dash, Streamlit, TensorBoard) on port P, at a
//! host of its own: `<P>--<name>--<namespace>.<domain>` ([`labforge_crds::host::port_host_label`]).
//! Each port is an origin of its own, signed in to as notebook hosts are, and reached through
//! [`NotebookPorts`] (embedded mode: the agent in the notebook's container, started by exec), so
//! that no port is published and the notebook's network stays closed. Who may open a port is
//! the notebook's owner's choice: those who may open the notebook (the default), the members of
//! its namespace, or every signed-in user.

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

/// Bytes both ways to a port inside a notebook.
pub trait PortStream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> PortStream for T {}

/// Port `port` of notebook `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortTarget {
    pub namespace: String,
    pub name: String,
    pub port: u16,
}

/// Why a port could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    #[error("nothing listens on port {0} in this notebook; start the server there, then reload")]
    NotListening(u16),
    #[error("the notebook is not running; start it, then reload")]
    NotRunning,
    #[error("the notebook could not be reached: {0}")]
    Unavailable(String),
}

/// Where ports are: the notebooks a label names, who may open them, and a connection to one.
#[async_trait::async_trait]
pub trait NotebookPorts: Send + Sync {
    /// The notebook port whose host label is `label`, if any.
    fn resolve(&self, label: &str) -> Option<PortTarget>;
    /// Whether `user` may open `target`, as its notebook's owner shared it.
    fn may_open(&self, user: &str, target: &PortTarget) -> bool;
    /// A connection to `target`.
    async fn connect(&self, target: &PortTarget) -> Result<Box<dyn PortStream>, PortError>;
}

/// Sends `request` (its labforge cookies already stripped) over `stream` and gives the answer;
/// an upgrade (a websocket) is carried both ways until either side ends.
pub async fn exchange(
    stream: Box<dyn PortStream>,
    mut request: Request<Incoming>,
) -> Result<Response<Incoming>, PortError> {
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| PortError::Unavailable(e.to_string()))?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            tracing::debug!(%error, "notebook port connection");
        }
    });
    let client_upgrade = request
        .headers()
        .contains_key(header::UPGRADE)
        .then(|| hyper::upgrade::on(&mut request));
    let mut response = sender
        .send_request(request)
        .await
        .map_err(|e| PortError::Unavailable(e.to_string()))?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        let upstream_upgrade = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            let (Ok(client), Ok(upstream)) = (client_upgrade.await, upstream_upgrade.await) else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(
                &mut TokioIo::new(client),
                &mut TokioIo::new(upstream),
            )
            .await;
        });
    }
    Ok(response)
}

/// The proxy's page for a port that could not be reached.
pub fn error_page(error: &PortError, app: &str) -> Response<http_body_util::Full<Bytes>> {
    let status = match error {
        PortError::NotListening(_) | PortError::NotRunning => StatusCode::BAD_GATEWAY,
        PortError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    crate::respond::page(status, &error.to_string(), app)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    #[tokio::test]
    async fn a_port_error_page_has_its_status_and_escapes_the_reason() {
        assert_eq!(
            error_page(&PortError::NotRunning, "/").status(),
            StatusCode::BAD_GATEWAY
        );
        let page = error_page(&PortError::Unavailable("<script>x</script>".into()), "/");
        assert_eq!(page.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = page.into_body().collect().await.unwrap().to_bytes();
        let body = std::str::from_utf8(&body).unwrap();
        assert!(
            body.contains(
                "<p>the notebook could not be reached: &lt;script&gt;x&lt;/script&gt;</p>"
            ),
            "{body}"
        );
    }
}
