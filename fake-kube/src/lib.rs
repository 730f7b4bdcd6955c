//! A fake Kubernetes API server for tests: real API semantics over HTTP, and every object written
//! validated against the official schemas.
//!
//! No real API server can run on these machines, so Kubernetes-mode code is tested against this
//! one through the same `kube::Client` it uses in a cluster. It keeps the behaviour that code
//! depends on: one global resourceVersion, list + watch (resume, bookmarks, 410 Expired on a
//! compacted resourceVersion), create/update/patch/server-side apply with no-op writes left free,
//! status subresources, finalizers, ownerReference cascades (background, orphan, and foreground
//! waiting for `blockOwnerDeletion` dependents), label and field selectors, and
//! Kubernetes `Status` errors, and `pods/<name>/exec` over remotecommand's websocket protocol with
//! a runner the test sets standing in for the kubelet, `pods/<name>/log` from a log source the test
//! sets, `metrics.k8s.io` PodMetrics the test sets (`metrics`), and, when asked, a minimal StatefulSet
//! controller and kubelet (`kubelet`). Validation is strict: a field the schema does not declare is an
//! error, so a typo in an object builder fails a test instead of being pruned silently.
//!
//! Main types: [`FakeApiServer`] (start, client, write accounting) and [`SchemaSet`] (the same
//! validation without a server). Built-in kinds come from `kubernetes-openapi-v2.json`, custom
//! resources from CRD YAML (Kubeflow Notebook, Istio networking/security, plus `extra_crds`).
//!
//! Simplified on purpose: no built-in defaulting beyond CRD `default`s, no admission, no CEL
//! `x-kubernetes-validations`, namespaces need not
//! exist, `limit`/`continue` are ignored (lists are whole).

mod apply;
mod catalog;
mod discovery;
mod exec;
mod http;
mod kubelet;
mod metrics;
mod patch;
mod rbac;
mod schema;
mod selector;
mod status;
mod store;
mod watch;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

pub use exec::ExecRequest;
pub use schema::{FieldError, SchemaSet};

/// Installs the crypto provider labforge uses (ring) for this process, if none is yet: kube's
/// client needs one.
pub fn init_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The repository root: `../shared/schemas` and `crds/` are found from it.
fn repo_root() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default()
}

