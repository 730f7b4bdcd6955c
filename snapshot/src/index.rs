//! The baseline index: what the filesystem of an image looks like, per path, without its contents.
//!
//! Saving an environment means finding what changed inside a running notebook since the image it
//! runs. Comparing against an index of the image (type, mode, owner, size, mtime, link target,
//! device numbers, xattrs) finds that without reading any unchanged file. The index of a base image
//! is built once by streaming its layers (whiteouts applied, as a runtime does); the index of an
//! image labforge saved is its parent's index plus the one new layer.
//!
//! Applying a layer is also the one moment a layer's bytes pass by, so it is where a save learns
//! what the layer did: [`LayerStats`] (files added, changed, deleted) come from comparing each
//! entry with the index, and a [`LayerObserver`] sees every entry in order and may read the
//! content of the few files it asks for (package metadata, for the save's change summary) without
//! a second pass over the layer.

use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

/// File types a layer can carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
}

/// What the index knows of one path.
///
/// Kept to 40 bytes: an index holds every path of an image (100k and more) in the builder and in
/// the agent, so the fields most entries lack (link target, device numbers, xattrs, content
/// digest) share one box. The JSON form (cached indexes, the agent's stdin) is the flat one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub kind: EntryKind,
    /// Permission bits including setuid/setgid/sticky.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Modification time in whole seconds (what tar headers without PAX carry).
    pub mtime: i64,
    extra: Option<Box<EntryExtra>>,
}

/// The rarer facts of an entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct EntryExtra {
    link: Option<PathBuf>,
    device: Option<(u32, u32)>,
    xattrs: BTreeMap<String, Vec<u8>>,
    sha256: Option<String>,
}

static NO_XATTRS: BTreeMap<String, Vec<u8>> = BTreeMap::new();

impl IndexEntry {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kind: EntryKind,
        mode: u32,
        uid: u32,
        gid: u32,
        size: u64,
        mtime: i64,
        link: Option<PathBuf>,
        device: Option<(u32, u32)>,
        xattrs: BTreeMap<String, Vec<u8>>,
        sha256: Option<String>,
    ) -> Self {
        let extra = EntryExtra {
            link,
            device,
            xattrs,
            sha256,
        };
        Self {
            kind,
            mode,
            uid,
            gid,
            size,
            mtime,
            extra: (extra != EntryExtra::default()).then(|| Box::new(extra)),
        }
    }

    /// A symlink's target.
    pub fn link(&self) -> Option<&Path> {
        self.extra.as_ref()?.link.as_deref()
    }

    /// A device's major and minor numbers.
    pub fn device(&self) -> Option<(u32, u32)> {
        self.extra.as_ref()?.device
    }

    pub fn xattrs(&self) -> &BTreeMap<String, Vec<u8>> {
        self.extra.as_ref().map_or(&NO_XATTRS, |e| &e.xattrs)
    }

    /// Hex SHA-256 of a regular file's content, for scans that verify content.
    pub fn sha256(&self) -> Option<&str> {
        self.extra.as_ref()?.sha256.as_deref()
    }
}

/// The flat JSON form of an entry, as written.
#[derive(serde::Serialize)]
struct EntryOut<'a> {
    kind: EntryKind,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    link: Option<&'a Path>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device: Option<(u32, u32)>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    xattrs: &'a BTreeMap<String, Vec<u8>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sha256: Option<&'a str>,
}

/// The flat JSON form of an entry, as read.
#[derive(serde::Deserialize)]
struct EntryIn {
    kind: EntryKind,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: i64,
    #[serde(default)]
    link: Option<PathBuf>,
    #[serde(default)]
    device: Option<(u32, u32)>,
    #[serde(default)]
    xattrs: BTreeMap<String, Vec<u8>>,
    #[serde(default)]
    sha256: Option<String>,
}

impl serde::Serialize for IndexEntry {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        EntryOut {
            kind: self.kind,
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            mtime: self.mtime,
            link: self.link(),
            device: self.device(),
            xattrs: self.xattrs(),
            sha256: self.sha256(),
        }
        .serialize(serializer)
    }
}

