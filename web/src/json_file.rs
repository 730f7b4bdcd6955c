//! A JSON file in the data dir that the CLI (another process) and a running server both edit:
//! read again whenever it changed on disk, written whole by rename, readable only by the
//! server's user. The users and the namespaces' members live in such files.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::SystemTime;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// Inode and mtime of the file: the inode changes with every rename-replace, even within one
/// mtime tick.
type FileStamp = (u64, SystemTime);

/// The file's content as last read, and the file's identity then.
pub struct JsonFile<T> {
    path: PathBuf,
    cache: RwLock<(Option<FileStamp>, T)>,
}

impl<T: Default + Clone + Serialize + DeserializeOwned> JsonFile<T> {
    /// The file at `path`, read now (absent: `T::default()`).
    pub fn open(path: PathBuf) -> Result<Self, FileError> {
        let file = Self {
            path,
            cache: RwLock::new((None, T::default())),
        };
        file.refresh()?;
        Ok(file)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn stamp(&self) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(&self.path).ok()?;
        Some((meta.ino(), meta.modified().ok()?))
    }

    /// Reads the file again if it changed since the last read (one `stat` when it did not).
    pub fn refresh(&self) -> Result<(), FileError> {
        let stamp = self.stamp();
        if stamp.is_some() && self.cache.read().is_ok_and(|c| c.0 == stamp) {
            return Ok(());
        }
        let value = match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| FileError::Corrupt {
                path: self.path.clone(),
                source,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => T::default(),
            Err(source) => {
                return Err(FileError::Io {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        if let Ok(mut cache) = self.cache.write() {
            *cache = (stamp, value);
        }
        Ok(())
    }

    /// `f` of the content as last read.
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        self.cache.read().ok().map(|cache| f(&cache.1))
    }

    /// A copy of the content as last read.
    pub fn get(&self) -> T {
        self.read(T::clone).unwrap_or_default()
    }

    /// Replaces the file with `value`: written beside it, then renamed over it.
    pub fn write(&self, value: &T) -> Result<(), FileError> {
        let io = |source| FileError::Io {
            path: self.path.clone(),
            source,
        };
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let temporary = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(value).unwrap_or_default();
        {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            // Only the server's user reads it (the users file holds password hashes).
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&temporary)
                .map_err(io)?;
            file.write_all(&bytes).map_err(io)?;
        }
        std::fs::rename(&temporary, &self.path).map_err(io)?;
        if let Ok(mut cache) = self.cache.write() {
            *cache = (self.stamp(), value.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_by_another_writer_is_read_at_the_next_refresh() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("things.json");
        let ours: JsonFile<Vec<String>> = JsonFile::open(path.clone()).unwrap();
        assert!(ours.get().is_empty());
        let theirs: JsonFile<Vec<String>> = JsonFile::open(path.clone()).unwrap();
        theirs.write(&vec!["a".into()]).unwrap();
        assert!(ours.get().is_empty(), "read only at a refresh");
        ours.refresh().unwrap();
        assert_eq!(ours.get(), vec!["a".to_string()]);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(&path, b"not json").unwrap();
        assert!(matches!(ours.refresh(), Err(FileError::Corrupt { .. })));
    }
}
