//! The blob cache in S3 (or any S3-compatible server: custom endpoint, path-style addressing).
//!
//! Blobs are large (a saved environment is often hundreds of MiB), so uploads above one part size go
//! through a multipart upload that is aborted on failure, and downloads stream to a file. Nothing is
//! held in memory beyond one part.

use aws_sdk_s3::Client;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use aws_smithy_runtime_api::http::Response as HttpResponse;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// S3's minimum part size (except the last part).
pub const MIN_PART_SIZE: usize = 5 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("S3 {operation} in bucket {bucket:?} failed: {failure}")]
    S3 {
        operation: &'static str,
        bucket: String,
        key: String,
        failure: S3Failure,
    },
    #[error("local file {path}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Why S3 refused or failed a request, as a person reads it: what happened, what to do, and
/// S3's own code and message as the cause (never the SDK's whole error structure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum S3Failure {
    /// The bucket does not exist.
    NoSuchBucket { code: String, message: String },
    /// The credentials were refused (unknown key, wrong secret, no permission).
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    /// Any other answer from S3.
    Answered {
        status: u16,
        code: String,
        message: String,
    },
    /// No answer: the endpoint could not be reached, or did not answer in time.
    Unreachable { endpoint: String, detail: String },
    /// A body broke off part-way.
    Interrupted { detail: String },
    /// The request could not be made (a malformed endpoint, say).
    Request { detail: String },
}

impl S3Failure {
    fn of<E: ProvideErrorMetadata + std::error::Error + 'static>(
        err: &SdkError<E, HttpResponse>,
        endpoint: Option<&str>,
    ) -> Self {
        let endpoint = endpoint.unwrap_or("AWS S3").to_owned();
        match err {
            SdkError::ServiceError(service) => {
                let status = service.raw().status().as_u16();
                let code = service.err().code().unwrap_or_default().to_owned();
                let message = service.err().message().unwrap_or_default().to_owned();
                match (status, code.as_str()) {
                    (_, "NoSuchBucket") => S3Failure::NoSuchBucket { code, message },
                    (401 | 403, _)
                    | (_, "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "AccessDenied") => {
                        S3Failure::Refused {
                            status,
                            code,
                            message,
                        }
                    }
                    _ => S3Failure::Answered {
                        status,
                        code,
                        message,
                    },
                }
            }
            SdkError::DispatchFailure(failure) => S3Failure::Unreachable {
                endpoint,
                detail: if failure.is_timeout() {
                    "timed out connecting".into()
                } else {
                    // The connector's causes down to the system's ("Connection refused"),
                    // without the SDK's wrapping.
                    failure
                        .as_connector_error()
                        .and_then(std::error::Error::source)
                        .map_or_else(
                            || "could not connect".into(),
                            labforge_messages::error_chain,
                        )
                },
            },
            SdkError::TimeoutError(_) => S3Failure::Unreachable {
                endpoint,
                detail: "no answer in time".into(),
            },
            SdkError::ResponseError(response) => S3Failure::Answered {
                status: response.raw().status().as_u16(),
                code: String::new(),
                message: "unreadable answer".into(),
            },
            other => S3Failure::Request {
                detail: labforge_messages::error_chain(other),
            },
        }
    }
}

/// S3's code where the hint already says what its message would, else what it sent.
fn known_cause(code: &str, message: &str) -> String {
    if code.is_empty() {
        s3_cause(code, message)
    } else {
        code.to_owned()
    }
}

/// `code: message`, or whichever of them S3 sent (the message's first line, cut short).
fn s3_cause(code: &str, message: &str) -> String {
    let message: String = message
        .lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(120)
        .collect();
    match (code.is_empty(), message.is_empty()) {
        (false, false) => format!("{code}: {message}"),
        (false, true) => code.to_owned(),
        (true, false) => message,
        (true, true) => "no detail".to_owned(),
    }
}

impl std::fmt::Display for S3Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // S3's code is the cause where the hint already says what its message would.
            S3Failure::NoSuchBucket { code, message } => write!(
                f,
                "the bucket does not exist; create it or name another; caused by: {}",
                known_cause(code, message)
            ),
            S3Failure::Refused {
                status,
                code,
                message,
            } => write!(
                f,
                "credentials refused (HTTP {status}); check AWS_ACCESS_KEY_ID, \
                 AWS_SECRET_ACCESS_KEY and the key's rights; caused by: {}",
                known_cause(code, message)
            ),
            S3Failure::Answered {
                status,
                code,
                message,
            } => write!(f, "HTTP {status}; caused by: {}", s3_cause(code, message)),
            S3Failure::Request { detail } => write!(
                f,
                "the request could not be made; check --s3-endpoint and --cache-s3; caused by: {detail}"
            ),
            S3Failure::Interrupted { detail } => {
                write!(f, "the transfer broke off; caused by: {detail}")
            }
            S3Failure::Unreachable { endpoint, detail } => write!(
                f,
                "{endpoint} is unreachable; check that it runs and the endpoint is right; \
                 caused by: {detail}"
            ),
        }
    }
}

