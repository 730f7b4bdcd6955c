//! `labforge up`: everything on one machine, in one process.
//!
//! ```text
//! client ──▶ proxy (one port) ──/notebook/<ns>/<nb>/…──▶ notebook container (routes pushed by the runtime)
//!                             └─everything else───────▶ web app (API, UI; own session auth)
//! store (data dir) ──changes──▶ runtime ──podman run/rm──▶ containers, routes, status
//! save button ──▶ builder ──agent via podman exec──▶ layer ──▶ local registry (+ local cache)
//! ```
//!
//! A local OCI registry (Debian's `docker-registry`) is started on a loopback port unless one is
//! configured; it holds the notebook images and every saved environment.

use crate::culler::StoreCulling;
use crate::engine_workloads::EngineWorkloads;
use crate::gpus::GpuPool;
use crate::notebook_secrets::NotebookSecrets;
use crate::runtime::{Engine, Runtime};
use crate::sampling::sample_forever;
use crate::save_jobs::SaveJobs;
use crate::store::Store;
use labforge_builder::cache::BlobCache;
use labforge_builder::image::RuntimeConfig;
use labforge_builder::layer::Compression;
use labforge_builder::registry::RegistryOptions;
use labforge_builder::save::SaveOptions;
use labforge_notebook_controller::builders::BuilderConfig;
use labforge_notebook_controller::culler::{CullingConfig, cull_forever};
use labforge_proxy::notebook_host::NotebookHosts;
use labforge_proxy::routes::GatewayFilter;
use labforge_proxy::{ProxyOptions, RoutesFrom, RunningProxy};
use labforge_supervise::{PartEnded, Supervised};
use labforge_web::api::ApiState;
use labforge_web::config::{SpawnerConfig, default_spawner};
use labforge_web::preparing::ImagesBeingPrepared;
use labforge_web::saves::Saves;
use labforge_web::sign_in::SignIn;
use labforge_web::ui;
use labforge_web::usage::{UsageBoard, serve_metrics};
use labforge_web::users::{LocalAuth, UserError};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::process::{Child, Command};

#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error("data dir {path}: {source}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "labforge is already running with {data_dir} ({holder}); stop it first, or give this one another --data-dir"
    )]
    AlreadyRunning { data_dir: PathBuf, holder: String },
    #[error(transparent)]
    Users(#[from] UserError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("starting the local registry ({program}): {detail}")]
    Registry { program: String, detail: String },
    #[error("the agent binary {path}: {source}")]
    Agent {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{program} is not installed or not on PATH; install it (make setup does), or name another engine with --engine"
    )]
    EngineMissing { program: String },
    #[error("serving the web app: {0}")]
    Web(#[source] std::io::Error),
    #[error("serving metrics on {address}: {source}; pass another --metrics-listen address")]
    Metrics {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the proxy: {0}")]
    Proxy(#[from] labforge_proxy::ProxyStartError),
    #[error("the self-signed certificate: {0}")]
    SelfSigned(#[from] crate::self_signed::SelfSignedError),
    #[error("the TLS certificate: {0}")]
    Tls(#[from] labforge_proxy::server::TlsError),
    #[error(
        "--tls-self-signed: a certificate cannot cover every notebook's host below {domain:?} (a wildcard needs two labels after it); pass --notebook-domain with two labels or more, e.g. labforge.localhost or lab.example.com"
    )]
    WildcardTooWide { domain: String },
    #[error(
        "{domain} over plain HTTP: notebooks' pages could set cookies for the web app's host and sign its visitors in as someone else (browsers keep __Host- cookies on plain HTTP only on localhost); serve HTTPS with --tls-cert and --tls-key, or --tls-self-signed"
    )]
    PlainHttpSharedSite { domain: String },
    #[error(transparent)]
    Format(#[from] crate::data_dir::DataDirError),
}

/// Where `labforge up` gets its TLS certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSource {
    /// A certificate chain and key the admin provides.
    Files(labforge_proxy::server::TlsFiles),
    /// One made and kept in the data dir ([`crate::self_signed`]).
    SelfSigned,
}

