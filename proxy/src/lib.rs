//! labforge's notebook proxy: what Istio's ingress gateway does for Kubeflow notebooks, plus the
//! per-notebook authorization and activity Kubeflow gets from other parts.
//!
//! Data flow: a route source (Kubernetes watch of VirtualServices, YAML files, or records pushed
//! by the embedded web app) → [`source::RouteStore`] rebuilds an immutable [`routes::RouteTable`]
//! and swaps it in → each request is normalized ([`normalize`]), identified and authorized
//! ([`authz`]; in a cluster by SubjectAccessReview, [`review`]), matched with Istio's semantics and forwarded ([`forward`]) over a per-thread
//! HTTP/1.1 connection pool ([`upstream`]), websockets tunnelled; successful responses and websocket traffic update the route's
//! [`activity`], which the admin endpoint ([`admin`]) serves to the culler.
//!
//! The key decision: the table is rebuilt whole and swapped atomically instead of being edited in
//! place, so lookups take no lock and never see half an update; a 10,000-route rebuild costs
//! milliseconds, and prefix lookups are indexed so they do not grow with the route count.

pub mod activity;
pub mod admin;
pub mod authz;
pub mod forward;
pub mod heap_release;
pub mod metrics;
pub mod normalize;
pub mod notebook_host;
pub mod ports;
pub mod respond;
pub mod review;
pub mod routes;
pub mod server;
pub mod source;
mod tunnel;
pub mod upstream;