impl<'de> serde::Deserialize<'de> for IndexEntry {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let e = EntryIn::deserialize(deserializer)?;
        Ok(IndexEntry::new(
            e.kind, e.mode, e.uid, e.gid, e.size, e.mtime, e.link, e.device, e.xattrs, e.sha256,
        ))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("reading layer {layer}")]
    Layer {
        layer: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("layer {layer}: entry {path:?} escapes the root")]
    UnsafePath { layer: usize, path: PathBuf },
}

/// Path → entry for a whole image filesystem; paths are relative (`usr/bin/python3`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BaselineIndex {
    entries: BTreeMap<PathBuf, IndexEntry>,
}

impl BaselineIndex {
    /// Checks that `reader` holds an index in its JSON form, entry by entry, keeping none of it:
    /// for an encoded index that is only passed on.
    pub fn check_json(reader: impl Read) -> serde_json::Result<()> {
        struct Entries;
        impl<'de> serde::Deserialize<'de> for Entries {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_map(Entries)
            }
        }
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("path to entry")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                while map.next_entry::<PathBuf, IndexEntry>()?.is_some() {}
                Ok(Entries)
            }
        }
        #[derive(serde::Deserialize)]
        struct Shape {
            #[serde(rename = "entries")]
            _entries: Entries,
        }
        serde_json::from_reader::<_, Shape>(reader).map(|_| ())
    }
}

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_WHITEOUT: &str = ".wh..wh..opq";

/// What one layer did to the index's non-directory entries (files, symlinks, devices, fifos).
///
/// Directories are left out: a change-set layer carries every changed entry's parent directories
/// as context, so counting them would report directories nobody touched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerStats {
    /// Entries at paths the index had no non-directory at.
    pub added: u64,
    /// Entries replacing a non-directory (of any type) the index had at the same path.
    pub changed: u64,
    /// Non-directories the layer removed (whiteouts, opaque directories, a file replacing a
    /// directory) and did not put back.
    pub deleted: u64,
    /// Content bytes of the regular files the layer carries.
    pub written_bytes: u64,
    /// Sizes of the regular files it deleted, as the index knew them.
    pub deleted_bytes: u64,
}

/// Sees a layer's entries as they are applied, in the layer's order, with the same whiteout
/// semantics as the index.
pub trait LayerObserver {
    /// Whether the content of the regular file at `path` is wanted in [`LayerObserver::entry`].
    fn wants(&self, path: &Path) -> bool;
    /// `path` and everything below it are gone (a whiteout).
    fn removed(&mut self, path: &Path);
    /// Everything below `dir` is gone, `dir` stays (an opaque whiteout).
    fn emptied(&mut self, dir: &Path);
    /// An entry is put at `path`; a non-directory takes away what was below `path`. `content` is
    /// given for the regular files [`LayerObserver::wants`]; what it leaves unread is skipped.
    fn entry(
        &mut self,
        path: &Path,
        kind: EntryKind,
        content: Option<&mut dyn Read>,
    ) -> io::Result<()>;
    /// A hardlink at `path` to `target`, an entry of this or a lower layer.
    fn linked(&mut self, path: &Path, target: &Path);
}

/// An observer that wants nothing.
pub struct NoObserver;

impl LayerObserver for NoObserver {
    fn wants(&self, _: &Path) -> bool {
        false
    }
    fn removed(&mut self, _: &Path) {}
    fn emptied(&mut self, _: &Path) {}
    fn entry(&mut self, _: &Path, _: EntryKind, _: Option<&mut dyn Read>) -> io::Result<()> {
        Ok(())
    }
    fn linked(&mut self, _: &Path, _: &Path) {}
}

/// Counts a layer's effect while it is applied.
#[derive(Default)]
struct Tally {
    stats: LayerStats,
    /// Non-directories removed by this layer so far, with their sizes: one put back at the same
    /// path later in the layer (a type change: whiteout, then the new entry) is a change.
    removed: HashMap<PathBuf, u64>,
}

