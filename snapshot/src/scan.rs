//! Scan: what changed below a root since the image it was unpacked from.
//!
//! The walk is parallel (jwalk on rayon: directories are read and every entry `lstat`ed on all
//! cores) and yields entries in the same order as the baseline index (depth-first, names sorted
//! bytewise), so changes are found by one merge of two sorted streams. Unchanged files are never
//! opened: type, mode, owner, size, mtime and link target decide, unless content verification is
//! asked for.
//!
//! Mount points (from the mountinfo of the root's process) and the ignore list are not part of the
//! environment: they are neither saved nor turned into deletions of what the image had below them.

use crate::index::{BaselineIndex, EntryKind, IndexEntry};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Paths that are never part of a saved environment, as seen from inside a container.
pub const DEFAULT_IGNORE: &[&str] = &[
    "/proc",
    "/sys",
    "/dev",
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
    // Made by the runtime at start (a link to /proc/mounts) when the image has none.
    "/etc/mtab",
    "/run/secrets",
    "/var/run/secrets",
    "/run/.containerenv",
    "/.labforge",
];

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("{root} is not a directory")]
    NotADirectory { root: PathBuf },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading mount table {path}: {source}")]
    MountInfo {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What to leave out and how closely to look.
#[derive(Clone, Debug, Default)]
pub struct ScanOptions {
    /// Paths as seen from the root (`/home/jovyan`); each is skipped with everything below it.
    pub ignore: Vec<PathBuf>,
    /// A `/proc/<pid>/mountinfo` whose mount points below the root are skipped.
    pub mountinfo: Option<PathBuf>,
    /// Hash files whose metadata is unchanged and compare with the index's content digest.
    pub verify_content: bool,
}

impl ScanOptions {
    /// The defaults for a container root: [`DEFAULT_IGNORE`] plus the process's own mounts.
    pub fn container() -> Self {
        ScanOptions {
            ignore: DEFAULT_IGNORE.iter().map(PathBuf::from).collect(),
            mountinfo: Some(PathBuf::from("/proc/self/mountinfo")),
            verify_content: false,
        }
    }
}

/// One path to write into the new layer.
#[derive(Debug)]
pub struct ChangedEntry {
    /// Relative to the root.
    pub path: PathBuf,
    pub meta: Metadata,
    /// Something of another type was at this path in the image: it is whited out first.
    pub replaces: bool,
}

/// Everything that differs from the baseline, in the order a layer must carry it.
#[derive(Debug, Default)]
pub struct ChangeSet {
    /// Paths the image had that are gone (a directory's whiteout covers its subtree).
    pub deleted: Vec<PathBuf>,
    /// Directories whose every original entry is gone: one opaque whiteout instead of many.
    pub opaque: Vec<PathBuf>,
    /// Added or modified paths, parents before children.
    pub entries: Vec<ChangedEntry>,
    /// Entries walked (changed or not).
    pub scanned: u64,
    /// Skipped paths that exist (mount points and ignored paths), relative to the root.
    pub skipped: Vec<PathBuf>,
    /// Directories whose entries the scanning user may not list, relative to the root: what the
    /// image had below them is kept as it was, neither saved again nor deleted.
    pub unreadable: Vec<PathBuf>,
}

impl ChangeSet {
    pub fn is_empty(&self) -> bool {
        self.deleted.is_empty() && self.opaque.is_empty() && self.entries.is_empty()
    }

    /// Bytes of file content the layer will carry.
    pub fn content_bytes(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.meta.is_file())
            .map(|e| e.meta.len())
            .sum()
    }

    /// A key that is equal for two scans exactly when they would write the same layer on the same
    /// parent: it covers every changed path's full metadata including inode and ctime, which the
    /// kernel moves on any write, so a file rewritten with an old mtime still changes the key.
    pub fn key(&self, parent: &str) -> String {
        let mut hash = Sha256::new();
        hash.update(b"labforge change set v1\0");
        hash.update(parent.as_bytes());
        for path in &self.deleted {
            hash.update(b"\0D");
            hash.update(path.as_os_str().as_encoded_bytes());
        }
        for path in &self.opaque {
            hash.update(b"\0O");
            hash.update(path.as_os_str().as_encoded_bytes());
        }
        for entry in &self.entries {
            let m = &entry.meta;
            hash.update(b"\0E");
            hash.update(entry.path.as_os_str().as_encoded_bytes());
            for field in [
                m.mode() as i64,
                m.uid() as i64,
                m.gid() as i64,
                m.size() as i64,
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
                m.ino() as i64,
                m.rdev() as i64,
                i64::from(entry.replaces),
            ] {
                hash.update(field.to_le_bytes());
            }
        }
        format!("sha256:{}", hex::encode(hash.finalize()))
    }
}

