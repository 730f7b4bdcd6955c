//! The embedded mode's data dir as something an admin upgrades, backs up and restores.
//!
//! `format.json` says which layout the data dir holds. A newer labforge migrates an older data
//! dir at start and then records its own format; an older labforge refuses a newer data dir
//! rather than misread it. Data dirs from before the file existed are format 0.
//!
//! A backup holds what cannot be made again: users, the store (notebooks, events, saved-image
//! records), the instance id (so running notebooks are adopted after a restore), the notebook
//! secrets' key, the TLS certificate labforge made, and the format. Images stay in their
//! registry; the blob cache, scratch space and the agent's copy are made again.

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

/// What [`backup`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupSummary {
    pub files: usize,
    pub bytes: u64,
    /// Times everything was read again because labforge wrote meanwhile.
    pub retries: usize,
}

/// A file as found in the data dir: its identity changes with every write labforge makes
/// (each replaces the file by a rename, so the inode changes).
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    inode: u64,
    modified_ns: i128,
    len: u64,
}

/// A file read for a backup.
struct FileRead {
    mode: u32,
    bytes: Vec<u8>,
}

/// Writes a backup of data dir `dir` to `archive` (tar + zstd, readable by its owner only),
/// while labforge runs: everything is read, and read again whenever a file changed meanwhile,
/// so the archive is one moment's state.
pub fn backup(dir: &Path, archive: &Path) -> Result<BackupSummary, DataDirError> {
    if matches!(check_format(dir)?, Found::Fresh) {
        return Err(DataDirError::NoData {
            dir: dir.to_owned(),
        });
    }
    let mut retries = 0;
    let snapshot = loop {
        let before = identities(dir)?;
        let mut files = BTreeMap::new();
        let mut changed = false;
        for relative in before.keys() {
            let path = dir.join(relative);
            let read = std::fs::File::open(&path).and_then(|mut file| {
                let mode = file.metadata()?.permissions().mode();
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes)?;
                Ok(FileRead { mode, bytes })
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
            break files;
        }
        retries += 1;
        if retries >= BACKUP_ATTEMPTS {
            return Err(DataDirError::Busy {
                dir: dir.to_owned(),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };

    let temporary = archive.with_extension("partial");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(io_error(&temporary))?;
    let written = (|| -> std::io::Result<u64> {
        let encoder = zstd::Encoder::new(file, 3)?;
        let mut tar = tar::Builder::new(encoder);
        let mut bytes = 0;
        // The format first, so that a restore can refuse an archive before reading the rest.
        let order = snapshot
            .iter()
            .filter(|(path, _)| path.as_path() == Path::new(FORMAT_FILE))
            .chain(
                snapshot
                    .iter()
                    .filter(|(path, _)| path.as_path() != Path::new(FORMAT_FILE)),
            );
        for (path, read) in order {
            let mut header = tar::Header::new_gnu();
            header.set_size(read.bytes.len() as u64);
            header.set_mode(read.mode & 0o777);
            header.set_mtime(jiff::Timestamp::now().as_second().max(0) as u64);
            header.set_entry_type(tar::EntryType::Regular);
            tar.append_data(&mut header, path, read.bytes.as_slice())?;
            bytes += read.bytes.len() as u64;
        }
        let file = tar.into_inner()?.finish()?;
        file.sync_all()?;
        Ok(bytes)
    })()
    .map_err(|source| {
        let _ = std::fs::remove_file(&temporary);
        io_error(archive)(source)
    })?;
    std::fs::rename(&temporary, archive).map_err(io_error(archive))?;
    Ok(BackupSummary {
        files: snapshot.len(),
        bytes: written,
        retries,
    })
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

/// What [`restore`] brought back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreSummary {
    pub files: usize,
    /// The format the archive was written in (migrated at the next start when older).
    pub format: u32,
}

/// Restores `archive` into data dir `dir`, which must hold no labforge data yet. Nothing is
/// written unless the whole archive reads and every entry is a file labforge keeps.
pub fn restore(archive: &Path, dir: &Path) -> Result<RestoreSummary, DataDirError> {
    let refuse = |reason: String| DataDirError::Archive {
        archive: archive.to_owned(),
        reason,
    };
    if let Some(what) = KEPT.iter().find(|name| dir.join(name).exists()) {
        return Err(DataDirError::NotEmpty {
            dir: dir.to_owned(),
            what: (*what).to_owned(),
        });
    }
    let file = std::fs::File::open(archive).map_err(io_error(archive))?;
    let decoder = zstd::Decoder::new(file).map_err(io_error(archive))?;
    let mut tar = tar::Archive::new(decoder);
    let mut files: Vec<(PathBuf, u32, Vec<u8>)> = Vec::new();
    let mut format = None;
    for entry in tar
        .entries()
        .map_err(|e| refuse(format!("not a labforge backup: {e}")))?
    {
        let mut entry = entry.map_err(|e| refuse(format!("not a labforge backup: {e}")))?;
        let path = entry
            .path()
            .map_err(|e| refuse(format!("an entry's path: {e}")))?
            .into_owned();
        let kept = path.components().all(|c| matches!(c, Component::Normal(_)))
            && path
                .components()
                .next()
                .is_some_and(|first| KEPT.iter().any(|k| first.as_os_str() == *k));
        if !kept || entry.header().entry_type() != tar::EntryType::Regular {
            return Err(refuse(format!(
                "{} is nothing a labforge backup holds",
                path.display()
            )));
        }
        let mode = entry.header().mode().unwrap_or(0o600) & 0o777;
        let mut bytes = Vec::new();
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| refuse(format!("{}: {e}", path.display())))?;
        if path.as_path() == Path::new(FORMAT_FILE) {
            let record: FormatRecord = serde_json::from_slice(&bytes)
                .map_err(|e| refuse(format!("its format.json: {e}")))?;
            if record.format > FORMAT {
                return Err(DataDirError::Newer {
                    dir: archive.to_owned(),
                    found: record.format,
                    written_by: record.written_by,
                });
            }
            format = Some(record.format);
        }
        files.push((path, mode, bytes));
    }
    if !files
        .iter()
        .any(|(path, _, _)| path.as_path() == Path::new("users.json"))
    {
        return Err(refuse(
            "not a labforge backup: it holds no users.json".into(),
        ));
    }

    // Into a directory of its own first, then moved into place: a failure leaves no half.
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    let staging = dir.join(".restoring");
    let _ = std::fs::remove_dir_all(&staging);
    let staged = (|| -> Result<(), DataDirError> {
        for (path, mode, bytes) in &files {
            let target = staging.join(path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(io_error(parent))?;
            }
            write_replacing(&target, bytes, *mode).map_err(io_error(&target))?;
        }
        let mut tops: Vec<&str> = KEPT
            .iter()
            .copied()
            .filter(|top| staging.join(top).exists())
            .collect();
        // The format last: a restore cut short is not taken for a complete data dir.
        tops.sort_by_key(|top| *top == FORMAT_FILE);
        let mut placed = Vec::new();
        for top in tops {
            let to = dir.join(top);
            if let Err(source) = std::fs::rename(staging.join(top), &to) {
                // Back out of what was placed, so that the restore can be run again.
                for placed in placed {
                    let _ = std::fs::rename(dir.join(placed), staging.join(placed));
                }
                return Err(io_error(&to)(source));
            }
            placed.push(top);
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&staging);
    staged?;
    Ok(RestoreSummary {
        files: files.len(),
        format: format.unwrap_or(0),
    })
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
    fn a_backup_holds_the_state_and_restores_into_an_empty_dir_only() {
        let dir = data_dir();
        record_format(dir.path()).unwrap();
        std::fs::set_permissions(
            dir.path().join("users.json"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let out = tempfile::tempdir().unwrap();
        let archive = out.path().join("lab.tar.zst");
        let summary = backup(dir.path(), &archive).unwrap();
        assert_eq!(summary.files, 4, "{summary:?}");
        let mode = std::fs::metadata(&archive).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the archive holds secrets");

        let target = out.path().join("restored");
        let restored = restore(&archive, &target).unwrap();
        assert_eq!((restored.files, restored.format), (4, FORMAT));
        for kept in [
            "users.json",
            "instance-id",
            "store/notebooks/ada/lab.json",
            FORMAT_FILE,
        ] {
            assert_eq!(
                std::fs::read(target.join(kept)).unwrap(),
                std::fs::read(dir.path().join(kept)).unwrap(),
                "{kept}"
            );
        }
        let users_mode = std::fs::metadata(target.join("users.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(users_mode & 0o777, 0o600);
        assert!(!target.join("registry").exists() && !target.join("cache").exists());
        assert!(!target.join(".restoring").exists());

        let again = restore(&archive, &target).unwrap_err().to_string();
        assert!(again.contains("already holds labforge data"), "{again}");
    }

    #[test]
    fn a_backup_while_files_are_written_holds_one_moments_state() {
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
        let out = tempfile::tempdir().unwrap();
        let mut retried = 0;
        for round in 0..30 {
            let archive = out.path().join(format!("{round}.tar.zst"));
            retried += backup(dir.path(), &archive).unwrap().retries;
            let mut counters = BTreeMap::new();
            let file = std::fs::File::open(&archive).unwrap();
            let mut tar = tar::Archive::new(zstd::Decoder::new(file).unwrap());
            for entry in tar.entries().unwrap() {
                let mut entry = entry.unwrap();
                let name = entry.path().unwrap().display().to_string();
                if let Some(counter) = name.strip_prefix("store/notebooks/ada/") {
                    let mut text = String::new();
                    entry.read_to_string(&mut text).unwrap();
                    counters.insert(counter.to_owned(), text.parse::<u64>().unwrap_or(0));
                }
            }
            let read = |name: &str| counters.get(name).copied().unwrap_or(0);
            let (first, second) = (read("a-first"), read("z-second"));
            assert!(
                first == second || first == second + 1,
                "round {round}: first {first}, second {second}"
            );
        }
        writing.store(false, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        // Writes fall into some of the reads, and each of those is read again.
        assert!(retried > 0, "no backup ever had to read again");
    }

    #[test]
    fn an_archive_with_anything_else_is_refused_and_nothing_is_written() {
        let out = tempfile::tempdir().unwrap();
        let archive = out.path().join("evil.tar.zst");
        let file = std::fs::File::create(&archive).unwrap();
        let mut tar = tar::Builder::new(zstd::Encoder::new(file, 3).unwrap().auto_finish());
        for path in ["users.json", "etc/cron.d/x"] {
            let mut header = tar::Header::new_gnu();
            header.set_size(2);
            header.set_mode(0o644);
            tar.append_data(&mut header, path, &b"[]"[..]).unwrap();
        }
        drop(tar.into_inner().unwrap());
        let target = out.path().join("target");
        let error = restore(&archive, &target).unwrap_err().to_string();
        assert!(error.contains("etc/cron.d/x"), "{error}");
        assert!(!target.join("users.json").exists());

        // Entries `tar::Builder` would not write: a path out of the data dir, a link.
        for (path, kind) in [
            (&b"../users.json"[..], tar::EntryType::Regular),
            (&b"/etc/passwd"[..], tar::EntryType::Regular),
            (&b"store/link"[..], tar::EntryType::Symlink),
        ] {
            let crafted = out.path().join("crafted.tar.zst");
            let file = std::fs::File::create(&crafted).unwrap();
            let mut tar = tar::Builder::new(zstd::Encoder::new(file, 3).unwrap().auto_finish());
            let mut header = tar::Header::new_gnu();
            header.as_old_mut().name[..path.len()].copy_from_slice(path);
            header.set_entry_type(kind);
            header.set_size(2);
            header.set_mode(0o644);
            header.set_cksum();
            tar.append(&header, &b"[]"[..]).unwrap();
            drop(tar.into_inner().unwrap());
            let error = restore(&crafted, &target).unwrap_err().to_string();
            assert!(
                error.contains(std::str::from_utf8(path).unwrap()),
                "{error}"
            );
            assert!(!target.exists() || std::fs::read_dir(&target).unwrap().next().is_none());
            assert!(!out.path().join("users.json").exists());
        }

        let not_backup = out.path().join("not.tar.zst");
        std::fs::write(&not_backup, b"hello").unwrap();
        assert!(restore(&not_backup, &target).is_err());
    }
}
