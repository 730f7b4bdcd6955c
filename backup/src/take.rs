//! `labforge backup DEST`: one snapshot, taken while labforge runs.
//!
//! The parts are read in the order that keeps them consistent with each other: the state first
//! (read whole at one moment), then the registry (so every image the state records is in it:
//! blobs first, then the manifests and tags that name them, then any blob a manifest written
//! meanwhile names), then the volumes. Each volume is exported by the engine while its notebook
//! runs, file after file, unpaused: a file being written at that moment is kept as the export
//! read it, which may be its old content, its new one, or a mix cut at the length it had, as
//! after a power cut for that file alone; files written after the export passed them go into
//! the next snapshot.

use crate::destination::Destination;
use crate::manifest::{self, Entry, INLINE_MAX, Kind, MANIFEST_FORMAT, Snapshot, Volume};
use crate::object::{Spooled, StoreError};
use crate::volumes::Volumes;
use crate::{BackupError, io_error};
use labforge_embedded::data_dir::{self, BackupRecord, REGISTRY_DIR};
use std::collections::{BTreeSet, HashSet};
use std::path::{Component, Path, PathBuf};

/// What a backup is of and where it goes.
pub struct BackupOptions<'a> {
    pub data_dir: &'a Path,
    pub dest: &'a Destination,
    pub volumes: &'a dyn Volumes,
    /// Keep only this many snapshots (the newest), and the objects they name.
    pub keep: Option<usize>,
}

/// What a backup did.
#[derive(Debug, Clone)]
pub struct BackupSummary {
    pub id: String,
    pub files: usize,
    pub volumes: usize,
    /// Bytes the snapshot holds.
    pub bytes: u64,
    /// Objects, and their stored bytes, this backup added to the destination.
    pub added_objects: u64,
    pub added_bytes: u64,
    /// Snapshots removed by `keep`.
    pub pruned: Vec<String>,
}

/// Where a backup is, for a progress display.
pub trait Progress {
    /// A part begins: `state`, `registry`, or `volume NAME`.
    fn part(&self, what: &str);
    /// Bytes of content read.
    fn read(&self, bytes: u64);
}

impl Progress for () {
    fn part(&self, _: &str) {}
    fn read(&self, _: u64) {}
}