/// Walks `root` and compares it with `baseline`.
pub fn scan(
    root: &Path,
    baseline: &BaselineIndex,
    options: &ScanOptions,
    mut progress: impl FnMut(u64),
) -> Result<ChangeSet, ScanError> {
    if !fs::metadata(root).is_ok_and(|m| m.is_dir()) {
        return Err(ScanError::NotADirectory {
            root: root.to_owned(),
        });
    }
    let skip = Arc::new(skip_set(root, options)?);
    let walk = walk_below(root, Arc::clone(&skip));

    let mut changes = ChangeSet::default();
    let mut lower = baseline.iter().peekable();
    let mut deletions = Deletions {
        root,
        skip: &skip,
        removed: None,
    };
    for walked in walk {
        let walked = walked.map_err(|err| walk_error(root, err))?;
        let full = walked.path();
        let meta = match walked.client_state {
            Some(Ok(meta)) => meta,
            Some(Err(source)) => return Err(ScanError::Read { path: full, source }),
            None => continue,
        };
        changes.scanned += 1;
        if changes.scanned % 4096 == 0 {
            progress(changes.scanned);
        }
        let Ok(rel) = full.strip_prefix(root).map(Path::to_owned) else {
            continue;
        };
        if meta.file_type().is_socket() {
            continue;
        }
        if walked.read_children_error.is_some() {
            changes.unreadable.push(rel.clone());
        }
        while let Some((path, _)) = lower.next_if(|(path, _)| path.as_path() < rel.as_path()) {
            deletions.record(path, &mut changes);
        }
        let original = lower.next_if(|(path, _)| **path == rel).map(|(_, e)| e);
        if let Some(changed) = changed_entry(rel, &full, meta, original, options.verify_content)? {
            if changed.replaces {
                // The image's subtree below a replaced directory is covered by this whiteout.
                deletions.removed = Some(changed.path.clone());
            }
            changes.entries.push(changed);
        }
    }
    for (path, _) in lower {
        deletions.record(path, &mut changes);
    }
    progress(changes.scanned);

    changes.skipped = skip
        .iter()
        .filter(|s| fs::symlink_metadata(s).is_ok())
        .filter_map(|s| s.strip_prefix(root).ok().map(Path::to_owned))
        .collect();
    fold_into_opaque(baseline, &mut changes);
    Ok(changes)
}

/// A parallel walk that carries each entry's `lstat` (or why it failed).
type Walk = jwalk::WalkDirGeneric<((), Option<io::Result<Metadata>>)>;

/// The walk below `root`, in the baseline index's order, leaving out `skip`.
fn walk_below(root: &Path, skip: Arc<BTreeSet<PathBuf>>) -> Walk {
    Walk::new(root)
        .sort(true)
        .skip_hidden(false)
        .follow_links(false)
        .min_depth(1)
        .process_read_dir(move |_, dir, _, children| {
            // Runs on the walker's threads: the lstat of every entry happens in parallel.
            children.retain(|child| {
                child
                    .as_ref()
                    .map_or(true, |c| !skip.contains(&dir.join(&c.file_name)))
            });
            for child in children.iter_mut().flatten() {
                let meta = fs::symlink_metadata(dir.join(&child.file_name));
                if meta.as_ref().is_ok_and(|m| m.file_type().is_socket()) {
                    child.read_children_path = None;
                }
                child.client_state = Some(meta);
            }
        })
}

/// A failed step of the walk, as a read error of the path it names (the root when none).
fn walk_error(root: &Path, err: jwalk::Error) -> ScanError {
    let path = err
        .path()
        .map(Path::to_owned)
        .unwrap_or_else(|| root.into());
    ScanError::Read {
        path,
        source: err.into(),
    }
}

/// Decides which of the image's paths that the walk passed by are deletions.
struct Deletions<'a> {
    root: &'a Path,
    skip: &'a BTreeSet<PathBuf>,
    /// The last path whose whole subtree is already gone (whited out), so its children are not.
    removed: Option<PathBuf>,
}

impl Deletions<'_> {
    /// Records the image's `path` as deleted, unless a whiteout already covers it or the walk
    /// did not look there.
    fn record(&mut self, path: &Path, changes: &mut ChangeSet) {
        if self.removed.as_deref().is_some_and(|r| path.starts_with(r))
            || self.skip.iter().any(|s| self.root.join(path).starts_with(s))
            // Not seen is not gone: the walk could not list it.
            || changes.unreadable.iter().any(|u| path.starts_with(u) && path != u)
        {
            return;
        }
        self.removed = Some(path.to_owned());
        changes.deleted.push(path.to_owned());
    }
}

/// The entry to save for the walked path `rel`, when the image had nothing there (`original`)
/// or something that differs.
fn changed_entry(
    rel: PathBuf,
    full: &Path,
    meta: Metadata,
    original: Option<&IndexEntry>,
    verify_content: bool,
) -> Result<Option<ChangedEntry>, ScanError> {
    let replaces = match original {
        None => false,
        Some(original) if kind_of(&meta) != Some(original.kind) => true,
        Some(original) if differs(full, &meta, original, verify_content)? => false,
        Some(_) => return Ok(None),
    };
    Ok(Some(ChangedEntry {
        path: rel,
        meta,
        replaces,
    }))
}

