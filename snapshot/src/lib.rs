//! What changed in a root filesystem since the image it runs, as one layer.
//!
//! Saving a notebook's environment needs three things that must also run *inside* the notebook's
//! container, where there are no credentials, no network and no async runtime: an index of the
//! image's files ([`index`]), a scan of the live root against it ([`scan`]), and a tar writer for
//! the differences ([`changeset`]). They live in this small crate so that the agent binary is built
//! from it alone; compression, caching and registry I/O stay in `labforge-builder`, outside the
//! container. [`protocol`] is what the agent and the builder say to each other.

pub mod changeset;
pub mod guard;
pub mod index;
pub mod protocol;
pub mod scan;

pub use changeset::{WriteError, WriteSummary, write_change_set};
pub use index::{BaselineIndex, EntryKind, IndexEntry, LayerObserver, LayerStats, NoObserver};
pub use scan::{ChangeSet, ScanError, ScanOptions, scan};