use crate::activity::Activity;
use crate::authz::{IdentitySource, NamespaceAccess};
use crate::forward::Forwarder;
use crate::heap_release::HeapRelease;
use crate::metrics::Metrics;
use crate::routes::GatewayFilter;
use crate::server::TlsFiles;
use crate::source::RouteStore;
use crate::upstream::UpstreamPool;
use labforge_supervise::{PartEnded, Supervised};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A map looked up on every request, keyed by text: foldhash instead of std's SipHash, which
/// costs several times as much per lookup on the request path. foldhash is seeded at random per process and per map, and calls
/// itself minimally DoS-resistant; that is enough here, since the keys stored come from
/// VirtualServices, the proxy's configuration and the auth proxy's user names, and a client's
/// path only probes.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

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
    /// Serving threads; 0 means one per CPU.
    pub threads: usize,
    /// How long an upstream's most recently used connection stays pooled without a request
    /// ([`upstream::DEFAULT_IDLE_TIMEOUT`] unless configured); its other idle ones stay at most
    /// [`upstream::SURPLUS_IDLE_TIMEOUT`].
    pub upstream_idle_timeout: Duration,
    /// How long getting an upstream connection may take, waiting for a connecting slot included
    /// ([`upstream::DEFAULT_CONNECT_TIMEOUT`] unless configured).
    pub upstream_connect_timeout: Duration,
    /// `host:port` that requests outside `/notebook/` go to, authenticated by it rather than by
    /// the proxy: the web app, when the proxy is embedded mode's one entry point.
    pub fallback: Option<String>,
    /// How long a client connection may go without completing a request head while none is in
    /// flight ([`server::DEFAULT_REQUEST_HEAD_TIMEOUT`] unless configured).
    pub request_head_timeout: Duration,
    /// What VirtualServices from the watch or files may do outside trusted namespaces.
    pub confinement: routes::Confinement,
    /// Cookies that identify the visitor (the platform's session, the auth proxy's), never
    /// forwarded to a route ([`forward::DEFAULT_VISITOR_COOKIES`] and any configured); a name
    /// also covers its split parts `<name>_<n>`.
    pub visitor_cookies: Vec<String>,
    /// Client connections served at once, over all threads; more are answered 503.
    pub max_connections: usize,
    /// How fast a request body must arrive ([`server::BodyPace::default`] unless configured).
    pub body_pace: server::BodyPace,
    /// Each notebook on a host of its own ([`notebook_host`]); `None`: on the paths of every
    /// host, as Kubeflow.
    pub notebook_hosts: Option<notebook_host::NotebookHosts>,
    /// The web app's root path (`/`, `/jupyter/`), on the request's host or, with notebook hosts,
    /// on their domain. A browser opening a notebook that has no route (stopped, failed, gone) is
    /// sent to the app's page of it, which says why and offers Start; the proxy's error pages
    /// link back to it. `None`: no such redirect, and error pages link to `/`.
    pub app_path: Option<String>,
    /// Give free memory back to the operating system after a burst of connections
    /// ([`heap_release`]); off only to measure what that saves.
    pub heap_release: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyStartError {
    #[error("{addr} is in use by another program; stop it, or give {what} another address")]
    AddressInUse {
        what: &'static str,
        addr: SocketAddr,
    },
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

/// A started proxy; its threads and tasks stop when it is dropped.
pub struct RunningProxy {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub routes: Arc<RouteStore>,
    pub activity: Arc<Activity>,
    /// The admin server, the heap release and the route watch when there is one.
    tasks: Supervised,
    stop: tokio::sync::watch::Sender<bool>,
}

impl RunningProxy {
    /// Waits until any of the proxy's tasks ends (each runs until the proxy stops), and says
    /// which and why; the proxy stops then, as it is dropped.
    pub async fn wait(&mut self) -> PartEnded {
        self.tasks.first_ended().await
    }
}

impl Drop for RunningProxy {
    fn drop(&mut self) {
        // The serving threads; the tasks are aborted as their set is dropped.
        self.stop.send_replace(true);
    }
}

/// Binds `addr` once without SO_REUSEPORT, to learn whether another program listens there: the
/// listeners below share their port with anyone else who sets SO_REUSEPORT, and the kernel would
/// split connections between them and that program without a word. Returns the address with the
/// port the kernel chose when `addr` asks for any.
fn claim(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind(addr)?.local_addr()
}

/// Binds `addr` with SO_REUSEPORT, so one listener per serving thread shares the port and the
/// kernel spreads connections over them.
fn bind_shared(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

/// What a bind failure is: the address taken, or another reason.
fn bind_error(what: &'static str, addr: SocketAddr) -> impl Fn(std::io::Error) -> ProxyStartError {
    move |source: std::io::Error| match source.kind() {
        std::io::ErrorKind::AddrInUse => ProxyStartError::AddressInUse { what, addr },
        _ => ProxyStartError::Bind { what, addr, source },
    }
}

/// One listener per serving thread, all on the same address (`SO_REUSEPORT`): the configured
/// thread count, or one per core. Returns them and the address they got.
fn bind_listeners(
    options: &ProxyOptions,
) -> Result<(Vec<tokio::net::TcpListener>, SocketAddr), ProxyStartError> {
    let claimed = claim(options.listen).map_err(bind_error("the proxy", options.listen))?;
    let first = bind_shared(claimed).map_err(bind_error("the proxy", claimed))?;
    let addr = first
        .local_addr()
        .map_err(bind_error("the proxy", options.listen))?;
    let mut listeners = vec![first];
    let threads = match options.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    for _ in 1..threads {
        listeners.push(bind_shared(addr).map_err(bind_error("the proxy", addr))?);
    }
    Ok((listeners, addr))
}

/// What a serving thread needs: it runs a runtime of its own and serves its listener until told
/// to stop.
struct Serving {
    forwarder: Forwarder,
    tls: Option<tokio_rustls::TlsAcceptor>,
    heap: Arc<HeapRelease>,
    stopped: tokio::sync::watch::Receiver<bool>,
    request_head_timeout: Duration,
    max_connections: usize,
}

impl Serving {
    /// Starts serving thread `i` on `listener`.
    fn spawn(self, i: usize, listener: std::net::TcpListener) -> std::io::Result<()> {
        let Serving {
            forwarder,
            tls,
            heap,
            mut stopped,
            request_head_timeout,
            max_connections,
        } = self;
        let serving = move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    tracing::error!(error = %err, "starting a serving thread's runtime");
                    return;
                }
            };
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => listener,
                    Err(err) => {
                        tracing::error!(error = %err, "registering the listener");
                        return;
                    }
                };
                tokio::select! {
                    () = server::serve(listener, Arc::new(forwarder), tls, heap, request_head_timeout, max_connections) => {}
                    _ = stopped.wait_for(|stop| *stop) => {}
                }
            });
            // Dropping the runtime ends this thread's connections and tunnels.
        };
        std::thread::Builder::new()
            .name(format!("labforge-proxy-{i}"))
            .spawn(serving)
            .map(|_| ())
    }
}

