//! The web app in a cluster (`labforge web`): the same API and pages over Notebook CRs, behind the
//! cluster's auth proxy (Kubeflow's `kubeflow-userid` header), every decision a
//! SubjectAccessReview.

use crate::api::{ApiState, LogSource};
use crate::backend::{KubernetesAccess, KubernetesBackend};
use crate::config::SpawnerConfig;
use labforge_proxy::authz::TrustedHeader;
use std::sync::Arc;

/// The app's routes for a cluster reached through `client`.
pub fn router(client: kube::Client, header: TrustedHeader, spawner: SpawnerConfig) -> axum::Router {
    let state = ApiState {
        backend: Arc::new(KubernetesBackend::new(client.clone())),
        access: Arc::new(KubernetesAccess {
            client: client.clone(),
            header,
        }),
        local_users: None,
        saves: None,
        config: Arc::new(spawner),
        logs: LogSource::Kubernetes(client),
        // The proxy's activity reaches the culler, which writes it into the Notebook.
        activity: Arc::default(),
        secure_cookies: false,
    };
    crate::api::router(state.clone()).merge(crate::ui::router(state))
}
