//! The controller process: admin server, leader election, reconcile loop and culler, wired together.

use crate::admin::{self, AdminState};
use crate::builders::BuilderConfig;
use crate::controller::{self, Context, FIELD_MANAGER};
use crate::culler::{self, ActivitySource, ClusterCulling, CullingConfig, JupyterActivity};
use crate::leader::LeaderElector;
use crate::metrics::Metrics;
use crate::proxy_activity::ProxyActivity;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("binding the admin server on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("leader election")]
    Leader(#[source] kube::Error),
}

/// Everything the controller process needs, already validated.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub builder: BuilderConfig,
    pub culling: CullingConfig,
    /// `/metrics`, `/healthz`, `/readyz` (ready as soon as it serves, leading or standing by).
    pub admin_addr: SocketAddr,
    /// Lease namespace and identity; `None` runs without leader election (a single replica).
    pub leader_election: Option<LeaderElection>,
    /// Base URL of notebook servers for culling, with `{namespace}` and `{name}` placeholders;
    /// `None` uses the notebook's Service DNS name inside the cluster.
    pub jupyter_base_url: Option<String>,
    /// The labforge proxy's admin URL; when set, its per-route activity is a culling source too
    /// (the only one for notebooks without Jupyter's API).
    pub proxy_activity_url: Option<String>,
    /// How often an unchanged Notebook is reconciled again.
    pub resync: Duration,
}

#[derive(Clone, Debug)]
pub struct LeaderElection {
    pub namespace: String,
    pub identity: String,
    pub lease_duration: Duration,
}

/// Runs until interrupted, or until this replica loses its lease.
pub async fn serve(client: kube::Client, options: ServeOptions) -> Result<(), ServeError> {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let ready = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind(options.admin_addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: options.admin_addr,
            source,
        })?;
    let admin_router = admin::router(AdminState {
        registry: Arc::new(registry),
        ready: ready.clone(),
    });
    let admin = tokio::spawn(async move { axum::serve(listener, admin_router).await });

    // Ready means serving: a standby replica waiting for the lease is healthy, and must not hold
    // up a rolling update. Who leads is the `labforge_controller_leader` gauge.
    ready.store(true, Ordering::Relaxed);
    let elector = options.leader_election.as_ref().map(|election| {
        LeaderElector::new(
            client.clone(),
            &election.namespace,
            FIELD_MANAGER,
            &election.identity,
            election.lease_duration,
        )
    });
    if let Some(elector) = &elector {
        tracing::info!("waiting for the leader lease");
        elector
            .acquire(Duration::from_secs(2))
            .await
            .map_err(ServeError::Leader)?;
        tracing::info!("leading");
    }
    metrics.leader.set(1);

    let culler = options.culling.enabled.then(|| {
        let jupyter = match options.jupyter_base_url.clone() {
            Some(template) => JupyterActivity::new(move |namespace, name| {
                template
                    .replace("{namespace}", namespace)
                    .replace("{name}", name)
            }),
            None => JupyterActivity::in_cluster(options.builder.cluster_domain.clone()),
        };
        // labforge's images answer only with the notebook's secret, when notebooks have one.
        let jupyter: Arc<dyn ActivitySource> = match options.builder.notebook_secret_key.clone() {
            Some(key) => Arc::new(jupyter.with_authorization(move |namespace, name| {
                format!("token {}", key.of(namespace, name))
            })),
            None => Arc::new(jupyter),
        };
        let mut sources = vec![jupyter];
        if let Some(url) = &options.proxy_activity_url {
            sources.push(Arc::new(ProxyActivity::in_cluster(
                url.clone(),
                client.clone(),
            )));
        }
        let platform = ClusterCulling {
            client: client.clone(),
            sources,
            metrics: metrics.clone(),
        };
        tokio::spawn(culler::cull_forever(platform, options.culling.clone()))
    });

    let instance = options.leader_election.as_ref().map(|e| e.identity.clone());
    let (caches, cache_writers) = crate::cache::caches();
    let mut ctx = Context::new(client, options.builder, metrics, instance, caches);
    ctx.resync = options.resync;
    let ctx = Arc::new(ctx);
    let lease_lost = async {
        match &elector {
            Some(elector) => elector.hold(Duration::from_secs(5)).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = controller::run(ctx, cache_writers) => tracing::info!("controller stopped"),
        () = lease_lost => tracing::warn!("lost the leader lease; exiting so another replica leads"),
    }
    if let Some(culler) = culler {
        culler.abort();
    }
    admin.abort();
    Ok(())
}
