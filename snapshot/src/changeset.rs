//! Writing a change set as an uncompressed layer tar.
//!
//! Every header is built here from the scan's `lstat`, never by the tar crate from a second look at
//! the file, and every file body is exactly the size its header announces: a file that grows or
//! shrinks while a live notebook is saved cannot corrupt the stream (it is cut or zero-padded and
//! reported). Names, link targets, sub-second mtimes, large ids and xattrs that ustar cannot hold
//! go into PAX records. Whiteouts come first so that a runtime applying the layer in order removes
//! what the image had before it adds what replaces it.
//!
//! Every entry's parent directories are in the layer too, with their metadata as they are now
//! (as containerd's and Docker's diffs do): a runtime applying a layer creates a missing parent as
//! root 0755, and on overlayfs that new directory would hide the image's own owner and mode, so a
//! user's `pip install` into a directory they own would leave it owned by root.

use crate::scan::{ChangeSet, device_numbers};
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, Metadata};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing the layer stream: {0}")]
    Write(#[source] io::Error),
}

/// What writing a change set did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WriteSummary {
    /// Tar entries written, whiteouts included.
    pub entries: u64,
    pub whiteouts: u64,
    /// File content bytes written.
    pub content_bytes: u64,
    /// Files whose size changed between the scan and the copy (cut or zero-padded to the scan's size).
    pub changed_while_writing: Vec<PathBuf>,
}

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_WHITEOUT: &str = ".wh..wh..opq";
/// Extended attributes that describe the filesystem below, not the file.
const FOREIGN_XATTR_PREFIXES: &[&str] = &["trusted.overlay.", "user.overlay."];

/// Streams `changes` (paths relative to `root`) as a tar into `out`.
///
/// `progress` is called after each entry with (entries written, content bytes written).
pub fn write_change_set<W: Write>(
    root: &Path,
    changes: &ChangeSet,
    out: W,
    mut progress: impl FnMut(u64, u64),
) -> Result<(W, WriteSummary), WriteError> {
    let mut writer = EntryWriter {
        tar: tar::Builder::new(out),
        hardlinks: HashMap::new(),
        directories: HashSet::new(),
        summary: WriteSummary::default(),
    };
    for path in &changes.deleted {
        writer.parents(root, path)?;
        writer.whiteout(&whiteout_path(path))?;
    }
    for path in changes.entries.iter().filter(|e| e.replaces) {
        writer.parents(root, &path.path)?;
        writer.whiteout(&whiteout_path(&path.path))?;
    }
    for dir in &changes.opaque {
        writer.parents(root, &dir.join(OPAQUE_WHITEOUT))?;
        writer.whiteout(&dir.join(OPAQUE_WHITEOUT))?;
    }
    for entry in &changes.entries {
        if entry.meta.is_dir() && writer.directories.contains(&entry.path) {
            continue;
        }
        writer.parents(root, &entry.path)?;
        writer.entry(root, &entry.path, &entry.meta)?;
        if entry.meta.is_dir() {
            writer.directories.insert(entry.path.clone());
        }
        progress(writer.summary.entries, writer.summary.content_bytes);
    }
    let out = writer.tar.into_inner().map_err(WriteError::Write)?;
    Ok((out, writer.summary))
}

fn whiteout_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.as_bytes()).unwrap_or_default();
    let mut whiteout = WHITEOUT_PREFIX.as_bytes().to_vec();
    whiteout.extend_from_slice(name);
    path.with_file_name(std::ffi::OsStr::from_bytes(&whiteout))
}

struct EntryWriter<W: Write> {
    tar: tar::Builder<W>,
    /// First name written for each multiply-linked inode; later names become hardlink entries.
    hardlinks: HashMap<(u64, u64), PathBuf>,
    /// Directories already in the layer.
    directories: HashSet<PathBuf>,
    summary: WriteSummary,
}

