//! What the builder checks of a change-set stream as it reads it.
//!
//! The stream comes from inside the notebook, whose owner controls everything there, root
//! included: with podman any root process in the container can open the agent's descriptor
//! (`/proc/<pid>/fd/3`) and write to it. What the stream *says* is the owner's to choose: it
//! becomes their own image layer, and they could put anything in their image anyway. What the
//! builder must not take from it is harm to itself: memory without bound (the tar reader holds a
//! PAX or GNU long-name entry whole, whatever size it claims), paths that leave the root, more
//! file content than the header announced, or data after the archive's end (which would go into
//! the layer unread). [`GuardedChangeSet`] follows the tar's framing block by block, before the
//! tar reader sees a byte, and fails the stream with a [`StreamViolation`] at the first of these.

use std::io::{self, Read};

/// The largest PAX or GNU long-name extension accepted. The agent writes a path, a link target
/// and xattrs there; Linux caps a name at 4 KiB and all of a file's xattrs at 64 KiB.
pub const MAX_EXTENSION: u64 = 1 << 20;
/// Zero blocks accepted at the end: the two of the end-of-archive mark, padded to a 10 KiB record.
const MAX_ZERO_BLOCKS: u64 = 20;
const BLOCK: usize = 512;

/// How a change-set stream broke the rules; `entry` counts the tar's entries from 0.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamViolation {
    #[error("entry {entry}: a {kind} of {size} bytes, more than the {MAX_EXTENSION} allowed")]
    ExtensionTooLarge {
        entry: u64,
        kind: &'static str,
        size: u64,
    },
    #[error("entry {entry}: malformed tar header ({problem})")]
    MalformedHeader { entry: u64, problem: &'static str },
    #[error("entry {entry}: malformed PAX extension")]
    MalformedPax { entry: u64 },
    #[error("entry {entry}: tar entry type {kind:?}, which the agent never writes")]
    UnexpectedType { entry: u64, kind: char },
    #[error("entry {entry}: path {path:?} is empty, absolute or leaves the root")]
    UnsafePath { entry: u64, path: String },
    #[error("entry {entry}: hardlink target {path:?} is empty, absolute or leaves the root")]
    UnsafeLink { entry: u64, path: String },
    #[error("entry {entry}: file content beyond the {announced} bytes the header announced")]
    ContentBeyondHeader { entry: u64, announced: u64 },
    #[error("data after the end of the archive")]
    TrailingData,
}

/// A change-set tar that fails with a [`StreamViolation`] (as `io::ErrorKind::InvalidData`)
/// instead of passing on a byte that breaks the rules. Bytes come out unchanged.
pub struct GuardedChangeSet<R> {
    inner: R,
    state: State,
    entry: u64,
    announced: u64,
    content_left: u64,
    pending: Pending,
    failed: Option<StreamViolation>,
}

enum State {
    Header {
        block: Box<[u8; BLOCK]>,
        filled: usize,
    },
    /// An entry's data and its padding to the next block.
    Body { remaining: u64 },
    Extension {
        kind: u8,
        data: Vec<u8>,
        remaining: u64,
        padding: u64,
    },
    /// After the first zero block only zeros may follow, and not many.
    Ended { zero_bytes: u64 },
}

/// What extension entries said about the entry that follows them.
#[derive(Default)]
struct Pending {
    pax_path: Option<Vec<u8>>,
    pax_link: Option<Vec<u8>>,
    pax_size: Option<u64>,
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
}

impl<R: Read> GuardedChangeSet<R> {
    /// Guards `inner`, whose header announced `content_bytes` of file content.
    pub fn new(inner: R, content_bytes: u64) -> Self {
        Self {
            inner,
            state: State::header(),
            entry: 0,
            announced: content_bytes,
            content_left: content_bytes,
            pending: Pending::default(),
            failed: None,
        }
    }

    /// The violation that failed the stream, if one did.
    pub fn violation(&self) -> Option<&StreamViolation> {
        self.failed.as_ref()
    }

