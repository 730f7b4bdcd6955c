//! Streaming layer writer: tar → compressor → sink, with the `diff_id` (digest of the uncompressed
//! tar) and the blob digest (digest of the compressed bytes) computed in the same pass.
//!
//! Memory stays bounded whatever the layer size: nothing is buffered beyond the compressor's window
//! and one file copy buffer.

use crate::digest::{Digest, DigestWriter};
use std::io::{self, Write};

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

    /// Short name used in cache keys.
    pub fn name(self) -> &'static str {
        match self {
            Compression::Zstd { .. } => "zstd",
            Compression::Gzip { .. } => "gzip",
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
    #[error("writing the layer stream: {0}")]
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
                // zstd's default job (four windows) takes large buffers per worker; 1 MiB jobs
                // keep the builder's memory small at a negligible cost in ratio.
                encoder.set_parameter(zstd::stream::raw::CParameter::JobSize(1 << 20))?;
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

/// The write side of one layer blob: uncompressed tar bytes in, compressed bytes out to the sink,
/// with both digests kept on the way.
pub struct LayerStream<W: Write> {
    pipeline: DigestWriter<Compressor<DigestWriter<W>>>,
    compression: Compression,
}

impl<W: Write> LayerStream<W> {
    pub fn new(sink: W, compression: Compression) -> Result<Self, LayerError> {
        let compressor =
            Compressor::new(DigestWriter::new(sink), compression).map_err(LayerError::Write)?;
        Ok(Self {
            pipeline: DigestWriter::new(compressor),
            compression,
        })
    }

    /// Uncompressed bytes written so far.
    pub fn written(&self) -> u64 {
        self.pipeline.written()
    }

    /// Flushes the compressor and returns the sink with the layer's descriptor.
    pub fn finish(self, entries: u64) -> Result<(W, LayerDescriptor), LayerError> {
        let (compressor, diff_id, uncompressed_size) = self.pipeline.finish();
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
                entries,
            },
        ))
    }
}

impl<W: Write> Write for LayerStream<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pipeline.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.pipeline.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn sample_tar() -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_ustar();
        header.set_size(300_000);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, "big.bin", &vec![7u8; 300_000][..])
            .unwrap();
        builder.into_inner().unwrap()
    }

    fn stream(compression: Compression, tar: &[u8]) -> (Vec<u8>, LayerDescriptor) {
        let mut layer = LayerStream::new(Vec::new(), compression).unwrap();
        layer.write_all(tar).unwrap();
        assert_eq!(layer.written(), tar.len() as u64);
        layer.finish(1).unwrap()
    }

    #[test]
    fn zstd_layer_digests_match_the_bytes() {
        let tar = sample_tar();
        let (blob, desc) = stream(Compression::default(), &tar);
        assert_eq!(
            desc.media_type,
            "application/vnd.oci.image.layer.v1.tar+zstd"
        );
        assert_eq!(desc.size, blob.len() as u64);
        assert_eq!(desc.digest, Digest::of(&blob));
        assert_eq!(zstd::decode_all(&blob[..]).unwrap(), tar);
        assert_eq!(desc.diff_id, Digest::of(&tar));
        assert_eq!(desc.uncompressed_size, tar.len() as u64);
        assert!(
            desc.size < 10_000,
            "300 KB of sevens must compress: {}",
            desc.size
        );
    }

    #[test]
    fn gzip_layer_has_gzip_media_type_and_same_diff_id_as_zstd() {
        let tar = sample_tar();
        let (gz_blob, gz) = stream(Compression::Gzip { level: 6 }, &tar);
        let (_, zs) = stream(Compression::default(), &tar);
        assert_eq!(gz.media_type, "application/vnd.oci.image.layer.v1.tar+gzip");
        let mut unpacked = Vec::new();
        flate2::read::GzDecoder::new(&gz_blob[..])
            .read_to_end(&mut unpacked)
            .unwrap();
        assert_eq!(unpacked, tar);
        assert_eq!(
            gz.diff_id, zs.diff_id,
            "the diff_id does not depend on the compressor"
        );
        assert_ne!(gz.digest, zs.digest);
    }
}