/// Takes one snapshot of data dir `options.data_dir` into `options.dest`.
pub async fn backup(
    options: &BackupOptions<'_>,
    progress: &dyn Progress,
) -> Result<BackupSummary, BackupError> {
    let dest = options.dest;
    let at_dest = |source| BackupError::Destination {
        dest: dest.to_string(),
        source,
    };
    let format = match data_dir::check_format(options.data_dir)? {
        data_dir::Found::Current => data_dir::FORMAT,
        data_dir::Found::Older(format) => format,
        data_dir::Found::Fresh => {
            return Err(data_dir::DataDirError::NoData {
                dir: options.data_dir.to_owned(),
            }
            .into());
        }
    };
    dest.prepare().await.map_err(at_dest)?;
    let lock = dest.lock().map_err(at_dest)?;
    let known = dest.object_digests().await.map_err(at_dest)?;
    let existing = dest.snapshot_ids().await.map_err(at_dest)?;
    let created = jiff::Timestamp::now();
    let mut id = manifest::snapshot_id(created);
    // Two backups within a second: the second gets a suffix.
    for n in 2.. {
        if !existing.contains(&id) {
            break;
        }
        id = format!("{}-{n}", manifest::snapshot_id(created));
    }
    let scratch = tempfile::Builder::new()
        .prefix(".backup-")
        .tempdir_in(options.data_dir)
        .map_err(io_error(options.data_dir))?;
    let mut writer = Writer {
        dest,
        known,
        kept: existing.len(),
        scratch: scratch.path().to_owned(),
        bytes: 0,
        added_objects: 0,
        added_bytes: 0,
        progress,
    };

    progress.part("state");
    let state = data_dir::read_state(options.data_dir)?;
    let namespaces = namespaces(options.data_dir, state.files.keys())?;
    let mut state_entries = Vec::new();
    for (path, file) in state.files {
        let entry = Entry {
            path: path.to_string_lossy().into_owned(),
            mode: file.mode,
            ..Entry::default()
        };
        state_entries.push(writer.file(entry, Spooled::of_bytes(file.bytes)).await?);
    }

    progress.part("registry");
    let registry = writer
        .registry(&options.data_dir.join(REGISTRY_DIR))
        .await?;

    let names: Vec<String> = options
        .volumes
        .list()
        .map_err(BackupError::VolumeList)?
        .into_iter()
        .filter(|volume| {
            namespaces.iter().any(|ns| {
                volume
                    .strip_prefix(&labforge_embedded::runtime::volume_name(ns, ""))
                    .is_some_and(|claim| !claim.is_empty())
            })
        })
        .collect();
    let mut volumes = Vec::new();
    for name in names {
        progress.part(&format!("volume {name}"));
        volumes.push(writer.volume(options.volumes, &name).await?);
    }

    let snapshot = Snapshot {
        format: MANIFEST_FORMAT,
        id: id.clone(),
        created: created.to_string(),
        labforge: env!("CARGO_PKG_VERSION").to_owned(),
        data_format: format,
        state: state_entries,
        registry,
        volumes,
        bytes: writer.bytes,
        added_objects: writer.added_objects,
        added_bytes: writer.added_bytes,
    };
    let manifest = serde_json::to_vec(&snapshot).map_err(|e| BackupError::Manifest {
        id: id.clone(),
        detail: e.to_string(),
    })?;
    dest.put_snapshot(&id, &manifest)
        .await
        .map_err(|source| writer.interrupted(source))?;
    data_dir::record_backup(
        options.data_dir,
        &BackupRecord {
            destination: dest.to_string(),
            snapshot: id.clone(),
            finished: jiff::Timestamp::now().to_string(),
            bytes: snapshot.bytes,
            added_bytes: snapshot.added_bytes,
        },
    )?;
    // Pruning takes the lock itself.
    drop(lock);
    let pruned = match options.keep {
        Some(keep) => crate::prune(dest, keep).await?,
        None => Vec::new(),
    };
    Ok(BackupSummary {
        id,
        files: snapshot.files(),
        volumes: snapshot.volumes.len(),
        bytes: snapshot.bytes,
        added_objects: snapshot.added_objects,
        added_bytes: snapshot.added_bytes,
        pruned,
    })
}

/// The namespaces whose volumes a backup keeps: every user's, and every namespace the store
/// holds anything of.
fn namespaces<'a>(
    data_dir: &Path,
    state_paths: impl Iterator<Item = &'a PathBuf>,
) -> Result<BTreeSet<String>, BackupError> {
    let mut found: BTreeSet<String> = labforge_web::users::Users::open(data_dir)?
        .list()
        .into_iter()
        .map(|user| user.name)
        .collect();
    for path in state_paths {
        let mut parts = path.components().map(|c| c.as_os_str().to_string_lossy());
        if parts.next().as_deref() == Some("store")
            && let (Some(_kind), Some(ns)) = (parts.next(), parts.next())
        {
            let ns = ns.strip_suffix(".json").unwrap_or(&ns);
            found.insert(ns.to_owned());
        }
    }
    Ok(found)
}

/// Writes the objects of one snapshot and counts what it holds.
struct Writer<'a> {
    dest: &'a Destination,
    /// Objects the destination holds, this backup's included.
    known: HashSet<String>,
    /// Snapshots there before this one.
    kept: usize,
    scratch: PathBuf,
    bytes: u64,
    added_objects: u64,
    added_bytes: u64,
    progress: &'a dyn Progress,
}