impl<W: Write> EntryWriter<W> {
    /// Writes the directories above `rel` that the layer does not have yet, outermost first.
    fn parents(&mut self, root: &Path, rel: &Path) -> Result<(), WriteError> {
        let mut missing: Vec<&Path> = rel
            .ancestors()
            .skip(1)
            .filter(|a| !a.as_os_str().is_empty())
            .take_while(|a| !self.directories.contains(*a))
            .collect();
        missing.reverse();
        for dir in missing {
            let full = root.join(dir);
            let meta = fs::symlink_metadata(&full).map_err(|source| WriteError::Read {
                path: full.clone(),
                source,
            })?;
            if meta.is_dir() {
                self.entry(root, dir, &meta)?;
            }
            self.directories.insert(dir.to_owned());
        }
        Ok(())
    }

    fn whiteout(&mut self, path: &Path) -> Result<(), WriteError> {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_size(0);
        header.set_mtime(0);
        self.append(header, path, None, &[], io::empty())?;
        self.summary.whiteouts += 1;
        Ok(())
    }

    fn entry(&mut self, root: &Path, rel: &Path, meta: &Metadata) -> Result<(), WriteError> {
        let full = root.join(rel);
        let read = |source| WriteError::Read {
            path: full.clone(),
            source,
        };
        let file_type = meta.file_type();
        let mut header = tar::Header::new_ustar();
        header.set_mode(meta.mode() & 0o7777);
        header.set_uid(meta.uid().into());
        header.set_gid(meta.gid().into());
        header.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
        header.set_size(0);
        let mut pax: Vec<(String, Vec<u8>)> = Vec::new();
        if meta.mtime_nsec() != 0 {
            pax.push((
                "mtime".into(),
                format!("{}.{:09}", meta.mtime(), meta.mtime_nsec()).into_bytes(),
            ));
        }
        if !file_type.is_symlink() {
            // Symlinks carry no xattrs of their own that runtimes restore.
            for (name, value) in xattrs(&full).map_err(read)? {
                pax.push((format!("SCHILY.xattr.{name}"), value));
            }
        }

        if file_type.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            return self.append(header, rel, None, &pax, io::empty());
        }
        if file_type.is_symlink() {
            header.set_entry_type(tar::EntryType::Symlink);
            let target = fs::read_link(&full).map_err(read)?;
            return self.append(header, rel, Some(&target), &pax, io::empty());
        }
        if file_type.is_char_device() || file_type.is_block_device() {
            header.set_entry_type(if file_type.is_char_device() {
                tar::EntryType::Char
            } else {
                tar::EntryType::Block
            });
            let (major, minor) = device_numbers(meta.rdev());
            header.set_device_major(major).map_err(WriteError::Write)?;
            header.set_device_minor(minor).map_err(WriteError::Write)?;
            return self.append(header, rel, None, &pax, io::empty());
        }
        if file_type.is_fifo() {
            header.set_entry_type(tar::EntryType::Fifo);
            return self.append(header, rel, None, &pax, io::empty());
        }
        if !file_type.is_file() {
            return Ok(()); // sockets cannot be recreated from a tar
        }
        if meta.nlink() > 1 {
            let key = (meta.dev(), meta.ino());
            if let Some(first) = self.hardlinks.get(&key).cloned() {
                header.set_entry_type(tar::EntryType::Link);
                return self.append(header, rel, Some(&first), &pax, io::empty());
            }
            self.hardlinks.insert(key, rel.to_owned());
        }
        header.set_entry_type(tar::EntryType::Regular);
        let size = meta.len();
        header.set_size(size);
        let file = fs::OpenOptions::new()
            .read(true)
            // Never follow a symlink swapped in since the scan, and leave atimes alone.
            .custom_flags(libc::O_NOFOLLOW | libc::O_NOATIME)
            .open(&full)
            .or_else(|_| {
                fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&full)
            })
            .map_err(read)?;
        let mut body = ExactSize::new(file, size);
        self.append(header, rel, None, &pax, &mut body)?;
        if let Some(source) = body.error.take() {
            return Err(read(source));
        }
        if body.size_changed() {
            self.summary.changed_while_writing.push(rel.to_owned());
        }
        self.summary.content_bytes += size;
        Ok(())
    }

    fn append(
        &mut self,
        mut header: tar::Header,
        path: &Path,
        link: Option<&Path>,
        pax: &[(String, Vec<u8>)],
        body: impl Read,
    ) -> Result<(), WriteError> {
        let mut records: Vec<(&str, &[u8])> = pax
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let path_bytes = path.as_os_str().as_bytes();
        let is_dir = header.entry_type() == tar::EntryType::Directory;
        let mut dir_name;
        let name: &[u8] = if is_dir {
            dir_name = path_bytes.to_vec();
            dir_name.push(b'/');
            &dir_name
        } else {
            path_bytes
        };
        // ustar holds short ASCII names; anything else goes into a PAX `path` record.
        if !name.is_ascii() || header.set_path(std::ffi::OsStr::from_bytes(name)).is_err() {
            records.push(("path", name));
            header
                .set_path(pax_placeholder(name))
                .map_err(WriteError::Write)?;
        }
        if let Some(link) = link {
            let link_bytes = link.as_os_str().as_bytes();
            if !link_bytes.is_ascii() || header.set_link_name(link).is_err() {
                records.push(("linkpath", link_bytes));
                header
                    .set_link_name(pax_placeholder(link_bytes))
                    .map_err(WriteError::Write)?;
            }
        }
        if !records.is_empty() {
            self.tar
                .append_pax_extensions(records)
                .map_err(WriteError::Write)?;
        }
        header.set_cksum();
        self.tar.append(&header, body).map_err(WriteError::Write)?;
        self.summary.entries += 1;
        Ok(())
    }
}