/// Failures to start the fake server or load its schemas.
#[derive(Debug, thiserror::Error)]
pub enum FakeKubeError {
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {} as JSON", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("parsing {} as YAML", path.display())]
    Yaml {
        path: PathBuf,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("compiling the schema at {location} in {}: {message}", path.display())]
    Schema {
        path: PathBuf,
        location: String,
        message: String,
    },
    #[error("binding the fake API server to 127.0.0.1")]
    Bind(#[source] std::io::Error),
    #[error("parsing the fake API server URL {url}")]
    Url {
        url: String,
        #[source]
        source: axum::http::uri::InvalidUri,
    },
    #[error("building a kube client for {url}")]
    Client {
        url: String,
        #[source]
        source: kube::Error,
    },
}

/// What the fake serves and how much watch history it keeps.
#[derive(Debug, Clone)]
pub struct FakeApiServerOptions {
    /// Directory with `kubernetes-openapi-v2.json`, `kubeflow.org_notebooks.yaml` and
    /// `istio-networking-crds.yaml`.
    pub schemas_dir: PathBuf,
    /// More CRD YAML files (e.g. the project's own `crds/*.yaml`); a CRD for a group/plural
    /// already known replaces it.
    pub extra_crds: Vec<PathBuf>,
    /// Watch events kept for resuming; a watch from an older resourceVersion gets 410 Expired.
    pub watch_history: usize,
    /// Runs a minimal StatefulSet controller and kubelet (see `kubelet`), so that StatefulSets
    /// get pods that run; off, tests write pods and their status themselves.
    pub kubelet: bool,
}

impl Default for FakeApiServerOptions {
    fn default() -> Self {
        FakeApiServerOptions {
            schemas_dir: repo_root().join("../shared/schemas"),
            extra_crds: Vec::new(),
            watch_history: 1000,
            kubelet: false,
        }
    }
}

impl FakeApiServerOptions {
    /// Options whose Notebook CRD is labforge's own (`crds/notebooks.kubeflow.org.yaml`) instead of
    /// Kubeflow's, for tests of what our CRD lets through. The returned directory holds the
    /// schema set and must outlive the options' use.
    pub fn with_labforge_notebook_crd() -> std::io::Result<(Self, tempfile::TempDir)> {
        let defaults = Self::default();
        let dir = tempfile::tempdir()?;
        for file in ["kubernetes-openapi-v2.json", "istio-networking-crds.yaml"] {
            std::os::unix::fs::symlink(defaults.schemas_dir.join(file), dir.path().join(file))?;
        }
        std::os::unix::fs::symlink(
            repo_root().join("crds/notebooks.kubeflow.org.yaml"),
            dir.path().join("kubeflow.org_notebooks.yaml"),
        )?;
        let options = Self {
            schemas_dir: dir.path().to_owned(),
            ..defaults
        };
        Ok((options, dir))
    }
}

/// A running fake API server on `127.0.0.1`, stopped when dropped.
pub struct FakeApiServer {
    app: Arc<http::App>,
    address: SocketAddr,
    client: kube::Client,
    shutdown: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeApiServer {
    /// Loads the schemas, binds `127.0.0.1:0` and serves in a background task.
    pub async fn start(options: FakeApiServerOptions) -> Result<FakeApiServer, FakeKubeError> {
        let schemas = Arc::new(SchemaSet::load(&options)?);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(FakeKubeError::Bind)?;
        let address = listener.local_addr().map_err(FakeKubeError::Bind)?;
        let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
        let app = Arc::new(http::App {
            store: Arc::new(store::Store::new(schemas, options.watch_history)),
            stats: Mutex::new(http::Stats::default()),
            access_rule: RwLock::new(Arc::new(|_: &serde_json::Value| true)),
            exec_runner: RwLock::new(None),
            log_source: RwLock::new(None),
            pod_metrics: RwLock::default(),
            shutdown: shutdown_rx.clone(),
            address: address.to_string(),
            tokens: RwLock::default(),
        });
        let router = http::router(app.clone());
        let mut stop = shutdown_rx;
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, router).with_graceful_shutdown(async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            });
            if let Err(err) = serve.await {
                tracing::warn!(error = %err, "the fake API server stopped");
            }
        });
        let url = format!("http://{address}");
        init_crypto();
        let client = Self::build_client(&url, None)?;
        if options.kubelet {
            tokio::spawn(kubelet::run(
                client.clone(),
                app.store.subscribe(),
                app.shutdown.clone(),
            ));
        }
        Ok(FakeApiServer {
            app,
            address,
            client,
            shutdown,
            task,
        })
    }

    /// A client that acts as `user` (`system:serviceaccount:<namespace>:<name>` for a service
    /// account): each of its requests is allowed only by the RBAC objects stored here, as a
    /// real API server's authorizer would, and refused with 403 otherwise.
    pub fn client_as(&self, user: &str) -> Result<kube::Client, FakeKubeError> {
        let token = self.token_for(user);
        init_crypto();
        Self::build_client(&self.url(), Some(&token))
    }

    /// The bearer token this server takes for `user`, made on first use.
    fn token_for(&self, user: &str) -> String {
        let mut tokens = self
            .app
            .tokens
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((token, _)) = tokens.iter().find(|(_, u)| *u == user) {
            return token.clone();
        }
        let token = format!("fake-token-{}", tokens.len() + 1);
        tokens.insert(token.clone(), user.to_string());
        token
    }

    /// A client for `url`, presenting `token` when given (default namespace `default`).
    fn build_client(url: &str, token: Option<&str>) -> Result<kube::Client, FakeKubeError> {
        let uri: axum::http::Uri = url.parse().map_err(|source| FakeKubeError::Url {
            url: url.to_string(),
            source,
        })?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".to_string();
        if let Some(Ok(value)) =
            token.map(|token| axum::http::HeaderValue::from_str(&format!("Bearer {token}")))
        {
            config
                .headers
                .push((axum::http::header::AUTHORIZATION, value));
        }
        kube::Client::try_from(config).map_err(|source| FakeKubeError::Client {
            url: url.to_string(),
            source,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Writes a kubeconfig for this server (no auth, namespace `default`) to `path`, for the
    /// real `labforge` binary started with `KUBECONFIG`.
    pub fn write_kubeconfig(&self, path: &std::path::Path) -> std::io::Result<()> {
        self.write_kubeconfig_with(path, "{}")
    }

    /// [`Self::write_kubeconfig`] for a client acting as `user` (see [`Self::client_as`]).
    pub fn write_kubeconfig_as(&self, path: &std::path::Path, user: &str) -> std::io::Result<()> {
        let token = self.token_for(user);
        self.write_kubeconfig_with(path, &format!("{{token: {token}}}"))
    }

    /// A kubeconfig for this server whose user entry is `credentials` (YAML flow mapping).
    fn write_kubeconfig_with(
        &self,
        path: &std::path::Path,
        credentials: &str,
    ) -> std::io::Result<()> {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
                 users:\n- name: fake\n  user: {credentials}\ncontexts:\n- name: fake\n  context:\n    \
                 cluster: fake\n    user: fake\n    namespace: default\ncurrent-context: fake\n",
                self.url()
            ),
        )
    }

    /// A client for this server (default namespace `default`, no auth).
    pub fn client(&self) -> kube::Client {
        init_crypto();
        self.client.clone()
    }

    /// Successful writes that changed something (create, update, patch, apply, delete, status
    /// included) since start; no-op writes are not counted.
    pub fn write_count(&self) -> u64 {
        self.app.stats().writes
    }

    /// Successful mutating requests, including no-op ones that changed nothing: what a client
    /// costs the API server even when it writes nothing.
    pub fn write_requests(&self) -> u64 {
        self.app.stats().write_requests
    }

    /// [`Self::write_count`] by method and resource, e.g. `PATCH statefulsets`, `PUT notebooks/status`.
    pub fn writes_by(&self) -> BTreeMap<String, u64> {
        self.app.stats().writes_by.clone()
    }

    /// Every request for a resource so far, by verb and resource (`list pods`, `watch events`,
    /// `patch notebooks/status`), refused ones included: what clients cost the API server.
    pub fn requests_by(&self) -> BTreeMap<String, u64> {
        self.app.stats().requests_by.clone()
    }

    /// Removed objects as `Kind namespace/name`, in the order they went, to check the order a
    /// cascade takes.
    pub fn removals(&self) -> Vec<String> {
        self.app.store.removals()
    }

    /// Messages of every 400 and 422 answer so far (to assert nothing invalid was written).
    pub fn rejected(&self) -> Vec<String> {
        self.app.stats().rejected.clone()
    }

    /// Sets how SubjectAccessReviews are answered: `f` gets the review's `spec` and returns
    /// `status.allowed`. The default allows everything.
    pub fn set_access_rule(&self, f: impl Fn(&serde_json::Value) -> bool + Send + Sync + 'static) {
        *self
            .app
            .access_rule
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(f);
    }

    /// Sets how `pods/<name>/exec` runs: `f` turns the request into a process on this machine
    /// (`podman exec -i <container> …`, the kubelet's part), or refuses it with `None`. Without
    /// a runner, exec is refused. The pod must exist.
    pub fn set_exec_runner(
        &self,
        f: impl Fn(&ExecRequest) -> Option<std::process::Command> + Send + Sync + 'static,
    ) {
        *self
            .app
            .exec_runner
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(f));
    }

    /// Sets what `pods/<name>/log` answers: `f` gets the namespace, pod and container and returns
    /// what that container logged. Without a source, logs are empty. The pod must exist.
    pub fn set_log_source(
        &self,
        f: impl Fn(&str, &str, &str) -> Option<String> + Send + Sync + 'static,
    ) {
        *self
            .app
            .log_source
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(f));
    }

    /// Sets what `metrics.k8s.io` reports for pod `namespace/pod`, as metrics-server would after
    /// scraping it: its labels and, per container, CPU and memory quantities (`"250m"`,
    /// `"300Mi"`). The pod need not exist.
    pub fn set_pod_metrics(
        &self,
        namespace: &str,
        pod: &str,
        labels: &[(&str, &str)],
        containers: &[(&str, &str, &str)],
    ) {
        let sample = metrics::PodSample {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            containers: containers
                .iter()
                .map(|(name, cpu, memory)| {
                    ((*name).to_owned(), (*cpu).to_owned(), (*memory).to_owned())
                })
                .collect(),
        };
        self.app
            .pod_metrics
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((namespace.to_owned(), pod.to_owned()), sample);
    }

    /// Forgets the kept watch history, as an etcd compaction would: watches resuming from an
    /// older resourceVersion get 410 Expired and kube-runtime watchers re-list.
    pub fn compact_history(&self) {
        self.app.store.compact();
    }

    /// The schemas this server validates with.
    pub fn schemas(&self) -> &SchemaSet {
        self.app.store.schemas()
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        // Ends open watch streams (their connections then close) and stops accepting.
        self.shutdown.send_replace(true);
        self.task.abort();
    }
}