/// How to run the embedded mode.
#[derive(Debug)]
pub struct UpOptions {
    pub data_dir: PathBuf,
    /// The one address users connect to.
    pub listen: SocketAddr,
    /// `podman` or `docker`.
    pub engine: PathBuf,
    /// An existing registry (`host:port`); `None` starts a local one on `registry_listen`.
    pub registry: Option<String>,
    pub registry_listen: SocketAddr,
    pub registry_program: PathBuf,
    /// Registries spoken to over plain HTTP besides the local one.
    pub insecure_registries: Vec<String>,
    /// The static agent binary mounted into notebooks for saves.
    pub agent: Option<PathBuf>,
    /// The spawner's catalog; `None`: the JupyterLab image in the registry.
    pub spawner: Option<SpawnerConfig>,
    pub cache: Option<BlobCache>,
    pub culling: CullingConfig,
    pub cdi_dirs: Vec<PathBuf>,
    /// Each notebook on a host of its own below this domain ([`NotebookHosts`]), and the web
    /// app on the domain itself unless [`Self::app_host`] says; `None`: notebooks on the web
    /// app's host, under their paths.
    pub notebook_domain: Option<String>,
    /// The web app's host when it is not the notebook domain itself: one of another site, whose
    /// cookies no notebook's page can set. Only with a notebook domain.
    pub app_host: Option<String>,
    /// HTTPS on the listen address (plain HTTP there is redirected to it), and cookies marked
    /// `Secure`; `None`: plain HTTP.
    pub tls: Option<TlsSource>,
    /// Where Prometheus metrics are served (`/metrics`); `None`: nowhere.
    pub metrics_listen: Option<SocketAddr>,
    /// How many notebooks start at once; `None`: [`crate::runtime::default_concurrent_starts`].
    pub concurrent_starts: Option<usize>,
}

impl UpOptions {
    /// The web app's host, when notebooks are on hosts of their own.
    pub fn app_host(&self) -> Option<&str> {
        self.app_host.as_deref().or(self.notebook_domain.as_deref())
    }
}

/// A running embedded mode; everything stops when it is dropped.
pub struct Running {
    /// The URL users open.
    pub url: String,
    pub registry: String,
    /// The first admin's name and password, when this start created them.
    pub created_admin: Option<(String, String)>,
    /// The self-signed certificate in use, when there is one.
    pub self_signed: Option<crate::self_signed::SelfSigned>,
    /// Where the metrics are served, when they are.
    pub metrics_url: Option<String>,
    pub store: Arc<Store>,
    pub runtime: Arc<Runtime>,
    pub proxy: RunningProxy,
    /// The parts that run as long as labforge does: the web app, the runtime, the watches.
    tasks: Supervised,
    /// The catalog's first pull, which ends when its images are there.
    prepull: tokio::task::JoinHandle<()>,
    data_dir: PathBuf,
    _registry: Option<Child>,
    _lock: InstanceLock,
}

impl Running {
    /// Waits until one of labforge's parts ends (none does while it runs), and says which and
    /// why; everything stops then, as `self` is dropped.
    pub async fn wait(&mut self) -> PartEnded {
        tokio::select! {
            ended = self.tasks.first_ended() => ended,
            ended = self.proxy.wait() => ended,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // The supervised parts are aborted as their set is dropped.
        self.prepull.abort();
        // Stopped cleanly: nothing runs on the data dir any more.
        let _ = std::fs::remove_file(self.data_dir.join(RunningRecord::FILE));
    }
}

fn data_dir(path: &Path) -> Result<PathBuf, UpError> {
    std::fs::create_dir_all(path).map_err(|source| UpError::DataDir {
        path: path.to_owned(),
        source,
    })?;
    path.canonicalize().map_err(|source| UpError::DataDir {
        path: path.to_owned(),
        source,
    })
}

/// Held while `labforge up` runs: one instance per data dir, because two would serve the same
/// store and reconcile the same containers against each other. The kernel drops the lock when the
/// process ends, however it ends; the file says who holds it, for the second start's message.
struct InstanceLock {
    file: std::fs::File,
}

impl InstanceLock {
    const FILE: &str = "labforge.lock";

