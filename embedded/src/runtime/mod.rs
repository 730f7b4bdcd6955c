//! The embedded mode's kubelet: realizes each stored Notebook's pod, as the controller's builders
//! produce it, as one podman (or docker) container, and registers its route with the proxy.
//!
//! Three parts: [`plan`], what a Notebook's container is (a pure function of the Notebook and
//! the runtime's settings, tested without an engine); [`engine`], the podman or docker command
//! line; and [`reconcile`], the loop that makes the engine's containers match the plans: a
//! notebook whose spec changed is reconciled alone, through a work queue that holds one
//! reconcile per notebook, and every notebook is looked at again every few seconds.
//! Containers carry labels naming their notebook and a digest of their plan, so after a restart
//! of `labforge up` the runtime adopts what is running instead of starting it twice, and replaces
//! a container whose notebook changed (a new image, say). Workspaces are named volumes, kept on
//! stop and on delete. [`admission`] bounds how many notebooks start at once and keeps the
//! others in line, in order. [`prepull`] pulls the catalog's images in the background at start.

pub mod admission;
pub mod engine;
pub mod plan;
pub mod prepull;
pub mod reconcile;

pub use engine::*;
pub use plan::*;
pub use reconcile::*;
