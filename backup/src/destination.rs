//! Where backups go: a directory or an S3 prefix (the builder's [`BlobCache`], which already
//! speaks both), holding objects by content and one manifest per snapshot.
//!
//! Layout (the same in both): `objects/<2 hex>/<sha256 hex>`, each a file's content compressed
//! with zstd and named by the digest of what it holds uncompressed; `snapshots/<id>.json`, a
//! snapshot's manifest. A manifest is written only after every object it names, so a backup
//! cut short leaves objects no manifest names and the earlier snapshots as they were.

use labforge_builder::cache::{BlobCache, CacheError};
use std::collections::HashSet;
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
    Store(Box<CacheError>),
    #[error("another backup or pruning holds {} (lock); try again when it is done", path.display())]
    Busy { path: PathBuf },
}

impl From<CacheError> for DestinationError {
    fn from(err: CacheError) -> Self {
        DestinationError::Store(Box::new(err))
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> DestinationError + '_ {
    move |source| DestinationError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A backup destination.
pub struct Destination {
    store: BlobCache,
    /// The directory or `s3://bucket/prefix` as given, for messages and records.
    name: String,
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
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
    pub fn dir(dir: PathBuf) -> Self {
        Self {
            name: dir.display().to_string(),
            store: BlobCache::Dir(dir),
        }
    }

    /// An S3 prefix, `url` naming it in messages.
    pub fn s3(cache: labforge_builder::cache::S3Cache, url: String) -> Self {
        Self {
            store: BlobCache::S3(cache),
            name: url,
        }
    }

    /// Makes the destination ready to be written (its directory, or its bucket).
    pub async fn prepare(&self) -> Result<(), DestinationError> {
        match &self.store {
            BlobCache::Dir(dir) => std::fs::create_dir_all(dir).map_err(io_error(dir)),
            BlobCache::S3(cache) => Ok(cache.ensure_bucket().await?),
        }
    }

    /// The digests of every object stored.
    pub async fn object_digests(&self) -> Result<HashSet<String>, DestinationError> {
        Ok(self
            .store
            .list(OBJECTS)
            .await?
            .into_iter()
            .filter_map(|(key, _)| key.rsplit('/').next().map(str::to_owned))
            .filter(|name| name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()))
            .collect())
    }

    /// The snapshots' ids, oldest first (ids sort by time).
    pub async fn snapshot_ids(&self) -> Result<Vec<String>, DestinationError> {
        let mut ids: Vec<String> = self
            .store
            .list(SNAPSHOTS)
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

    /// Stores the compressed object at `file` as the content of digest `hex`.
    pub async fn put_object(&self, hex: &str, file: &Path) -> Result<(), DestinationError> {
        self.put_durably(&object_key(hex), file).await
    }

    /// Copies the compressed object of digest `hex` to a new file at `to`; `false` when there
    /// is no such object.
    pub async fn get_object(&self, hex: &str, to: &Path) -> Result<bool, DestinationError> {
        Ok(self.store.get_to_file(&object_key(hex), to).await?)
    }

    pub async fn delete_object(&self, hex: &str) -> Result<(), DestinationError> {
        Ok(self.store.delete(&object_key(hex)).await?)
    }

    /// Writes snapshot `id`'s manifest: the last write of a backup.
    pub async fn put_snapshot(&self, id: &str, manifest: &[u8]) -> Result<(), DestinationError> {
        let scratch = tempfile::NamedTempFile::new().map_err(io_error(&std::env::temp_dir()))?;
        std::fs::write(scratch.path(), manifest).map_err(io_error(scratch.path()))?;
        self.put_durably(&snapshot_key(id), scratch.path()).await
    }

    /// Snapshot `id`'s manifest, or `None` when there is no such snapshot.
    pub async fn get_snapshot(&self, id: &str) -> Result<Option<Vec<u8>>, DestinationError> {
        Ok(self.store.get_bytes(&snapshot_key(id)).await?)
    }

    pub async fn delete_snapshot(&self, id: &str) -> Result<(), DestinationError> {
        Ok(self.store.delete(&snapshot_key(id)).await?)
    }

    /// Stores `file` under `key`; in a directory, on disk before it returns, so that a manifest
    /// never outlives a crash that took the objects it names.
    async fn put_durably(&self, key: &str, file: &Path) -> Result<(), DestinationError> {
        self.store.put_file(key, file).await?;
        if let BlobCache::Dir(dir) = &self.store {
            let stored = dir.join(key);
            std::fs::File::open(&stored)
                .and_then(|f| f.sync_all())
                .map_err(io_error(&stored))?;
        }
        Ok(())
    }

    /// Holds the destination for one backup or pruning at a time: a lock on `DEST/lock` for a
    /// directory (released when the returned file is dropped), refused while another holds it.
    /// S3 has no lock: one machine backs up to one prefix.
    pub fn lock(&self) -> Result<Option<std::fs::File>, DestinationError> {
        let BlobCache::Dir(dir) = &self.store else {
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
