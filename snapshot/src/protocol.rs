//! The agent's wire format, shared by the agent and the builder.
//!
//! The builder starts the agent through the runtime's exec (`podman exec -i`, or the Kubernetes exec
//! API) and talks over its stdio: stdin carries the baseline index as JSON; stdout carries one JSON
//! line ([`ChangeSetHeader`]) and then the uncompressed layer tar; a failure is a non-zero exit with
//! the reason (and the path it concerns) on stderr. The header comes first so that the builder can
//! recognise a change set it has already saved and hang up before any file is read.

use crate::scan::ChangeSet;
use std::io::{self, BufRead, Read, Write};

/// The longest header line accepted. Its one open-ended part is the list of skipped mount
/// points, which GPU drivers' many mounted files can take to a few KiB.
pub const MAX_HEADER_LINE: usize = 64 << 10;

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

    /// Reads the header line, leaving the reader at the first byte of the tar. The line comes
    /// from inside the notebook: at most [`MAX_HEADER_LINE`] bytes are read, and the key must
    /// be a SHA-256 digest, since the builder makes cache keys of it.
    pub fn read_line(mut input: impl BufRead) -> io::Result<Self> {
        let invalid = |message: String| io::Error::new(io::ErrorKind::InvalidData, message);
        let mut line = Vec::new();
        (&mut input)
            .take(MAX_HEADER_LINE as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if line.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the agent ended before sending its header",
            ));
        }
        if line.len() > MAX_HEADER_LINE {
            return Err(invalid(format!(
                "the agent's header line is longer than {MAX_HEADER_LINE} bytes"
            )));
        }
        let header: Self = serde_json::from_slice(&line)
            .map_err(|err| invalid(format!("malformed agent header: {err}")))?;
        let digest = header.key.strip_prefix("sha256:").unwrap_or_default();
        if digest.len() != 64
            || !digest
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(invalid(format!(
                "the agent's change-set key {:?} is not a sha256 digest",
                header.key.chars().take(80).collect::<String>()
            )));
        }
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(key: &str) -> ChangeSetHeader {
        ChangeSetHeader {
            key: key.into(),
            scanned: 1,
            changed: 1,
            deleted: 0,
            content_bytes: 0,
            skipped: vec![],
        }
    }

    fn line(header: &ChangeSetHeader) -> Vec<u8> {
        let mut out = Vec::new();
        header.write_line(&mut out).expect("written");
        out
    }

    /// A line without end is not read without end.
    #[test]
    fn an_endless_header_line_is_refused_after_the_bound() {
        let mut endless = io::BufReader::new(io::repeat(b'x'));
        let err = ChangeSetHeader::read_line(&mut endless).expect_err("refused");
        assert!(err.to_string().contains("longer than"), "{err}");

        let mut long = header(&format!("sha256:{}", "a".repeat(64)));
        long.skipped = vec!["/m".repeat(MAX_HEADER_LINE / 2)];
        let err = ChangeSetHeader::read_line(&line(&long)[..]).expect_err("refused");
        assert!(err.to_string().contains("longer than"), "{err}");
    }

    /// The key names cache files: nothing but a digest may pass.
    #[test]
    fn a_key_that_is_no_digest_is_refused() {
        let good = header(&format!("sha256:{}", "0f".repeat(32)));
        let read = ChangeSetHeader::read_line(&line(&good)[..]).expect("a digest key");
        assert_eq!(read, good);
        for key in [
            "../../blobs/sha256/x".to_owned(),
            format!("sha256:{}/../x", "a".repeat(60)),
            format!("sha256:{}", "A".repeat(64)),
            "sha256:".to_owned(),
        ] {
            let err = ChangeSetHeader::read_line(&line(&header(&key))[..]).expect_err(&key);
            assert!(err.to_string().contains("not a sha256 digest"), "{err}");
        }
    }
}