impl Tally {
    fn removed(&mut self, path: PathBuf, entry: &IndexEntry) {
        if entry.kind != EntryKind::Dir {
            self.removed.insert(path, entry.size);
        }
    }

    fn put(&mut self, path: &Path, previous: Option<&IndexEntry>, entry: &IndexEntry, body: u64) {
        if entry.kind == EntryKind::Dir {
            return;
        }
        if previous.is_some_and(|p| p.kind != EntryKind::Dir) || self.removed.remove(path).is_some()
        {
            self.stats.changed += 1;
        } else {
            self.stats.added += 1;
        }
        self.stats.written_bytes += body;
    }

    fn finish(mut self) -> LayerStats {
        self.stats.deleted = self.removed.len() as u64;
        self.stats.deleted_bytes = self.removed.values().sum();
        self.stats
    }
}

/// Hashes what a reader reads: a wanted file's content goes to its observer and to the index's
/// content digest in the same pass.
struct HashingReader<'a, R: Read> {
    inner: &'a mut R,
    hash: &'a mut Sha256,
}

impl<R: Read> Read for HashingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

impl BaselineIndex {
    pub fn get(&self, path: &Path) -> Option<&IndexEntry> {
        self.entries.get(path)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&PathBuf, &IndexEntry)> {
        self.entries.iter()
    }

    /// Entries strictly below `dir`.
    pub fn children<'a>(
        &'a self,
        dir: &'a Path,
    ) -> impl Iterator<Item = (&'a PathBuf, &'a IndexEntry)> + 'a {
        self.entries
            .range::<Path, _>((std::ops::Bound::Excluded(dir), std::ops::Bound::Unbounded))
            .take_while(move |(p, _)| p.starts_with(dir))
    }

    /// Applies one uncompressed layer tar on top of the index, the way a container runtime
    /// unpacks it: whiteouts delete, opaque whiteouts hide everything below from lower layers,
    /// hardlinks take their target's metadata. File contents are hashed for content verification.
    pub fn apply_layer(&mut self, layer: usize, tar: impl Read) -> Result<(), IndexError> {
        self.apply_layer_with(layer, tar, true, &mut NoObserver)
            .map(drop)
    }

    /// [`BaselineIndex::apply_layer`] without hashing contents: for a layer labforge just wrote,
    /// whose files a content-verifying scan then compares by metadata only.
    pub fn apply_layer_metadata(&mut self, layer: usize, tar: impl Read) -> Result<(), IndexError> {
        self.apply_layer_with(layer, tar, false, &mut NoObserver)
            .map(drop)
    }

    /// Applies a layer (hashing contents when `hash`), showing every entry to `observer`, and
    /// says what the layer did to the index's files.
    pub fn apply_layer_with(
        &mut self,
        layer: usize,
        tar: impl Read,
        hash: bool,
        observer: &mut dyn LayerObserver,
    ) -> Result<LayerStats, IndexError> {
        let io = |source| IndexError::Layer { layer, source };
        let mut tally = Tally::default();
        let mut archive = tar::Archive::new(tar);
        for entry in archive.entries().map_err(io)? {
            let mut entry = entry.map_err(io)?;
            let raw = entry.path().map_err(io)?.into_owned();
            let path = normalize(&raw).ok_or(IndexError::UnsafePath {
                layer,
                path: raw.clone(),
            })?;
            if path.as_os_str().is_empty() {
                // The root itself (`./`): not a path of the image, and never deleted.
                continue;
            }
            if self.apply_whiteout(&path, &mut tally, observer) {
                continue;
            }
            let kind = match entry.header().entry_type() {
                tar::EntryType::Directory => EntryKind::Dir,
                tar::EntryType::Symlink => EntryKind::Symlink,
                tar::EntryType::Char => EntryKind::CharDevice,
                tar::EntryType::Block => EntryKind::BlockDevice,
                tar::EntryType::Fifo => EntryKind::Fifo,
                tar::EntryType::Link => {
                    self.apply_hardlink(path, &entry, &mut tally, observer)
                        .map_err(io)?;
                    continue;
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => EntryKind::File,
                // PAX/GNU extension headers are folded into the next entry by the tar crate.
                _ => continue,
            };
            let record = read_record(&mut entry, &path, kind, hash, observer).map_err(io)?;
            let body = if kind == EntryKind::File {
                record.size
            } else {
                0
            };
            self.replace(path, record, body, &mut tally);
        }
        Ok(tally.finish())
    }

    /// Applies `path` if it is a whiteout (plain or opaque) and says whether it was one: a
    /// whiteout is a marker, never an entry of the index.
    fn apply_whiteout(
        &mut self,
        path: &Path,
        tally: &mut Tally,
        observer: &mut dyn LayerObserver,
    ) -> bool {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
        if name == OPAQUE_WHITEOUT {
            self.remove_below(&parent, tally);
            observer.emptied(&parent);
            return true;
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            let target = parent.join(hidden);
            self.remove_below(&target, tally);
            if let Some((path, entry)) = self.entries.remove_entry(&target) {
                tally.removed(path, &entry);
            }
            observer.removed(&target);
            return true;
        }
        false
    }

    /// Puts a hardlink at `path` as a copy of its target's entry; a link to a path the index
    /// lacks adds nothing.
    fn apply_hardlink<R: Read>(
        &mut self,
        path: PathBuf,
        entry: &tar::Entry<'_, R>,
        tally: &mut Tally,
        observer: &mut dyn LayerObserver,
    ) -> io::Result<()> {
        let target = entry
            .link_name()?
            .and_then(|l| normalize(&l))
            .and_then(|l| self.entries.get(&l).cloned().map(|e| (l, e)));
        if let Some((target, target_entry)) = target {
            observer.linked(&path, &target);
            self.replace(path, target_entry, 0, tally);
        }
        Ok(())
    }

    /// Puts `entry` at `path`; a non-directory replacing a directory takes its subtree away.
    /// `body` is the content bytes the layer carries for it.
    fn replace(&mut self, path: PathBuf, entry: IndexEntry, body: u64, tally: &mut Tally) {
        if entry.kind != EntryKind::Dir {
            self.remove_below(&path, tally);
        }
        tally.put(&path, self.entries.get(&path), &entry, body);
        self.entries.insert(path, entry);
    }

    fn remove_below(&mut self, dir: &Path, tally: &mut Tally) {
        let doomed: Vec<PathBuf> = self.children(dir).map(|(p, _)| p.clone()).collect();
        for path in doomed {
            if let Some((path, entry)) = self.entries.remove_entry(&path) {
                tally.removed(path, &entry);
            }
        }
    }
}

