//! Streaming layer writer: tar → compressor → sink, with the `diff_id` (digest of the uncompressed
//! tar) and the blob digest (digest of the compressed bytes) computed in the same pass.
//!
//! Memory stays bounded whatever the layer size: nothing is buffered beyond the compressor's window
//! and one file copy buffer.

use crate::digest::{Digest, DigestWriter};
use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// How a layer is compressed; decides its media type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// zstd, multi-threaded across the machine's cores; the OCI default for labforge.
    Zstd { level: i32 },
    /// gzip, for registries and runtimes that predate zstd layers.
    Gzip { level: u32 },
}

impl Default for Compression {
    fn default() -> Self {
        Compression::Zstd { level: 3 }
    }
}

impl Compression {
    /// OCI media type of a layer compressed this way.
    pub fn media_type(self) -> &'static str {
        match self {
            Compression::Zstd { .. } => "application/vnd.oci.image.layer.v1.tar+zstd",
            Compression::Gzip { .. } => "application/vnd.oci.image.layer.v1.tar+gzip",
        }
    }
}

/// What a finished layer is: enough to reference it from a manifest and a config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerDescriptor {
    pub media_type: &'static str,
    /// Digest of the compressed blob (the manifest's layer digest).
    pub digest: Digest,
    /// Size of the compressed blob in bytes.
    pub size: u64,
    /// Digest of the uncompressed tar (the config's `rootfs.diff_ids` entry).
    pub diff_id: Digest,
    pub uncompressed_size: u64,
    /// Entries written (files, directories, links, ...).
    pub entries: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing the layer stream")]
    Write(#[source] io::Error),
}

enum Compressor<W: Write> {
    Zstd(zstd::stream::write::Encoder<'static, W>),
    Gzip(flate2::write::GzEncoder<W>),
}

impl<W: Write> Compressor<W> {
    fn new(inner: W, compression: Compression) -> io::Result<Self> {
        Ok(match compression {
            Compression::Zstd { level } => {
                let mut encoder = zstd::stream::write::Encoder::new(inner, level)?;
                let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
                encoder.multithread(u32::try_from(workers).unwrap_or(1))?;
                Compressor::Zstd(encoder)
            }
            Compression::Gzip { level } => Compressor::Gzip(flate2::write::GzEncoder::new(
                inner,
                flate2::Compression::new(level),
            )),
        })
    }

    fn finish(self) -> io::Result<W> {
        match self {
            Compressor::Zstd(e) => e.finish(),
            Compressor::Gzip(e) => e.finish(),
        }
    }
}

impl<W: Write> Write for Compressor<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Compressor::Zstd(e) => e.write(buf),
            Compressor::Gzip(e) => e.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Compressor::Zstd(e) => e.flush(),
            Compressor::Gzip(e) => e.flush(),
        }
    }
}

type Pipeline<W> = tar::Builder<DigestWriter<Compressor<DigestWriter<W>>>>;

/// Writes one layer. Entries go in through [`LayerWriter::append_tree`]; [`LayerWriter::finish`]
/// closes the stream and returns its descriptor.
pub struct LayerWriter<W: Write> {
    tar: Pipeline<W>,
    compression: Compression,
    entries: u64,
    /// First path seen for each multiply-linked inode, so later names become hardlink entries.
    hardlinks: HashMap<(u64, u64), PathBuf>,
    progress: Option<ProgressFn>,
}

/// Called after each entry with (entries written, uncompressed bytes written).
type ProgressFn = Box<dyn FnMut(u64, u64) + Send>;

impl<W: Write> LayerWriter<W> {
    pub fn new(sink: W, compression: Compression) -> Result<Self, LayerError> {
        let compressor =
            Compressor::new(DigestWriter::new(sink), compression).map_err(LayerError::Write)?;
        let mut tar = tar::Builder::new(DigestWriter::new(compressor));
        // A layer records links as links and never expands holes: what is on disk is what unpacks.
        tar.follow_symlinks(false);
        tar.sparse(false);
        tar.mode(tar::HeaderMode::Complete);
        Ok(Self {
            tar,
            compression,
            entries: 0,
            hardlinks: HashMap::new(),
            progress: None,
        })
    }

