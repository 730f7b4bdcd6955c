//! labforge's notebook proxy: what Istio's ingress gateway does for Kubeflow notebooks, plus the
//! per-notebook authorization and activity Kubeflow gets from other parts.
//!
//! Data flow: a route source (Kubernetes watch of VirtualServices, YAML files, or records pushed
//! by the embedded web app) → [`source::RouteStore`] rebuilds an immutable [`routes::RouteTable`]
//! and swaps it in → each request is normalized ([`normalize`]), identified and authorized
//! ([`authz`]), matched with Istio's semantics and forwarded ([`forward`]) over a pooled hyper
//! client, websockets tunnelled; successful responses and websocket traffic update the route's
//! [`activity`], which the admin endpoint ([`admin`]) serves to the culler.
//!
//! The key decision: the table is rebuilt whole and swapped atomically instead of being edited in
//! place, so lookups take no lock and never see half an update; a 10,000-route rebuild costs
//! milliseconds, and prefix lookups are indexed so they do not grow with the route count.

pub mod activity;
pub mod admin;
pub mod authz;
pub mod forward;
pub mod metrics;
pub mod normalize;
pub mod respond;
pub mod routes;
pub mod server;
pub mod source;

use crate::activity::Activity;
use crate::authz::{IdentitySource, NamespaceAccess};
use crate::forward::Forwarder;
use crate::metrics::Metrics;
use crate::routes::GatewayFilter;
use crate::server::TlsFiles;
use crate::source::RouteStore;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// Where routes come from.
#[derive(Clone)]
pub enum RoutesFrom {
    /// Watch VirtualServices through this client.
    Kubernetes(kube::Client),
    /// VirtualService YAML files, read once at start.
    Files(Vec<PathBuf>),
    /// Pushed through [`RunningProxy::routes`] (the embedded mode's web app, tests).
    Pushed,
}

/// Everything the proxy needs, already validated.
#[derive(Clone)]
pub struct ProxyOptions {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub gateway: GatewayFilter,
    pub identity: Arc<dyn IdentitySource>,
    pub access: Arc<dyn NamespaceAccess>,
    pub tls: Option<TlsFiles>,
    /// Destination `host:port` → address actually connected to.
    pub upstream_addresses: HashMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyStartError {
    #[error("binding {what} on {addr}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS")]
    Tls(#[from] server::TlsError),
    #[error("loading routes")]
    Routes(#[from] source::SourceError),
}

/// A started proxy; its tasks stop when it is dropped.
pub struct RunningProxy {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub routes: Arc<RouteStore>,
    pub activity: Arc<Activity>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RunningProxy {
    /// Waits until a task ends (they run forever unless the runtime stops).
    pub async fn wait(mut self) {
        if let Some(first) = self.tasks.first_mut() {
            let _ = first.await;
        }
    }
}

impl Drop for RunningProxy {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Binds both listeners, loads or starts watching routes, and serves in background tasks.
pub async fn start(
    options: ProxyOptions,
    routes_from: RoutesFrom,
) -> Result<RunningProxy, ProxyStartError> {
    let tls = options.tls.as_ref().map(server::tls_acceptor).transpose()?;
    let bind = |what, addr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ProxyStartError::Bind { what, addr, source })
    };
    let listener = bind("the proxy", options.listen).await?;
    let admin_listener = bind("the admin server", options.admin).await?;
    let local = |l: &tokio::net::TcpListener, what, addr| {
        l.local_addr()
            .map_err(|source| ProxyStartError::Bind { what, addr, source })
    };
    let addr = local(&listener, "the proxy", options.listen)?;
    let admin_addr = local(&admin_listener, "the admin server", options.admin)?;

    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let activity = Arc::new(Activity::default());
    let routes = Arc::new(RouteStore::new(
        options.gateway.clone(),
        activity.clone(),
        metrics.clone(),
    ));
    let mut tasks = Vec::new();
    match routes_from {
        RoutesFrom::Files(paths) => routes.replace_all(source::load_files(&paths)?),
        RoutesFrom::Kubernetes(client) => {
            tasks.push(tokio::spawn(source::watch_kubernetes(
                client,
                routes.clone(),
            )));
        }
        RoutesFrom::Pushed => {}
    }
    let forwarder = Arc::new(Forwarder::new(
        routes.clone(),
        options.identity.clone(),
        options.access.clone(),
        metrics,
        options.upstream_addresses.clone(),
    ));
    tasks.insert(0, tokio::spawn(server::serve(listener, forwarder, tls)));
    let admin_router = admin::router(admin::AdminState {
        registry: Arc::new(registry),
        routes: routes.clone(),
        activity: activity.clone(),
    });
    tasks.push(tokio::spawn(async move {
        if let Err(err) = axum::serve(admin_listener, admin_router).await {
            tracing::warn!(error = %err, "admin server stopped");
        }
    }));
    tracing::info!(%addr, %admin_addr, "proxy serving");
    Ok(RunningProxy {
        addr,
        admin_addr,
        routes,
        activity,
        tasks,
    })
}