    fn acquire(dir: &Path) -> Result<Self, UpError> {
        let path = dir.join(Self::FILE);
        let data_dir_error = |source| UpError::DataDir {
            path: path.clone(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(data_dir_error)?;
        // `labforge status` holds the lock shared for a moment to see whether it is taken.
        let mut attempt = 0;
        let taken = loop {
            match file.try_lock() {
                Err(std::fs::TryLockError::WouldBlock) if attempt < 10 => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                taken => break taken,
            }
        };
        match taken {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                let holder = holder.trim();
                return Err(UpError::AlreadyRunning {
                    data_dir: dir.to_owned(),
                    holder: if holder.is_empty() {
                        "starting".into()
                    } else {
                        holder.into()
                    },
                });
            }
            Err(std::fs::TryLockError::Error(source)) => return Err(data_dir_error(source)),
        }
        let lock = Self { file };
        lock.record("starting").map_err(data_dir_error)?;
        Ok(lock)
    }

    /// Writes "pid N, <what>" over the file's contents.
    fn record(&self, what: &str) -> std::io::Result<()> {
        use std::io::{Seek, Write};
        let mut file = &self.file;
        file.set_len(0)?;
        file.seek(std::io::SeekFrom::Start(0))?;
        write!(file, "pid {}, {what}", std::process::id())
    }
}

/// What `labforge status` reads about the instance running on a data dir
/// (`<data dir>/running.json`, believed only while the instance lock is held).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunningRecord {
    pub pid: u32,
    pub url: String,
    /// `host:port` of the registry saves go to.
    pub registry: String,
    /// Whether labforge started that registry itself (its blobs are in the data dir).
    pub local_registry: bool,
    pub engine: PathBuf,
    pub started: jiff::Timestamp,
}

impl RunningRecord {
    const FILE: &str = "running.json";

    fn write(&self, dir: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self)?;
        crate::data_dir::write_replacing(&dir.join(Self::FILE), &bytes, 0o644)
    }

    /// The instance running on `dir` now, if one is: the lock is held and it said who it is.
    pub fn of_running(dir: &Path) -> Option<Self> {
        let lock = std::fs::File::open(dir.join(InstanceLock::FILE)).ok()?;
        match lock.try_lock_shared() {
            // Nobody holds it: nothing runs there (and a record left is from an earlier run).
            Ok(()) => None,
            Err(std::fs::TryLockError::WouldBlock) => {
                let bytes = std::fs::read(dir.join(Self::FILE)).ok()?;
                serde_json::from_slice(&bytes).ok()
            }
            Err(std::fs::TryLockError::Error(_)) => None,
        }
    }
}

/// The engine's path: as given when it names a file, else found on PATH.
fn which_engine(engine: &Path) -> Option<PathBuf> {
    if engine.components().count() > 1 {
        return engine.is_file().then(|| engine.to_owned());
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(engine))
            .find(|candidate| candidate.is_file())
    })
}