    fn inspect(&mut self, mut bytes: &[u8]) -> Result<(), StreamViolation> {
        while !bytes.is_empty() {
            match &mut self.state {
                State::Body { remaining } => {
                    let take = (*remaining).min(bytes.len() as u64);
                    *remaining -= take;
                    bytes = &bytes[take as usize..];
                    if *remaining == 0 {
                        self.state = State::header();
                    }
                }
                State::Extension {
                    data, remaining, ..
                } => {
                    let take = (*remaining).min(bytes.len() as u64) as usize;
                    data.extend_from_slice(&bytes[..take]);
                    *remaining -= take as u64;
                    bytes = &bytes[take..];
                    if *remaining == 0 {
                        self.extension_done()?;
                    }
                }
                State::Header { block, filled } => {
                    let take = (BLOCK - *filled).min(bytes.len());
                    block[*filled..*filled + take].copy_from_slice(&bytes[..take]);
                    *filled += take;
                    bytes = &bytes[take..];
                    if *filled == BLOCK {
                        let block = std::mem::replace(block, Box::new([0; BLOCK]));
                        self.header(&block)?;
                    }
                }
                State::Ended { zero_bytes } => {
                    if bytes.iter().any(|b| *b != 0) {
                        return Err(StreamViolation::TrailingData);
                    }
                    *zero_bytes += bytes.len() as u64;
                    bytes = &[];
                    if *zero_bytes > MAX_ZERO_BLOCKS * BLOCK as u64 {
                        return Err(StreamViolation::TrailingData);
                    }
                }
            }
        }
        Ok(())
    }

    fn header(&mut self, block: &[u8; BLOCK]) -> Result<(), StreamViolation> {
        let entry = self.entry;
        if block.iter().all(|b| *b == 0) {
            // The tar reader stops at the first zero block: what follows is never read as
            // entries, but it would go into the layer.
            self.state = State::Ended {
                zero_bytes: BLOCK as u64,
            };
            return Ok(());
        }
        let malformed = |problem| StreamViolation::MalformedHeader { entry, problem };
        let stored = octal(&block[148..156]).ok_or(malformed("checksum field"))?;
        let computed: u64 = block
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u64::from(*b)
                }
            })
            .sum();
        if stored != computed {
            return Err(malformed("checksum"));
        }
        let size = numeric(&block[124..136]).ok_or(malformed("size field"))?;
        let kind = block[156];
        match kind {
            b'x' | b'L' | b'K' => {
                if size > MAX_EXTENSION {
                    return Err(StreamViolation::ExtensionTooLarge {
                        entry,
                        kind: match kind {
                            b'x' => "PAX extension",
                            b'L' => "GNU long name",
                            _ => "GNU long link name",
                        },
                        size,
                    });
                }
                self.state = State::Extension {
                    kind,
                    data: Vec::with_capacity(size as usize),
                    remaining: size,
                    padding: padding(size),
                };
                if size == 0 {
                    self.extension_done()?;
                }
                Ok(())
            }
            0 | b'0'..=b'7' => {
                let pending = std::mem::take(&mut self.pending);
                // Every name the tar reader could pick must be safe, so that which one it picks
                // does not matter.
                let header_name = ustar_path(block);
                for path in [
                    Some(&header_name),
                    pending.pax_path.as_ref(),
                    pending.long_name.as_ref(),
                ]
                .into_iter()
                .flatten()
                {
                    if !safe_path(path) {
                        return Err(StreamViolation::UnsafePath {
                            entry,
                            path: String::from_utf8_lossy(path).into_owned(),
                        });
                    }
                }
                if kind == b'1' {
                    let header_link = until_nul(&block[157..257]).to_vec();
                    for link in [
                        Some(&header_link),
                        pending.pax_link.as_ref(),
                        pending.long_link.as_ref(),
                    ]
                    .into_iter()
                    .flatten()
                    {
                        if !safe_path(link) {
                            return Err(StreamViolation::UnsafeLink {
                                entry,
                                path: String::from_utf8_lossy(link).into_owned(),
                            });
                        }
                    }
                }
                let size = pending.pax_size.unwrap_or(size);
                if matches!(kind, 0 | b'0' | b'7') {
                    self.content_left = self.content_left.checked_sub(size).ok_or(
                        StreamViolation::ContentBeyondHeader {
                            entry,
                            announced: self.announced,
                        },
                    )?;
                }
                self.entry += 1;
                self.state = match size + padding(size) {
                    0 => State::header(),
                    remaining => State::Body { remaining },
                };
                Ok(())
            }
            other => Err(StreamViolation::UnexpectedType {
                entry,
                kind: char::from(other),
            }),
        }
    }

    fn extension_done(&mut self) -> Result<(), StreamViolation> {
        let State::Extension {
            kind,
            data,
            padding,
            ..
        } = std::mem::replace(&mut self.state, State::header())
        else {
            return Ok(());
        };
        let entry = self.entry;
        match kind {
            b'x' => {
                for (key, value) in
                    pax_records(&data).ok_or(StreamViolation::MalformedPax { entry })?
                {
                    match key {
                        b"path" => self.pending.pax_path = Some(value.to_vec()),
                        b"linkpath" => self.pending.pax_link = Some(value.to_vec()),
                        b"size" => {
                            let size = std::str::from_utf8(value)
                                .ok()
                                .and_then(|v| v.parse::<u64>().ok())
                                .ok_or(StreamViolation::MalformedPax { entry })?;
                            self.pending.pax_size = Some(size);
                        }
                        _ => {}
                    }
                }
            }
            // The tar reader drops one trailing NUL of a GNU long name.
            b'L' => self.pending.long_name = Some(strip_one_nul(data)),
            _ => self.pending.long_link = Some(strip_one_nul(data)),
        }
        if padding > 0 {
            self.state = State::Body { remaining: padding };
        }
        Ok(())
    }
}

