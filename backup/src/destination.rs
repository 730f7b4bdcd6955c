//! Where backups go: a directory or an S3 prefix, holding objects by content and one manifest
//! per snapshot.
//!
//! Layout (the same in both): `objects/<2 hex>/<sha256 hex>`, each a file's content compressed
//! with zstd and named by the digest of what it holds uncompressed; `snapshots/<id>.json`, a
//! snapshot's manifest. A manifest is written only after every object it names, so a backup
//! cut short leaves objects no manifest names and the earlier snapshots as they were.

use labforge_builder::cache::{CacheError, S3Cache};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

const OBJECTS: &str = "objects/";
const SNAPSHOTS: &str = "snapshots/";

#[derive(Debug, thiserror::Error)]
pub enum DestinationError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    S3(Box<CacheError>),
    #[error("another backup or pruning holds {} (lock); try again when it is done", path.display())]
    Busy { path: PathBuf },
}

impl From<CacheError> for DestinationError {
    fn from(err: CacheError) -> Self {
        DestinationError::S3(Box::new(err))
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> DestinationError + '_ {
    move |source| DestinationError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A backup destination.
pub enum Destination {
    Dir(PathBuf),
    S3 {
        cache: S3Cache,
        /// `s3://bucket/prefix` as given, for messages and records.
        url: String,
    },
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Destination::Dir(dir) => write!(f, "{}", dir.display()),
            Destination::S3 { url, .. } => f.write_str(url),
        }
    }
}

/// The key of the object holding content of digest `hex`.
fn object_key(hex: &str) -> String {
    format!("{OBJECTS}{}/{hex}", hex.get(..2).unwrap_or("00"))
}

fn snapshot_key(id: &str) -> String {
    format!("{SNAPSHOTS}{id}.json")
}

impl Destination {
    /// Makes the destination ready to be written (its directories, or its bucket).
    pub async fn prepare(&self) -> Result<(), DestinationError> {
        match self {
            Destination::Dir(dir) => {
                for sub in [OBJECTS, SNAPSHOTS] {
                    let path = dir.join(sub);
                    std::fs::create_dir_all(&path).map_err(io_error(&path))?;
                }
                Ok(())
            }
            Destination::S3 { cache, .. } => Ok(cache.ensure_bucket().await?),
        }
    }

