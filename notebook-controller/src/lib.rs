//! The notebook controller: a drop-in for Kubeflow's notebook-controller.
//!
//! [`builders`] turns a Notebook into the objects Kubeflow's controller would create for it (a
//! StatefulSet, a Service and an Istio VirtualService), and [`status`] mirrors the pod back into
//! the Notebook, both as pure functions that take no client: they are tested, rendered
//! (`labforge render`) and validated against the Kubernetes and Istio schemas without a server. The
//! same builders feed the Kubernetes reconcile loop ([`controller`]) and the embedded runtime.
//!
//! Beyond Kubeflow: status is written only when it changed (an idle resync writes nothing), culling
//! takes activity from any source (so non-Jupyter IDEs are culled too), and replicas elect a leader.

pub mod admin;
pub mod builders;
pub mod cache;
pub mod controller;
pub mod culler;
#[cfg(test)]
mod fixtures;
pub mod leader;
pub mod metrics;
pub mod proxy_activity;
pub mod render;
pub mod secret;
pub mod service;
pub mod status;

pub use builders::{BuildError, BuilderConfig, Children, build_children};