/// `./usr//bin/` → `usr/bin`; `None` for paths that climb out of the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// The index entry for a tar entry of `kind` at `path` (not a hardlink or a whiteout), its
/// content shown to `observer` and hashed when `hash`.
fn read_record<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    path: &Path,
    kind: EntryKind,
    hash: bool,
    observer: &mut dyn LayerObserver,
) -> io::Result<IndexEntry> {
    let header = entry.header();
    let device = matches!(kind, EntryKind::CharDevice | EntryKind::BlockDevice).then(|| {
        (
            header.device_major().ok().flatten().unwrap_or(0),
            header.device_minor().ok().flatten().unwrap_or(0),
        )
    });
    let xattrs = pax_xattrs(entry)?;
    let sha256 = observe_content(entry, path, kind, hash, observer)?;
    let header = entry.header();
    // Linux ids are 32-bit; a layer claiming more gets the overflow id, as the kernel maps it.
    let id = |n: u64| u32::try_from(n).unwrap_or(65534);
    Ok(IndexEntry::new(
        kind,
        header.mode()? & 0o7777,
        id(header.uid()?),
        id(header.gid()?),
        if kind == EntryKind::File {
            entry.size()
        } else {
            0
        },
        i64::try_from(header.mtime()?).unwrap_or(i64::MAX),
        match kind {
            EntryKind::Symlink => entry.link_name()?.map(|l| l.into_owned()),
            _ => None,
        },
        device,
        xattrs,
        sha256,
    ))
}