/// A stand-in ustar name for an entry whose real name is in a PAX record (readers that do not
/// know PAX still see a sane, relative, short name).
fn pax_placeholder(name: &[u8]) -> String {
    let tail: String = String::from_utf8_lossy(name)
        .chars()
        .rev()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .take(60)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("PaxHeaders/{tail}")
}

fn xattrs(path: &Path) -> io::Result<Vec<(String, Vec<u8>)>> {
    let names = match xattr::list(path) {
        Ok(names) => names,
        // Filesystems without xattr support have none to save.
        Err(err) if err.raw_os_error() == Some(libc::ENOTSUP) => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    let mut out = Vec::new();
    for name in names {
        let Some(name) = name.to_str().map(str::to_owned) else {
            continue;
        };
        if FOREIGN_XATTR_PREFIXES.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        if let Some(value) = xattr::get(path, &name)? {
            out.push((name, value));
        }
    }
    out.sort();
    Ok(out)
}

/// Reads exactly `size` bytes from a file: cut if it grew, zero-padded if it shrank.
struct ExactSize {
    file: File,
    remaining: u64,
    from_file: u64,
    size: u64,
    file_ended: bool,
    error: Option<io::Error>,
}

impl ExactSize {
    fn new(file: File, size: u64) -> Self {
        Self {
            file,
            remaining: size,
            from_file: 0,
            size,
            file_ended: false,
            error: None,
        }
    }

    fn size_changed(&mut self) -> bool {
        if self.from_file < self.size {
            return true;
        }
        // Anything left to read means the file grew.
        let mut probe = [0u8; 1];
        matches!(self.file.read(&mut probe), Ok(n) if n > 0)
    }
}

impl Read for ExactSize {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        let n = if self.file_ended {
            buf[..want].fill(0);
            want
        } else {
            match self.file.read(&mut buf[..want]) {
                Ok(0) => {
                    self.file_ended = true;
                    buf[..want].fill(0);
                    want
                }
                Ok(n) => {
                    self.from_file += n as u64;
                    n
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => return Err(err),
                Err(err) => {
                    // Keep the stream well-formed; the caller reports the error by path.
                    self.error = Some(err);
                    self.file_ended = true;
                    buf[..want].fill(0);
                    want
                }
            }
        };
        self.remaining -= n as u64;
        Ok(n)
    }
}
