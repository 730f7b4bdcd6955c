//! The web app's server side and the embedded single-machine mode.
//!
//! The JSON API ([`api`]) serves the UI, the CLI and scripts; it validates every request into a
//! Kubeflow `Notebook` ([`validate`]) before anything is stored. In the embedded mode
//! ([`embedded`]) the Kubernetes API is replaced by a file-backed [`store`], pods by podman
//! containers ([`runtime`]), the auth proxy by local [`users`] and sessions, and the save button
//! runs the builder against the notebook's container ([`saves`]). The controller's builders, the
//! proxy and the builder are the same code as in a cluster.

pub mod api;
pub mod backend;
pub mod base_path;
pub mod cgroup;
pub mod cluster;
pub mod config;
pub mod data_dir;
pub mod embedded;
pub mod engine_workloads;
pub mod gpus;
pub mod image_builds;
pub mod image_check;
pub mod keep_alive;
pub mod kubeflow;
pub mod kubeflow_api;
pub mod model;
pub mod notebook_secret;
pub mod notebook_sign_in;
pub mod runtime;
pub mod saves;
pub mod self_signed;
pub mod sign_in;
pub mod status;
pub mod store;
pub mod ui;
pub mod usage;
pub mod users;
pub mod validate;
pub mod workloads;
