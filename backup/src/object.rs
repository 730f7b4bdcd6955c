//! Content as objects: hashed while it is read, compressed only when the destination lacks it,
//! and checked against its digest when it comes back.

use crate::destination::Destination;
use crate::{BackupError, io_error};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::Path;

/// Content up to this size is held in memory while it is hashed; larger content in a file.
const IN_MEMORY_MAX: u64 = 16 * 1024 * 1024;

/// zstd's level: fast, and most of the bytes (image layers) are compressed already.
const LEVEL: i32 = 3;

/// Content read once, with its digest.
pub(crate) struct Spooled {
    pub hex: String,
    pub size: u64,
    content: Content,
}

enum Content {
    Memory(Vec<u8>),
    File(tempfile::NamedTempFile),
}

/// A writer that hashes what passes through it.
struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    size: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl Spooled {
    /// Reads `reader` (of `size` bytes, as far as known) whole, hashing it; `scratch` holds
    /// what is too large for memory.
    pub fn read(reader: &mut dyn Read, size: u64, scratch: &Path) -> std::io::Result<Self> {
        if size <= IN_MEMORY_MAX {
            let mut bytes = Vec::with_capacity(size as usize);
            reader.read_to_end(&mut bytes)?;
            return Ok(Self::of_bytes(bytes));
        }
        let file = tempfile::NamedTempFile::new_in(scratch)?;
        let mut writer = Hashing {
            inner: std::io::BufWriter::new(file),
            hasher: Sha256::new(),
            size: 0,
        };
        std::io::copy(reader, &mut writer)?;
        let file = writer.inner.into_inner().map_err(|e| e.into_error())?;
        Ok(Self {
            hex: hex::encode(writer.hasher.finalize()),
            size: writer.size,
            content: Content::File(file),
        })
    }

    pub fn of_bytes(bytes: Vec<u8>) -> Self {
        Self {
            hex: hex::encode(Sha256::digest(&bytes)),
            size: bytes.len() as u64,
            content: Content::Memory(bytes),
        }
    }

    /// The content, when it is in memory.
    pub fn bytes(&self) -> Option<&[u8]> {
        match &self.content {
            Content::Memory(bytes) => Some(bytes),
            Content::File(_) => None,
        }
    }

    /// Compresses the content and stores it in `dest`; returns the bytes stored.
    pub async fn store(&self, dest: &Destination, scratch: &Path) -> Result<u64, StoreError> {
        let compressed = tempfile::NamedTempFile::new_in(scratch)
            .map_err(|e| StoreError::Local(io_error(scratch)(e)))?;
        let compressed_path = compressed.path().to_owned();
        let local = |e| StoreError::Local(io_error(&compressed_path)(e));
        let stored = (|| {
            let mut encoder = zstd::Encoder::new(compressed.reopen()?, LEVEL)?;
            match &self.content {
                Content::Memory(bytes) => encoder.write_all(bytes)?,
                Content::File(file) => {
                    std::io::copy(&mut file.reopen()?, &mut encoder)?;
                }
            }
            Ok(encoder.finish()?.metadata()?.len())
        })()
        .map_err(local)?;
        dest.put_object(&self.hex, &compressed_path)
            .await
            .map_err(StoreError::Destination)?;
        Ok(stored)
    }
}

/// Why an object could not be stored: here (reading, compressing) or at the destination.
pub(crate) enum StoreError {
    Local(BackupError),
    Destination(crate::destination::DestinationError),
}

/// Fetches object `hex` from `dest` into a new file at `to`, decompressed, and checks it holds
/// what its digest says; `what` (the file it is) and `id` (the snapshot) name it in errors.
pub(crate) async fn fetch_verified(
    dest: &Destination,
    id: &str,
    hex: &str,
    what: &str,
    to: &Path,
) -> Result<(), BackupError> {
    let scratch = to.parent().unwrap_or(Path::new("."));
    let compressed = tempfile::NamedTempFile::new_in(scratch).map_err(io_error(scratch))?;
    let found = dest
        .get_object(hex, compressed.path())
        .await
        .map_err(|source| BackupError::Destination {
            dest: dest.to_string(),
            source,
        })?;
    if !found {
        return Err(BackupError::Missing {
            id: id.to_owned(),
            digest: format!("sha256:{hex}"),
            what: what.to_owned(),
            dest: dest.to_string(),
        });
    }
    let corrupt = |why: String| BackupError::Corrupt {
        id: id.to_owned(),
        digest: format!("sha256:{hex}"),
        what: what.to_owned(),
        why,
    };
    let out = std::fs::File::create(to).map_err(io_error(to))?;
    let mut writer = Hashing {
        inner: std::io::BufWriter::new(out),
        hasher: Sha256::new(),
        size: 0,
    };
    // Opened by its path: a download replaces the file there rather than writing into it.
    let decoded = zstd::Decoder::new(
        std::fs::File::open(compressed.path()).map_err(io_error(compressed.path()))?,
    )
    .and_then(|mut decoder| std::io::copy(&mut decoder, &mut writer));
    if let Err(e) = decoded {
        let _ = std::fs::remove_file(to);
        // Bytes that do not decompress: damaged at the destination, not here.
        return Err(corrupt(format!("it does not decompress ({e})")));
    }
    writer
        .inner
        .into_inner()
        .map_err(|e| io_error(to)(e.into_error()))?
        .sync_all()
        .map_err(io_error(to))?;
    let got = hex::encode(writer.hasher.finalize());
    if got != hex {
        let _ = std::fs::remove_file(to);
        return Err(corrupt(format!("its content hashes to sha256:{got}")));
    }
    Ok(())
}