    /// Reports progress after each entry: (entries written, uncompressed bytes written).
    pub fn with_progress(mut self, report: impl FnMut(u64, u64) + Send + 'static) -> Self {
        self.progress = Some(Box::new(report));
        self
    }

    fn entry_written(&mut self) {
        self.entries += 1;
        if let Some(report) = self.progress.as_mut() {
            report(self.entries, self.tar.get_ref().written());
        }
    }

    /// Appends everything below `root` (not `root` itself), in sorted order so that the same tree
    /// always yields the same bytes. Sockets are skipped: they cannot be recreated from a tar.
    pub fn append_tree(&mut self, root: &Path) -> Result<(), LayerError> {
        self.append_dir_contents(root, Path::new(""))
    }

    fn append_dir_contents(&mut self, dir: &Path, rel: &Path) -> Result<(), LayerError> {
        let read = |source| LayerError::Read {
            path: dir.to_owned(),
            source,
        };
        let mut names: Vec<_> = fs::read_dir(dir)
            .map_err(read)?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(read)?;
        names.sort();
        for name in names {
            let path = dir.join(&name);
            let rel_path = rel.join(&name);
            let meta = fs::symlink_metadata(&path).map_err(|source| LayerError::Read {
                path: path.clone(),
                source,
            })?;
            let file_type = meta.file_type();
            if file_type.is_socket() {
                continue;
            }
            if file_type.is_file() && meta.nlink() > 1 {
                let key = (meta.dev(), meta.ino());
                if let Some(target) = self.hardlinks.get(&key) {
                    let mut header = tar::Header::new_gnu();
                    header.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
                    header.set_entry_type(tar::EntryType::Link);
                    header.set_size(0);
                    self.tar
                        .append_link(&mut header, &rel_path, target)
                        .map_err(LayerError::Write)?;
                    self.entry_written();
                    continue;
                }
                self.hardlinks.insert(key, rel_path.clone());
            }
            self.tar
                .append_path_with_name(&path, &rel_path)
                .map_err(|source| LayerError::Read {
                    path: path.clone(),
                    source,
                })?;
            self.entry_written();
            if file_type.is_dir() {
                self.append_dir_contents(&path, &rel_path)?;
            }
        }
        Ok(())
    }

    /// Ends the tar stream, flushes the compressor and returns the sink with the layer's descriptor.
    pub fn finish(self) -> Result<(W, LayerDescriptor), LayerError> {
        let tar_stream = self.tar.into_inner().map_err(LayerError::Write)?;
        let (compressor, diff_id, uncompressed_size) = tar_stream.finish();
        let blob_stream = compressor.finish().map_err(LayerError::Write)?;
        let (mut sink, digest, size) = blob_stream.finish();
        sink.flush().map_err(LayerError::Write)?;
        Ok((
            sink,
            LayerDescriptor {
                media_type: self.compression.media_type(),
                digest,
                size,
                diff_id,
                uncompressed_size,
                entries: self.entries,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::symlink;

    fn sample_tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("usr/lib/python3/site-packages/pkg")).unwrap();
        fs::write(
            root.join("usr/lib/python3/site-packages/pkg/__init__.py"),
            b"x = 1\n",
        )
        .unwrap();
        fs::write(root.join("big.bin"), vec![7u8; 300_000]).unwrap();
        symlink("usr/lib", root.join("lib")).unwrap();
        fs::hard_link(root.join("big.bin"), root.join("big-again.bin")).unwrap();
        fs::create_dir(root.join("empty")).unwrap();
        dir
    }

    fn unpack_entries(tar_bytes: &[u8]) -> Vec<(String, tar::EntryType, Vec<u8>, Option<String>)> {
        let mut archive = tar::Archive::new(tar_bytes);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let path = e.path().unwrap().to_string_lossy().into_owned();
                let kind = e.header().entry_type();
                let link = e
                    .link_name()
                    .unwrap()
                    .map(|l| l.to_string_lossy().into_owned());
                let mut body = Vec::new();
                e.read_to_end(&mut body).unwrap();
                (path, kind, body, link)
            })
            .collect()
    }

