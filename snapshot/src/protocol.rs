//! The agent's wire format, shared by the agent and the builder.
//!
//! The builder starts the agent through the runtime's exec (`podman exec -i`, or the Kubernetes exec
//! API) and talks over its stdio: stdin carries the baseline index as JSON; stdout carries one JSON
//! line ([`ChangeSetHeader`]) and then the uncompressed layer tar; a failure is a non-zero exit with
//! the reason (and the path it concerns) on stderr. The header comes first so that the builder can
//! recognise a change set it has already saved and hang up before any file is read.

use crate::scan::ChangeSet;
use std::io::{self, BufRead, Write};

/// Summary of a scan, sent before the tar.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChangeSetHeader {
    /// [`ChangeSet::key`] of this change set on its parent.
    pub key: String,
    /// Entries walked.
    pub scanned: u64,
    /// Added or modified entries.
    pub changed: u64,
    /// Whiteouts (deletions, replaced types, opaque directories).
    pub deleted: u64,
    /// File content bytes the tar will carry.
    pub content_bytes: u64,
    /// Skipped mount points and ignored paths that exist.
    pub skipped: Vec<String>,
}

impl ChangeSetHeader {
    pub fn new(changes: &ChangeSet, parent: &str) -> Self {
        ChangeSetHeader {
            key: changes.key(parent),
            scanned: changes.scanned,
            changed: changes.entries.len() as u64,
            deleted: (changes.deleted.len()
                + changes.opaque.len()
                + changes.entries.iter().filter(|e| e.replaces).count())
                as u64,
            content_bytes: changes.content_bytes(),
            skipped: changes
                .skipped
                .iter()
                .map(|p| format!("/{}", p.display()))
                .collect(),
        }
    }

    pub fn write_line(&self, mut out: impl Write) -> io::Result<()> {
        serde_json::to_writer(&mut out, self)?;
        out.write_all(b"\n")
    }

    /// Reads the header line, leaving the reader at the first byte of the tar.
    pub fn read_line(mut input: impl BufRead) -> io::Result<Self> {
        let mut line = Vec::new();
        input.read_until(b'\n', &mut line)?;
        if line.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the agent ended before sending its header",
            ));
        }
        serde_json::from_slice(&line).map_err(|err| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("malformed agent header: {err}"),
            )
        })
    }
}