/// Where the S3 cache lives and how to sign requests to it.
#[derive(Clone)]
pub struct S3CacheConfig {
    /// e.g. `http://127.0.0.1:9000`; AWS's own endpoint when absent.
    pub endpoint: Option<String>,
    pub region: String,
    pub bucket: String,
    /// Key prefix, so that one bucket can serve several installations.
    pub prefix: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Multipart part size in bytes (at least [`MIN_PART_SIZE`]).
    pub part_size: usize,
}

// Written by hand so that the secret key never reaches a log line.
impl std::fmt::Debug for S3CacheConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3CacheConfig")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("access_key_id", &self.access_key_id)
            .field("part_size", &self.part_size)
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
pub struct S3Cache {
    client: Client,
    /// The endpoint as configured (AWS's when `None`), for messages.
    endpoint: Option<String>,
    bucket: String,
    prefix: String,
    part_size: usize,
}

impl S3Cache {
    pub fn new(config: S3CacheConfig) -> Self {
        // ring, like every other TLS client in the labforge binary: one crypto provider only.
        let http_client = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let credentials = Credentials::new(
            config.access_key_id,
            config.secret_access_key,
            None,
            None,
            "labforge-config",
        );
        let mut builder = aws_sdk_s3::config::Builder::new()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(config.region))
            .credentials_provider(credentials)
            .http_client(http_client)
            .force_path_style(true)
            // Checksums only where S3 requires them: S3-compatible servers differ in the rest.
            .request_checksum_calculation(
                aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired,
            )
            .response_checksum_validation(
                aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired,
            );
        if let Some(endpoint) = &config.endpoint {
            builder = builder.endpoint_url(endpoint);
        }
        Self {
            client: Client::from_conf(builder.build()),
            endpoint: config.endpoint,
            bucket: config.bucket,
            prefix: config.prefix,
            part_size: config.part_size.max(MIN_PART_SIZE),
        }
    }

    fn object_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// A body that broke off while streaming (to or from S3).
    fn stream_error(
        &self,
        operation: &'static str,
        key: &str,
        err: &dyn std::error::Error,
    ) -> CacheError {
        CacheError::S3 {
            operation,
            bucket: self.bucket.clone(),
            key: self.object_key(key),
            failure: S3Failure::Interrupted {
                detail: labforge_messages::error_chain(err),
            },
        }
    }

    fn error<E: ProvideErrorMetadata + std::error::Error + 'static>(
        &self,
        operation: &'static str,
        key: &str,
        err: SdkError<E, HttpResponse>,
    ) -> CacheError {
        CacheError::S3 {
            operation,
            bucket: self.bucket.clone(),
            key: self.object_key(key),
            failure: S3Failure::of(&err, self.endpoint.as_deref()),
        }
    }

    /// Creates the bucket when it does not exist yet.
    pub async fn ensure_bucket(&self) -> Result<(), CacheError> {
        if self
            .client
            .head_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .is_ok()
        {
            return Ok(());
        }
        self.client
            .create_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .map_err(|e| self.error("create bucket", "", e))?;
        Ok(())
    }

    /// Whether `key` is in the cache.
    pub async fn contains(&self, key: &str) -> Result<bool, CacheError> {
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(self.object_key(key))
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => Ok(false),
            Err(e) => Err(self.error("head", key, e)),
        }
    }

    /// Stores the file at `path` under `key`: one PUT when it fits a part, multipart otherwise.
    pub async fn put_file(&self, key: &str, path: &Path) -> Result<(), CacheError> {
        let file_error = |source| CacheError::File {
            path: path.to_owned(),
            source,
        };
        let size = tokio::fs::metadata(path).await.map_err(file_error)?.len();
        if size <= self.part_size as u64 {
            let body = ByteStream::from_path(path)
                .await
                .map_err(|e| self.stream_error("read for put", key, &e))?;
            self.client
                .put_object()
                .bucket(&self.bucket)
                .key(self.object_key(key))
                .body(body)
                .send()
                .await
                .map_err(|e| self.error("put", key, e))?;
            return Ok(());
        }
        let upload = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(self.object_key(key))
            .send()
            .await
            .map_err(|e| self.error("start multipart upload", key, e))?;
        let upload_id = upload.upload_id().unwrap_or_default().to_owned();
        match self.upload_parts(key, path, &upload_id).await {
            Ok(parts) => {
                self.client
                    .complete_multipart_upload()
                    .bucket(&self.bucket)
                    .key(self.object_key(key))
                    .upload_id(&upload_id)
                    .multipart_upload(
                        CompletedMultipartUpload::builder()
                            .set_parts(Some(parts))
                            .build(),
                    )
                    .send()
                    .await
                    .map_err(|e| self.error("complete multipart upload", key, e))?;
                Ok(())
            }
            Err(err) => {
                // Leave no orphaned parts behind; the original error is the one worth reporting.
                let _ = self
                    .client
                    .abort_multipart_upload()
                    .bucket(&self.bucket)
                    .key(self.object_key(key))
                    .upload_id(&upload_id)
                    .send()
                    .await;
                Err(err)
            }
        }
    }

    async fn upload_parts(
        &self,
        key: &str,
        path: &Path,
        upload_id: &str,
    ) -> Result<Vec<CompletedPart>, CacheError> {
        let file_error = |source| CacheError::File {
            path: path.to_owned(),
            source,
        };
        let mut file = tokio::fs::File::open(path).await.map_err(file_error)?;
        let mut parts = Vec::new();
        for part_number in 1.. {
            let mut buf = Vec::with_capacity(self.part_size);
            (&mut file)
                .take(self.part_size as u64)
                .read_to_end(&mut buf)
                .await
                .map_err(file_error)?;
            if buf.is_empty() {
                break;
            }
            let uploaded = self
                .client
                .upload_part()
                .bucket(&self.bucket)
                .key(self.object_key(key))
                .upload_id(upload_id)
                .part_number(part_number)
                .body(ByteStream::from(buf))
                .send()
                .await
                .map_err(|e| self.error("upload part", key, e))?;
            parts.push(
                CompletedPart::builder()
                    .part_number(part_number)
                    .set_e_tag(uploaded.e_tag().map(str::to_owned))
                    .build(),
            );
        }
        Ok(parts)
    }

    /// Every key under `prefix` (the cache's own prefix left out), with its size in bytes, one
    /// page of S3's listing after another.
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, CacheError> {
        let mut found = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(self.object_key(prefix))
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| self.error("list", prefix, e))?;
            for object in page.contents() {
                if let Some(key) = object.key().and_then(|k| k.strip_prefix(&self.prefix)) {
                    found.push((key.to_owned(), object.size().unwrap_or(0).max(0) as u64));
                }
            }
            match page.next_continuation_token() {
                Some(next) if page.is_truncated() == Some(true) => token = Some(next.to_owned()),
                _ => return Ok(found),
            }
        }
    }

    /// Removes `key`; removing one that is not there is no error (as in S3 itself).
    pub async fn delete(&self, key: &str) -> Result<(), CacheError> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.object_key(key))
            .send()
            .await
            .map_err(|e| self.error("delete", key, e))?;
        Ok(())
    }

    /// Streams `key` into a new file at `path`. Returns `false`, creating nothing, when the key is
    /// not in the cache. The file appears under its name only once complete.
    pub async fn get_to_file(&self, key: &str, path: &Path) -> Result<bool, CacheError> {
        let object = match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.object_key(key))
            .send()
            .await
        {
            Ok(object) => object,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => return Ok(false),
            Err(e) => return Err(self.error("get", key, e)),
        };
        // A uniquely named file beside the target, renamed into place when complete: concurrent
        // gets never share it, and a failed one leaves nothing behind (removed on drop).
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let partial = tempfile::Builder::new()
            .prefix(".labforge-partial-")
            .tempfile_in(dir)
            .map_err(|source| CacheError::File {
                path: dir.to_owned(),
                source,
            })?;
        let partial_path = partial.path().to_owned();
        let file_error = |source| CacheError::File {
            path: partial_path.clone(),
            source,
        };
        let mut file = tokio::fs::File::from_std(partial.reopen().map_err(file_error)?);
        let mut body = object.body;
        while let Some(chunk) = body
            .try_next()
            .await
            .map_err(|e| self.stream_error("read body", key, &e))?
        {
            file.write_all(&chunk).await.map_err(file_error)?;
        }
        file.flush().await.map_err(file_error)?;
        partial.persist(path).map_err(|err| CacheError::File {
            path: path.to_owned(),
            source: err.error,
        })?;
        Ok(true)
    }
}