/// Starts Debian's `docker-registry` with its data under `dir`, and waits until it answers.
async fn start_registry(program: &Path, dir: &Path, listen: SocketAddr) -> Result<Child, UpError> {
    let failed = |detail: String| UpError::Registry {
        program: program.display().to_string(),
        detail,
    };
    let storage = dir.join("registry");
    std::fs::create_dir_all(&storage).map_err(|e| failed(e.to_string()))?;
    let config = dir.join("registry.yml");
    let yaml = format!(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {listen}\n",
        storage.display()
    );
    std::fs::write(&config, yaml).map_err(|e| failed(e.to_string()))?;
    let log = std::fs::File::create(dir.join("registry.log")).map_err(|e| failed(e.to_string()))?;
    let mut child = Command::new(program)
        .arg("serve")
        .arg(&config)
        .stdout(log.try_clone().map_err(|e| failed(e.to_string()))?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    let http = reqwest::Client::new();
    for _ in 0..100 {
        if http
            .get(format!("http://{listen}/v2/"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default();
            return Err(failed(format!("exited with {status}: {}", log.trim())));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(failed(format!(
        "http://{listen}/v2/ did not answer within 10 s"
    )))
}

/// This data dir's instance id, made at its first start.
fn instance_id(dir: &Path) -> Result<String, UpError> {
    let path = dir.join("instance-id");
    let failed = |source| UpError::DataDir {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(failed(e)),
    }
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| failed(std::io::Error::other(e.to_string())))?;
    let id = hex::encode(bytes);
    std::fs::write(&path, &id).map_err(failed)?;
    Ok(id)
}

/// The names a self-signed certificate covers: the notebook domain and every notebook's host
/// below it, the web app's host (`app_host`, when it is another), `localhost`, and the listen
/// address when it is one address. Certificate checks refuse a wildcard with one label after it
/// (`*.localhost`), so the domain needs two.
pub fn certificate_names(
    notebook_domain: Option<&str>,
    app_host: Option<&str>,
    listen: SocketAddr,
) -> Result<Vec<String>, UpError> {
    let mut names = Vec::new();
    if let Some(domain) = notebook_domain {
        if !domain.contains('.') {
            return Err(UpError::WildcardTooWide {
                domain: domain.to_owned(),
            });
        }
        names.push(domain.to_owned());
        names.push(format!("*.{domain}"));
    }
    if let Some(host) = app_host
        && !names.iter().any(|name| name == host)
    {
        names.push(host.to_owned());
    }
    if !names.iter().any(|name| name == "localhost") {
        names.push("localhost".to_owned());
    }
    if !listen.ip().is_unspecified() {
        names.push(listen.ip().to_string());
    }
    Ok(names)
}

/// Refuses plain HTTP where notebooks' pages could plant the web app's session cookie: a
/// notebook domain or web app host off `localhost`, where browsers keep `__Host-` cookies only
/// over TLS. `localhost` itself is not a site notebooks share (browsers let no host set a
/// cookie for it), and its subdomains are secure contexts.
pub fn check_notebook_site(
    notebook_domain: Option<&str>,
    app_host: Option<&str>,
    tls: bool,
) -> Result<(), UpError> {
    if tls {
        return Ok(());
    }
    match [notebook_domain, app_host]
        .into_iter()
        .flatten()
        .find(|host| !labforge_web::users::is_localhost(host))
    {
        Some(host) => Err(UpError::PlainHttpSharedSite {
            domain: host.to_owned(),
        }),
        None => Ok(()),
    }
}

/// Starts everything; returns once the URL answers.
pub async fn start(mut options: UpOptions) -> Result<Running, UpError> {
    let opened = open(&mut options).await?;
    // The web app listens on loopback only; users reach it through the proxy.
    let web_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(UpError::Web)?;
    let web_addr = web_listener.local_addr().map_err(UpError::Web)?;
    let proxy = labforge_proxy::start(
        proxy_options(
            &options,
            &opened.auth,
            &opened.builder_config,
            opened.tls.clone(),
            web_addr,
            &opened.notebook_sign_in,
            Arc::new(crate::ports::EnginePorts {
                store: opened.store.clone(),
                auth: opened.auth.clone(),
                workloads: EngineWorkloads {
                    engine: opened.engine.clone(),
                },
            }),
        ),
        RoutesFrom::Pushed,
    )
    .await?;
    proxy.routes.replace_all(Vec::new());
    // Made only once the address is ours: a start that fails before has no one to show the
    // password to.
    let created_admin = opened.auth.users.ensure_admin()?;
    if opened
        .auth
        .users
        .get(labforge_web::users::RESERVED_NAMESPACE)
        .is_some()
    {
        tracing::warn!(
            user = labforge_web::users::RESERVED_NAMESPACE,
            "a user has the name no user may have now: the local registry keeps the catalog's \
             images under it, where this user's saves go too; remove the user (labforge user remove)"
        );
    }
    // Sessions of users removed or reset by the CLI end, and their tunnels with them.
    let mut tasks = Supervised::default();
    tasks.spawn_unit("session watch", opened.auth.clone().watch_sessions());

    let saves = Arc::new(SaveJobs::new(
        opened.store.clone(),
        options.engine.clone(),
        opened.registry.clone(),
        opened.save_options,
        opened.spawner.defaults.keep_saved_images,
    ));
    let catalog: Vec<String> = opened
        .spawner
        .images
        .iter()
        .map(|entry| entry.image.clone())
        .collect();
    let preparing = Arc::new(ImagesBeingPrepared::new(catalog.clone()));
    let prepull = tokio::spawn(crate::runtime::prepull::pull_catalog(
        opened.engine.clone(),
        catalog,
        preparing.clone(),
    ));
    let runtime = Arc::new(
        Runtime::new(
            opened.engine.clone(),
            opened.store.clone(),
            proxy.routes.clone(),
            opened.builder_config,
            opened.agent_dir,
            opened.gpus,
            Some(saves.clone()),
            opened.secrets.clone(),
        )
        .with_concurrent_starts(
            options
                .concurrent_starts
                .unwrap_or_else(crate::runtime::default_concurrent_starts),
        )
        .with_images_being_prepared(preparing.clone()),
    );
    migrate_data_dir(&opened.dir, opened.found, &runtime, &opened.auth).await?;
    adopt_running(&runtime).await;
    let usage = Arc::new(UsageBoard::default());
    let metrics = match options.metrics_listen {
        Some(address) => Some(metrics_listener(address).await?),
        None => None,
    };
    let state = ApiState {
        backend: opened.store.clone(),
        access: opened.auth.clone(),
        local_users: Some(opened.auth.clone()),
        sign_in: Some(Arc::new(SignIn::for_this_machine()?)),
        saves: Some(saves.clone() as Arc<dyn Saves>),
        config: Arc::new(opened.spawner),
        workloads: Arc::new(EngineWorkloads {
            engine: opened.engine,
        }),
        activity: proxy.activity.clone(),
        secure_cookies: opened.tls.is_some(),
        notebook_links: notebook_links(&options, &opened.notebook_sign_in),
        image_check: Some(image_check(&options, opened.insecure)),
        usage: Some(usage.clone()),
        idle_after: options.culling.idle_time,
        base_path: Default::default(),
        saves_registry: Some(labforge_web::image_access::SavesRegistry::new(
            &opened.registry,
        )),
        preparing,
        audit: Arc::new(labforge_web::audit::AuditFiles::new(
            opened.dir.join(crate::data_dir::AUDIT_DIR),
        )),
    };
    let api = ui::app(state).layer(axum::middleware::map_response(ui::deny_framing));
    tasks.spawn_unit(
        "notebook sign-in sweep",
        end_grants_no_longer_allowed(
            opened.auth.clone(),
            opened.notebook_sign_in.clone(),
            opened.store.clone(),
        ),
    );
    tasks.spawn(
        "web app",
        async move { axum::serve(web_listener, api).await },
    );
    tasks.spawn_unit("notebook runtime", runtime.clone().run());
    tasks.spawn_unit(
        "resource sampling",
        sample_forever(runtime.clone(), usage.clone()),
    );
    let metrics_url = metrics.map(|(listener, url)| {
        tasks.spawn_unit("metrics server", serve_metrics(listener, usage));
        url
    });
    if options.culling.enabled {
        let activity = proxy.activity.clone();
        let culling = options.culling.clone();
        let platform = StoreCulling::new(opened.store.clone(), runtime.clone(), activity);
        tasks.spawn_unit("culler", cull_forever(platform, culling));
    }
    let url = announce(
        &options,
        &opened.dir,
        &opened.lock,
        &proxy,
        opened.tls.is_some(),
        &opened.registry,
        opened.registry_child.is_some(),
    );
    Ok(Running {
        url,
        registry: opened.registry,
        created_admin,
        self_signed: opened.self_signed,
        metrics_url,
        store: opened.store,
        runtime,
        proxy,
        tasks,
        prepull,
        data_dir: opened.dir.clone(),
        _registry: opened.registry_child,
        _lock: opened.lock,
    })
}

/// What `up` opens before it serves: the data dir and what it holds, the registry, the engine,
/// and the settings they give.
struct Opened {
    dir: PathBuf,
    found: crate::data_dir::Found,
    self_signed: Option<crate::self_signed::SelfSigned>,
    tls: Option<labforge_proxy::server::TlsFiles>,
    auth: Arc<LocalAuth>,
    store: Arc<Store>,
    secrets: Arc<NotebookSecrets>,
    /// The registry saves go to, and the local one's process when `up` runs it.
    registry: String,
    registry_child: Option<Child>,
    insecure: Vec<String>,
    agent_dir: Option<PathBuf>,
    spawner: SpawnerConfig,
    gpus: GpuPool,
    builder_config: BuilderConfig,
    notebook_sign_in: Arc<labforge_web::notebook_sign_in::NotebookSignIn>,
    engine: Engine,
    save_options: SaveOptions,
    /// Last: fields drop in order, and the data dir stays held until all else has gone.
    lock: InstanceLock,
}

/// Opens the data dir and everything `up` keeps there, and starts the local registry.
async fn open(options: &mut UpOptions) -> Result<Opened, UpError> {
    check_notebook_site(
        options.notebook_domain.as_deref(),
        options.app_host(),
        options.tls.is_some(),
    )?;
    let (dir, lock, found) = open_data_dir(options)?;
    let (self_signed, tls) = tls_files(options, &dir)?;
    let auth = Arc::new(LocalAuth::open(
        &dir,
        labforge_web::users::session_cookie_name(tls.is_some(), options.app_host()),
    )?);
    let store = Arc::new(Store::open(&dir.join("store"))?);
    let secrets = Arc::new(
        NotebookSecrets::open(&dir).map_err(|source| UpError::DataDir {
            path: dir.clone(),
            source,
        })?,
    );

    let (registry, registry_child) = match &options.registry {
        Some(registry) => (registry.clone(), None),
        None => (
            options.registry_listen.to_string(),
            Some(start_registry(&options.registry_program, &dir, options.registry_listen).await?),
        ),
    };
    let mut insecure = options.insecure_registries.clone();
    insecure.push(registry.clone());

    let agent_dir = match &options.agent {
        Some(agent) => Some(install_agent(agent, &dir)?),
        None => None,
    };
    let (spawner, gpus) = spawner_for_this_machine(options, &registry);

    let builder_config = BuilderConfig {
        notebook_domain: options.notebook_domain.clone(),
        ..BuilderConfig::default()
    };
    let notebook_sign_in = Arc::new(labforge_web::notebook_sign_in::NotebookSignIn::new(
        auth.clone(),
    ));
    let engine = Engine {
        program: options.engine.clone(),
        insecure_registries: insecure.clone(),
        instance: instance_id(&dir)?,
    };
    let save_options = save_options(options.cache.take(), &dir, &insecure)?;

    Ok(Opened {
        dir,
        found,
        self_signed,
        tls,
        auth,
        store,
        secrets,
        registry,
        registry_child,
        insecure,
        agent_dir,
        spawner,
        gpus,
        builder_config,
        notebook_sign_in,
        engine,
        save_options,
        lock,
    })
}

/// Every [`labforge_web::users::SESSION_CHECK_PERIOD`], ends the notebook sign-ins whose user may
/// no longer open that notebook (a member taken out or made `view` by the CLI, a share
/// revoked): the proxy refuses their next request anyway, and this closes their websockets.
async fn end_grants_no_longer_allowed(
    auth: Arc<LocalAuth>,
    sign_in: Arc<labforge_web::notebook_sign_in::NotebookSignIn>,
    store: Arc<Store>,
) {
    let mut every = tokio::time::interval(labforge_web::users::SESSION_CHECK_PERIOD);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        auth.end_grants_no_longer_allowed(&sign_in, |namespace, name| {
            store
                .get(namespace, name)
                .map(|nb| nb.shared_with().into_iter().map(String::from).collect())
                .unwrap_or_default()
        });
    }
}

/// Adopts the notebooks' containers still running from an earlier `up`.
async fn adopt_running(runtime: &Runtime) {
    match runtime.adopt().await {
        Ok(0) => {}
        Ok(adopted) => tracing::info!(adopted, "notebooks still running were adopted"),
        Err(err) => tracing::warn!(error = %err, "listing running notebooks"),
    }
}

/// Where notebooks are opened on hosts of their own (with `--notebook-domain`), and who signs
/// visitors in there.
fn notebook_links(
    options: &UpOptions,
    sign_in: &Arc<labforge_web::notebook_sign_in::NotebookSignIn>,
) -> Option<labforge_web::notebook_sign_in::NotebookLinks> {
    options
        .notebook_domain
        .as_ref()
        .map(|domain| labforge_web::notebook_sign_in::NotebookLinks {
            domain: domain.clone(),
            sign_in: Some(sign_in.clone()),
        })
}

/// How a new notebook's image is checked before it is stored: among the engine's own images,
/// then in its registry (the insecure ones over plain HTTP).
fn image_check(
    options: &UpOptions,
    insecure: Vec<String>,
) -> Arc<labforge_web::image_check::RegistryImageCheck> {
    Arc::new(labforge_web::image_check::RegistryImageCheck {
        options: RegistryOptions {
            insecure,
            ..RegistryOptions::default()
        },
        engine: Some(options.engine.clone()),
    })
}

/// The data dir, held for this instance, and the format it was found in. The engine is checked
/// first: without it no notebook could ever start, and every reconcile would say so again.
fn open_data_dir(
    options: &UpOptions,
) -> Result<(PathBuf, InstanceLock, crate::data_dir::Found), UpError> {
    if which_engine(&options.engine).is_none() {
        return Err(UpError::EngineMissing {
            program: options.engine.display().to_string(),
        });
    }
    let dir = data_dir(&options.data_dir)?;
    let lock = InstanceLock::acquire(&dir)?;
    // Before anything reads or writes the data: a newer labforge's data is refused untouched.
    let found = crate::data_dir::check_format(&dir)?;
    // What an earlier run that did not stop cleanly left; this one writes its own once it serves.
    let _ = std::fs::remove_file(dir.join(RunningRecord::FILE));
    Ok((dir, lock, found))
}

/// The URL `up` serves at, written where `labforge status` and a second `up` read it.
fn announce(
    options: &UpOptions,
    dir: &Path,
    lock: &InstanceLock,
    proxy: &RunningProxy,
    tls: bool,
    registry: &str,
    local_registry: bool,
) -> String {
    let scheme = if tls { "https" } else { "http" };
    let url = match options.app_host() {
        Some(host) => format!("{scheme}://{host}:{}/", proxy.addr.port()),
        None => format!("{scheme}://{}/", proxy.addr),
    };
    if let Err(err) = lock.record(&url) {
        tracing::warn!(error = %labforge_messages::error_chain(&err), "cannot write the instance's URL into the data dir's lock file");
    }
    let record = RunningRecord {
        pid: std::process::id(),
        url: url.clone(),
        registry: registry.to_owned(),
        local_registry,
        engine: options.engine.clone(),
        started: jiff::Timestamp::now(),
    };
    if let Err(err) = record.write(dir) {
        tracing::warn!(error = %labforge_messages::error_chain(&err), "cannot record the running instance for labforge status");
    }
    url
}

/// The certificate the proxy serves, if any: the admin's files, or one made and kept in the data
/// dir (returned too, so that `up` can say where it is). Read now, so that a wrong path stops the
/// start before anything else is set up.
fn tls_files(
    options: &UpOptions,
    dir: &Path,
) -> Result<
    (
        Option<crate::self_signed::SelfSigned>,
        Option<labforge_proxy::server::TlsFiles>,
    ),
    UpError,
> {
    let self_signed = match options.tls {
        Some(TlsSource::SelfSigned) => Some(crate::self_signed::ensure(
            &dir.join("tls"),
            &certificate_names(
                options.notebook_domain.as_deref(),
                options.app_host(),
                options.listen,
            )?,
            jiff::Timestamp::now(),
        )?),
        _ => None,
    };
    let tls = match (&options.tls, &self_signed) {
        (Some(TlsSource::Files(files)), _) => Some(files.clone()),
        (_, Some(made)) => Some(made.files.clone()),
        _ => None,
    };
    if let Some(files) = &tls {
        labforge_proxy::server::tls_acceptor(files)?;
    }
    Ok((self_signed, tls))
}

/// Copies the agent into a directory of its own in the data dir: that directory is what
/// notebooks mount. Returns the directory.
fn install_agent(agent: &Path, dir: &Path) -> Result<PathBuf, UpError> {
    let target_dir = dir.join("agent");
    let target = target_dir.join("labforge-agent");
    let copy = || -> std::io::Result<()> {
        std::fs::create_dir_all(&target_dir)?;
        let temporary = target_dir.join(".labforge-agent.tmp");
        std::fs::copy(agent, &temporary)?;
        std::fs::rename(&temporary, &target)
    };
    copy().map_err(|source| UpError::Agent {
        path: agent.to_owned(),
        source,
    })?;
    Ok(target_dir)
}

/// The spawner's options as this machine can honour them, and its GPUs: only vendors with devices
/// here are offered, and no more GPUs than it has (more would wait forever).
fn spawner_for_this_machine(options: &UpOptions, registry: &str) -> (SpawnerConfig, GpuPool) {
    let mut spawner = options
        .spawner
        .clone()
        .unwrap_or_else(|| default_spawner(registry));
    let gpus = GpuPool::discover(&spawner.gpu_vendors, &options.cdi_dirs);
    let available = gpus.available_vendors();
    spawner
        .gpu_vendors
        .retain(|v| available.contains(&v.limits_key));
    spawner.defaults.max_gpus = spawner.defaults.max_gpus.min(gpus.most_devices());
    (spawner, gpus)
}

/// How saves run here: zstd, the local registry (and the admin's insecure ones), blobs cached in
/// `cache` or the data dir, scratch space in the data dir (made now).
fn save_options(
    cache: Option<BlobCache>,
    dir: &Path,
    insecure: &[String],
) -> Result<SaveOptions, UpError> {
    let options = SaveOptions {
        compression: Compression::Zstd { level: 3 },
        registry: RegistryOptions {
            insecure: insecure.to_vec(),
            credentials: None,
            trusted_token_realms: Vec::new(),
            stall_timeout: None,
        },
        cache: Some(cache.unwrap_or_else(|| BlobCache::Dir(dir.join("cache")))),
        runtime: RuntimeConfig::default(),
        scratch_dir: dir.join("scratch"),
        created_by: "labforge save (web)".into(),
        // A save with nothing to keep makes no image: the notebook's own is that already.
        push_unchanged: false,
    };
    std::fs::create_dir_all(&options.scratch_dir).map_err(|source| UpError::DataDir {
        path: options.scratch_dir.clone(),
        source,
    })?;
    Ok(options)
}

/// The proxy of `up`: the one entry point, on `options.listen`, with the web app (at `web_addr`)
/// behind every path that is no notebook's, and the local users as identity and access.
fn proxy_options(
    options: &UpOptions,
    auth: &Arc<LocalAuth>,
    builder_config: &BuilderConfig,
    tls: Option<labforge_proxy::server::TlsFiles>,
    web_addr: SocketAddr,
    notebook_sign_in: &Arc<labforge_web::notebook_sign_in::NotebookSignIn>,
    ports: Arc<dyn labforge_proxy::ports::NotebookPorts>,
) -> ProxyOptions {
    ProxyOptions {
        listen: options.listen,
        admin: SocketAddr::from(([127, 0, 0, 1], 0)),
        gateway: GatewayFilter(Some(builder_config.gateway.clone())),
        identity: auth.clone(),
        access: auth.clone(),
        tls,
        upstream_addresses: Default::default(),
        threads: 0,
        upstream_idle_timeout: labforge_proxy::upstream::DEFAULT_IDLE_TIMEOUT,
        upstream_connect_timeout: labforge_proxy::upstream::DEFAULT_CONNECT_TIMEOUT,
        request_head_timeout: labforge_proxy::server::DEFAULT_REQUEST_HEAD_TIMEOUT,
        fallback: Some(web_addr.to_string()),
        // Every route is the runtime's own (`RouteStore::upsert`), trusted.
        confinement: Default::default(),
        visitor_cookies: labforge_proxy::forward::DEFAULT_VISITOR_COOKIES
            .map(String::from)
            .into(),
        max_connections: labforge_proxy::server::DEFAULT_MAX_CONNECTIONS as usize,
        body_pace: Default::default(),
        // Each notebook on a host below the domain; the web app on its own host.
        notebook_hosts: options
            .notebook_domain
            .as_ref()
            .map(|domain| NotebookHosts {
                domain: domain.clone(),
                app_host: options.app_host().unwrap_or(domain).to_owned(),
                sign_in: Some(notebook_sign_in.clone()),
                ports: Some(ports),
            }),
        app_path: Some("/".into()),
        heap_release: true,
    }
}

/// Brings an older data dir to the current format, and records it once everything moved.
async fn migrate_data_dir(
    dir: &Path,
    found: crate::data_dir::Found,
    runtime: &Runtime,
    auth: &LocalAuth,
) -> Result<(), UpError> {
    if let crate::data_dir::Found::Older(format) = found {
        tracing::info!(
            from = format,
            to = crate::data_dir::FORMAT,
            "migrating the data dir"
        );
    }
    // Format 1: workspace volumes under their injective names. Until every one is, the format
    // stays older, and the next start tries again.
    let mut migrated = true;
    if found == crate::data_dir::Found::Older(0) {
        let namespaces = auth.users.list().into_iter().map(|u| u.namespace);
        let volumes = runtime.migrate_legacy_volumes(dir, namespaces).await;
        if volumes.copied > 0 {
            tracing::info!(
                copied = volumes.copied,
                "workspace volumes moved to their new names"
            );
        }
        if volumes.left > 0 {
            tracing::warn!(
                left = volumes.left,
                "workspace volumes left under their old names; the data dir stays at format 0 and the next start tries again"
            );
            migrated = false;
        }
    }
    if found != crate::data_dir::Found::Current && migrated {
        crate::data_dir::record_format(dir)?;
    }
    Ok(())
}

/// A listener for the metrics endpoint on `address`, and the URL it answers at.
async fn metrics_listener(
    address: SocketAddr,
) -> Result<(tokio::net::TcpListener, String), UpError> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| UpError::Metrics { address, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| UpError::Metrics { address, source })?;
    Ok((listener, format!("http://{bound}/metrics")))
}