/// Turns "every original entry of directory D deleted" into one opaque whiteout for D, which is
/// what a directory removed and recreated (`rm -rf pkg; mkdir pkg`) is.
fn fold_into_opaque(baseline: &BaselineIndex, changes: &mut ChangeSet) {
    let mut deleted_per_dir: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for path in &changes.deleted {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            *deleted_per_dir.entry(parent.to_owned()).or_default() += 1;
        }
    }
    let opaque: BTreeSet<PathBuf> = deleted_per_dir
        .into_iter()
        .filter(|(dir, deleted)| {
            // The directory itself is still there: had it gone, its own whiteout would cover
            // its entries and none of them would be listed.
            *deleted >= 2
                && baseline
                    .children(dir)
                    .filter(|(p, _)| p.parent() == Some(dir.as_path()))
                    .count()
                    == *deleted
        })
        .map(|(dir, _)| dir)
        .collect();
    if opaque.is_empty() {
        return;
    }
    changes
        .deleted
        .retain(|p| !p.parent().is_some_and(|parent| opaque.contains(parent)));
    changes.opaque = opaque.into_iter().collect();
}

fn skip_set(root: &Path, options: &ScanOptions) -> Result<BTreeSet<PathBuf>, ScanError> {
    let mut skip = BTreeSet::new();
    for ignored in &options.ignore {
        let rel = ignored.strip_prefix("/").unwrap_or(ignored);
        skip.insert(root.join(rel));
    }
    if let Some(mountinfo) = &options.mountinfo {
        let table = fs::read_to_string(mountinfo).map_err(|source| ScanError::MountInfo {
            path: mountinfo.clone(),
            source,
        })?;
        for mount_point in mount_points(&table) {
            // Mount points are absolute in the process's view; the root is `/` inside a container
            // or a directory on the host.
            if mount_point != root && mount_point.starts_with(root) {
                skip.insert(mount_point);
            }
        }
    }
    Ok(skip)
}

/// The mount point column (5th) of a mountinfo table, octal escapes (`\040`) decoded.
pub fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|escaped| PathBuf::from(unescape_octal(escaped)))
        .collect()
}

fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..=i + 3]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value = bytes[i + 1..=i + 3]
                .iter()
                .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push(u8::try_from(value).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(crate) fn kind_of(meta: &Metadata) -> Option<EntryKind> {
    let t = meta.file_type();
    Some(if t.is_file() {
        EntryKind::File
    } else if t.is_dir() {
        EntryKind::Dir
    } else if t.is_symlink() {
        EntryKind::Symlink
    } else if t.is_char_device() {
        EntryKind::CharDevice
    } else if t.is_block_device() {
        EntryKind::BlockDevice
    } else if t.is_fifo() {
        EntryKind::Fifo
    } else {
        return None;
    })
}

/// Whether an entry of the same type as in the image must be saved again.
fn differs(
    full: &Path,
    meta: &Metadata,
    original: &IndexEntry,
    verify_content: bool,
) -> Result<bool, ScanError> {
    let read = |source| ScanError::Read {
        path: full.to_owned(),
        source,
    };
    if meta.mode() & 0o7777 != original.mode
        || meta.uid() != original.uid
        || meta.gid() != original.gid
        || meta.mtime() != original.mtime
    {
        return Ok(true);
    }
    Ok(match original.kind {
        EntryKind::File => {
            meta.len() != original.size
                || (verify_content
                    && original.sha256().is_some_and(|want| {
                        file_sha256(full).map_err(read).is_ok_and(|h| h != want)
                    }))
        }
        EntryKind::Symlink => {
            fs::read_link(full).map_err(read)?.as_path() != original.link().unwrap_or(Path::new(""))
        }
        EntryKind::CharDevice | EntryKind::BlockDevice => {
            Some(device_numbers(meta.rdev())) != original.device()
        }
        EntryKind::Dir | EntryKind::Fifo => false,
    })
}

fn file_sha256(path: &Path) -> io::Result<String> {
    let mut hash = Sha256::new();
    io::copy(&mut fs::File::open(path)?, &mut hash)?;
    Ok(hex::encode(hash.finalize()))
}

/// (major, minor) of a Linux `dev_t`.
pub(crate) fn device_numbers(rdev: u64) -> (u32, u32) {
    let major = ((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff);
    let minor = ((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff);
    (major as u32, minor as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_mount_points_are_decoded() {
        let table = "22 1 0:21 / / rw,relatime - overlay overlay rw\n\
                     23 22 0:22 / /home/jovyan rw - ext4 /dev/sda1 rw\n\
                     24 22 0:23 / /data\\040set rw - tmpfs tmpfs rw\n";
        assert_eq!(
            mount_points(table),
            [
                PathBuf::from("/"),
                PathBuf::from("/home/jovyan"),
                PathBuf::from("/data set")
            ]
        );
    }

    #[test]
    fn device_numbers_split_like_the_kernel() {
        // /dev/null is 1:3, /dev/nvme0n1 259:0.
        assert_eq!(device_numbers(0x103), (1, 3));
        assert_eq!(device_numbers(0x10300), (259, 0));
    }
}
