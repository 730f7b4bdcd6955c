//! The web app's server side: the JSON API ([`api`]), its pages ([`ui`]) and the Kubeflow-shaped
//! routes ([`api::kubeflow`]), over whichever platform runs the notebooks.
//!
//! The API validates every request into a Kubeflow `Notebook` ([`validate`]) before anything is
//! stored, then speaks to the platform only through traits: [`backend::Backend`] keeps notebooks,
//! [`backend::Access`] says who may touch them, [`saves::Saves`] runs saves and
//! [`workloads::Workloads`] reads logs, pods and volumes. [`cluster`] implements them on the
//! Kubernetes API; the `labforge-embedded` crate implements them on one machine. Local users and
//! sessions ([`users`], [`sign_in`]) are here, not in a platform: signing in is the web app's own
//! job, with its cookies and its sign-in route.

pub mod api;
pub mod audit;
pub mod backend;
pub mod base_path;
pub mod cluster;
pub mod config;
pub mod image_access;
pub mod image_check;
pub mod json_file;
pub mod keep_alive;
pub mod kubeflow;
pub mod model;
pub mod namespaces;
pub mod notebook_sign_in;
mod openapi;
pub mod ports;
pub mod preparing;
pub mod quota;
pub mod same_origin;
pub mod saves;
pub mod sign_in;
pub mod tokens;
pub mod ui;
pub mod unavailable;
pub mod usage;
pub mod users;
pub mod validate;
pub mod workloads;