/// Where saved layers, baseline indexes and change-set records are cached: S3 for clusters, a
/// local directory for one machine. Keys look like `blobs/sha256/<hex>`.
#[derive(Clone)]
pub enum BlobCache {
    S3(S3Cache),
    Dir(PathBuf),
}

impl std::fmt::Debug for BlobCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlobCache::S3(cache) => write!(f, "S3 bucket {:?}", cache.bucket),
            BlobCache::Dir(dir) => write!(f, "directory {}", dir.display()),
        }
    }
}

impl BlobCache {
    fn dir_path(dir: &Path, key: &str) -> PathBuf {
        // Keys are built by labforge from digests; never let one climb out of the directory.
        dir.join(key.replace("..", "_"))
    }

    /// Copies `key` to a new file at `path`; `false` (nothing created) when it is not cached.
    pub async fn get_to_file(&self, key: &str, path: &Path) -> Result<bool, CacheError> {
        match self {
            BlobCache::S3(cache) => cache.get_to_file(key, path).await,
            BlobCache::Dir(dir) => {
                let source = Self::dir_path(dir, key);
                match tokio::fs::copy(&source, path).await {
                    Ok(_) => Ok(true),
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
                    Err(source_err) => Err(CacheError::File {
                        path: source,
                        source: source_err,
                    }),
                }
            }
        }
    }

