//! Accepting connections: HTTP/1.1 and HTTP/2 (prior knowledge on plain TCP, ALPN under TLS) on
//! a listener, with upgrades enabled, a task per connection, and rustls when configured. Each
//! serving thread runs one of these loops on its own listener (see [`crate::start`]).

use crate::forward::{Forwarder, Peer};
use crate::heap_release::HeapRelease;
use futures::FutureExt as _;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// Certificate chain and private key, PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading PEM from {}", path.display())]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("building the TLS server configuration")]
    Config(#[source] rustls::Error),
}

/// A TLS acceptor (rustls with the process's crypto provider, ring) offering h2 and http/1.1.
pub fn tls_acceptor(files: &TlsFiles) -> Result<TlsAcceptor, TlsError> {
    fn pem(path: &Path) -> impl Fn(rustls::pki_types::pem::Error) -> TlsError + '_ {
        move |source| TlsError::Pem {
            path: path.to_owned(),
            source,
        }
    }
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .map_err(pem(&files.cert))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem(&files.cert))?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(pem(&files.key))?;
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(TlsError::Config)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `listener` forever, one task per connection (each counted by `heap`), and closes this
/// thread's expired upstream connections as it goes.
pub async fn serve(
    listener: TcpListener,
    forwarder: Arc<Forwarder>,
    tls: Option<TlsAcceptor>,
    heap: Arc<HeapRelease>,
) {
    tokio::spawn(forwarder.upstreams().clone().close_expired_forever());
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Slow clients may not hold a connection open by trickling headers.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30));
    let builder = Arc::new(builder);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of descriptors, most likely: wait instead of spinning.
                tracing::warn!(error = %err, "accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let forwarder = forwarder.clone();
        let connections = forwarder.metrics().connections_open.clone();
        connections.inc();
        let open = heap.open_connection();
        let builder = builder.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let is_tls = tls.is_some();
            let client = Arc::new(Peer::new(peer));
            // `map`, not an async block awaiting it: that would hold the future twice.
            let service = service_fn(move |request| {
                forwarder
                    .handle(request, client.clone(), is_tls)
                    .map(Ok::<_, Infallible>)
            });
            let served = match tls {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(stream) => {
                        builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), service)
                            .await
                    }
                    Err(err) => {
                        tracing::debug!(%peer, error = %err, "TLS handshake");
                        connections.dec();
                        return;
                    }
                },
                None => {
                    builder
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await
                }
            };
            if let Err(err) = served {
                tracing::debug!(%peer, error = %err, "connection");
            }
            connections.dec();
            drop(open);
        });
    }
}