impl Writer<'_> {
    fn interrupted(&self, source: crate::destination::DestinationError) -> BackupError {
        BackupError::Interrupted {
            dest: self.dest.to_string(),
            kept: self.kept,
            source,
        }
    }

    /// `entry` with `content`: inline when small, else as an object (stored unless the
    /// destination has it).
    async fn file(&mut self, mut entry: Entry, content: Spooled) -> Result<Entry, BackupError> {
        self.bytes += content.size;
        self.progress.read(content.size);
        entry.size = content.size;
        match content.bytes() {
            Some(bytes) if content.size <= INLINE_MAX => {
                entry.inline = Some(Entry::inline_content(bytes));
            }
            _ => {
                if !self.known.contains(&content.hex) {
                    let stored =
                        content
                            .store(self.dest, &self.scratch)
                            .await
                            .map_err(|e| match e {
                                StoreError::Local(e) => e,
                                StoreError::Destination(source) => self.interrupted(source),
                            })?;
                    self.added_objects += 1;
                    self.added_bytes += stored;
                    self.known.insert(content.hex.clone());
                }
                entry.digest = Some(content.hex);
            }
        }
        Ok(entry)
    }

    /// The local registry's files under `root`: blobs, then what names them, then blobs named
    /// by manifests written meanwhile. Uploads in progress are left out.
    async fn registry(&mut self, root: &Path) -> Result<Vec<Entry>, BackupError> {
        let mut files = Vec::new();
        walk_files(root, Path::new(""), &mut files)?;
        files.retain(|path| !path.components().any(|c| c.as_os_str() == "_uploads"));
        let (blobs, rest): (Vec<PathBuf>, Vec<PathBuf>) =
            files.into_iter().partition(|path| blob_hex(path).is_some());
        let mut entries = Vec::new();
        let mut have: HashSet<String> = HashSet::new();
        for path in blobs {
            if let Some(entry) = self.registry_file(root, &path).await? {
                have.extend(blob_hex(&path).map(str::to_owned));
                entries.push(entry);
            }
        }
        let mut named = Vec::new();
        for path in rest {
            if let Some(entry) = self.registry_file(root, &path).await? {
                // A link file holds `sha256:<hex>`, the blob it names.
                if let Some(hex) = entry
                    .inline_bytes()
                    .and_then(Result::ok)
                    .and_then(|bytes| String::from_utf8(bytes).ok())
                    .and_then(|text| text.trim().strip_prefix("sha256:").map(str::to_owned))
                {
                    named.push(hex);
                }
                entries.push(entry);
            }
        }
        for hex in named {
            if have.contains(&hex) || hex.len() != 64 {
                continue;
            }
            let path = blob_path(&hex);
            if let Some(entry) = self.registry_file(root, &path).await? {
                have.insert(hex);
                // Before the entries that name it, as the others.
                entries.insert(0, entry);
            }
        }
        Ok(entries)
    }

    /// One registry file, or `None` when it went away meanwhile (a blob the registry's garbage
    /// collection removed, a tag moved).
    async fn registry_file(
        &mut self,
        root: &Path,
        relative: &Path,
    ) -> Result<Option<Entry>, BackupError> {
        let path = root.join(relative);
        let mut file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(&path)(e)),
        };
        let meta = file.metadata().map_err(io_error(&path))?;
        let entry = Entry {
            path: relative.to_string_lossy().into_owned(),
            mode: std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            ..Entry::default()
        };
        // A blob is named by its digest: one the destination holds is not read again.
        if let Some(hex) = blob_hex(relative).filter(|hex| self.known.contains(*hex)) {
            self.bytes += meta.len();
            self.progress.read(meta.len());
            return Ok(Some(Entry {
                size: meta.len(),
                digest: Some(hex.to_owned()),
                ..entry
            }));
        }
        let content =
            Spooled::read(&mut file, meta.len(), &self.scratch).map_err(io_error(&path))?;
        Ok(Some(self.file(entry, content).await?))
    }

    /// Volume `name`, as the engine exports it.
    async fn volume(&mut self, volumes: &dyn Volumes, name: &str) -> Result<Volume, BackupError> {
        let archive_path = self.scratch.join("volume.tar");
        volumes
            .export(name, &archive_path)
            .map_err(|source| BackupError::Volume {
                volume: name.to_owned(),
                source,
            })?;
        let archive = std::fs::File::open(&archive_path).map_err(io_error(&archive_path))?;
        let mut archive = tar::Archive::new(archive);
        let mut entries = Vec::new();
        let read_error = |e| io_error(&archive_path)(e);
        for tar_entry in archive.entries().map_err(read_error)? {
            let mut tar_entry = tar_entry.map_err(read_error)?;
            let raw = tar_entry.path_bytes().into_owned();
            let path = String::from_utf8(raw).map_err(|e| BackupError::NotUtf8 {
                volume: name.to_owned(),
                path: String::from_utf8_lossy(e.as_bytes()).into_owned(),
            })?;
            let path = volume_path(&path);
            let header = tar_entry.header();
            let kind = match header.entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => Kind::File,
                tar::EntryType::Directory => Kind::Dir,
                tar::EntryType::Symlink => Kind::Symlink,
                tar::EntryType::Link => Kind::Hardlink,
                // Devices, fifos and sockets hold no data a user made.
                _ => continue,
            };
            let target = match tar_entry.link_name_bytes() {
                Some(target) => Some(String::from_utf8(target.into_owned()).map_err(|e| {
                    BackupError::NotUtf8 {
                        volume: name.to_owned(),
                        path: String::from_utf8_lossy(e.as_bytes()).into_owned(),
                    }
                })?),
                None => None,
            };
            let entry = Entry {
                path,
                kind,
                mode: header.mode().unwrap_or(0o644) & 0o7777,
                uid: header.uid().unwrap_or(0),
                gid: header.gid().unwrap_or(0),
                mtime: header.mtime().unwrap_or(0),
                target: target.map(|t| match kind {
                    Kind::Hardlink => volume_path(&t),
                    _ => t,
                }),
                ..Entry::default()
            };
            if kind == Kind::File {
                let size = tar_entry.size();
                let content =
                    Spooled::read(&mut tar_entry, size, &self.scratch).map_err(read_error)?;
                entries.push(self.file(entry, content).await?);
            } else {
                entries.push(entry);
            }
        }
        let _ = std::fs::remove_file(&archive_path);
        Ok(Volume {
            name: name.to_owned(),
            entries,
        })
    }
}