    /// Stores the file at `path` under `key`, replacing atomically. The file must not be written
    /// afterwards: a directory cache on the same filesystem keeps it as a hard link.
    pub async fn put_file(&self, key: &str, path: &Path) -> Result<(), CacheError> {
        match self {
            BlobCache::S3(cache) => cache.put_file(key, path).await,
            BlobCache::Dir(dir) => {
                let (source, target) = (path.to_owned(), Self::dir_path(dir, key));
                tokio::task::spawn_blocking(move || store_in_dir(&source, &target))
                    .await
                    .map_err(|err| CacheError::File {
                        path: path.to_owned(),
                        source: std::io::Error::other(err),
                    })?
            }
        }
    }

    pub async fn contains(&self, key: &str) -> Result<bool, CacheError> {
        match self {
            BlobCache::S3(cache) => cache.contains(key).await,
            BlobCache::Dir(dir) => Ok(tokio::fs::try_exists(Self::dir_path(dir, key))
                .await
                .unwrap_or(false)),
        }
    }

    /// A small document (an index, a record), or `None` when it is not cached.
    pub async fn get_bytes(&self, key: &str) -> Result<Option<Vec<u8>>, CacheError> {
        let scratch = tempfile::tempdir().map_err(|source| CacheError::File {
            path: std::env::temp_dir(),
            source,
        })?;
        let path = scratch.path().join("doc");
        if !self.get_to_file(key, &path).await? {
            return Ok(None);
        }
        tokio::fs::read(&path)
            .await
            .map(Some)
            .map_err(|source| CacheError::File { path, source })
    }

    /// Every key under `prefix` with its size; in a directory, files being written (hidden,
    /// `.labforge-partial-*`) are left out.
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, CacheError> {
        let dir = match self {
            BlobCache::S3(cache) => return cache.list(prefix).await,
            BlobCache::Dir(dir) => dir.clone(),
        };
        let prefix = prefix.trim_end_matches('/').to_owned();
        tokio::task::spawn_blocking(move || list_dir(&dir, &prefix))
            .await
            .map_err(|err| CacheError::File {
                path: PathBuf::new(),
                source: std::io::Error::other(err),
            })?
    }

    /// Removes `key`; one that is not there is no error.
    pub async fn delete(&self, key: &str) -> Result<(), CacheError> {
        match self {
            BlobCache::S3(cache) => cache.delete(key).await,
            BlobCache::Dir(dir) => {
                let path = Self::dir_path(dir, key);
                match tokio::fs::remove_file(&path).await {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(source) => Err(CacheError::File { path, source }),
                }
            }
        }
    }

    pub async fn put_bytes(&self, key: &str, bytes: &[u8]) -> Result<(), CacheError> {
        let scratch = tempfile::NamedTempFile::new().map_err(|source| CacheError::File {
            path: std::env::temp_dir(),
            source,
        })?;
        tokio::fs::write(scratch.path(), bytes)
            .await
            .map_err(|source| CacheError::File {
                path: scratch.path().to_owned(),
                source,
            })?;
        self.put_file(key, scratch.path()).await
    }
}

