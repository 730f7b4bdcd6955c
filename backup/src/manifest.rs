//! A snapshot's manifest: every file it holds, with its metadata and where its content is.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The manifest layout this labforge writes and reads.
pub const MANIFEST_FORMAT: u32 = 1;

/// Files up to this size are kept in the manifest itself: registry links, small state files and
/// small workspace files cost no object (nor an S3 request) of their own.
pub const INLINE_MAX: u64 = 2048;

/// One snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub format: u32,
    pub id: String,
    /// When the backup began (RFC 3339).
    pub created: String,
    /// The labforge that wrote it, and the data dir's format.
    pub labforge: String,
    pub data_format: u32,
    /// The data dir's state, paths relative to the data dir.
    pub state: Vec<Entry>,
    /// The local registry, paths relative to `registry/`; blobs before what names them.
    pub registry: Vec<Entry>,
    /// Each notebook volume, as its engine exports it.
    pub volumes: Vec<Volume>,
    /// Bytes of every file it holds.
    pub bytes: u64,
    /// What this backup added to the destination: objects, and their stored (compressed) bytes.
    pub added_objects: u64,
    pub added_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Volume {
    pub name: String,
    pub entries: Vec<Entry>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    #[default]
    File,
    Dir,
    Symlink,
    /// A hard link to `target`, a path earlier in the same volume.
    Hardlink,
}

/// One file, directory or link.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub path: String,
    #[serde(default, skip_serializing_if = "is_file")]
    pub kind: Kind,
    pub mode: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub uid: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gid: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtime: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub size: u64,
    /// The object holding its content (sha256, hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Its content itself, base64, when at most [`INLINE_MAX`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline: Option<String>,
    /// A link's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

fn is_file(kind: &Kind) -> bool {
    *kind == Kind::File
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Entry {
    /// A file whose content is `bytes`, when small enough to keep inline.
    pub fn inline_content(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// The inline content, decoded.
    pub fn inline_bytes(&self) -> Option<Result<Vec<u8>, base64::DecodeError>> {
        self.inline
            .as_ref()
            .map(|text| base64::engine::general_purpose::STANDARD.decode(text))
    }
}

impl Snapshot {
    /// Every object the snapshot names.
    pub fn digests(&self) -> impl Iterator<Item = &str> {
        self.state
            .iter()
            .chain(&self.registry)
            .chain(self.volumes.iter().flat_map(|v| &v.entries))
            .filter_map(|entry| entry.digest.as_deref())
    }

    /// Files it holds (directories and links left out).
    pub fn files(&self) -> usize {
        self.state.len()
            + self.registry.len()
            + self
                .volumes
                .iter()
                .flat_map(|v| &v.entries)
                .filter(|e| e.kind == Kind::File)
                .count()
    }
}

/// A snapshot id for a backup begun at `now`: its UTC time, so that ids sort by time.
pub fn snapshot_id(now: jiff::Timestamp) -> String {
    now.strftime("%Y%m%dT%H%M%SZ").to_string()
}

/// Whether `id` could be a snapshot's id (what `--snapshot` accepts).
pub fn is_snapshot_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sort_by_time_and_only_plain_ids_are_taken() {
        let early = snapshot_id("2026-11-28T09:05:03Z".parse().unwrap());
        let late = snapshot_id("2026-11-28T10:00:00Z".parse().unwrap());
        assert_eq!(early, "20261128T090503Z");
        assert!(early < late);
        assert!(is_snapshot_id(&early));
        for bad in ["", "../x", "a/b", "x.json"] {
            assert!(!is_snapshot_id(bad), "{bad}");
        }
    }
}
