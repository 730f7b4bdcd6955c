//! The single-machine platform behind `labforge up`: what stands for Kubernetes when notebooks
//! run as podman (or docker) containers on one machine.
//!
//! The web app (`labforge-web`) serves the same API and pages in both modes and speaks to its
//! platform through traits; this crate implements them here. The Kubernetes API is replaced by a
//! file-backed [`store`], pods by containers ([`runtime`]), the notebook's logs and volumes by
//! the engine's ([`engine_workloads`]), and the save button runs the builder against the
//! notebook's container ([`save_jobs`]). [`up::start`] wires these to the web app, the proxy and
//! a local registry. The controller's builders, its culling loop (over [`culler`]), the proxy and
//! the builder are the same code as in a cluster.

pub mod cgroup;
pub mod culler;
pub mod data_dir;
pub mod engine_workloads;
pub mod gpus;
pub mod notebook_secrets;
pub mod ports;
pub mod runtime;
pub mod sampling;
pub mod save_jobs;
pub mod self_signed;
pub mod status;
pub mod store;
pub mod up;
