//! The web app in a cluster (`labforge web`): the same API and pages over Notebook CRs, behind the
//! cluster's auth proxy (Kubeflow's `kubeflow-userid` header), every decision a
//! SubjectAccessReview.

mod access;
mod backend;
pub mod image_builds;
mod workloads;

pub use access::KubernetesAccess;
pub use backend::KubernetesBackend;
pub use image_builds::ImageBuildSaves;
pub use workloads::ClusterWorkloads;

use crate::api::ApiState;
use crate::base_path::BasePath;
use crate::config::SpawnerConfig;
use labforge_proxy::authz::TrustedHeader;
use std::sync::Arc;

/// How `labforge web` serves.
pub struct WebOptions {
    /// Who the auth proxy in front says the user is.
    pub header: TrustedHeader,
    pub spawner: SpawnerConfig,
    /// Saves are ImageBuilds pushing under this registry (`host[/path]`); `None`: no saving.
    pub save_registry: Option<String>,
    /// Notebooks are opened on their own hosts below this domain, as the proxy and controller
    /// serve them.
    pub notebook_domain: Option<String>,
    /// The path the app is served under (`/jupyter/` in Kubeflow's dashboard).
    pub base_path: BasePath,
}

/// The app's routes for a cluster reached through `client`. GPU vendors are offered only when some
/// node has them in its capacity (read once, at start). Notebooks' resource use comes from the
/// cluster's metrics API (metrics-server), read in the background.
pub async fn router(client: kube::Client, options: WebOptions) -> axum::Router {
    let WebOptions {
        header,
        mut spawner,
        save_registry,
        notebook_domain,
        base_path,
    } = options;
    if !spawner.gpu_vendors.is_empty() {
        let found = vendors_on_nodes(&client).await;
        spawner
            .gpu_vendors
            .retain(|v| found.contains(&v.limits_key));
    }
    let backend = KubernetesBackend::new(client.clone());
    let usage = Arc::new(crate::usage::UsageBoard::default());
    tokio::spawn(crate::usage::sample_metrics_api(
        client.clone(),
        usage.clone(),
        backend.change_sender(),
    ));
    let saves_registry = save_registry
        .as_deref()
        .map(crate::image_access::SavesRegistry::new);
    let state = ApiState {
        backend: Arc::new(backend),
        access: Arc::new(KubernetesAccess {
            client: client.clone(),
            header,
        }),
        local_users: None,
        sign_in: None,
        saves: save_registry.map(|registry| {
            Arc::new(ImageBuildSaves::new(client.clone(), registry)) as Arc<dyn crate::saves::Saves>
        }),
        config: Arc::new(spawner),
        workloads: Arc::new(ClusterWorkloads { client }),
        // The proxy's activity reaches the culler, which writes it into the Notebook.
        activity: Arc::default(),
        secure_cookies: false,
        // The auth proxy in front signs visitors in on every notebook host.
        notebook_links: notebook_domain.map(|domain| crate::notebook_sign_in::NotebookLinks {
            domain,
            sign_in: None,
        }),
        // The kubelet pulls with the namespace's pull secrets, which the web app does not see:
        // its pull is the check.
        image_check: None,
        usage: Some(usage),
        idle_after: labforge_notebook_controller::culler::CullingConfig::default().idle_time,
        base_path: base_path.clone(),
        saves_registry,
        preparing: Arc::default(),
        audit: Arc::new(crate::audit::AuditToLog),
    };
    let app = crate::ui::app(state);
    let app = if base_path.is_root() {
        app.layer(axum::middleware::map_response(crate::ui::deny_framing))
    } else {
        app.layer(axum::middleware::map_response(
            crate::ui::same_origin_framing_only,
        ))
    };
    crate::base_path::serve_under(base_path, app)
}

/// Extended resources with a nonzero capacity on some node.
async fn vendors_on_nodes(client: &kube::Client) -> Vec<String> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    match nodes.list(&Default::default()).await {
        Ok(list) => list
            .items
            .iter()
            .filter_map(|n| n.status.as_ref()?.capacity.as_ref())
            .flat_map(|capacity| capacity.iter())
            .filter(|(_, q)| q.0 != "0")
            .map(|(k, _)| k.clone())
            .collect(),
        Err(err) => {
            // Listing nodes needs its own RBAC; without it no GPU is offered rather than a wrong one.
            tracing::warn!(error = %err, "listing nodes for GPU vendors");
            Vec::new()
        }
    }
}
