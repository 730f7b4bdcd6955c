//! The baseline index: what the filesystem of an image looks like, per path, without its contents.
//!
//! Saving an environment means finding what changed inside a running notebook since the image it
//! runs. Comparing against an index of the image (type, mode, owner, size, mtime, link target,
//! device numbers, xattrs) finds that without reading any unchanged file. The index of a base image
//! is built once by streaming its layers (whiteouts applied, as a runtime does); the index of an
//! image labforge saved is its parent's index plus the one new layer.

use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
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
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexEntry {
    pub kind: EntryKind,
    /// Permission bits including setuid/setgid/sticky.
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub size: u64,
    /// Modification time in whole seconds (what tar headers without PAX carry).
    pub mtime: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<(u32, u32)>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, Vec<u8>>,
    /// Hex SHA-256 of a regular file's content, for scans that verify content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
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

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_WHITEOUT: &str = ".wh..wh..opq";

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
        self.apply(layer, tar, true)
    }

    /// [`BaselineIndex::apply_layer`] without hashing contents: for a layer labforge just wrote,
    /// whose files a content-verifying scan then compares by metadata only.
    pub fn apply_layer_metadata(&mut self, layer: usize, tar: impl Read) -> Result<(), IndexError> {
        self.apply(layer, tar, false)
    }

    fn apply(&mut self, layer: usize, tar: impl Read, hash: bool) -> Result<(), IndexError> {
        let io = |source| IndexError::Layer { layer, source };
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
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
            if name == OPAQUE_WHITEOUT {
                self.remove_below(&parent);
                continue;
            }
            if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
                let target = parent.join(hidden);
                self.remove_below(&target);
                self.entries.remove(&target);
                continue;
            }
            let header = entry.header();
            let kind = match header.entry_type() {
                tar::EntryType::Directory => EntryKind::Dir,
                tar::EntryType::Symlink => EntryKind::Symlink,
                tar::EntryType::Char => EntryKind::CharDevice,
                tar::EntryType::Block => EntryKind::BlockDevice,
                tar::EntryType::Fifo => EntryKind::Fifo,
                tar::EntryType::Link => {
                    let target = entry
                        .link_name()
                        .map_err(io)?
                        .and_then(|l| normalize(&l))
                        .and_then(|l| self.entries.get(&l).cloned());
                    if let Some(target) = target {
                        self.replace(path, target);
                    }
                    continue;
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => EntryKind::File,
                // PAX/GNU extension headers are folded into the next entry by the tar crate.
                _ => continue,
            };
            let device =
                matches!(kind, EntryKind::CharDevice | EntryKind::BlockDevice).then(|| {
                    (
                        header.device_major().ok().flatten().unwrap_or(0),
                        header.device_minor().ok().flatten().unwrap_or(0),
                    )
                });
            let mut xattrs = BTreeMap::new();
            if let Some(extensions) = entry.pax_extensions().map_err(io)? {
                for ext in extensions.flatten() {
                    if let (Ok(key), value) = (ext.key(), ext.value_bytes())
                        && let Some(name) = key.strip_prefix("SCHILY.xattr.")
                    {
                        xattrs.insert(name.to_owned(), value.to_vec());
                    }
                }
            }
            let sha256 = if hash && kind == EntryKind::File {
                let mut hash = Sha256::new();
                std::io::copy(&mut entry, &mut hash).map_err(io)?;
                Some(hex::encode(hash.finalize()))
            } else {
                None
            };
            let header = entry.header();
            let record = IndexEntry {
                kind,
                mode: header.mode().map_err(io)? & 0o7777,
                uid: header.uid().map_err(io)?,
                gid: header.gid().map_err(io)?,
                size: if kind == EntryKind::File {
                    entry.size()
                } else {
                    0
                },
                mtime: i64::try_from(header.mtime().map_err(io)?).unwrap_or(i64::MAX),
                link: match kind {
                    EntryKind::Symlink => entry.link_name().map_err(io)?.map(|l| l.into_owned()),
                    _ => None,
                },
                device,
                xattrs,
                sha256,
            };
            self.replace(path, record);
        }
        Ok(())
    }

    /// Puts `entry` at `path`; a non-directory replacing a directory takes its subtree away.
    fn replace(&mut self, path: PathBuf, entry: IndexEntry) {
        if entry.kind != EntryKind::Dir {
            self.remove_below(&path);
        }
        self.entries.insert(path, entry);
    }

    fn remove_below(&mut self, dir: &Path) {
        let doomed: Vec<PathBuf> = self.children(dir).map(|(p, _)| p.clone()).collect();
        for path in doomed {
            self.entries.remove(&path);
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

#[cfg(test)]
mod tests {
    use super::*;

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
            index.get(Path::new("usr/lib")).unwrap().link.as_deref(),
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
}