    #[test]
    fn zstd_layer_digests_match_the_bytes_and_the_tree_round_trips() {
        let tree = sample_tree();
        let mut writer = LayerWriter::new(Vec::new(), Compression::default()).unwrap();
        writer.append_tree(tree.path()).unwrap();
        let (blob, desc) = writer.finish().unwrap();

        assert_eq!(
            desc.media_type,
            "application/vnd.oci.image.layer.v1.tar+zstd"
        );
        assert_eq!(desc.size, blob.len() as u64);
        assert_eq!(desc.digest, Digest::of(&blob));
        let tar_bytes = zstd::decode_all(&blob[..]).unwrap();
        assert_eq!(desc.diff_id, Digest::of(&tar_bytes));
        assert_eq!(desc.uncompressed_size, tar_bytes.len() as u64);
        assert!(
            desc.size < 10_000,
            "300 KB of sevens must compress: {}",
            desc.size
        );

        let entries = unpack_entries(&tar_bytes);
        let names: Vec<_> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "big-again.bin",
                "big.bin",
                "empty",
                "lib",
                "usr",
                "usr/lib",
                "usr/lib/python3",
                "usr/lib/python3/site-packages",
                "usr/lib/python3/site-packages/pkg",
                "usr/lib/python3/site-packages/pkg/__init__.py",
            ]
        );
        assert_eq!(desc.entries, names.len() as u64);
        // The first name of the inode carries the data, the second is a hardlink to it.
        assert_eq!(entries[0].1, tar::EntryType::Regular);
        assert_eq!(entries[0].2.len(), 300_000);
        assert_eq!(entries[1].1, tar::EntryType::Link);
        assert_eq!(entries[1].3.as_deref(), Some("big-again.bin"));
        assert_eq!(entries[3].1, tar::EntryType::Symlink);
        assert_eq!(entries[3].3.as_deref(), Some("usr/lib"));
        assert_eq!(entries[9].2, b"x = 1\n");
    }

    #[test]
    fn gzip_layer_has_gzip_media_type_and_same_diff_id_as_zstd() {
        let tree = sample_tree();
        let mut gz = LayerWriter::new(Vec::new(), Compression::Gzip { level: 6 }).unwrap();
        gz.append_tree(tree.path()).unwrap();
        let (gz_blob, gz_desc) = gz.finish().unwrap();
        let mut zs = LayerWriter::new(Vec::new(), Compression::default()).unwrap();
        zs.append_tree(tree.path()).unwrap();
        let (_, zs_desc) = zs.finish().unwrap();

        assert_eq!(
            gz_desc.media_type,
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
        let mut tar_bytes = Vec::new();
        flate2::read::GzDecoder::new(&gz_blob[..])
            .read_to_end(&mut tar_bytes)
            .unwrap();
        assert_eq!(gz_desc.diff_id, Digest::of(&tar_bytes));
        // The uncompressed stream does not depend on the compressor.
        assert_eq!(gz_desc.diff_id, zs_desc.diff_id);
        assert_ne!(gz_desc.digest, zs_desc.digest);
    }

    #[test]
    fn unreadable_directory_is_named_in_the_error() {
        let err = LayerWriter::new(Vec::new(), Compression::default())
            .unwrap()
            .append_tree(Path::new("/nonexistent/labforge-tree"))
            .unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/labforge-tree"),
            "{err}"
        );
    }
}
