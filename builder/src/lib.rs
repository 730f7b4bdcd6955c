//! The daemonless image builder.
//!
//! labforge saves a running notebook's environment as one new layer on the image it runs, without a
//! Dockerfile, a container daemon or a privileged pod. This crate holds the parts of that pipeline that
//! do I/O on blobs:
//!
//! - [`layer`]: a layer stream that compresses (zstd or gzip) and computes both the
//!   uncompressed `diff_id` and the compressed blob digest in the same single pass;
//! - [`image`]: OCI image configs and manifests, edited as JSON so that fields we do not model survive;
//! - [`registry`]: pushing blobs (streamed from disk, skipped when already present) and manifests
//!   through `oci-client`, tag written last;
//! - [`upload`]: the layer's upload while it is still being compressed (one streamed PATCH, the
//!   digest given when it is known), which the disk copy backs up;
//! - [`cache`]: the blob cache, S3 (`aws-sdk-s3`, custom endpoint, multipart) or a local directory;
//! - [`source`]: where a change set comes from (a directory, or the agent inside a container);
//! - [`save`]: the save itself: baseline index, change set, one new layer, push, cache;
//! - [`summary`]: what a save changed (packages added, upgraded, removed; file totals), read from
//!   the layer as it is written.
//!
//! Scanning and the change-set tar live in `labforge-snapshot`, which the in-container agent is
//! built from.
//!
//! The key design decision is that every blob is hashed while it is written, never re-read: a layer of
//! any size costs one pass over the files and bounded memory.

pub mod cache;
pub mod digest;
pub mod image;
pub mod layer;
pub mod registry;
pub mod save;
pub mod source;
pub mod stall;
pub mod summary;
pub mod upload;

pub use digest::Digest;