/// Stores `source` at `target` in a directory cache, replacing atomically. A hard link stores a
/// layer of hundreds of MiB at no cost, where a copy writes it all again while the push still
/// reads it (seconds on a small machine); across filesystems it is a copy.
fn store_in_dir(source: &Path, target: &Path) -> Result<(), CacheError> {
    let file_error = |path: &Path| {
        let path = path.to_owned();
        move |source| CacheError::File { path, source }
    };
    // Renaming a link onto another link of the same file does nothing and would leave the
    // partial file behind.
    if same_file(source, target) {
        return Ok(());
    }
    let parent = target.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(file_error(parent))?;
    let mut partial_name = tempfile::Builder::new();
    partial_name.prefix(".labforge-partial-");
    let partial = match partial_name.make_in(parent, |path| std::fs::hard_link(source, path)) {
        Ok(linked) => linked.into_temp_path(),
        // Another filesystem, or one without hard links.
        Err(_) => {
            let copy = partial_name
                .tempfile_in(parent)
                .map_err(file_error(parent))?;
            std::fs::copy(source, copy.path()).map_err(file_error(source))?;
            copy.into_temp_path()
        }
    };
    partial
        .persist(target)
        .map_err(|err| file_error(target)(err.error))?;
    Ok(())
}

/// The files under `dir/prefix`, as keys relative to `dir`, with their sizes.
fn list_dir(dir: &Path, prefix: &str) -> Result<Vec<(String, u64)>, CacheError> {
    let mut found = Vec::new();
    let mut pending = vec![prefix.to_owned()];
    while let Some(relative) = pending.pop() {
        let path = dir.join(&relative);
        let entries = match std::fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(CacheError::File { path, source }),
        };
        for entry in entries {
            let entry = entry.map_err(|source| CacheError::File {
                path: path.clone(),
                source,
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let key = format!("{relative}/{name}");
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => pending.push(key),
                Ok(kind) if kind.is_file() && !name.starts_with('.') => {
                    found.push((key, entry.metadata().map_or(0, |m| m.len())));
                }
                _ => {}
            }
        }
    }
    Ok(found)
}

/// Whether two paths name the same file (hard links of one inode).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::BlobCache;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    async fn put_and_read_back(cache_dir: &Path, staged_dir: &Path) -> (u64, u64) {
        let staged = staged_dir.join("layer");
        std::fs::write(&staged, b"layer bytes").unwrap();
        let cache = BlobCache::Dir(cache_dir.to_owned());
        // A partial file from an interrupted copy of an older version is replaced.
        let stored = BlobCache::dir_path(cache_dir, "blobs/sha256/ab");
        std::fs::create_dir_all(stored.parent().unwrap()).unwrap();
        std::fs::write(&stored, b"stale").unwrap();
        cache.put_file("blobs/sha256/ab", &staged).await.unwrap();
        // Stored again (a second save of the same layer): still one file.
        cache.put_file("blobs/sha256/ab", &staged).await.unwrap();
        let fetched = staged_dir.join("fetched");
        assert!(
            cache
                .get_to_file("blobs/sha256/ab", &fetched)
                .await
                .unwrap()
        );
        assert_eq!(std::fs::read(&fetched).unwrap(), b"layer bytes");
        let leftovers: Vec<_> = std::fs::read_dir(stored.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|name| name.to_string_lossy().starts_with(".labforge-partial-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        (
            std::fs::metadata(&staged).unwrap().ino(),
            std::fs::metadata(&stored).unwrap().ino(),
        )
    }

    #[tokio::test]
    async fn a_file_is_linked_into_a_directory_cache_on_its_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let (staged, stored) = put_and_read_back(&dir.path().join("cache"), dir.path()).await;
        assert_eq!(staged, stored, "the layer was copied, not linked");
    }

    #[tokio::test]
    async fn a_file_on_another_filesystem_is_copied_into_the_cache() {
        // /dev/shm is a tmpfs, apart from the temporary directory's filesystem on this machine
        // and on CI; where it is not apart, the link path above is what this exercises.
        let Ok(other) = tempfile::tempdir_in("/dev/shm") else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let apart = std::fs::metadata(other.path()).unwrap().dev()
            != std::fs::metadata(dir.path()).unwrap().dev();
        let (staged, stored) = put_and_read_back(&dir.path().join("cache"), other.path()).await;
        if apart {
            assert_ne!(staged, stored);
        }
    }
}
