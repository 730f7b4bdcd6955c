//! What several suites share, in one place: no suite imports another's helpers. Helpers that
//! need neither this build's binaries nor labforge's crates live in `labforge-tests`.

pub mod cluster;
pub mod deploy;
pub mod embedded;
pub mod proxy;
pub mod save;
