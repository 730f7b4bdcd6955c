//! The embedded mode's data dir as something an admin upgrades, backs up and restores.
//!
//! `format.json` says which layout the data dir holds. A newer labforge migrates an older data
//! dir at start and then records its own format; an older labforge refuses a newer data dir
//! rather than misread it. Data dirs from before the file existed are format 0.
//!
//! The state a backup keeps ([`read_state`]) is what cannot be made again: users, namespaces and
//! their members, the store
//! (notebooks, events, saved-image records), the instance id (so running notebooks are adopted
//! after a restore), the notebook secrets' key, the TLS certificate labforge made, and the
//! format. The backup also keeps the local registry (`registry/`) and the notebooks' volumes
//! (`labforge-backup`); the blob cache, scratch space and the agent's copy are made again.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// The layout this labforge writes. Format 1: `format.json` exists; workspace volumes carry
/// their injective names (`labforge-<ns>_<claim>`).
pub const FORMAT: u32 = 1;

const FORMAT_FILE: &str = "format.json";

/// What a backup holds: files and directories at the top of the data dir.
const KEPT: &[&str] = &[
    FORMAT_FILE,
    "users.json",
    "namespaces.json",
    "tokens.json",
    "instance-id",
    "notebook-secrets.key",
    "store",
    "tls",
];

/// How often a backup reads everything again when labforge wrote meanwhile.
const BACKUP_ATTEMPTS: usize = 20;

#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a labforge format file: {source}", path.display())]
    FormatFile {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{} holds data of format {found} (written by labforge {written_by}); this labforge ({}) reads formats up to {FORMAT}: run that version or a newer one",
        dir.display(),
        env!("CARGO_PKG_VERSION")
    )]
    Newer {
        dir: PathBuf,
        found: u32,
        written_by: String,
    },
    #[error("{} changed throughout {BACKUP_ATTEMPTS} attempts to read it whole; try again", dir.display())]
    Busy { dir: PathBuf },
    #[error("{}: {reason}", archive.display())]
    Archive { archive: PathBuf, reason: String },
    #[error("{} holds no labforge data (no users.json, no store)", dir.display())]
    NoData { dir: PathBuf },
    #[error(
        "{} already holds labforge data ({what}); restore into a new data dir, or move that one away first",
        dir.display()
    )]
    NotEmpty { dir: PathBuf, what: String },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> DataDirError + '_ {
    move |source| DataDirError::Io {
        path: path.to_owned(),
        source,
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FormatRecord {
    format: u32,
    written_by: String,
}

/// What a data dir holds, as found at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Nothing yet.
    Fresh,
    /// This labforge's format.
    Current,
    /// An older format, to be migrated from.
    Older(u32),
}

/// Reads the data dir's format; a newer one than this labforge's is an error.
pub fn check_format(dir: &Path) -> Result<Found, DataDirError> {
    let path = dir.join(FORMAT_FILE);
    let record = match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice::<FormatRecord>(&bytes)
            .map_err(|source| DataDirError::FormatFile { path, source })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let has_data = ["users.json", "store"]
                .iter()
                .any(|name| dir.join(name).exists());
            return Ok(if has_data {
                Found::Older(0)
            } else {
                Found::Fresh
            });
        }
        Err(e) => return Err(io_error(&path)(e)),
    };
    match record.format {
        FORMAT => Ok(Found::Current),
        older if older < FORMAT => Ok(Found::Older(older)),
        newer => Err(DataDirError::Newer {
            dir: dir.to_owned(),
            found: newer,
            written_by: record.written_by,
        }),
    }
}

/// Records this labforge's format: once every migration to it is done.
pub fn record_format(dir: &Path) -> Result<(), DataDirError> {
    let path = dir.join(FORMAT_FILE);
    let record = FormatRecord {
        format: FORMAT,
        written_by: env!("CARGO_PKG_VERSION").to_owned(),
    };
    let bytes = serde_json::to_vec_pretty(&record).map_err(|e| io_error(&path)(e.into()))?;
    write_replacing(&path, &bytes, 0o644).map_err(io_error(&path))
}

/// The state a backup keeps, as it was at one moment.
#[derive(Debug)]
pub struct State {
    /// Each file, by its path in the data dir.
    pub files: BTreeMap<PathBuf, StateFile>,
    /// Times everything was read again because labforge wrote meanwhile.
    pub retries: usize,
}

/// A file of the state, read whole.
#[derive(Debug)]
pub struct StateFile {
    pub mode: u32,
    pub bytes: Vec<u8>,
}

/// A file as found in the data dir: its identity changes with every write labforge makes
/// (each replaces the file by a rename, so the inode changes).
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    inode: u64,
    modified_ns: i128,
    len: u64,
}