impl<R: Read> Read for GuardedChangeSet<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(violation) = &self.failed {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                violation.clone(),
            ));
        }
        let n = self.inner.read(buf)?;
        if let Err(violation) = self.inspect(&buf[..n]) {
            self.failed = Some(violation.clone());
            return Err(io::Error::new(io::ErrorKind::InvalidData, violation));
        }
        Ok(n)
    }
}

impl State {
    fn header() -> Self {
        State::Header {
            block: Box::new([0; BLOCK]),
            filled: 0,
        }
    }
}

fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

fn until_nul(field: &[u8]) -> &[u8] {
    field
        .iter()
        .position(|b| *b == 0)
        .map_or(field, |end| &field[..end])
}

fn strip_one_nul(mut data: Vec<u8>) -> Vec<u8> {
    if data.last() == Some(&0) {
        data.pop();
    }
    data
}

/// The name as the tar reader forms it: POSIX ustar joins a prefix, other formats have none.
fn ustar_path(block: &[u8; BLOCK]) -> Vec<u8> {
    let name = until_nul(&block[..100]);
    if &block[257..263] == b"ustar\0" {
        let prefix = until_nul(&block[345..500]);
        if !prefix.is_empty() {
            let mut path = prefix.to_vec();
            path.push(b'/');
            path.extend_from_slice(name);
            return path;
        }
    }
    name.to_vec()
}

/// Relative, inside the root, no NUL: `usr/bin/x`, `./etc/`, `.` (the root itself).
fn safe_path(path: &[u8]) -> bool {
    !path.is_empty()
        && path[0] != b'/'
        && !path.contains(&0)
        && path.split(|b| *b == b'/').all(|part| part != b"..")
}

/// An octal field as tar writes it (leading spaces, ended by NUL or space).
fn octal(field: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(until_nul(field)).ok()?.trim();
    u64::from_str_radix(text, 8).ok()
}

/// A numeric field: octal, or GNU's base-256 (high bit set) for large values.
fn numeric(field: &[u8]) -> Option<u64> {
    if field[0] & 0x80 == 0 {
        return octal(field);
    }
    let (high, low) = field.split_at(field.len() - 8);
    if high[0] & 0x7f != 0 || high[1..].iter().any(|b| *b != 0) {
        return None;
    }
    Some(u64::from_be_bytes(low.try_into().ok()?))
}