/// Binds both listeners, loads or starts watching routes, and serves: requests on `threads`
/// threads, each with its own single-threaded runtime, listener and upstream pool (a request and
/// its upstream call never cross threads, as in nginx's workers); admin and route watch on the
/// caller's runtime.
pub async fn start(
    options: ProxyOptions,
    routes_from: RoutesFrom,
) -> Result<RunningProxy, ProxyStartError> {
    let tls = options.tls.as_ref().map(server::tls_acceptor).transpose()?;
    let (listeners, addr) = bind_listeners(&options)?;
    let threads = listeners.len();
    let admin_listener = tokio::net::TcpListener::bind(options.admin)
        .await
        .map_err(bind_error("the admin server", options.admin))?;
    let admin_addr = admin_listener
        .local_addr()
        .map_err(bind_error("the admin server", options.admin))?;

    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let activity = Arc::new(Activity::default());
    let heap = Arc::new(HeapRelease::default());
    let routes = Arc::new(RouteStore::new(
        options.gateway.clone(),
        options.confinement.clone(),
        activity.clone(),
        metrics.clone(),
        heap.clone(),
    ));
    let admin_router = admin::router(admin::AdminState {
        registry: Arc::new(registry),
        routes: routes.clone(),
        activity: activity.clone(),
    });
    let mut tasks = Supervised::default();
    tasks.spawn("proxy's admin server", async move {
        let served = axum::serve(admin_listener, admin_router).await;
        if let Err(err) = &served {
            tracing::warn!(error = %err, "admin server stopped");
        }
        served
    });
    if options.heap_release {
        let release = heap
            .clone()
            .release_when_asked(metrics.heap_releases.clone());
        tasks.spawn_unit("proxy's heap release", release);
    }
    match routes_from {
        RoutesFrom::Files(paths) => {
            let listing = source::load_listing(&routes, &paths)?;
            routes.apply([source::Change::Replace(listing)]);
        }
        RoutesFrom::Kubernetes(client) => {
            let watch = source::watch_kubernetes(client, routes.clone());
            tasks.spawn_unit("proxy's route watch", watch);
        }
        RoutesFrom::Pushed => {}
    }

    let (stop, stopped) = tokio::sync::watch::channel(false);
    // The port claimed, for links to the app on the notebook hosts' domain.
    let options = ProxyOptions {
        listen: addr,
        ..options
    };
    for (i, listener) in listeners.into_iter().enumerate() {
        // Moved to the thread's runtime: deregistered here, registered there.
        let listener = listener.into_std().map_err(bind_error("the proxy", addr))?;
        let forwarder = Forwarder::new(
            routes.clone(),
            metrics.clone(),
            &options,
            UpstreamPool::new(
                options.upstream_idle_timeout,
                options.upstream_connect_timeout,
                heap.clone(),
            ),
        );
        let serving = Serving {
            forwarder,
            tls: tls.clone(),
            heap: heap.clone(),
            stopped: stopped.clone(),
            request_head_timeout: options.request_head_timeout,
            max_connections: options.max_connections,
        };
        serving
            .spawn(i, listener)
            .map_err(bind_error("a serving thread", addr))?;
    }
    tracing::info!(%addr, %admin_addr, threads, "proxy serving");
    Ok(RunningProxy {
        addr,
        admin_addr,
        routes,
        activity,
        tasks,
        stop,
    })
}