/// Reads the state of data dir `dir` (the files of [`KEPT`]) while labforge runs: everything is
/// read, and read again whenever a file changed meanwhile, so what is returned is one moment's
/// state.
pub fn read_state(dir: &Path) -> Result<State, DataDirError> {
    if matches!(check_format(dir)?, Found::Fresh) {
        return Err(DataDirError::NoData {
            dir: dir.to_owned(),
        });
    }
    let mut retries = 0;
    loop {
        let before = identities(dir)?;
        let mut files = BTreeMap::new();
        let mut changed = false;
        for relative in before.keys() {
            let path = dir.join(relative);
            let read = std::fs::File::open(&path).and_then(|mut file| {
                let mode = file.metadata()?.permissions().mode() & 0o777;
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes)?;
                Ok(StateFile { mode, bytes })
            });
            match read {
                Ok(read) => {
                    files.insert(relative.clone(), read);
                }
                // Removed meanwhile: read again.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => changed = true,
                Err(e) => return Err(io_error(&path)(e)),
            }
        }
        if !changed && identities(dir)? == before {
            return Ok(State { files, retries });
        }
        retries += 1;
        if retries >= BACKUP_ATTEMPTS {
            return Err(DataDirError::Busy {
                dir: dir.to_owned(),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The files a backup holds, each with its identity now.
fn identities(dir: &Path) -> Result<BTreeMap<PathBuf, Seen>, DataDirError> {
    let mut found = BTreeMap::new();
    let mut pending: Vec<PathBuf> = KEPT.iter().map(PathBuf::from).collect();
    while let Some(relative) = pending.pop() {
        let path = dir.join(&relative);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error(&path)(e)),
        };
        if meta.is_dir() {
            let entries = match std::fs::read_dir(&path) {
                Ok(entries) => entries,
                // Removed since it was seen: the comparison of both walks notices.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error(&path)(e)),
            };
            for entry in entries {
                let name = entry.map_err(io_error(&path))?.file_name();
                // Files being written (`*.tmp`) are not state yet.
                if !name.to_string_lossy().ends_with(".tmp") {
                    pending.push(relative.join(name));
                }
            }
        } else if meta.is_file() && !relative.to_string_lossy().ends_with(".tmp") {
            found.insert(
                relative,
                Seen {
                    inode: meta.ino(),
                    modified_ns: i128::from(meta.mtime()) * 1_000_000_000
                        + i128::from(meta.mtime_nsec()),
                    len: meta.len(),
                },
            );
        }
    }
    Ok(found)
}

/// Whether `path` (relative to a data dir) is a file of the state a backup keeps: plain
/// components only, under one of [`KEPT`].
pub fn is_state_path(path: &Path) -> bool {
    path.components().all(|c| matches!(c, Component::Normal(_)))
        && path
            .components()
            .next()
            .is_some_and(|first| KEPT.iter().any(|k| first.as_os_str() == *k))
}

/// Refuses a data dir to restore into that already holds labforge data, naming what is there.
pub fn check_restorable(dir: &Path) -> Result<(), DataDirError> {
    match KEPT
        .iter()
        .chain(&[REGISTRY_DIR])
        .find(|name| dir.join(name).exists())
    {
        Some(what) => Err(DataDirError::NotEmpty {
            dir: dir.to_owned(),
            what: (*what).to_owned(),
        }),
        None => Ok(()),
    }
}

/// The local registry's storage in the data dir.
pub const REGISTRY_DIR: &str = "registry";

/// The audit trail's files in the data dir ([`labforge_web::audit::AuditFiles`]).
pub const AUDIT_DIR: &str = "audit";

/// Moves what a restore staged in `staging` (the state's files and the registry) into data dir
/// `dir`, the format last, so that a restore cut short is not taken for a complete data dir;
/// on failure what was placed goes back, so that the restore can be run again.
pub fn place_restored(staging: &Path, dir: &Path) -> Result<(), DataDirError> {
    check_restorable(dir)?;
    let mut tops: Vec<&str> = KEPT
        .iter()
        .copied()
        .chain([REGISTRY_DIR])
        .filter(|top| staging.join(top).exists())
        .collect();
    tops.sort_by_key(|top| *top == FORMAT_FILE);
    let mut placed = Vec::new();
    for top in tops {
        let to = dir.join(top);
        if let Err(source) = std::fs::rename(staging.join(top), &to) {
            for placed in placed {
                let _ = std::fs::rename(dir.join(placed), staging.join(placed));
            }
            return Err(io_error(&to)(source));
        }
        placed.push(top);
    }
    Ok(())
}

/// What `labforge status` shows of the last backup: written by `labforge backup` into the data
/// dir it backed up (not itself backed up: it describes this machine's backups).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackupRecord {
    /// Where it went (`s3://bucket/prefix` or a directory).
    pub destination: String,
    /// The snapshot's id.
    pub snapshot: String,
    /// When it finished (RFC 3339).
    pub finished: String,
    /// Bytes it holds, and bytes this backup added to the destination.
    pub bytes: u64,
    pub added_bytes: u64,
}

const BACKUP_RECORD_FILE: &str = "last-backup.json";

/// Records `record` as the data dir's last backup.
pub fn record_backup(dir: &Path, record: &BackupRecord) -> Result<(), DataDirError> {
    let path = dir.join(BACKUP_RECORD_FILE);
    let bytes = serde_json::to_vec_pretty(record).map_err(|e| io_error(&path)(e.into()))?;
    write_replacing(&path, &bytes, 0o644).map_err(io_error(&path))
}

/// The data dir's last backup, if one was recorded (an unreadable record counts as none).
pub fn last_backup(dir: &Path) -> Option<BackupRecord> {
    let bytes = std::fs::read(dir.join(BACKUP_RECORD_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Writes `bytes` to `path` through a temporary file, so a crash leaves the old file or the new.
pub(crate) fn write_replacing(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let write = |path: &str, text: &str| {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("users.json", "[]");
        write("instance-id", "abc");
        write("store/notebooks/ada/lab.json", "{}");
        write("registry/blob", "not backed up");
        write("cache/blob", "not backed up");
        dir
    }

    #[test]
    fn formats_are_told_apart_and_a_newer_one_is_refused() {
        let fresh = tempfile::tempdir().unwrap();
        assert_eq!(check_format(fresh.path()).unwrap(), Found::Fresh);
        let dir = data_dir();
        assert_eq!(check_format(dir.path()).unwrap(), Found::Older(0));
        record_format(dir.path()).unwrap();
        assert_eq!(check_format(dir.path()).unwrap(), Found::Current);
        std::fs::write(
            dir.path().join(FORMAT_FILE),
            r#"{"format": 7, "writtenBy": "9.0.0"}"#,
        )
        .unwrap();
        let error = check_format(dir.path()).unwrap_err().to_string();
        assert!(
            error.contains("format 7") && error.contains("9.0.0") && error.contains("up to 1"),
            "{error}"
        );
    }

    #[test]
    fn the_state_read_while_files_are_written_is_one_moments_state() {
        let dir = data_dir();
        let notebooks = dir.path().join("store/notebooks/ada");
        // Files read between the two, so that reading them all takes long enough for a write
        // to fall in between.
        for n in 0..3000 {
            std::fs::write(notebooks.join(format!("m{n:04}")), [b'x'; 100]).unwrap();
        }
        // The writer bumps a counter in two files, one after the other, as labforge writes a
        // notebook and then its events: at any moment the first is equal or one ahead.
        let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let writer = {
            let (notebooks, writing) = (notebooks.clone(), writing.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while writing.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    for name in ["a-first", "z-second"] {
                        write_replacing(&notebooks.join(name), n.to_string().as_bytes(), 0o644)
                            .unwrap();
                    }
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
            })
        };
        let mut retried = 0;
        for round in 0..30 {
            let state = read_state(dir.path()).unwrap();
            retried += state.retries;
            assert!(!state.files.contains_key(Path::new("registry/blob")));
            assert!(!state.files.contains_key(Path::new("cache/blob")));
            let read = |name: &str| {
                state
                    .files
                    .get(&Path::new("store/notebooks/ada").join(name))
                    .and_then(|f| std::str::from_utf8(&f.bytes).ok()?.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let (first, second) = (read("a-first"), read("z-second"));
            assert!(
                first == second || first == second + 1,
                "round {round}: first {first}, second {second}"
            );
        }
        writing.store(false, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        // Writes fall into some of the reads, and each of those is read again.
        assert!(retried > 0, "no read of the state ever had to read again");
    }

    #[test]
    fn a_restore_is_refused_where_labforge_data_is_and_placed_whole_elsewhere() {
        let dir = data_dir();
        let error = check_restorable(dir.path()).unwrap_err().to_string();
        assert!(error.contains("already holds labforge data"), "{error}");
        let staging = tempfile::tempdir().unwrap();
        for path in [
            "users.json",
            "namespaces.json",
            "format.json",
            "registry/docker/x",
            "cache/y",
        ] {
            let path = staging.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "{}").unwrap();
        }
        let target = tempfile::tempdir().unwrap();
        place_restored(staging.path(), target.path()).unwrap();
        for kept in [
            "users.json",
            "namespaces.json",
            "format.json",
            "registry/docker/x",
        ] {
            assert!(target.path().join(kept).exists(), "{kept}");
        }
        assert!(
            !target.path().join("cache").exists(),
            "only what a backup holds"
        );
        assert!(is_state_path(Path::new("store/notebooks/ada/lab.json")));
        for outside in [
            "../users.json",
            "/etc/passwd",
            "cache/blob",
            "store/../../x",
        ] {
            assert!(!is_state_path(Path::new(outside)), "{outside}");
        }
    }
}