/// `LEN KEY=VALUE\n` records; `None` when one is malformed.
fn pax_records(mut data: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    let mut records = Vec::new();
    while !data.is_empty() {
        let space = data.iter().position(|b| *b == b' ')?;
        let len: usize = std::str::from_utf8(&data[..space]).ok()?.parse().ok()?;
        if len <= space + 1 || len > data.len() || data[len - 1] != b'\n' {
            return None;
        }
        let record = &data[space + 1..len - 1];
        let equals = record.iter().position(|b| *b == b'=')?;
        records.push((&record[..equals], &record[equals + 1..]));
        data = &data[len..];
    }
    Some(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BaselineIndex, ScanOptions, scan, write_change_set};

    /// Reads all of `tar` through a guard, `chunk` bytes at a time.
    fn guarded(tar: &[u8], announced: u64, chunk: usize) -> Result<Vec<u8>, StreamViolation> {
        let mut guard = GuardedChangeSet::new(tar, announced);
        let mut out = Vec::new();
        let mut buf = vec![0; chunk];
        loop {
            match guard.read(&mut buf) {
                Ok(0) => return Ok(out),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(err) => {
                    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
                    return Err(guard.violation().cloned().expect("a violation"));
                }
            }
        }
    }

    /// A raw header: whatever `name` and `link` say, which `tar::Header::set_path` would refuse.
    fn raw_header(kind: u8, name: &[u8], link: &[u8], size: u64) -> tar::Header {
        let mut header = tar::Header::new_ustar();
        let bytes = header.as_mut_bytes();
        bytes[..name.len()].copy_from_slice(name);
        bytes[157..157 + link.len()].copy_from_slice(link);
        header.set_entry_type(tar::EntryType::new(kind));
        header.set_size(size);
        header.set_mode(0o644);
        header.set_cksum();
        header
    }

    fn archive(parts: &[(tar::Header, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (header, body) in parts {
            out.extend_from_slice(header.as_bytes());
            out.extend_from_slice(body);
            out.resize(out.len() + padding(body.len() as u64) as usize, 0);
        }
        out.extend_from_slice(&[0; 1024]);
        out
    }

    fn pax(records: &[(&str, &[u8])]) -> Vec<u8> {
        let mut data = Vec::new();
        for (key, value) in records {
            let body = 1 + key.len() + 1 + value.len() + 1;
            let mut len = body + body.to_string().len();
            if len.to_string().len() != body.to_string().len() {
                len += 1;
            }
            data.extend_from_slice(format!("{len} {key}=").as_bytes());
            data.extend_from_slice(value);
            data.push(b'\n');
        }
        data
    }

    fn file(name: &[u8], body: &[u8]) -> (tar::Header, Vec<u8>) {
        (
            raw_header(b'0', name, b"", body.len() as u64),
            body.to_vec(),
        )
    }

    #[test]
    fn a_real_change_set_passes_unchanged_in_any_chunking() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("home/jovyan/deep")).expect("dirs");
        std::fs::write(root.path().join("home/jovyan/a.txt"), b"hello").expect("file");
        let long = "n".repeat(150);
        std::fs::write(
            root.path().join("home/jovyan/deep").join(&long),
            vec![7; 3000],
        )
        .expect("long name");
        std::os::unix::fs::symlink("/etc/passwd", root.path().join("home/jovyan/abs-link"))
            .expect("symlink");
        std::fs::hard_link(
            root.path().join("home/jovyan/a.txt"),
            root.path().join("home/jovyan/b.txt"),
        )
        .expect("hardlink");
        let changes = scan(
            root.path(),
            &BaselineIndex::default(),
            &ScanOptions::default(),
            |_| {},
        )
        .expect("scan");
        let (tar, _) =
            write_change_set(root.path(), &changes, Vec::new(), |_, _| {}).expect("write");
        for chunk in [1, 7, 512, 1 << 16] {
            assert_eq!(
                guarded(&tar, changes.content_bytes(), chunk).as_ref(),
                Ok(&tar),
                "chunks of {chunk}"
            );
        }
    }

    #[test]
    fn pax_size_and_names_are_followed() {
        let records = pax(&[("path", b"home/jovyan/x"), ("size", b"5")]);
        let extension = raw_header(b'x', b"pax", b"", records.len() as u64);
        let tar = archive(&[
            (extension, records),
            // The header says 0 bytes; the PAX size (5) frames the body.
            (raw_header(b'0', b"x", b"", 0), b"hello".to_vec()),
            file(b"y", b"after"),
        ]);
        assert_eq!(guarded(&tar, 10, 3), Ok(tar.clone()));
    }

    #[test]
    fn hostile_paths_are_refused() {
        let unsafe_path = |violation: Result<Vec<u8>, StreamViolation>| {
            matches!(violation, Err(StreamViolation::UnsafePath { .. }))
        };
        for name in [
            &b"../etc/passwd"[..],
            b"/etc/passwd",
            b"home/../../x",
            b"..",
        ] {
            let tar = archive(&[file(name, b"x")]);
            assert!(unsafe_path(guarded(&tar, 1, 512)), "{name:?}");
        }
        // Through a PAX path, behind a harmless header name.
        let records = pax(&[("path", b"../../root/.ssh/authorized_keys")]);
        let tar = archive(&[
            (raw_header(b'x', b"pax", b"", records.len() as u64), records),
            file(b"harmless", b"x"),
        ]);
        assert!(unsafe_path(guarded(&tar, 1, 512)));
        // Through a GNU long name.
        let long = b"a/../../x\0".to_vec();
        let tar = archive(&[
            (
                raw_header(b'L', b"././@LongLink", b"", long.len() as u64),
                long,
            ),
            file(b"harmless", b"x"),
        ]);
        assert!(unsafe_path(guarded(&tar, 1, 512)));
        // A ustar prefix that is absolute.
        let mut header = raw_header(b'0', b"passwd", b"", 0);
        header.as_mut_bytes()[345..349].copy_from_slice(b"/etc");
        header.set_cksum();
        assert!(unsafe_path(guarded(&archive(&[(header, vec![])]), 0, 512)));
    }

    #[test]
    fn hardlinks_out_of_the_root_are_refused_symlinks_are_not() {
        let tar = archive(&[(raw_header(b'1', b"x", b"../../etc/shadow", 0), vec![])]);
        assert!(matches!(
            guarded(&tar, 0, 512),
            Err(StreamViolation::UnsafeLink { .. })
        ));
        // A symlink's target is the image's business: absolute ones are everywhere.
        let tar = archive(&[(raw_header(b'2', b"x", b"/etc/shadow", 0), vec![])]);
        assert_eq!(guarded(&tar, 0, 512), Ok(tar.clone()));
    }

    #[test]
    fn huge_extensions_are_refused_before_they_are_read() {
        for kind in [b'x', b'L', b'K'] {
            // Only the header: refused on its claim, nothing more is read or held.
            let header = raw_header(kind, b"ext", b"", 100 << 30);
            let mut guard = GuardedChangeSet::new(header.as_bytes().as_slice(), 0);
            let mut buf = [0; 512];
            assert!(guard.read(&mut buf).is_err());
            assert!(matches!(
                guard.violation(),
                Some(StreamViolation::ExtensionTooLarge { size, .. }) if *size == 100 << 30
            ));
        }
    }

    #[test]
    fn content_beyond_the_header_and_trailing_data_are_refused() {
        let tar = archive(&[file(b"a", b"12345"), file(b"b", b"6789")]);
        assert_eq!(guarded(&tar, 9, 512), Ok(tar.clone()));
        assert_eq!(
            guarded(&tar, 8, 512),
            Err(StreamViolation::ContentBeyondHeader {
                entry: 1,
                announced: 8
            })
        );
        let mut trailing = tar.clone();
        trailing.extend_from_slice(b"injected after the end");
        assert_eq!(
            guarded(&trailing, 9, 100),
            Err(StreamViolation::TrailingData)
        );
        let mut zeros = tar.clone();
        zeros.resize(tar.len() + 64 * 512, 0);
        assert_eq!(guarded(&zeros, 9, 4096), Err(StreamViolation::TrailingData));
    }

    #[test]
    fn malformed_headers_and_foreign_types_are_refused() {
        let mut tar = archive(&[file(b"a", b"x")]);
        tar[0] ^= 1; // the checksum no longer matches
        assert!(matches!(
            guarded(&tar, 1, 512),
            Err(StreamViolation::MalformedHeader { .. })
        ));
        for kind in [b'S', b'g', b'V', b'Z'] {
            let tar = archive(&[(raw_header(kind, b"a", b"", 0), vec![])]);
            assert!(
                matches!(
                    guarded(&tar, 0, 512),
                    Err(StreamViolation::UnexpectedType { .. })
                ),
                "{kind}"
            );
        }
        let records = b"99 path=x\n".to_vec();
        let tar = archive(&[
            (raw_header(b'x', b"pax", b"", records.len() as u64), records),
            file(b"a", b"x"),
        ]);
        assert_eq!(
            guarded(&tar, 1, 512),
            Err(StreamViolation::MalformedPax { entry: 0 })
        );
    }

    #[test]
    fn the_guard_fails_every_later_read() {
        let tar = archive(&[file(b"/abs", b"x")]);
        let mut guard = GuardedChangeSet::new(tar.as_slice(), 1);
        let mut buf = [0; 512];
        assert!(guard.read(&mut buf).is_err());
        assert!(guard.read(&mut buf).is_err());
    }
}