/// A path in a volume's tar as a manifest keeps it: without `./`, the volume's root as `.`.
fn volume_path(path: &str) -> String {
    let trimmed = path.trim_start_matches("./").trim_end_matches('/');
    if trimmed.is_empty() || trimmed == "." {
        ".".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// The digest a registry blob's path names: `docker/registry/v2/blobs/sha256/<2>/<hex>/data`.
fn blob_hex(path: &Path) -> Option<&str> {
    let parts: Vec<&str> = path
        .components()
        .map(|c| match c {
            Component::Normal(part) => part.to_str(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    match parts.as_slice() {
        [
            "docker",
            "registry",
            "v2",
            "blobs",
            "sha256",
            _,
            hex,
            "data",
        ] if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => Some(hex),
        _ => None,
    }
}

fn blob_path(hex: &str) -> PathBuf {
    PathBuf::from(format!(
        "docker/registry/v2/blobs/sha256/{}/{hex}/data",
        &hex[..2]
    ))
}

/// Every regular file under `root`, as paths relative to it, sorted.
fn walk_files(root: &Path, relative: &Path, found: &mut Vec<PathBuf>) -> Result<(), BackupError> {
    let path = root.join(relative);
    let entries = match std::fs::read_dir(&path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(&path)(e)),
    };
    let mut names: Vec<_> = entries
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(io_error(&path))?;
    names.sort();
    for name in names {
        let child = relative.join(&name);
        let meta = match std::fs::symlink_metadata(root.join(&child)) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error(&root.join(&child))(e)),
        };
        if meta.is_dir() {
            walk_files(root, &child, found)?;
        } else if meta.is_file() {
            found.push(child);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_blobs_are_known_by_their_path() {
        let hex = "ab".repeat(32);
        assert_eq!(blob_hex(&blob_path(&hex)), Some(hex.as_str()));
        assert_eq!(
            blob_hex(Path::new(
                "docker/registry/v2/repositories/x/_layers/sha256/abab/link"
            )),
            None
        );
        assert_eq!(volume_path("./"), ".");
        assert_eq!(volume_path("./work/a.txt"), "work/a.txt");
        assert_eq!(volume_path("work/dir/"), "work/dir");
    }
}