/// The extended attributes a tar entry carries in its PAX header.
fn pax_xattrs<R: Read>(entry: &mut tar::Entry<'_, R>) -> io::Result<BTreeMap<String, Vec<u8>>> {
    let mut xattrs = BTreeMap::new();
    if let Some(extensions) = entry.pax_extensions()? {
        for ext in extensions.flatten() {
            if let (Ok(key), value) = (ext.key(), ext.value_bytes())
                && let Some(name) = key.strip_prefix("SCHILY.xattr.")
            {
                xattrs.insert(name.to_owned(), value.to_vec());
            }
        }
    }
    Ok(xattrs)
}

/// Shows a tar entry to `observer`, with its content for a regular file the observer wants,
/// and returns the content digest when `hash` and the entry is a regular file.
fn observe_content<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    path: &Path,
    kind: EntryKind,
    hash: bool,
    observer: &mut dyn LayerObserver,
) -> io::Result<Option<String>> {
    let observed = kind == EntryKind::File && observer.wants(path);
    if hash && kind == EntryKind::File {
        let mut digest = Sha256::new();
        if observed {
            let mut reader = HashingReader {
                inner: &mut *entry,
                hash: &mut digest,
            };
            observer.entry(path, kind, Some(&mut reader))?;
        } else {
            observer.entry(path, kind, None)?;
        }
        // What the observer left unread still counts for the digest.
        io::copy(entry, &mut digest)?;
        Ok(Some(hex::encode(digest.finalize())))
    } else {
        let content: Option<&mut dyn Read> = if observed { Some(entry) } else { None };
        observer.entry(path, kind, content)?;
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_small_and_keep_their_flat_json_form() {
        // 100k entries per index, in the builder and in the agent: a regression here costs MiBs.
        assert_eq!(std::mem::size_of::<IndexEntry>(), 40);
        let link = IndexEntry::new(
            EntryKind::Symlink,
            0o777,
            0,
            0,
            0,
            1,
            Some(PathBuf::from("lib64")),
            None,
            BTreeMap::new(),
            None,
        );
        let json = serde_json::to_string(&link).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"Symlink","mode":511,"uid":0,"gid":0,"size":0,"mtime":1,"link":"lib64"}"#
        );
        assert_eq!(serde_json::from_str::<IndexEntry>(&json).unwrap(), link);
        let file: IndexEntry = serde_json::from_str(
            r#"{"kind":"File","mode":420,"uid":1000,"gid":100,"size":3,"mtime":2,
                "xattrs":{"user.a":[1,2]},"sha256":"ab"}"#,
        )
        .unwrap();
        assert_eq!((file.uid, file.size, file.sha256()), (1000, 3, Some("ab")));
        assert_eq!(file.xattrs()["user.a"], [1, 2]);
        assert_eq!(file.link(), None);
        let plain: IndexEntry =
            serde_json::from_str(r#"{"kind":"Dir","mode":493,"uid":0,"gid":0,"size":0,"mtime":0}"#)
                .unwrap();
        assert!(plain.extra.is_none(), "nothing rare, nothing boxed");
    }

    #[test]
    fn an_encoded_index_is_checked_without_being_kept() {
        let mut index = BaselineIndex::default();
        index
            .apply_layer(0, &layer(&[("a/b.txt", F, "hi")])[..])
            .unwrap();
        let json = serde_json::to_vec(&index).unwrap();
        assert!(BaselineIndex::check_json(&json[..]).is_ok());
        let cut = &json[..json.len() - 3];
        assert!(BaselineIndex::check_json(cut).is_err(), "truncated");
        let wrong = br#"{"entries":{"a":{"kind":"Nope"}}}"#;
        assert!(
            BaselineIndex::check_json(&wrong[..]).is_err(),
            "not an entry"
        );
    }

    /// Builds an uncompressed layer from (path, kind, body or link target).
    fn layer(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, kind, data) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(*kind);
            header.set_mode(if *kind == tar::EntryType::Directory {
                0o755
            } else {
                0o644
            });
            header.set_uid(1000);
            header.set_gid(100);
            header.set_mtime(1_700_000_000);
            match kind {
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    header.set_size(0);
                    builder.append_link(&mut header, path, data).unwrap();
                }
                _ => {
                    header.set_size(data.len() as u64);
                    builder
                        .append_data(&mut header, path, data.as_bytes())
                        .unwrap();
                }
            }
        }
        builder.into_inner().unwrap()
    }

    use tar::EntryType::{Directory as D, Link as H, Regular as F, Symlink as L};

    fn paths(index: &BaselineIndex) -> Vec<String> {
        index.iter().map(|(p, _)| p.display().to_string()).collect()
    }

    #[test]
    fn layers_stack_with_whiteouts_and_opaque_directories() {
        let base = layer(&[
            ("etc/", D, ""),
            ("etc/hosts", F, "127.0.0.1"),
            ("opt/", D, ""),
            ("opt/pkg/", D, ""),
            ("opt/pkg/a.py", F, "a"),
            ("opt/pkg/b.py", F, "bb"),
            ("usr/", D, ""),
            ("usr/lib", L, "lib64"),
            ("var/", D, ""),
            ("var/cache/", D, ""),
            ("var/cache/x", F, "x"),
        ]);
        let top = layer(&[
            ("etc/.wh.hosts", F, ""),
            ("opt/pkg/.wh..wh..opq", F, ""),
            ("opt/pkg/c.py", F, "ccc"),
            ("var/cache", F, "now a file"),
            ("usr/lib2", H, "usr/lib"),
        ]);
        let mut index = BaselineIndex::default();
        index.apply_layer(0, &base[..]).unwrap();
        index.apply_layer(1, &top[..]).unwrap();
        assert_eq!(
            paths(&index),
            [
                "etc",
                "opt",
                "opt/pkg",
                "opt/pkg/c.py",
                "usr",
                "usr/lib",
                "usr/lib2",
                "var",
                "var/cache"
            ]
        );
        let c = index.get(Path::new("opt/pkg/c.py")).unwrap();
        assert_eq!(
            (c.kind, c.size, c.uid, c.gid, c.mode, c.mtime),
            (EntryKind::File, 3, 1000, 100, 0o644, 1_700_000_000)
        );
        assert_eq!(
            index.get(Path::new("var/cache")).unwrap().kind,
            EntryKind::File,
            "dir replaced by a file"
        );
        assert_eq!(
            index.get(Path::new("usr/lib")).unwrap().link(),
            Some(Path::new("lib64"))
        );
        assert_eq!(
            index.get(Path::new("usr/lib2")).unwrap().kind,
            EntryKind::Symlink,
            "hardlink takes its target's metadata"
        );
    }

    #[test]
    fn entries_escaping_the_root_are_refused() {
        // tar's builder refuses such names, so write the header bytes by hand as an attacker would.
        let mut header = tar::Header::new_old();
        header.as_old_mut().name[..16].copy_from_slice(b"../../etc/passwd");
        header.set_size(1);
        header.set_entry_type(F);
        header.set_cksum();
        let mut evil = header.as_bytes().to_vec();
        evil.extend_from_slice(&[b'x'; 512]);
        evil.extend_from_slice(&[0; 1024]);
        let err = BaselineIndex::default()
            .apply_layer(3, &evil[..])
            .unwrap_err();
        assert!(
            err.to_string().contains("layer 3") && err.to_string().contains("escapes"),
            "{err}"
        );
    }

    #[test]
    fn the_root_entry_of_a_layer_is_not_a_path() {
        let mut index = BaselineIndex::default();
        index
            .apply_layer(0, &layer(&[("./", D, ""), ("./bin/", D, "")])[..])
            .unwrap();
        assert_eq!(paths(&index), ["bin"]);
    }

    #[test]
    fn index_round_trips_through_json_for_the_cache() {
        let mut index = BaselineIndex::default();
        index
            .apply_layer(0, &layer(&[("bin/", D, ""), ("bin/sh", F, "#!")])[..])
            .unwrap();
        let json = serde_json::to_vec(&index).unwrap();
        assert_eq!(
            serde_json::from_slice::<BaselineIndex>(&json).unwrap(),
            index
        );
    }

    #[test]
    fn layer_stats_count_files_added_changed_and_deleted() {
        let base = layer(&[
            ("a", F, "aaaa"),
            ("b", F, "b"),
            ("d/", D, ""),
            ("d/x", F, "xx"),
            ("d/y", F, "yyy"),
            ("l", L, "b"),
        ]);
        // What a change set looks like: whiteouts first, then entries with their parents.
        let top = layer(&[
            ("./", D, ""),
            (".wh.a", F, ""),
            (".wh.l", F, ""),
            ("d/.wh..wh..opq", F, ""),
            ("d/", D, ""),
            ("d/z", F, "zzzzz"),
            ("l", F, "now a file"),
            ("b", F, "bbbbbb"),
            ("c", F, "cc"),
            ("e/", D, ""),
            ("c2", H, "c"),
        ]);
        let mut index = BaselineIndex::default();
        index.apply_layer(0, &base[..]).unwrap();
        let stats = index
            .apply_layer_with(1, &top[..], false, &mut NoObserver)
            .unwrap();
        assert_eq!(
            stats,
            LayerStats {
                added: 3,   // d/z, c, c2 (the directory e is not counted)
                changed: 2, // l (symlink became a file), b
                deleted: 3, // a, d/x, d/y
                written_bytes: 5 + 10 + 6 + 2,
                deleted_bytes: 4 + 2 + 3,
            }
        );
    }

    /// Records what it is shown; reads only the first bytes of the files it wants.
    #[derive(Default)]
    struct Recorder(Vec<String>);

    impl LayerObserver for Recorder {
        fn wants(&self, path: &Path) -> bool {
            path.ends_with("METADATA")
        }
        fn removed(&mut self, path: &Path) {
            self.0.push(format!("removed {}", path.display()));
        }
        fn emptied(&mut self, dir: &Path) {
            self.0.push(format!("emptied {}", dir.display()));
        }
        fn entry(
            &mut self,
            path: &Path,
            kind: EntryKind,
            content: Option<&mut dyn Read>,
        ) -> io::Result<()> {
            let mut head = [0u8; 4];
            let shown = match content {
                Some(content) => {
                    content.read_exact(&mut head)?;
                    format!(" {}", String::from_utf8_lossy(&head))
                }
                None => String::new(),
            };
            self.0.push(format!("{kind:?} {}{shown}", path.display()));
            Ok(())
        }
        fn linked(&mut self, path: &Path, target: &Path) {
            self.0
                .push(format!("link {} -> {}", path.display(), target.display()));
        }
    }

    #[test]
    fn an_observer_sees_entries_in_order_and_reads_wanted_files_without_breaking_the_digest() {
        let body = "Name: a\nVersion: 1.0\n";
        let tar = layer(&[
            ("site/", D, ""),
            ("site/a.dist-info/", D, ""),
            ("site/a.dist-info/METADATA", F, body),
            ("site/a.dist-info/RECORD", F, "x"),
            ("site/.wh.old.dist-info", F, ""),
            ("opt/.wh..wh..opq", F, ""),
            ("site/copy", H, "site/a.dist-info/METADATA"),
        ]);
        let mut recorder = Recorder::default();
        let mut index = BaselineIndex::default();
        index
            .apply_layer_with(0, &tar[..], true, &mut recorder)
            .unwrap();
        assert_eq!(
            recorder.0,
            [
                "Dir site",
                "Dir site/a.dist-info",
                "File site/a.dist-info/METADATA Name",
                "File site/a.dist-info/RECORD",
                "removed site/old.dist-info",
                "emptied opt",
                "link site/copy -> site/a.dist-info/METADATA",
            ]
        );
        let metadata = index.get(Path::new("site/a.dist-info/METADATA")).unwrap();
        assert_eq!(
            metadata.sha256(),
            Some(hex::encode(Sha256::digest(body)).as_str()),
            "the observer read 4 bytes; the digest still covers the whole file"
        );
    }
}
