//! Uploading a layer while it is still being compressed.
//!
//! A layer's digest is known only once its last byte is compressed, and oci-client uploads either
//! a blob whose digest is known up front or one request per chunk, which is several times slower
//! than writing the layer on common registries (see bench/README.md). The distribution spec's
//! streamed upload fits instead: POST opens a session, one PATCH carries the blob as it is
//! produced, and a PUT with `?digest=` closes it once the digest is known; the registry checks the
//! digest against what it received. Uploading thus overlaps compression instead of following it.
//!
//! This is an optimization only: whatever goes wrong here (a registry refusing streamed uploads,
//! a cut connection, a digest mismatch), the caller uploads the finished blob from disk through
//! oci-client, which retries and reports failures.

use crate::digest::Digest;
use crate::stall::{self, Progress, Stalled};
use bytes::{Bytes, BytesMut};
use http::{HeaderValue, StatusCode};
use reqwest::Url;
use std::io::{self, Write};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Bytes handed to the upload at a time; with [`QUEUED_CHUNKS`], what the upload holds in memory.
const CHUNK: usize = 64 << 10;
/// Chunks waiting for the connection before the writer waits: the upload paces the compressor
/// rather than buffering a slow registry's backlog.
const QUEUED_CHUNKS: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("{request} answered {status}")]
    Status {
        request: &'static str,
        status: StatusCode,
    },
    #[error("{request}: {source}")]
    Http {
        request: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("no usable Location header in the answer to {0}")]
    Location(&'static str),
    #[error("the registry received {received} bytes of a {size}-byte blob")]
    Incomplete { received: u64, size: u64 },
    #[error("the upload task ended abnormally")]
    Task,
    #[error("{request}: {source}")]
    Stalled {
        request: &'static str,
        #[source]
        source: Stalled,
    },
}

/// An upload session the registry has opened, with its PATCH running in the background.
pub struct StreamedUpload {
    registry: Registry,
    patch: JoinHandle<Result<(Url, Option<u64>), UploadError>>,
    /// Marked each time the PATCH takes a chunk.
    progress: Progress,
}

/// How requests reach the registry: its origin, the credentials only that origin gets, and how
/// long it may stay silent.
struct Registry {
    http: reqwest::Client,
    authorization: Option<HeaderValue>,
    origin: Url,
    stall_timeout: Duration,
}

/// The write end of a [`StreamedUpload`]: a blocking writer for the thread that compresses.
///
/// Writes never fail: once the upload is gone (the connection was cut, the registry refused), the
/// sink drops what it is given, and the caller's disk copy is uploaded instead.
pub struct BlobSink {
    chunks: Option<mpsc::Sender<Bytes>>,
    buffer: BytesMut,
    /// For waiting on a full queue at most the stall timeout, from the compressing thread.
    runtime: Handle,
    stall_timeout: Duration,
}

impl StreamedUpload {
    /// Opens an upload session at `blob_uploads` (`…/v2/<repository>/blobs/uploads/`) and starts
    /// the PATCH that will carry what is written to the returned sink.
    pub(crate) async fn start(
        http: reqwest::Client,
        blob_uploads: Url,
        authorization: Option<HeaderValue>,
        stall_timeout: Duration,
    ) -> Result<(Self, BlobSink), UploadError> {
        let registry = Registry {
            http,
            authorization,
            origin: origin(&blob_uploads),
            stall_timeout,
        };
        const OPEN: &str = "POST (open upload)";
        let opened = registry
            .send_empty(reqwest::Method::POST, blob_uploads, OPEN)
            .await?;
        let session = location(&opened, StatusCode::ACCEPTED, OPEN)?;

        let (sender, receiver) = mpsc::channel::<Bytes>(QUEUED_CHUNKS);
        let progress = Progress::default();
        let taken = progress.clone();
        let body =
            reqwest::Body::wrap_stream(futures::stream::unfold(receiver, move |mut receiver| {
                let taken = taken.clone();
                async move {
                    let chunk = receiver.recv().await?;
                    taken.mark();
                    Some((Ok::<_, io::Error>(chunk), receiver))
                }
            }));
        let request = registry
            .request(reqwest::Method::PATCH, session)
            .header(http::header::CONTENT_TYPE, "application/octet-stream")
            .body(body);
        let patch = tokio::spawn(async move {
            const PATCH: &str = "PATCH (blob data)";
            let answer = request.send().await.map_err(|source| UploadError::Http {
                request: PATCH,
                source,
            })?;
            let received = received_bytes(&answer);
            let next = location(&answer, StatusCode::ACCEPTED, PATCH)?;
            Ok((next, received))
        });
        Ok((
            Self {
                registry,
                patch,
                progress,
            },
            BlobSink {
                chunks: Some(sender),
                buffer: BytesMut::with_capacity(CHUNK),
                runtime: Handle::current(),
                stall_timeout,
            },
        ))
    }