    /// The digests of every object stored.
    pub async fn object_digests(&self) -> Result<HashSet<String>, DestinationError> {
        let keys = self.keys(OBJECTS).await?;
        Ok(keys
            .into_iter()
            .filter_map(|(key, _)| key.rsplit('/').next().map(str::to_owned))
            .filter(|name| name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()))
            .collect())
    }

    /// The snapshots' ids, oldest first (ids sort by time).
    pub async fn snapshot_ids(&self) -> Result<Vec<String>, DestinationError> {
        let mut ids: Vec<String> = self
            .keys(SNAPSHOTS)
            .await?
            .into_iter()
            .filter_map(|(key, _)| {
                key.strip_prefix(SNAPSHOTS)?
                    .strip_suffix(".json")
                    .filter(|id| !id.contains('/') && !id.starts_with('.'))
                    .map(str::to_owned)
            })
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Keys under `prefix` with their sizes.
    async fn keys(&self, prefix: &str) -> Result<Vec<(String, u64)>, DestinationError> {
        match self {
            Destination::Dir(dir) => {
                let mut found = Vec::new();
                let mut pending = vec![prefix.trim_end_matches('/').to_owned()];
                while let Some(relative) = pending.pop() {
                    let path = dir.join(&relative);
                    let entries = match std::fs::read_dir(&path) {
                        Ok(entries) => entries,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(io_error(&path)(e)),
                    };
                    for entry in entries {
                        let entry = entry.map_err(io_error(&path))?;
                        let name = entry.file_name().to_string_lossy().into_owned();
                        let kind = entry.file_type().map_err(io_error(&path))?;
                        let key = format!("{relative}/{name}");
                        if kind.is_dir() {
                            pending.push(key);
                        } else if kind.is_file() && !name.starts_with('.') {
                            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
                            found.push((key, len));
                        }
                    }
                }
                Ok(found)
            }
            Destination::S3 { cache, .. } => Ok(cache.list(prefix).await?),
        }
    }

    /// Stores the compressed object at `file` as the content of digest `hex`.
    pub async fn put_object(&self, hex: &str, file: &Path) -> Result<(), DestinationError> {
        self.put_file(&object_key(hex), file).await
    }

    /// Copies the compressed object of digest `hex` to a new file at `to`; `false` when there
    /// is no such object.
    pub async fn get_object(&self, hex: &str, to: &Path) -> Result<bool, DestinationError> {
        let key = object_key(hex);
        match self {
            Destination::Dir(dir) => match std::fs::copy(dir.join(&key), to) {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(io_error(&dir.join(&key))(e)),
            },
            Destination::S3 { cache, .. } => Ok(cache.get_to_file(&key, to).await?),
        }
    }

    pub async fn delete_object(&self, hex: &str) -> Result<(), DestinationError> {
        self.delete(&object_key(hex)).await
    }

    /// Writes snapshot `id`'s manifest: the last write of a backup.
    pub async fn put_snapshot(&self, id: &str, manifest: &[u8]) -> Result<(), DestinationError> {
        let scratch = tempfile::NamedTempFile::new().map_err(io_error(&std::env::temp_dir()))?;
        std::fs::write(scratch.path(), manifest).map_err(io_error(scratch.path()))?;
        self.put_file(&snapshot_key(id), scratch.path()).await
    }

    /// Snapshot `id`'s manifest, or `None` when there is no such snapshot.
    pub async fn get_snapshot(&self, id: &str) -> Result<Option<Vec<u8>>, DestinationError> {
        let key = snapshot_key(id);
        match self {
            Destination::Dir(dir) => match std::fs::read(dir.join(&key)) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(io_error(&dir.join(&key))(e)),
            },
            Destination::S3 { cache, .. } => {
                let scratch = tempfile::tempdir().map_err(io_error(&std::env::temp_dir()))?;
                let path = scratch.path().join("manifest");
                if !cache.get_to_file(&key, &path).await? {
                    return Ok(None);
                }
                std::fs::read(&path).map(Some).map_err(io_error(&path))
            }
        }
    }

    pub async fn delete_snapshot(&self, id: &str) -> Result<(), DestinationError> {
        self.delete(&snapshot_key(id)).await
    }

    async fn put_file(&self, key: &str, file: &Path) -> Result<(), DestinationError> {
        match self {
            Destination::Dir(dir) => {
                let target = dir.join(key);
                let parent = target.parent().unwrap_or(dir);
                std::fs::create_dir_all(parent).map_err(io_error(parent))?;
                // A hidden file beside the target, synced and then renamed: a destination that
                // fills up or goes away leaves no object half-written under its name.
                let mut partial = tempfile::Builder::new()
                    .prefix(".partial-")
                    .tempfile_in(parent)
                    .map_err(io_error(parent))?;
                let mut source = std::fs::File::open(file).map_err(io_error(file))?;
                std::io::copy(&mut source, partial.as_file_mut())
                    .and_then(|_| partial.as_file_mut().flush())
                    .and_then(|()| partial.as_file().sync_all())
                    .map_err(io_error(&target))?;
                partial
                    .persist(&target)
                    .map_err(|e| io_error(&target)(e.error))?;
                Ok(())
            }
            Destination::S3 { cache, .. } => Ok(cache.put_file(key, file).await?),
        }
    }

    async fn delete(&self, key: &str) -> Result<(), DestinationError> {
        match self {
            Destination::Dir(dir) => match std::fs::remove_file(dir.join(key)) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io_error(&dir.join(key))(e)),
            },
            Destination::S3 { cache, .. } => Ok(cache.delete(key).await?),
        }
    }

    /// Holds the destination for one backup or pruning at a time: a lock on `DEST/lock` for a
    /// directory (released when the returned file is dropped), refused while another holds it.
    /// S3 has no lock: one machine backs up to one prefix.
    pub fn lock(&self) -> Result<Option<std::fs::File>, DestinationError> {
        let Destination::Dir(dir) = self else {
            return Ok(None);
        };
        let path = dir.join("lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_error(&path))?;
        match file.try_lock() {
            Ok(()) => Ok(Some(file)),
            Err(std::fs::TryLockError::WouldBlock) => Err(DestinationError::Busy { path }),
            Err(std::fs::TryLockError::Error(e)) => Err(io_error(&path)(e)),
        }
    }
}