    /// Closes the session once the blob is complete (its sink finished or dropped): the registry
    /// commits the blob under `digest` only if what it received hashes to it.
    pub async fn finish(mut self, digest: &Digest, size: u64) -> Result<(), UploadError> {
        // The registry answers the PATCH once it has the blob's last bytes, which it took (or
        // did not) since the last chunk.
        let patched = stall::within(
            self.registry.stall_timeout,
            Some(&self.progress),
            &mut self.patch,
        )
        .await
        .map_err(|source| UploadError::Stalled {
            request: "PATCH (blob data)",
            source,
        })?;
        let (mut session, received) = patched.map_err(|_| UploadError::Task)??;
        if let Some(received) = received
            && received != size
        {
            return Err(UploadError::Incomplete { received, size });
        }
        session
            .query_pairs_mut()
            .append_pair("digest", digest.as_str());
        const CLOSE: &str = "PUT (close upload)";
        let closed = self
            .registry
            .send_empty(reqwest::Method::PUT, session, CLOSE)
            .await?;
        if closed.status() != StatusCode::CREATED {
            return Err(UploadError::Status {
                request: CLOSE,
                status: closed.status(),
            });
        }
        Ok(())
    }
}

impl Registry {
    fn request(&self, method: reqwest::Method, url: Url) -> reqwest::RequestBuilder {
        let authorization = authorization_for(&url, self.authorization.as_ref(), &self.origin);
        let request = self.http.request(method, url);
        match authorization {
            Some(value) => request.header(http::header::AUTHORIZATION, value.clone()),
            None => request,
        }
    }

    /// A request without a body (some registries insist on `Content-Length: 0`).
    async fn send_empty(
        &self,
        method: reqwest::Method,
        url: Url,
        name: &'static str,
    ) -> Result<reqwest::Response, UploadError> {
        let sent = self
            .request(method, url)
            .header(http::header::CONTENT_LENGTH, 0)
            .send();
        stall::within(self.stall_timeout, None, sent)
            .await
            .map_err(|source| UploadError::Stalled {
                request: name,
                source,
            })?
            .map_err(|source| UploadError::Http {
                request: name,
                source,
            })
    }
}

impl Drop for StreamedUpload {
    /// An upload given up on is cut rather than left to run: the registry discards the session.
    fn drop(&mut self) {
        self.patch.abort();
    }
}

impl BlobSink {
    fn send(&mut self) {
        if self.buffer.is_empty() {
            return;
        }
        let chunk = self.buffer.split().freeze();
        if let Some(chunks) = &self.chunks {
            let queued = self
                .runtime
                .block_on(tokio::time::timeout(self.stall_timeout, chunks.send(chunk)));
            match queued {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    tracing::debug!(
                        "streamed upload ended early; the layer goes up from disk instead"
                    );
                    self.chunks = None;
                }
                Err(_) => {
                    tracing::warn!(
                        "the registry took no data for {} s; the layer goes up from disk instead",
                        self.stall_timeout.as_secs_f64()
                    );
                    self.chunks = None;
                }
            }
        }
        self.buffer.reserve(CHUNK);
    }

    /// Sends what is buffered and ends the PATCH body.
    pub fn finish(mut self) {
        self.send();
    }
}

impl Write for BlobSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.chunks.is_some() {
            self.buffer.extend_from_slice(buf);
            if self.buffer.len() >= CHUNK {
                self.send();
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Credentials go only to the registry's own origin, never to a host a Location points at.
fn authorization_for<'a>(
    url: &Url,
    authorization: Option<&'a HeaderValue>,
    registry_origin: &Url,
) -> Option<&'a HeaderValue> {
    authorization.filter(|_| origin(url) == *registry_origin)
}

fn origin(url: &Url) -> Url {
    let mut origin = url.clone();
    origin.set_path("/");
    origin.set_query(None);
    origin.set_fragment(None);
    origin
}

/// The session's URL from an answer's `Location` (often relative to the registry).
fn location(
    answer: &reqwest::Response,
    expected: StatusCode,
    request: &'static str,
) -> Result<Url, UploadError> {
    if answer.status() != expected {
        return Err(UploadError::Status {
            request,
            status: answer.status(),
        });
    }
    answer
        .headers()
        .get(http::header::LOCATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| answer.url().join(value).ok())
        .ok_or(UploadError::Location(request))
}

/// What the registry says it holds after a PATCH: `Range: 0-<last byte>`.
fn received_bytes(answer: &reqwest::Response) -> Option<u64> {
    let range = answer.headers().get(http::header::RANGE)?.to_str().ok()?;
    let last: u64 = range.split_once('-')?.1.trim().parse().ok()?;
    Some(last + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).expect("test URL")
    }

    fn sent_authorization(to: &str) -> Option<HeaderValue> {
        let registry = origin(&url("https://registry.example:5000/v2/a/blobs/uploads/"));
        let secret = HeaderValue::from_static("Bearer secret");
        authorization_for(&url(to), Some(&secret), &registry).cloned()
    }

    #[test]
    fn credentials_go_only_to_the_registry_that_issued_the_session() {
        assert_eq!(
            sent_authorization("https://registry.example:5000/v2/a/blobs/uploads/u1?_state=x"),
            Some(HeaderValue::from_static("Bearer secret"))
        );
        // A Location elsewhere (another host, port or scheme) gets the request without them.
        for elsewhere in [
            "https://storage.example/upload/u1",
            "https://registry.example:5001/v2/a/blobs/uploads/u1",
            "http://registry.example:5000/v2/a/blobs/uploads/u1",
        ] {
            assert_eq!(sent_authorization(elsewhere), None, "{elsewhere}");
        }
    }
}
