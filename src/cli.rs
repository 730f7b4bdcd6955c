//! Command-line arguments (clap structs that only parse) and their conversion into library options.

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::HumanBytes;
use indicatif::{ProgressBar, ProgressStyle};
use labforge_builder::cache::{BlobCache, S3Cache, S3CacheConfig};
use labforge_builder::image::RuntimeConfig;
use labforge_builder::layer::Compression;
use labforge_builder::registry::RegistryOptions;
use labforge_builder::save::{CacheOutcome, SaveOptions, SaveProgress, save};
use labforge_builder::source::ChangeSource;
use labforge_builder::stall::DEFAULT_STALL_TIMEOUT;
use labforge_notebook_controller::BuilderConfig;
use labforge_notebook_controller::culler::CullingConfig;
use labforge_notebook_controller::service::{LeaderElection, ServeOptions, serve};
use labforge_proxy::authz::{StaticAccess, TrustedHeader};
use labforge_proxy::review::{ReviewCache, ReviewedAccess};
use labforge_proxy::routes::{Confinement, GatewayFilter};
use labforge_proxy::server::TlsFiles;
use labforge_proxy::{ProxyOptions, RoutesFrom};
use labforge_snapshot::ScanOptions;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// Exit code for bad configuration (sysexits' EX_USAGE), used before any work starts.
pub const EXIT_USAGE: u8 = 64;

/// Bad configuration, found before any work started; the binary exits with [`EXIT_USAGE`].
#[derive(Debug)]
pub struct UsageError(anyhow::Error);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for UsageError {}

#[derive(Debug, Parser)]
#[command(
    name = "labforge",
    version,
    about = "Notebook and online dev-environment manager"
)]
pub struct Cli {
    /// Log lines of what this filter keeps (tracing EnvFilter syntax), e.g. `info` or
    /// `labforge_builder=debug`. Without it, a command says only its warnings and errors, as
    /// `warning: …` lines; the services (`controller`, `proxy`, `web`, `image-builds`) log at
    /// `warn`.
    #[arg(long, global = true, env = "LABFORGE_LOG")]
    pub log: Option<String>,
    /// Milliseconds an idle thread of the async runtime's blocking pool is kept (tokio's
    /// default is 10 s). The memory soak shortens it so that every sign-in meets a fresh pool.
    #[arg(
        long,
        global = true,
        hide = true,
        env = "LABFORGE_BLOCKING_THREAD_KEEP_ALIVE_MS"
    )]
    pub blocking_thread_keep_alive_ms: Option<u64>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build images without a container daemon.
    #[command(subcommand)]
    Build(BuildCommand),
    /// Print the objects the controller creates for Notebook CRs (a dry run, nothing is applied).
    Render(RenderArgs),
    /// Print the CustomResourceDefinitions labforge serves (Notebook, ImageBuild) as YAML.
    Crds,
    /// Run the Kubernetes notebook controller (kubeconfig or in-cluster credentials).
    ///
    /// Reads Kubeflow's environment: ISTIO_GATEWAY, ISTIO_HOST, CLUSTER_DOMAIN, USE_ISTIO,
    /// ADD_FSGROUP, ENABLE_CULLING, CULL_IDLE_TIME, IDLENESS_CHECK_PERIOD; and LABFORGE_AGENT_IMAGE,
    /// the save agent's image an init container copies into each notebook pod;
    /// LABFORGE_NETWORK_POLICY_FROM, the namespaces each notebook's NetworkPolicy admits
    /// (LABFORGE_NETWORK_POLICY=false: none); LABFORGE_NOTEBOOK_DOMAIN, a host per notebook;
    /// LABFORGE_NOTEBOOK_SECRET_KEY, the key per-notebook secrets are derived from.
    Controller(ControllerArgs),
    /// Run the notebook proxy: routes from Istio VirtualServices (a Kubernetes watch, or
    /// --routes-file), every request authenticated and authorized per notebook.
    Proxy(ProxyArgs),
    /// Run everything on this machine (web app, proxy, notebooks in podman, saves, a local
    /// registry); prints the URL and, on first start, the admin's password.
    ///
    /// Reads Kubeflow's culling environment: ENABLE_CULLING, CULL_IDLE_TIME, IDLENESS_CHECK_PERIOD.
    Up(UpArgs),
    /// Run the web app (API and pages) in a cluster: Notebook CRs through the Kubernetes API, users
    /// from the auth proxy's header, access by SubjectAccessReview.
    Web(WebArgs),
    /// Manage the embedded mode's local users (the data dir `labforge up` uses).
    #[command(subcommand)]
    User(UserCommand),
    /// Run the ImageBuild reconciler in a cluster: saves running notebooks' environments as
    /// images (the agent through pods/exec; registry and cache credentials stay here).
    ImageBuilds(ImageBuildsArgs),
    /// Run `labforge up` as this machine's service.
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Back up the embedded mode to DEST (a directory or s3://bucket/prefix), whether labforge
    /// runs or not: users, notebooks, records and keys, the local registry's images (saved
    /// environments included) and every notebook volume. Each backup is a dated snapshot that
    /// stores only what the destination lacks. `labforge backup list DEST` lists them.
    Backup(BackupArgs),
    /// The embedded mode at a glance: whether it runs (pid, URL, registry), users, notebooks by
    /// state, saved images, disk use of the data dir and of the container engine's storage.
    Status {
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: PathBuf,
        /// The engine to ask when labforge is not running (a running one names its own).
        #[arg(long, default_value = "podman")]
        engine: PathBuf,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Restore a snapshot of DEST (the newest unless --snapshot) into a data dir that holds no
    /// labforge data yet, and its volumes into the engine; then `labforge up` starts every
    /// notebook on it.
    Restore(RestoreArgs),
    /// The embedded mode's audit trail: every change and notebook sign-in (when, who, from where,
    /// what, on which object, the result), oldest first.
    Audit(AuditArgs),
    /// Namespaces of the embedded mode.
    #[command(subcommand)]
    Namespace(NamespaceCommand),
    /// Sign in to a labforge server and keep an API token for this CLI
    /// (`~/.config/labforge/credentials.json`, mode 0600); LABFORGE_URL and LABFORGE_TOKEN take
    /// its place when set.
    Login(LoginArgs),
    /// Revoke and forget the token `labforge login` kept.
    Logout,
    /// SSH into a notebook: a shell, or COMMAND (its exit code is this command's). With --stdio,
    /// the SSH connection itself on stdin and stdout, as OpenSSH's ProxyCommand.
    Ssh(SshArgs),
    /// Write ~/.ssh/config entries for the notebooks you may open (`ssh NAME.NAMESPACE.labforge`,
    /// scp, rsync, ssh -L, VS Code Remote-SSH), reached through `labforge ssh --stdio`.
    ConfigSsh(ConfigSshArgs),
}

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The web app's address, e.g. http://localhost:8080.
    pub url: String,
    /// Sign in as this user (asked when not given).
    #[arg(long)]
    pub user: Option<String>,
    /// Read the password from the first line of stdin.
    #[arg(long)]
    pub password_stdin: bool,
    /// Keep this token (made on the web app's Tokens page) rather than sign in with a password.
    #[arg(long)]
    pub token: Option<String>,
    /// How long the token made for this CLI lasts: 90m, 12h, 30d (up to 366d).
    #[arg(long, default_value = "30d")]
    pub expires_in: String,
}

#[derive(Debug, Args)]
pub struct SshArgs {
    /// Carry the SSH connection on stdin and stdout (OpenSSH's ProxyCommand).
    #[arg(long)]
    pub stdio: bool,
    /// The notebook: NAMESPACE/NAME, or NAME.NAMESPACE.labforge.
    pub notebook: String,
    /// The command to run, after `--`; a shell when none.
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ConfigSshArgs {
    /// The OpenSSH config file to write the entries into.
    #[arg(long, default_value = None)]
    pub ssh_config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum NamespaceCommand {
    /// Show or set what a namespace's running notebooks may hold at once; a running labforge
    /// applies it at the next create or start. Without limits, shows the quota.
    Quota(QuotaArgs),
    /// Add a team namespace owned by a user, who manages its members.
    Add {
        name: String,
        /// The user who owns it.
        #[arg(long)]
        owner: String,
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: PathBuf,
    },
    /// List every namespace with its owner and members.
    List {
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: PathBuf,
    },
    /// Add or remove a namespace's members; a running labforge applies it at once.
    #[command(subcommand)]
    Member(MemberCommand),
}

#[derive(Debug, Subcommand)]
pub enum MemberCommand {
    /// Let a user into a namespace: `edit` creates, starts, stops, deletes, saves and opens its
    /// notebooks; `view` lists them, their status, events and logs, and opens nothing.
    Add {
        namespace: String,
        user: String,
        #[arg(long, value_parser = ["edit", "view"])]
        role: String,
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: PathBuf,
    },
    /// Take a user out of a namespace.
    Remove {
        namespace: String,
        user: String,
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct QuotaArgs {
    /// The namespace (a user's is named after them).
    pub namespace: String,
    #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
    pub data_dir: PathBuf,
    /// CPU cores, e.g. 4 or 500m.
    #[arg(long)]
    pub cpu: Option<String>,
    /// Memory, e.g. 16Gi.
    #[arg(long)]
    pub memory: Option<String>,
    #[arg(long)]
    pub gpus: Option<u32>,
    /// Notebooks running at once.
    #[arg(long)]
    pub notebooks: Option<u32>,
    /// Workspace and data volumes together, e.g. 100Gi: counted by the size each was made
    /// with, deleted notebooks' kept volumes included.
    #[arg(long)]
    pub storage: Option<String>,
    /// Remove the quota: the namespace's notebooks are limited only by the catalog.
    #[arg(long, conflicts_with_all = ["cpu", "memory", "gpus", "notebooks", "storage"])]
    pub clear: bool,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
    pub data_dir: PathBuf,
    /// Only what this user did (or tried to sign in as).
    #[arg(long)]
    pub user: Option<String>,
    /// Only what was done in this namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only since this time: RFC 3339 (2026-01-31T09:00:00Z) or a span back from now (90m, 2h,
    /// 7d).
    #[arg(long)]
    pub since: Option<String>,
    /// At most the newest N records.
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    /// One JSON object per line, as stored.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BackupArgs {
    #[command(subcommand)]
    pub command: Option<BackupCommand>,
    /// Where snapshots go: a directory, or s3://bucket/prefix (credentials from
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY).
    #[arg(required = true)]
    pub dest: Option<String>,
    /// Keep the newest N snapshots (this one included) and remove the others.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub keep: Option<u64>,
    #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
    pub data_dir: PathBuf,
    /// The engine holding the volumes when labforge is not running (a running one names its own).
    #[arg(long, default_value = "podman")]
    pub engine: PathBuf,
    #[command(flatten)]
    pub s3: BackupS3Args,
    /// Print no progress.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Debug, Subcommand)]
pub enum BackupCommand {
    /// The snapshots DEST holds, oldest first.
    List {
        dest: String,
        #[command(flatten)]
        s3: BackupS3Args,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct BackupS3Args {
    /// S3 endpoint URL (an S3-compatible server); AWS when absent.
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    pub s3_endpoint: Option<String>,
    /// S3 region.
    #[arg(long, env = "AWS_REGION", default_value = "us-east-1")]
    pub s3_region: String,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The backup: a directory or s3://bucket/prefix.
    pub dest: String,
    /// The snapshot to restore (an id of `labforge backup list`); the newest by default.
    #[arg(long)]
    pub snapshot: Option<String>,
    #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
    pub data_dir: PathBuf,
    /// The engine the volumes are made in.
    #[arg(long, default_value = "podman")]
    pub engine: PathBuf,
    /// Leave the volumes the engine still has as they are (this machine lost its data dir
    /// alone); without it, a volume that is there refuses the restore.
    #[arg(long)]
    pub keep_existing_volumes: bool,
    #[command(flatten)]
    pub s3: BackupS3Args,
}

#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// Write a systemd unit that runs `labforge up` with these arguments (restarted on failure;
    /// stopping it leaves notebooks running), then say how to start it.
    Install(ServiceInstallArgs),
}

#[derive(Debug, Args)]
pub struct ServiceInstallArgs {
    /// Where the unit file is written.
    #[arg(long, default_value = "/etc/systemd/system")]
    pub unit_dir: PathBuf,
    /// The unit's name (`<name>.service`).
    #[arg(long, default_value = "labforge", value_parser = unit_name)]
    pub name: String,
    /// Also back up on a schedule to this destination (a directory or s3://bucket/prefix):
    /// writes `<name>-backup.service` and `<name>-backup.timer`.
    #[arg(long, value_name = "DEST")]
    pub backup_to: Option<String>,
    /// Snapshots the scheduled backups keep.
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u64).range(1..))]
    pub backup_keep: u64,
    /// When scheduled backups run: systemd's OnCalendar= (`daily`, `*-*-* 03:00`).
    #[arg(long, default_value = "daily", value_parser = calendar)]
    pub backup_on: String,
    /// Where the scheduled backups read S3 credentials from (AWS_ACCESS_KEY_ID=…).
    #[arg(long, default_value = "/etc/labforge/backup.env")]
    pub backup_environment_file: PathBuf,
    #[command(flatten)]
    pub up: UpArgs,
}

/// `--backup-on`: one line of systemd calendar text.
fn calendar(value: &str) -> Result<String, String> {
    if value.trim().is_empty() || value.chars().any(char::is_control) {
        Err("a systemd calendar expression on one line, e.g. daily or \"*-*-* 03:00\"".into())
    } else {
        Ok(value.trim().to_owned())
    }
}

/// `--name`: what systemd accepts as a unit name, without its suffix.
fn unit_name(value: &str) -> Result<String, String> {
    let ok = !value.is_empty()
        && value.len() <= 200
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b));
    if ok {
        Ok(value.to_owned())
    } else {
        Err("letters, digits and -_.@ only".into())
    }
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Where users, notebooks, the registry's blobs and the cache are kept.
    #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
    pub data_dir: std::path::PathBuf,
    /// The one address users connect to (web app and notebooks).
    #[arg(long, env = "LABFORGE_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,
    /// Container engine: podman or docker.
    #[arg(long, default_value = "podman")]
    pub engine: std::path::PathBuf,
    /// Use this registry (`host:port`) instead of starting a local one.
    #[arg(long)]
    pub registry: Option<String>,
    /// Where the local registry listens.
    #[arg(
        long,
        env = "LABFORGE_REGISTRY_LISTEN",
        default_value = "127.0.0.1:5000"
    )]
    pub registry_listen: std::net::SocketAddr,
    /// The registry program (Debian's docker-registry).
    #[arg(long, default_value = "docker-registry")]
    pub registry_program: std::path::PathBuf,
    /// Registries spoken to over plain HTTP, besides the local one (repeatable).
    #[arg(long = "insecure-registry")]
    pub insecure_registries: Vec<String>,
    /// The static save agent (`make agent`); default: `../agent/labforge-agent` next to this binary.
    #[arg(long, env = "LABFORGE_AGENT")]
    pub agent: Option<std::path::PathBuf>,
    /// Spawner configuration (image catalog, GPU vendors, defaults): labforge's (JSON or YAML),
    /// or Kubeflow's `spawner_ui_config.yaml`.
    #[arg(long)]
    pub spawner_config: Option<std::path::PathBuf>,
    /// The web app's host; each notebook gets its own below it, `<name>--<namespace>.<domain>`,
    /// so a page a notebook serves cannot act as its visitor. Browsers resolve `*.localhost` to
    /// this machine by themselves.
    #[arg(long, env = "LABFORGE_NOTEBOOK_DOMAIN", default_value = "localhost")]
    pub notebook_domain: String,
    /// The web app's host, when not the notebook domain itself: one of another site (another
    /// registrable domain, e.g. lab.example.com with --notebook-domain
    /// notebooks.example-lab.net), so that no notebook's page shares a site with the web app
    /// (SECURITY.md). The same port serves both.
    #[arg(long, env = "LABFORGE_APP_HOST", conflicts_with = "notebook_paths")]
    pub app_host: Option<String>,
    /// Serve notebooks on the web app's host under `/notebook/<ns>/<name>/`, as Kubeflow does,
    /// instead of on hosts of their own: a notebook's pages can then act as whoever opens them
    /// (see SECURITY.md).
    #[arg(long)]
    pub notebook_paths: bool,
    /// TLS certificate chain (PEM) for the listen address, covering the notebook domain and its
    /// `*.` wildcard; needs --tls-key. Plain HTTP to the address is redirected to HTTPS.
    #[arg(long, env = "LABFORGE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM); needs --tls-cert.
    #[arg(long, env = "LABFORGE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve HTTPS with a certificate labforge makes and keeps in the data dir; its fingerprint
    /// is printed at start, for users to compare with what their browser shows.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    pub tls_self_signed: bool,
    /// Serve Prometheus metrics (each running notebook's CPU and memory use) at
    /// `http://<address>/metrics`; none when absent. Anyone who reaches it sees every
    /// notebook's name: keep it on loopback or a monitoring network.
    #[arg(long, env = "LABFORGE_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// How many notebooks start at once; the others wait in line, in order, and say their
    /// place ("starting: 4th in line"). Default: twice the machine's cores.
    #[arg(long, env = "LABFORGE_CONCURRENT_STARTS", value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrent_starts: Option<u16>,
}

impl UpArgs {
    /// The arguments that start `labforge up` as these, with every path made absolute (a service
    /// starts in `/`) and the default agent found now, as this binary sees it.
    fn service_args(&self) -> anyhow::Result<Vec<String>> {
        let absolute = |path: &std::path::Path| -> anyhow::Result<String> {
            Ok(std::path::absolute(path)
                .with_context(|| format!("{}", path.display()))?
                .display()
                .to_string())
        };
        // A bare program name is looked up on the service's PATH, as here on the shell's.
        let program = |path: &std::path::Path| -> anyhow::Result<String> {
            if path.components().count() > 1 {
                absolute(path)
            } else {
                Ok(path.display().to_string())
            }
        };
        let mut args = vec![
            "--data-dir".to_owned(),
            absolute(&self.data_dir)?,
            "--listen".to_owned(),
            self.listen.to_string(),
            "--engine".to_owned(),
            program(&self.engine)?,
            "--registry-listen".to_owned(),
            self.registry_listen.to_string(),
            "--registry-program".to_owned(),
            program(&self.registry_program)?,
            "--notebook-domain".to_owned(),
            self.notebook_domain.clone(),
        ];
        if let Some(host) = &self.app_host {
            args.extend(["--app-host".to_owned(), host.clone()]);
        }
        if let Some(registry) = &self.registry {
            args.extend(["--registry".to_owned(), registry.clone()]);
        }
        for registry in &self.insecure_registries {
            args.extend(["--insecure-registry".to_owned(), registry.clone()]);
        }
        if let Some(agent) = self.agent.clone().or_else(default_agent) {
            args.extend(["--agent".to_owned(), absolute(&agent)?]);
        }
        if let Some(config) = &self.spawner_config {
            args.extend(["--spawner-config".to_owned(), absolute(config)?]);
        }
        if self.notebook_paths {
            args.push("--notebook-paths".to_owned());
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            args.extend([
                "--tls-cert".to_owned(),
                absolute(cert)?,
                "--tls-key".to_owned(),
                absolute(key)?,
            ]);
        }
        if self.tls_self_signed {
            args.push("--tls-self-signed".to_owned());
        }
        if let Some(metrics) = self.metrics_listen {
            args.extend(["--metrics-listen".to_owned(), metrics.to_string()]);
        }
        if let Some(starts) = self.concurrent_starts {
            args.extend(["--concurrent-starts".to_owned(), starts.to_string()]);
        }
        Ok(args)
    }

    fn tls(&self) -> Option<labforge_embedded::up::TlsSource> {
        use labforge_embedded::up::TlsSource;
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsSource::Files(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            })),
            _ => self.tls_self_signed.then_some(TlsSource::SelfSigned),
        }
    }
}

#[derive(Debug, Args)]
pub struct WebArgs {
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: std::net::SocketAddr,
    /// Header carrying the authenticated user, set by the auth proxy in front.
    #[arg(long, env = "USERID_HEADER", default_value = "kubeflow-userid")]
    pub user_header: String,
    /// Prefix to strip from the header's value (e.g. `accounts.google.com:`).
    #[arg(long, env = "USERID_PREFIX", default_value = "")]
    pub user_prefix: String,
    /// Spawner configuration (image catalog, GPU vendors, defaults): labforge's (JSON or YAML),
    /// or Kubeflow's `spawner_ui_config.yaml`.
    #[arg(long)]
    pub spawner_config: Option<std::path::PathBuf>,
    /// Registry (`host[:port][/path]`) saved environments are pushed to, as
    /// `<registry>/<namespace>/<notebook>:<tag>`, by the ImageBuild reconciler; without it the
    /// web app offers no saving.
    #[arg(long, env = "LABFORGE_SAVE_REGISTRY")]
    pub save_registry: Option<String>,
    /// Notebooks are served on their own hosts below this domain (the proxy's and the
    /// controller's `LABFORGE_NOTEBOOK_DOMAIN`): the UI links there.
    #[arg(long, env = "LABFORGE_NOTEBOOK_DOMAIN")]
    pub notebook_domain: Option<String>,
    /// Serve the app under this path (`/jupyter/` under Kubeflow's central dashboard): pages,
    /// API, assets and redirects.
    #[arg(long, env = "LABFORGE_BASE_PATH", default_value = "/", value_parser = base_path)]
    pub base_path: labforge_web::base_path::BasePath,
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Add a user (their namespace has their name); prints the generated password once.
    Add {
        name: String,
        #[arg(long)]
        admin: bool,
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: std::path::PathBuf,
    },
    /// List users.
    List {
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: std::path::PathBuf,
    },
    /// Give a user a new generated password, printed once.
    Reset {
        name: String,
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: std::path::PathBuf,
    },
    /// Remove a user (their notebooks stay until an admin deletes them).
    Remove {
        name: String,
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: std::path::PathBuf,
    },
}

/// `--app-path`: an absolute path ending in `/`, nothing a link could be broken out of.
fn app_path(value: &str) -> Result<String, String> {
    base_path(value).map(|path| path.as_str().to_owned())
}

fn base_path(value: &str) -> Result<labforge_web::base_path::BasePath, String> {
    labforge_web::base_path::BasePath::parse(value).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Address the proxy serves on.
    #[arg(long, default_value = "0.0.0.0:8000")]
    pub listen: std::net::SocketAddr,
    /// Address of /metrics, /healthz, /readyz and /activity.
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub admin_addr: std::net::SocketAddr,
    /// Serve VirtualServices bound to this gateway (`<namespace>/<name>`).
    #[arg(
        long,
        env = "ISTIO_GATEWAY",
        default_value = "kubeflow/kubeflow-gateway"
    )]
    pub gateway: String,
    /// Serve VirtualServices of every gateway (ignores --gateway).
    #[arg(long)]
    pub any_gateway: bool,
    /// Header carrying the authenticated user, set by the auth proxy in front.
    #[arg(long, env = "USERID_HEADER", default_value = "kubeflow-userid")]
    pub user_header: String,
    /// Prefix of the user header's value to strip (e.g. `accounts.google.com:`).
    #[arg(long, env = "USERID_PREFIX", default_value = "")]
    pub user_prefix: String,
    /// Who reaches a namespace's notebooks: whom Kubernetes RBAC lets get Notebooks there (a
    /// SubjectAccessReview, cached briefly), or only those named by --admin and --member.
    #[arg(long, value_enum, default_value_t = ProxyAccess::SubjectAccessReview)]
    pub access: ProxyAccess,
    /// With `--access static`: a user who reaches every notebook; repeatable.
    #[arg(long = "admin")]
    pub admins: Vec<String>,
    /// With `--access static`: `<namespace>=<user>`, the user reaches the namespace's notebooks;
    /// repeatable.
    #[arg(long = "member")]
    pub members: Vec<String>,
    /// A namespace whose routes every authenticated user reaches (the dashboard's); repeatable.
    #[arg(long = "shared-namespace", default_value = "kubeflow")]
    pub shared_namespaces: Vec<String>,
    /// Read VirtualServices from these YAML files instead of watching Kubernetes; repeatable.
    #[arg(long = "routes-file")]
    pub routes_files: Vec<PathBuf>,
    /// `<host>:<port>=<address>:<port>`: connect there for that destination; repeatable.
    #[arg(long = "upstream")]
    pub upstreams: Vec<String>,
    /// Serving threads (each with its own listener and upstream pool); 0: one per CPU.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Seconds an upstream's most recently used connection stays pooled without a request before
    /// it is closed; its other idle ones (a burst's) stay at most 10 s, or this when shorter.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_idle_timeout: u64,
    /// Seconds a request may take to get an upstream connection (waiting for one included)
    /// before it is answered 503: a stopped notebook's address may drop connects unanswered.
    #[arg(
        long,
        default_value_t = labforge_proxy::upstream::DEFAULT_CONNECT_TIMEOUT.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub upstream_connect_timeout: u64,
    /// Seconds a client connection may go without completing a request head while none is in
    /// flight before it is closed (idle keep-alive connections, clients trickling headers).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_head_timeout: u64,
    /// A namespace whose VirtualServices are not confined to it (they may send requests to
    /// other namespaces and IPs, set identity headers, serve any path); repeatable. Every other
    /// namespace's rules are held to it: profile owners write VirtualServices there.
    #[arg(long = "trusted-namespace", default_values_t = labforge_proxy::routes::DEFAULT_TRUSTED_NAMESPACES.map(String::from))]
    pub trusted_namespaces: Vec<String>,
    /// A path under which each namespace has its own subtree (`/notebook/` →
    /// `/notebook/<ns>/`): a confined VirtualService serves only its namespace's; repeatable.
    #[arg(long = "tenant-root", default_values_t = labforge_proxy::routes::DEFAULT_TENANT_ROOTS.map(String::from))]
    pub tenant_roots: Vec<String>,
    /// The cluster's DNS domain (`<svc>.<ns>.svc.<domain>`).
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// A cookie never forwarded to notebooks (nor its split parts `<name>_<n>`), beside
    /// labforge_session, __Host-labforge_session, _oauth2_proxy and authservice_session;
    /// repeatable.
    #[arg(long = "strip-cookie")]
    pub strip_cookies: Vec<String>,
    /// Serve each notebook only on its own host, `<name>--<namespace>.<domain>`, and send
    /// `/notebook/…` on other hosts there; the controller's `LABFORGE_NOTEBOOK_DOMAIN`. The auth
    /// proxy in front must cover `*.<domain>` (SECURITY.md).
    #[arg(long, env = "LABFORGE_NOTEBOOK_DOMAIN")]
    pub notebook_domain: Option<String>,
    /// The web app's host, where error pages on notebook hosts link back to, when it is not the
    /// notebook domain itself (the dashboard on a site of its own).
    #[arg(long, env = "LABFORGE_APP_HOST", requires = "notebook_domain")]
    pub app_host: Option<String>,
    /// The web app's root path (e.g. `/jupyter/` under Kubeflow's dashboard): a browser opening a
    /// notebook without a route is sent to the app's page of it, and error pages link back there.
    #[arg(long, env = "LABFORGE_APP_PATH", value_parser = app_path)]
    pub app_path: Option<String>,
    /// Client connections served at once (all threads); more are answered 503 and closed.
    #[arg(long, default_value_t = labforge_proxy::server::DEFAULT_MAX_CONNECTIONS, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,
    /// Seconds a request body may take before it must keep up --request-body-min-rate.
    #[arg(long, default_value_t = labforge_proxy::server::BodyPace::default().grace.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub request_body_timeout: u64,
    /// Bytes per second a request body must average after --request-body-timeout: each byte
    /// received extends its deadline by 1/rate s; a slower body is cut off.
    #[arg(long, default_value_t = labforge_proxy::server::BodyPace::default().min_rate, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_body_min_rate: u64,
    /// TLS certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM); needs --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Keep the memory freed after a burst of connections instead of giving it back to the
    /// operating system: for measuring what giving it back saves (bench/README.md).
    #[arg(long)]
    pub no_heap_release: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProxyAccess {
    SubjectAccessReview,
    Static,
}

/// The proxy's options; with `--access subject-access-review`, `access` is a placeholder that
/// [`proxy`] replaces once it has a Kubernetes client.
impl TryFrom<&ProxyArgs> for ProxyOptions {
    type Error = anyhow::Error;

    fn try_from(args: &ProxyArgs) -> anyhow::Result<Self> {
        if args.access == ProxyAccess::SubjectAccessReview
            && !(args.admins.is_empty() && args.members.is_empty())
        {
            anyhow::bail!(
                "--admin and --member need --access static (with subject-access-review, Kubernetes RBAC decides)"
            );
        }
        let header = http::HeaderName::from_bytes(args.user_header.to_ascii_lowercase().as_bytes())
            .with_context(|| format!("--user-header {:?}", args.user_header))?;
        let mut access = StaticAccess::with_members(
            args.admins.iter().map(String::as_str),
            args.members.iter().map(String::as_str),
        )
        .context("--member")?;
        access.shared = args.shared_namespaces.iter().cloned().collect();
        let notebook_domain = args
            .notebook_domain
            .as_deref()
            .map(|domain| domain.trim_matches('.').to_ascii_lowercase())
            .filter(|domain| !domain.is_empty());
        let app_host = match (&args.app_host, &notebook_domain) {
            (Some(host), Some(domain)) => Some(app_host(host, domain)?),
            _ => None,
        };
        let upstream_addresses = args
            .upstreams
            .iter()
            .map(|pair| match pair.split_once('=') {
                Some((from, to)) if from.contains(':') && to.contains(':') => {
                    Ok((from.to_owned(), to.to_owned()))
                }
                _ => anyhow::bail!("--upstream {pair:?} is not <host>:<port>=<address>:<port>"),
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(ProxyOptions {
            listen: args.listen,
            admin: args.admin_addr,
            gateway: GatewayFilter((!args.any_gateway).then(|| args.gateway.clone())),
            identity: std::sync::Arc::new(TrustedHeader {
                header: header.clone(),
                prefix: args.user_prefix.clone(),
            }),
            access: std::sync::Arc::new(access),
            tls: match (&args.tls_cert, &args.tls_key) {
                (Some(cert), Some(key)) => Some(TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                }),
                _ => None,
            },
            upstream_addresses,
            threads: args.threads,
            upstream_idle_timeout: Duration::from_secs(args.upstream_idle_timeout),
            upstream_connect_timeout: Duration::from_secs(args.upstream_connect_timeout),
            request_head_timeout: Duration::from_secs(args.request_head_timeout),
            fallback: None,
            confinement: Confinement {
                trusted_namespaces: args.trusted_namespaces.iter().cloned().collect(),
                tenant_roots: args
                    .tenant_roots
                    .iter()
                    .map(|root| {
                        if root.starts_with('/') && root.ends_with('/') {
                            Ok(root.clone())
                        } else {
                            anyhow::bail!("--tenant-root {root:?} must start and end with /")
                        }
                    })
                    .collect::<anyhow::Result<_>>()?,
                identity_headers: vec![
                    header.clone(),
                    http::HeaderName::from_static(labforge_proxy::routes::KUBEFLOW_GROUPS_HEADER),
                ],
                cluster_domain: args.cluster_domain.trim_matches('.').to_ascii_lowercase(),
                notebook_domain: notebook_domain.clone(),
            },
            visitor_cookies: labforge_proxy::forward::DEFAULT_VISITOR_COOKIES
                .iter()
                .map(|name| name.to_string())
                .chain(args.strip_cookies.iter().cloned())
                .collect(),
            max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
            body_pace: labforge_proxy::server::BodyPace {
                grace: Duration::from_secs(args.request_body_timeout),
                min_rate: args.request_body_min_rate,
            },
            notebook_hosts: notebook_domain.map(|domain| {
                labforge_proxy::notebook_host::NotebookHosts {
                    app_host: app_host.unwrap_or_else(|| domain.clone()),
                    domain,
                    sign_in: None,
                    ports: None,
                }
            }),
            app_path: args.app_path.clone(),
            heap_release: !args.no_heap_release,
        })
    }
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub admin_addr: std::net::SocketAddr,
    /// Elect a leader among replicas through a Lease.
    #[arg(long)]
    pub leader_elect: bool,
    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kubeflow")]
    pub lease_namespace: String,
    /// Identity in the leader Lease (defaults to the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Notebook server base URL for culling, with {namespace} and {name} placeholders (default:
    /// the notebook's Service inside the cluster).
    #[arg(long)]
    pub jupyter_base_url: Option<String>,
    /// Admin URL of the labforge proxy (e.g. `http://labforge-proxy.kubeflow:8081`): its
    /// per-notebook activity counts for culling, so notebooks without Jupyter's API are culled
    /// by their traffic. A URL naming a Service is read from every ready replica behind it.
    #[arg(long, env = "PROXY_ACTIVITY_URL")]
    pub proxy_activity_url: Option<String>,
    /// Seconds between checks of an unchanged Notebook (they are served from watch caches).
    #[arg(long, default_value_t = labforge_notebook_controller::controller::DEFAULT_RESYNC.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub resync_seconds: u64,
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// YAML file with one or more Notebook documents; `-` reads standard input.
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    /// Namespace for Notebooks that name none.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Istio gateway of the VirtualService.
    #[arg(
        long,
        env = "ISTIO_GATEWAY",
        default_value = "kubeflow/kubeflow-gateway"
    )]
    pub istio_gateway: String,
    /// Host of the VirtualService.
    #[arg(long, env = "ISTIO_HOST", default_value = "*")]
    pub istio_host: String,
    /// Cluster DNS domain used in the VirtualService destination.
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Build no VirtualService (a cluster without Istio).
    #[arg(long)]
    pub no_virtual_service: bool,
    /// Image of the save agent, copied into each notebook pod by an init container.
    #[arg(long, env = "LABFORGE_AGENT_IMAGE")]
    pub agent_image: Option<String>,
    /// Serve each notebook on its own host, `<name>--<namespace>.<domain>`.
    #[arg(long, env = "LABFORGE_NOTEBOOK_DOMAIN")]
    pub notebook_domain: Option<String>,
    /// Build no NetworkPolicy (by default only the platform's namespaces reach notebook pods).
    #[arg(long)]
    pub no_network_policy: bool,
}

impl From<&RenderArgs> for BuilderConfig {
    fn from(args: &RenderArgs) -> Self {
        BuilderConfig {
            gateway: args.istio_gateway.clone(),
            host: args.istio_host.clone(),
            cluster_domain: args.cluster_domain.clone(),
            virtual_service: !args.no_virtual_service,
            agent_image: args.agent_image.clone(),
            notebook_domain: args.notebook_domain.clone().filter(|d| !d.is_empty()),
            network_policy_from: if args.no_network_policy {
                None
            } else {
                BuilderConfig::default().network_policy_from
            },
            ..BuilderConfig::default()
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum BuildCommand {
    /// Save a root (a directory, or a running container through its agent) as an image.
    ///
    /// With `--base`, only what differs from the base image becomes one new layer on top of it;
    /// without, the whole tree becomes the image's only layer.
    Commit(Box<CommitArgs>),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CompressionArg {
    Zstd,
    Gzip,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["root", "container"])))]
pub struct CommitArgs {
    /// Directory to save (mount points below it are skipped).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Running container to save, through the agent mounted in it (needs --base).
    #[arg(long, requires = "base")]
    pub container: Option<String>,
    /// Container engine for --container.
    #[arg(long, default_value = "podman")]
    pub engine: PathBuf,
    /// Image the root was started from; the new layer holds only the differences.
    #[arg(long)]
    pub base: Option<String>,
    /// Path (as seen from the root) to leave out; repeatable.
    #[arg(long = "ignore")]
    pub ignore: Vec<String>,
    /// Also compare file contents with the base (reads every file; metadata only by default).
    #[arg(long)]
    pub verify_content: bool,
    #[command(flatten)]
    pub storage: StorageArgs,
    /// Image reference to push, e.g. `registry.example.com/team/env:v1`.
    #[arg(long)]
    pub target: String,
    /// Layer compression.
    #[arg(long, value_enum, default_value = "zstd")]
    pub compression: CompressionArg,
    /// Compression level (zstd 1-22, default 3; gzip 0-9, default 6).
    #[arg(long)]
    pub level: Option<i32>,
    /// Image user (`uid[:gid]` or name).
    #[arg(long)]
    pub user: Option<String>,
    /// Image command; repeat for each argument.
    #[arg(long = "cmd")]
    pub cmd: Vec<String>,
    /// Print no progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Where saves push and cache, shared by `build commit` and `image-builds`.
#[derive(Debug, Args)]
pub struct StorageArgs {
    /// Cache blobs and indexes in this directory.
    #[arg(long, conflicts_with = "cache_s3")]
    pub cache_dir: Option<PathBuf>,
    /// Cache blobs and indexes in S3: `s3://bucket[/prefix]`; credentials from
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
    #[arg(long)]
    pub cache_s3: Option<String>,
    /// S3 endpoint URL (an S3-compatible server); AWS when absent.
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    pub s3_endpoint: Option<String>,
    /// S3 region.
    #[arg(long, env = "AWS_REGION", default_value = "us-east-1")]
    pub s3_region: String,
    /// Filled from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY by `run`, not by clap.
    #[arg(skip)]
    pub s3_credentials: Option<Secret<(String, String)>>,
    /// Registry (`host[:port]`) to reach over plain HTTP; repeatable.
    #[arg(long = "insecure-registry")]
    pub insecure_registries: Vec<String>,
    /// Registry user name (the password comes from LABFORGE_REGISTRY_PASSWORD, never from the
    /// command line, where other users of the machine could read it).
    #[arg(long, env = "LABFORGE_REGISTRY_USER")]
    pub registry_user: Option<String>,
    /// A token service (`https://auth.example.com`) on another origin than the target registry
    /// that may receive the registry credentials when the registry names it (Docker Hub needs
    /// `https://auth.docker.io`); repeatable. Without it such a service is asked anonymously.
    #[arg(long = "registry-token-realm", value_name = "URL")]
    pub registry_token_realms: Vec<String>,
    /// Filled from LABFORGE_REGISTRY_PASSWORD by `run`, not by clap.
    #[arg(skip)]
    pub registry_password: Option<Secret<String>>,
    /// Directory for the staged layer (default: the system temp dir).
    #[arg(long)]
    pub scratch_dir: Option<PathBuf>,
    /// Seconds a registry may stay silent (no answer, or no bytes of an upload taken) before
    /// the save fails; requests themselves have no time limit.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_STALL_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    pub registry_stall_timeout: u64,
}

impl StorageArgs {
    /// Reads the secrets from the environment (never from flags).
    fn with_secrets(mut self) -> Self {
        self.registry_password = env_var("LABFORGE_REGISTRY_PASSWORD").map(Secret);
        self.s3_credentials = env_var("AWS_ACCESS_KEY_ID")
            .zip(env_var("AWS_SECRET_ACCESS_KEY"))
            .map(Secret);
        self
    }

    fn registry(&self) -> anyhow::Result<RegistryOptions> {
        let credentials = match (&self.registry_user, &self.registry_password) {
            (Some(user), Some(Secret(password))) => Some((user.clone(), password.clone())),
            (None, None) => None,
            (Some(_), None) => {
                anyhow::bail!("--registry-user needs LABFORGE_REGISTRY_PASSWORD in the environment")
            }
            (None, Some(_)) => {
                anyhow::bail!("LABFORGE_REGISTRY_PASSWORD is set but --registry-user is not")
            }
        };
        Ok(RegistryOptions {
            insecure: self.insecure_registries.clone(),
            credentials,
            trusted_token_realms: self.registry_token_realms.clone(),
            stall_timeout: Some(Duration::from_secs(self.registry_stall_timeout)),
        })
    }
}

#[derive(Debug, Args)]
pub struct ImageBuildsArgs {
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub admin_addr: std::net::SocketAddr,
    /// This process in the Events it records (defaults to none).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Saves at once (each holds its image's index and compression buffers); others wait.
    #[arg(long, default_value_t = 2)]
    pub max_builds: usize,
    /// Builds may only push to `<prefix>/<their namespace>/…` (e.g. `registry.example.com/notebooks`,
    /// the web app's --save-registry); without it, anywhere the credentials reach.
    #[arg(long)]
    pub target_prefix: Option<String>,
    #[command(flatten)]
    pub storage: StorageArgs,
}

impl TryFrom<&ImageBuildsArgs> for SaveOptions {
    type Error = anyhow::Error;

    fn try_from(args: &ImageBuildsArgs) -> anyhow::Result<Self> {
        Ok(SaveOptions {
            compression: Compression::default(),
            cache: blob_cache(&args.storage)?,
            created_by: "labforge ImageBuild".into(),
            registry: args.storage.registry()?,
            runtime: RuntimeConfig::default(),
            scratch_dir: args
                .storage
                .scratch_dir
                .clone()
                .unwrap_or_else(std::env::temp_dir),
            // An ImageBuild names its target image: it exists once the build succeeded.
            push_unchanged: true,
        })
    }
}

impl TryFrom<&CommitArgs> for ChangeSource {
    type Error = anyhow::Error;

    fn try_from(args: &CommitArgs) -> anyhow::Result<Self> {
        Ok(match (&args.root, &args.container) {
            (Some(root), None) => ChangeSource::Directory {
                root: root.clone(),
                scan: ScanOptions {
                    ignore: args.ignore.iter().map(PathBuf::from).collect(),
                    mountinfo: Some(PathBuf::from("/proc/self/mountinfo")),
                    verify_content: args.verify_content,
                },
            },
            (None, Some(container)) => ChangeSource::Container {
                engine: args.engine.clone(),
                container: container.clone(),
                ignore: args.ignore.clone(),
                verify_content: args.verify_content,
            },
            _ => anyhow::bail!("give exactly one of --root and --container"),
        })
    }
}

fn blob_cache(args: &StorageArgs) -> anyhow::Result<Option<BlobCache>> {
    if let Some(dir) = &args.cache_dir {
        return Ok(Some(BlobCache::Dir(dir.clone())));
    }
    let Some(url) = &args.cache_s3 else {
        return Ok(None);
    };
    Ok(Some(BlobCache::S3(s3_cache(
        "--cache-s3",
        url,
        args.s3_endpoint.clone(),
        args.s3_region.clone(),
        args.s3_credentials.clone(),
    )?)))
}

/// The S3 client for `url` (`s3://bucket[/prefix]`), given as `what`.
fn s3_cache(
    what: &str,
    url: &str,
    endpoint: Option<String>,
    region: String,
    credentials: Option<Secret<(String, String)>>,
) -> anyhow::Result<S3Cache> {
    let Some(rest) = url.strip_prefix("s3://") else {
        anyhow::bail!("{what} {url:?} must look like s3://bucket[/prefix]");
    };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        anyhow::bail!("{what} {url:?} names no bucket");
    }
    let Some(Secret((access_key_id, secret_access_key))) = credentials else {
        anyhow::bail!(
            "{what} needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment"
        );
    };
    let prefix = match prefix.trim_end_matches('/') {
        "" => String::new(),
        p => format!("{p}/"),
    };
    Ok(S3Cache::new(S3CacheConfig {
        endpoint,
        region,
        bucket: bucket.to_owned(),
        prefix,
        access_key_id,
        secret_access_key,
        part_size: labforge_builder::cache::MIN_PART_SIZE * 2,
    }))
}

impl TryFrom<&CommitArgs> for SaveOptions {
    type Error = anyhow::Error;

    fn try_from(args: &CommitArgs) -> anyhow::Result<Self> {
        let compression = match (args.compression, args.level) {
            (CompressionArg::Zstd, None) => Compression::default(),
            (CompressionArg::Zstd, Some(level @ 1..=22)) => Compression::Zstd { level },
            (CompressionArg::Gzip, None) => Compression::Gzip { level: 6 },
            (CompressionArg::Gzip, Some(level @ 0..=9)) => Compression::Gzip {
                level: level.unsigned_abs(),
            },
            (kind, Some(level)) => {
                anyhow::bail!("--level {level} is out of range for {kind:?} compression")
            }
        };
        let created_by = match (&args.root, &args.container) {
            (Some(root), _) => format!("labforge build commit --root {}", root.display()),
            (_, Some(container)) => format!("labforge build commit --container {container}"),
            _ => "labforge build commit".to_owned(),
        };
        Ok(SaveOptions {
            compression,
            cache: blob_cache(&args.storage)?,
            created_by,
            registry: args.storage.registry()?,
            runtime: RuntimeConfig {
                user: args.user.clone(),
                cmd: args.cmd.clone(),
                ..Default::default()
            },
            scratch_dir: args
                .storage
                .scratch_dir
                .clone()
                .unwrap_or_else(std::env::temp_dir),
            // `--target` exists after a commit, as after `docker commit`.
            push_unchanged: true,
        })
    }
}

impl Cli {
    /// How this command reports: `--log`'s log lines when asked; a cluster service's log lines
    /// at `warn` (its output is a pod's log); otherwise lines for a person.
    pub fn logging(&self) -> crate::Logging {
        match (&self.log, &self.command) {
            (Some(filter), _) => crate::Logging::Log(filter.clone()),
            (
                None,
                Command::Controller(_)
                | Command::Proxy(_)
                | Command::Web(_)
                | Command::ImageBuilds(_),
            ) => crate::Logging::Log("warn".into()),
            (None, _) => crate::Logging::ForPeople,
        }
    }
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Build(BuildCommand::Commit(mut args)) => {
            args.storage = args.storage.with_secrets();
            build_commit(&args).await
        }
        Command::ImageBuilds(mut args) => {
            args.storage = args.storage.with_secrets();
            image_builds(&args).await
        }
        Command::Render(args) => render(&args),
        Command::Controller(args) => controller(&args).await,
        Command::Proxy(args) => proxy(&args).await,
        Command::Up(args) => up(&args).await,
        Command::Service(ServiceCommand::Install(args)) => service_install(&args),
        Command::Backup(args) => backup(args).await,
        Command::Status {
            data_dir,
            engine,
            json,
        } => {
            let status = labforge_embedded::status::read(&data_dir, &engine)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", StatusText(&status));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Restore(args) => restore(&args).await,
        Command::Audit(args) => audit(&args),
        Command::Namespace(command) => namespace(command),
        Command::User(command) => user(command),
        Command::Web(args) => web(&args).await,
        Command::Login(args) => login(args).await,
        Command::Logout => {
            if labforge_remote::commands::logout().await? {
                eprintln!("Signed out: the token is revoked and forgotten.");
            } else {
                eprintln!("Not signed in.");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Ssh(args) => {
            let status =
                labforge_remote::commands::ssh(&args.notebook, args.stdio, &args.command).await?;
            Ok(ExitCode::from(u8::try_from(status).unwrap_or(255)))
        }
        Command::ConfigSsh(args) => config_ssh(args).await,
        Command::Crds => {
            for crd in labforge_crds::crds() {
                print!("{}", labforge_crds::crd_yaml(&crd)?);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn login(args: LoginArgs) -> anyhow::Result<ExitCode> {
    let signed_in = labforge_remote::commands::login(labforge_remote::commands::Login {
        url: args.url,
        token: args.token,
        user: args.user,
        password_stdin: args.password_stdin,
        expires_in: args.expires_in,
    })
    .await?;
    let expiry = signed_in
        .expires
        .map(|at| format!("; it expires {at}"))
        .unwrap_or_default();
    eprintln!(
        "Signed in to {} as {}. The token is in {}{expiry}.",
        signed_in.url,
        signed_in.user,
        signed_in.saved_to.display()
    );
    Ok(ExitCode::SUCCESS)
}

async fn config_ssh(args: ConfigSshArgs) -> anyhow::Result<ExitCode> {
    let program = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "labforge".into());
    let (path, hosts) = labforge_remote::commands::config_ssh(args.ssh_config, &program).await?;
    eprintln!("Wrote {} host(s) to {}:", hosts.len(), path.display());
    for host in &hosts {
        eprintln!("  ssh {host}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `labforge status` as an admin reads it.
struct StatusText<'a>(&'a labforge_embedded::status::Status);

impl std::fmt::Display for StatusText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Data dir:      {} (format {})",
            self.0.data_dir.display(),
            self.0.format
        )?;
        match &self.0.running {
            Some(running) => {
                writeln!(
                    f,
                    "Instance:      running, pid {}, since {}",
                    running.pid,
                    running.started.strftime("%Y-%m-%d %H:%M UTC")
                )?;
                writeln!(f, "URL:           {}", running.url)?;
                let whose = if running.local_registry {
                    "labforge's own, blobs in the data dir"
                } else {
                    "configured"
                };
                writeln!(f, "Registry:      {} ({whose})", running.registry)?;
            }
            None => writeln!(f, "Instance:      not running")?,
        }
        writeln!(
            f,
            "Users:         {} ({} admin)",
            self.0.users, self.0.admins
        )?;
        let total: usize = self.0.notebooks.values().sum();
        let by_state: Vec<String> = self
            .0
            .notebooks
            .iter()
            .map(|(state, count)| format!("{count} {state}"))
            .collect();
        if by_state.is_empty() {
            writeln!(f, "Notebooks:     none")?;
        } else {
            writeln!(f, "Notebooks:     {total}: {}", by_state.join(", "))?;
        }
        writeln!(
            f,
            "Saved images:  {}, {} of layers",
            self.0.saved_images,
            HumanBytes(self.0.saved_layer_bytes)
        )?;
        writeln!(
            f,
            "Disk:          data dir {} (registry {}, cache {})",
            HumanBytes(self.0.disk.data_dir),
            HumanBytes(self.0.disk.registry),
            HumanBytes(self.0.disk.cache)
        )?;
        match &self.0.engine_error {
            None => {
                let parts: Vec<String> = self
                    .0
                    .engine_storage
                    .iter()
                    .map(|line| {
                        let size = line.size.parse::<u64>().map_or_else(
                            |_| line.size.clone(),
                            |bytes| HumanBytes(bytes).to_string(),
                        );
                        format!("{} {size} ({})", line.kind.to_lowercase(), line.count)
                    })
                    .collect();
                writeln!(f, "Engine:        {}", parts.join(", "))?;
            }
            Some(why) => writeln!(f, "Engine:        unknown: {why}")?,
        }
        match &self.0.last_backup {
            Some(last) => writeln!(
                f,
                "Last backup:   {} to {} (snapshot {}, {}, {} added)",
                last.finished,
                last.destination,
                last.snapshot,
                HumanBytes(last.bytes),
                HumanBytes(last.added_bytes)
            ),
            None => writeln!(f, "Last backup:   none (labforge backup DEST)"),
        }
    }
}

/// A value read from the environment that must never reach a log line or a `Debug` print.
#[derive(Clone)]
pub struct Secret<T>(pub T);

impl<T> std::fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Reads a variable of the process environment (the binary's one environment reader).
fn env_var(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

impl TryFrom<&ControllerArgs> for ServeOptions {
    type Error = anyhow::Error;

    fn try_from(args: &ControllerArgs) -> anyhow::Result<Self> {
        let identity = match &args.identity {
            Some(identity) => identity.clone(),
            None => std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| format!("labforge-{}", std::process::id())),
        };
        Ok(ServeOptions {
            builder: BuilderConfig::from_env(env_var)?,
            culling: CullingConfig::from_env(env_var)?,
            admin_addr: args.admin_addr,
            leader_election: args.leader_elect.then(|| LeaderElection {
                namespace: args.lease_namespace.clone(),
                identity,
                lease_duration: Duration::from_secs(15),
            }),
            jupyter_base_url: args.jupyter_base_url.clone(),
            proxy_activity_url: args.proxy_activity_url.clone(),
            resync: Duration::from_secs(args.resync_seconds),
        })
    }
}

async fn controller(args: &ControllerArgs) -> anyhow::Result<ExitCode> {
    let options = ServeOptions::try_from(args).map_err(UsageError)?;
    let client = kubernetes_client().await?;
    tokio::select! {
        result = serve(client, options) => result?,
        () = stop_signal() => tracing::info!("stopping"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `labforge proxy` and `labforge-proxy`.
pub async fn proxy(args: &ProxyArgs) -> anyhow::Result<ExitCode> {
    let options = ProxyOptions::try_from(args).map_err(UsageError)?;
    let options = match args.access {
        ProxyAccess::Static => options,
        ProxyAccess::SubjectAccessReview => ProxyOptions {
            access: std::sync::Arc::new(ReviewedAccess::new(
                kubernetes_client().await?,
                args.shared_namespaces.iter().cloned().collect(),
                ReviewCache::default(),
            )),
            ..options
        },
    };
    let routes = if args.routes_files.is_empty() {
        RoutesFrom::Kubernetes(kubernetes_client().await?)
    } else {
        RoutesFrom::Files(args.routes_files.clone())
    };
    let running = labforge_proxy::start(options, routes).await?;
    tokio::select! {
        () = running.wait() => {}
        () = stop_signal() => tracing::info!("stopping"),
    }
    Ok(ExitCode::SUCCESS)
}

async fn image_builds(args: &ImageBuildsArgs) -> anyhow::Result<ExitCode> {
    let options = SaveOptions::try_from(args).map_err(UsageError)?;
    let client = kubernetes_client().await?;
    let mut registry = prometheus_client::registry::Registry::default();
    let mut context = labforge_image_builds::Context::new(
        client,
        options,
        args.identity.clone(),
        args.max_builds,
        &mut registry,
    );
    context.target_prefix = args.target_prefix.clone();
    let context = std::sync::Arc::new(context);
    let listener = tokio::net::TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("binding --admin-addr {}", args.admin_addr))?;
    let admin = labforge_notebook_controller::admin::router(
        labforge_notebook_controller::admin::AdminState {
            registry: std::sync::Arc::new(registry),
            ready: std::sync::Arc::new(true.into()),
        },
    );
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, admin).await {
            tracing::error!(error = %err, "admin endpoint");
        }
    });
    // The reconciler stops on SIGTERM and Ctrl-C itself (`shutdown_on_signal`).
    labforge_image_builds::run(context).await;
    Ok(ExitCode::SUCCESS)
}

async fn kubernetes_client() -> anyhow::Result<kube::Client> {
    kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (kubeconfig or in-cluster)")
}

/// Ctrl-C, or SIGTERM (what Kubernetes and podman send to stop a container's first process).
async fn stop_signal() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn render(args: &RenderArgs) -> anyhow::Result<ExitCode> {
    let text = if args.file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    let notebooks = labforge_notebook_controller::render::parse_notebooks(&text, &args.namespace)
        .with_context(|| format!("parsing {}", args.file.display()))?;
    print!(
        "{}",
        labforge_notebook_controller::render::render_yaml(&notebooks, &BuilderConfig::from(args))?
    );
    Ok(ExitCode::SUCCESS)
}

async fn build_commit(args: &CommitArgs) -> anyhow::Result<ExitCode> {
    let parsed =
        ChangeSource::try_from(args).and_then(|source| Ok((source, SaveOptions::try_from(args)?)));
    let (source, options) = parsed.map_err(UsageError)?;
    if let Some(BlobCache::S3(cache)) = &options.cache
        && let Err(err) = cache.ensure_bucket().await
    {
        tracing::warn!("{err}");
    }
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    let reporter = bar.clone();
    let what = args
        .root
        .as_ref()
        .map(|r| r.display().to_string())
        .or_else(|| args.container.clone())
        .unwrap_or_default();
    let saved = save(
        &source,
        args.base.as_deref(),
        &args.target,
        &options,
        move |p| match p {
            SaveProgress::Indexing { layer, layers } => {
                reporter.set_message(format!("indexing base image: layer {layer}/{layers}"))
            }
            SaveProgress::Scanning { entries } => {
                reporter.set_message(format!("scanning: {entries} files"))
            }
            SaveProgress::Scanned(header) => reporter.set_message(format!(
                "scanned {} files: {} changed, {} removed, {} to write",
                header.scanned,
                header.changed,
                header.deleted,
                indicatif::HumanBytes(header.content_bytes)
            )),
            SaveProgress::Writing { bytes, total } => reporter.set_message(format!(
                "writing layer: {} of {} file data",
                indicatif::HumanBytes(bytes),
                indicatif::HumanBytes(total)
            )),
            SaveProgress::Uploading { layer_bytes } => reporter.set_message(format!(
                "uploading layer ({})",
                indicatif::HumanBytes(layer_bytes)
            )),
            SaveProgress::CacheUnavailable(reason) => {
                reporter.println(format!("cache unavailable, saving without it: {reason}"))
            }
        },
    )
    .await
    .with_context(|| format!("saving {what} as {}", args.target));
    bar.finish_and_clear();
    let saved = saved?;
    let cache = match &saved.cache {
        CacheOutcome::Disabled => String::new(),
        CacheOutcome::Hit => "; cache hit".to_owned(),
        CacheOutcome::Stored => "; cached".to_owned(),
        // Why is the warning's to tell, on a line of its own.
        CacheOutcome::Unavailable(_) => "; saved uncached, the cache was unavailable".to_owned(),
        CacheOutcome::Unused => String::new(),
    };
    let image = saved
        .image
        .as_ref()
        .context("the save pushed nothing, which a commit always does")?;
    match &saved.layer {
        Some(layer) => {
            println!(
                "pushed {}@{} (layer {}, {} files, {}{cache})",
                image.reference,
                image.manifest_digest,
                layer.digest,
                saved.header.changed,
                indicatif::HumanBytes(layer.size)
            );
            for line in summary_lines(&saved.summary) {
                println!("  {line}");
            }
        }
        None => println!(
            "pushed {}@{} (no changes since the base image{cache})",
            image.reference, image.manifest_digest
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// The change summary under the digest line: a line per package ecosystem that changed, then
/// the file totals.
fn summary_lines(summary: &labforge_builder::summary::ChangeSummary) -> Vec<String> {
    let mut lines: Vec<String> = summary
        .package_lines()
        .into_iter()
        .map(|(ecosystem, changes)| format!("{ecosystem}: {changes}"))
        .collect();
    if !summary.unknown.is_empty() {
        lines.push(format!(
            "not compared (too large to read): {}",
            summary.unknown.join(", ")
        ));
    }
    let files = &summary.files;
    lines.push(format!(
        "files: {} added, {} changed, {} deleted; {} written, {} deleted",
        files.added,
        files.changed,
        files.deleted,
        indicatif::HumanBytes(files.written_bytes),
        indicatif::HumanBytes(files.deleted_bytes)
    ));
    lines
}

fn spawner_config(
    path: Option<&std::path::Path>,
) -> anyhow::Result<Option<labforge_web::config::SpawnerConfig>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let config = labforge_web::config::SpawnerConfig::parse(&text)
        .with_context(|| format!("{} is not a valid spawner configuration", path.display()))?;
    Ok(Some(config))
}

async fn web(args: &WebArgs) -> anyhow::Result<ExitCode> {
    let header = http::HeaderName::try_from(args.user_header.as_str()).map_err(|_| {
        anyhow::anyhow!("--user-header {:?} is not a header name", args.user_header)
    })?;
    let spawner = spawner_config(args.spawner_config.as_deref())?.unwrap_or_else(|| {
        labforge_web::config::SpawnerConfig {
            images: Vec::new(),
            allow_custom_images: true,
            gpu_vendors: Vec::new(),
            defaults: Default::default(),
            kubeflow: Default::default(),
        }
    });
    let client = kubernetes_client().await?;
    let app = labforge_web::cluster::router(
        client,
        labforge_web::cluster::WebOptions {
            header: labforge_proxy::authz::TrustedHeader {
                header,
                prefix: args.user_prefix.clone(),
            },
            spawner,
            save_registry: args.save_registry.clone(),
            notebook_domain: args
                .notebook_domain
                .as_deref()
                .map(|domain| domain.trim_matches('.').to_ascii_lowercase())
                .filter(|domain| !domain.is_empty()),
            base_path: args.base_path.clone(),
        },
    )
    .await;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(listen = %args.listen, "web app serving");
    axum::serve(listener, app)
        .with_graceful_shutdown(stop_signal())
        .await?;
    Ok(ExitCode::SUCCESS)
}

fn user(command: UserCommand) -> anyhow::Result<ExitCode> {
    use labforge_web::users::Users;
    match command {
        UserCommand::Add {
            name,
            admin,
            data_dir,
        } => {
            let password = Users::open(&data_dir)?.add(&name, admin)?;
            println!("user {name} added; password (shown once): {password}");
        }
        UserCommand::List { data_dir } => {
            for user in Users::open(&data_dir)?.list() {
                let role = if user.admin { "admin" } else { "user" };
                println!("{}\t{}\tnamespace {}", user.name, role, user.namespace);
            }
        }
        UserCommand::Reset { name, data_dir } => {
            let password = Users::open(&data_dir)?.reset_password(&name)?;
            println!("new password for {name} (shown once): {password}");
        }
        UserCommand::Remove { name, data_dir } => {
            Users::open(&data_dir)?.remove(&name)?;
            labforge_web::tokens::Tokens::open(&data_dir)?.revoke_user(&name)?;
            println!("user {name} removed");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn namespace(command: NamespaceCommand) -> anyhow::Result<ExitCode> {
    use labforge_web::namespaces::Namespaces;
    use labforge_web::users::Users;
    let open = |dir: &std::path::Path| -> anyhow::Result<(Users, Namespaces)> {
        Ok((Users::open(dir)?, Namespaces::open(dir)?))
    };
    match command {
        NamespaceCommand::Quota(args) => return namespace_quota(&args),
        NamespaceCommand::Add {
            name,
            owner,
            data_dir,
        } => {
            let (users, namespaces) = open(&data_dir)?;
            namespaces.add(&name, &owner, &users)?;
            println!("namespace {name} added, owned by {owner}");
        }
        NamespaceCommand::List { data_dir } => {
            let (users, namespaces) = open(&data_dir)?;
            for ns in namespaces.list(&users) {
                let members: Vec<String> = ns
                    .members
                    .iter()
                    .map(|(user, role)| format!("{user} ({})", role.as_str()))
                    .collect();
                let members = if members.is_empty() {
                    "no members".to_owned()
                } else {
                    members.join(", ")
                };
                println!("{}\towner {}\t{members}", ns.name, ns.owner);
            }
        }
        NamespaceCommand::Member(MemberCommand::Add {
            namespace,
            user,
            role,
            data_dir,
        }) => {
            let (users, namespaces) = open(&data_dir)?;
            namespaces.set_member(&namespace, &user, role.parse()?, &users)?;
            println!("{user} is a member of {namespace} as {role}");
        }
        NamespaceCommand::Member(MemberCommand::Remove {
            namespace,
            user,
            data_dir,
        }) => {
            let (_, namespaces) = open(&data_dir)?;
            namespaces.remove_member(&namespace, &user)?;
            println!("{user} is no longer a member of {namespace}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The agent next to this binary: `<target>/agent/labforge-agent` beside `<target>/<profile>/labforge`.
fn default_agent() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let candidate = exe.parent()?.parent()?.join("agent").join("labforge-agent");
    candidate.is_file().then_some(candidate)
}

/// The domain `labforge up` serves the web app on and notebooks below, or `None` for paths.
fn notebook_domain(args: &UpArgs) -> anyhow::Result<Option<String>> {
    if args.notebook_paths {
        return Ok(None);
    }
    let domain = args.notebook_domain.trim_matches('.').to_ascii_lowercase();
    let is_host_name = domain.split('.').all(labforge_crds::host::is_dns_label);
    if !is_host_name {
        anyhow::bail!(
            "--notebook-domain {:?} is not a host name (e.g. localhost, lab.example.com)",
            args.notebook_domain
        );
    }
    if domain == "localhost" && !args.listen.ip().is_loopback() {
        tracing::warn!(
            listen = %args.listen,
            "notebooks are served on *.localhost, which only a browser on this machine reaches: \
             pass --notebook-domain with a wildcard DNS name for other machines"
        );
    }
    Ok(Some(domain))
}

/// `--app-host` of `labforge up`, checked against its notebook domain.
fn up_app_host(args: &UpArgs) -> anyhow::Result<Option<String>> {
    match (&args.app_host, notebook_domain(args)?) {
        (Some(host), Some(domain)) => Ok(Some(app_host(host, &domain)?)),
        _ => Ok(None),
    }
}

/// The web app's host as given, lowercased: a host name that is not a notebook's host
/// (`<label>.<domain>`), where requests would be taken for that notebook's.
fn app_host(host: &str, domain: &str) -> anyhow::Result<String> {
    let host = host.trim_matches('.').to_ascii_lowercase();
    if host.is_empty() || !host.split('.').all(labforge_crds::host::is_dns_label) {
        anyhow::bail!("--app-host {host:?} is not a host name (e.g. lab.example.com)");
    }
    if host
        .strip_suffix(domain)
        .and_then(|label| label.strip_suffix('.'))
        .is_some_and(|label| !label.contains('.'))
    {
        anyhow::bail!(
            "--app-host {host}: one label below --notebook-domain {domain} is a notebook's host; \
             pick a host of another site (or the domain itself, the default)"
        );
    }
    // Without the public suffix list this cannot be told for sure: the last two labels alike
    // is the common case of one registrable domain.
    fn last_two(name: &str) -> Vec<&str> {
        name.rsplit('.').take(2).collect()
    }
    if host != domain && last_two(&host) == last_two(domain) {
        tracing::warn!(
            app_host = %host,
            notebook_domain = %domain,
            "the web app's host and the notebooks' domain look like one site: notebooks' pages \
             could set cookies for the web app; a registrable domain of its own keeps them apart"
        );
    }
    Ok(host)
}

/// A backup destination as given on the command line: `s3://…` or a directory.
fn backup_destination(
    text: &str,
    s3: &BackupS3Args,
) -> anyhow::Result<labforge_backup::destination::Destination> {
    use labforge_backup::destination::Destination;
    if text.starts_with("s3://") {
        let credentials = env_var("AWS_ACCESS_KEY_ID")
            .zip(env_var("AWS_SECRET_ACCESS_KEY"))
            .map(Secret);
        let cache = s3_cache(
            "the backup destination",
            text,
            s3.s3_endpoint.clone(),
            s3.s3_region.clone(),
            credentials,
        )?;
        return Ok(Destination::s3(
            cache,
            text.trim_end_matches('/').to_owned(),
        ));
    }
    let path = PathBuf::from(text);
    if path.is_file() {
        anyhow::bail!(
            "{text} is a file; backups are directories or s3://bucket/prefix (a .tar.zst of an \
             earlier labforge is the data dir's state: extract it into an empty data dir with \
             tar --zstd -xf {text} -C DATA_DIR)"
        );
    }
    Ok(Destination::dir(path))
}

/// The engine whose volumes a backup reads: the running instance's, else `engine`.
fn backup_engine(data_dir: &Path, engine: &Path) -> labforge_backup::volumes::Podman {
    let running = labforge_embedded::up::RunningRecord::of_running(data_dir);
    labforge_backup::volumes::Podman {
        program: running.map_or_else(|| engine.to_owned(), |r| r.engine),
    }
}

/// A spinner naming the part being backed up and the bytes read so far.
struct BackupProgress {
    bar: ProgressBar,
    read: std::sync::atomic::AtomicU64,
}

impl labforge_backup::Progress for BackupProgress {
    fn part(&self, what: &str) {
        self.bar.set_prefix(what.to_owned());
        self.tick();
    }

    fn read(&self, bytes: u64) {
        self.read
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        self.tick();
    }
}

impl BackupProgress {
    fn tick(&self) {
        let read = self.read.load(std::sync::atomic::Ordering::Relaxed);
        self.bar.set_message(format!("{} read", HumanBytes(read)));
    }
}

async fn backup(args: BackupArgs) -> anyhow::Result<ExitCode> {
    if let Some(BackupCommand::List { dest, s3, json }) = args.command {
        let dest = backup_destination(&dest, &s3)?;
        let snapshots = labforge_backup::list(&dest).await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&snapshots)?);
        } else if snapshots.is_empty() {
            println!("{dest} holds no snapshot");
        } else {
            println!(
                "{:<20} {:<28} {:>8} {:>7} {:>10} {:>10}",
                "SNAPSHOT", "TAKEN", "FILES", "VOLUMES", "SIZE", "ADDED"
            );
            for s in &snapshots {
                println!(
                    "{:<20} {:<28} {:>8} {:>7} {:>10} {:>10}",
                    s.id,
                    s.created,
                    s.files,
                    s.volumes,
                    HumanBytes(s.bytes).to_string(),
                    HumanBytes(s.added_bytes).to_string()
                );
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(text) = args.dest.as_deref() else {
        anyhow::bail!("labforge backup: name the destination: a directory or s3://bucket/prefix");
    };
    let dest = backup_destination(text, &args.s3)?;
    let volumes = backup_engine(&args.data_dir, &args.engine);
    let bar = if args.quiet || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed:>4} {prefix}: {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let progress = BackupProgress {
        bar,
        read: std::sync::atomic::AtomicU64::new(0),
    };
    let options = labforge_backup::BackupOptions {
        data_dir: &args.data_dir,
        dest: &dest,
        volumes: &volumes,
        keep: args.keep.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let result = labforge_backup::backup(&options, &progress).await;
    progress.bar.finish_and_clear();
    let summary = result?;
    println!(
        "Snapshot {} of {} in {dest}: {} files, {} volumes, {}; added {} ({} objects).",
        summary.id,
        args.data_dir.display(),
        summary.files,
        summary.volumes,
        HumanBytes(summary.bytes),
        HumanBytes(summary.added_bytes),
        summary.added_objects
    );
    if !summary.pruned.is_empty() {
        println!(
            "Removed {} older snapshot(s): {}",
            summary.pruned.len(),
            summary.pruned.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn restore(args: &RestoreArgs) -> anyhow::Result<ExitCode> {
    let dest = backup_destination(&args.dest, &args.s3)?;
    let volumes = labforge_backup::volumes::Podman {
        program: args.engine.clone(),
    };
    let summary = labforge_backup::restore(&labforge_backup::RestoreOptions {
        dest: &dest,
        snapshot: args.snapshot.as_deref(),
        data_dir: &args.data_dir,
        volumes: &volumes,
        keep_existing_volumes: args.keep_existing_volumes,
    })
    .await?;
    if !summary.kept_volumes.is_empty() {
        println!(
            "Kept the engine's own volumes: {}",
            summary.kept_volumes.join(", ")
        );
    }
    println!(
        "Restored snapshot {} ({} files, {} volumes, {}; data format {}) into {}; start labforge up on it.",
        summary.id,
        summary.files,
        summary.volumes,
        HumanBytes(summary.bytes),
        summary.data_format,
        args.data_dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn service_install(args: &ServiceInstallArgs) -> anyhow::Result<ExitCode> {
    let binary = std::env::current_exe()
        .and_then(|exe| exe.canonicalize())
        .context("finding this program's own path")?;
    // What `up` would refuse is refused now, not by a service failing at every restart.
    if let Some(dest) = &args.backup_to {
        if dest.starts_with("s3://") {
            s3_cache(
                "--backup-to",
                dest,
                None,
                "us-east-1".into(),
                Some(Secret((String::new(), String::new()))),
            )?;
        } else if !Path::new(dest).is_absolute() {
            anyhow::bail!(
                "--backup-to {dest:?}: give the directory as an absolute path (the timer runs from /)"
            );
        }
    }
    let domain = notebook_domain(&args.up)?;
    let app_host = up_app_host(&args.up)?;
    let app_host = app_host.as_deref().or(domain.as_deref());
    labforge_embedded::up::check_notebook_site(
        domain.as_deref(),
        app_host,
        args.up.tls().is_some(),
    )?;
    match args.up.tls() {
        Some(labforge_embedded::up::TlsSource::Files(files)) => {
            labforge_proxy::server::tls_acceptor(&files)?;
        }
        Some(labforge_embedded::up::TlsSource::SelfSigned) => {
            labforge_embedded::up::certificate_names(domain.as_deref(), app_host, args.up.listen)?;
        }
        None => {}
    }
    labforge_notebook_controller::culler::CullingConfig::from_env(env_var)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let up_args = args.up.service_args()?;
    if !up_args.iter().any(|arg| arg == "--agent") {
        tracing::warn!("no save agent found (run `make agent` or pass --agent): saves will fail");
    }
    // `up` reads culling from the environment: the service gets the installer's.
    let environment: Vec<(String, String)> =
        ["ENABLE_CULLING", "CULL_IDLE_TIME", "IDLENESS_CHECK_PERIOD"]
            .into_iter()
            .filter_map(|name| env_var(name).map(|value| (name.to_owned(), value)))
            .collect();
    let unit = crate::service::unit_file(&binary, &up_args, &environment);
    let path = args.unit_dir.join(format!("{}.service", args.name));
    let temporary = args.unit_dir.join(format!(".{}.service.tmp", args.name));
    std::fs::write(&temporary, unit)
        .and_then(|()| std::fs::rename(&temporary, &path))
        .with_context(|| format!("writing {}", path.display()))?;
    println!("Wrote {}: it runs {} up.", path.display(), binary.display());
    if let Some(dest) = &args.backup_to {
        let (service, timer) = crate::service::backup_units(
            &binary,
            &args.up.data_dir,
            &crate::service::BackupSchedule {
                dest,
                keep: args.backup_keep,
                on_calendar: &args.backup_on,
                environment_file: &args.backup_environment_file,
            },
        );
        for (suffix, text) in [("service", service), ("timer", timer)] {
            let path = args.unit_dir.join(format!("{}-backup.{suffix}", args.name));
            let temporary = args
                .unit_dir
                .join(format!(".{}-backup.{suffix}.tmp", args.name));
            std::fs::write(&temporary, text)
                .and_then(|()| std::fs::rename(&temporary, &path))
                .with_context(|| format!("writing {}", path.display()))?;
            println!("Wrote {}", path.display());
        }
        if dest.starts_with("s3://") {
            println!(
                "Put AWS_ACCESS_KEY_ID=… and AWS_SECRET_ACCESS_KEY=… (and AWS_ENDPOINT_URL=… for an S3-compatible server) in {}, readable by root only.",
                args.backup_environment_file.display()
            );
        }
        println!(
            "Back up {} to {dest}, keeping {}:  systemctl daemon-reload && systemctl enable --now {}-backup.timer",
            args.backup_on, args.backup_keep, args.name
        );
    }
    // The first admin is made here, on the installer's terminal: made by the service, the
    // password would be printed into the system journal.
    std::fs::create_dir_all(&args.up.data_dir)
        .with_context(|| format!("creating {}", args.up.data_dir.display()))?;
    let fresh = labforge_embedded::data_dir::check_format(&args.up.data_dir)?
        == labforge_embedded::data_dir::Found::Fresh;
    let users = labforge_web::users::Users::open(&args.up.data_dir)?;
    if let Some((name, password)) = users.ensure_admin()? {
        println!("Sign in as {name} with password {password}  (shown only now)");
    }
    if fresh {
        // A new data dir is this labforge's format: nothing for the first start to migrate.
        labforge_embedded::data_dir::record_format(&args.up.data_dir)?;
    }
    println!(
        "Start it now and at every boot:  systemctl daemon-reload && systemctl enable --now {}",
        args.name
    );
    println!(
        "Its URL and certificate fingerprint:  journalctl -u {}",
        args.name
    );
    Ok(ExitCode::SUCCESS)
}

async fn up(args: &UpArgs) -> anyhow::Result<ExitCode> {
    let culling = labforge_notebook_controller::culler::CullingConfig::from_env(env_var)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let spawner = spawner_config(args.spawner_config.as_deref())?;
    let agent = args.agent.clone().or_else(default_agent);
    if agent.is_none() {
        tracing::warn!("no save agent found (run `make agent` or pass --agent): saves will fail");
    }
    let running = labforge_embedded::up::start(labforge_embedded::up::UpOptions {
        data_dir: args.data_dir.clone(),
        listen: args.listen,
        engine: args.engine.clone(),
        registry: args.registry.clone(),
        registry_listen: args.registry_listen,
        registry_program: args.registry_program.clone(),
        insecure_registries: args.insecure_registries.clone(),
        agent,
        spawner,
        cache: None,
        culling,
        notebook_domain: notebook_domain(args)?,
        app_host: up_app_host(args)?,
        tls: args.tls(),
        metrics_listen: args.metrics_listen,
        concurrent_starts: args.concurrent_starts.map(usize::from),
        cdi_dirs: labforge_embedded::gpus::CDI_DIRS
            .iter()
            .map(Into::into)
            .collect(),
    })
    .await?;
    println!();
    println!("  labforge is running: {}", running.url);
    match &running.created_admin {
        Some((name, password)) => {
            println!("  Sign in as {name} with password {password}  (shown only now)")
        }
        None => println!(
            "  Sign in with your user; a forgotten password: labforge user reset <name> --data-dir {}",
            args.data_dir.display()
        ),
    }
    if let Some(certificate) = &running.self_signed {
        println!(
            "  TLS: self-signed certificate {} ({}); SHA-256 fingerprint:\n    {}",
            certificate.files.cert.display(),
            if certificate.made {
                "made now"
            } else {
                "kept from before"
            },
            certificate.fingerprint
        );
    }
    if let Some(metrics) = &running.metrics_url {
        println!("  Metrics: {metrics}");
    }
    println!(
        "  Registry: http://{}   Data: {}",
        running.registry,
        args.data_dir.display()
    );
    println!(
        "  Ctrl-C stops labforge; running notebooks keep running and are adopted at the next start."
    );
    println!();
    stop_signal().await;
    tracing::info!("stopping");
    drop(running);
    Ok(ExitCode::SUCCESS)
}

fn namespace_quota(args: &QuotaArgs) -> anyhow::Result<ExitCode> {
    let ns = &args.namespace;
    labforge_web::validate::dns_label("namespace", ns).map_err(|e| anyhow::anyhow!("{e}"))?;
    let store = args.data_dir.join("store");
    let set = args.cpu.is_some()
        || args.memory.is_some()
        || args.gpus.is_some()
        || args.notebooks.is_some()
        || args.storage.is_some();
    if args.clear {
        labforge_embedded::store::write_quota(&store, ns, None)?;
    } else if set {
        let quota = labforge_web::quota::Quota {
            cpu: args.cpu.clone(),
            memory: args.memory.clone(),
            gpus: args.gpus,
            notebooks: args.notebooks,
            storage: args.storage.clone(),
        };
        if let Some(problem) = quota.problems().as_slice().first() {
            anyhow::bail!("--{}: {}", problem.field, problem.message);
        }
        labforge_embedded::store::write_quota(&store, ns, Some(&quota))?;
    }
    match labforge_embedded::store::read_quota(&store, ns)? {
        None => println!("{ns}: no quota"),
        Some(quota) => {
            let parts: Vec<String> = [
                quota.cpu.as_ref().map(|cpu| format!("cpu {cpu}")),
                quota
                    .memory
                    .as_ref()
                    .map(|memory| format!("memory {memory}")),
                quota.gpus.map(|gpus| format!("gpus {gpus}")),
                quota.notebooks.map(|n| format!("{n} running notebooks")),
                quota
                    .storage
                    .as_ref()
                    .map(|storage| format!("storage {storage}")),
            ]
            .into_iter()
            .flatten()
            .collect();
            println!("{ns}: {}", parts.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--since` as `labforge audit` takes it: an RFC 3339 time, or a span back from now.
fn audit_since(since: &str) -> anyhow::Result<String> {
    if since.parse::<jiff::Timestamp>().is_ok() {
        return Ok(since.to_owned());
    }
    let span: jiff::Span = since.parse().map_err(|_| {
        anyhow::anyhow!(
            "--since {since:?}: give an RFC 3339 time (2026-01-31T09:00:00Z) or a span back from now (90m, 2h, 7d)"
        )
    })?;
    let now = jiff::Zoned::now().with_time_zone(jiff::tz::TimeZone::UTC);
    Ok(now
        .checked_sub(span)
        .with_context(|| format!("--since {since:?}: too far back"))?
        .timestamp()
        .to_string())
}

fn audit(args: &AuditArgs) -> anyhow::Result<ExitCode> {
    let dir = args.data_dir.join(labforge_embedded::data_dir::AUDIT_DIR);
    let filter = labforge_web::audit::AuditFilter {
        user: args.user.clone(),
        namespace: args.namespace.clone(),
        since: args.since.as_deref().map(audit_since).transpose()?,
    };
    let records = labforge_web::audit::read_dir(&dir, &filter, args.limit)
        .with_context(|| format!("reading the audit trail in {}", dir.display()))?;
    for record in records {
        if args.json {
            println!("{}", serde_json::to_string(&record)?);
        } else {
            let on = match (record.namespace.as_str(), record.object.as_str()) {
                ("", _) => String::new(),
                (ns, "") => format!(" in {ns}"),
                (ns, object) => format!(" on {ns}/{object}"),
            };
            let who = if record.user.is_empty() {
                "(nobody)"
            } else {
                &record.user
            };
            let from = if record.from.is_empty() {
                "?"
            } else {
                &record.from
            };
            println!(
                "{}  {who} from {from}: {}{on} → {} {}",
                record.time, record.action, record.status, record.result
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use labforge_proxy::authz::Answer;

    #[test]
    fn a_service_runs_up_with_the_arguments_it_was_installed_with() {
        let install = |args: &[&str]| {
            let argv = [&["labforge", "service", "install"][..], args].concat();
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Service(ServiceCommand::Install(install)) => install,
                other => panic!("{other:?}"),
            }
        };
        let up = |args: &[String]| {
            let argv = ["labforge".to_owned(), "up".to_owned()]
                .into_iter()
                .chain(args.iter().cloned());
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Up(up) => up,
                other => panic!("{other:?}"),
            }
        };
        let every = [
            "--data-dir",
            "/srv/lab",
            "--listen",
            "0.0.0.0:8443",
            "--engine",
            "docker",
            "--registry",
            "registry.lab:5000",
            "--registry-listen",
            "127.0.0.1:5001",
            "--registry-program",
            "/opt/registry",
            "--insecure-registry",
            "a:5000",
            "--insecure-registry",
            "b:5000",
            "--agent",
            "/opt/agent",
            "--spawner-config",
            "/etc/spawner.json",
            "--notebook-domain",
            "lab.example.com",
            "--notebook-paths",
            "--metrics-listen",
            "127.0.0.1:9464",
        ];
        for tls in [
            &[
                "--tls-cert",
                "/etc/lab/cert.pem",
                "--tls-key",
                "/etc/lab/key.pem",
            ][..],
            &["--tls-self-signed"][..],
        ] {
            let installed = install(&[&every[..], tls].concat());
            let run = up(&installed.up.service_args().unwrap());
            assert_eq!(format!("{run:?}"), format!("{:?}", installed.up));
        }

        // A service starts in `/`: relative paths are made absolute.
        let relative = install(&["--data-dir", "lab-data", "--agent", "bin/agent"]);
        let args = relative.up.service_args().unwrap();
        let cwd = std::env::current_dir().unwrap();
        for (flag, path) in [("--data-dir", "lab-data"), ("--agent", "bin/agent")] {
            let at = args.iter().position(|a| a == flag).unwrap();
            assert_eq!(args[at + 1], cwd.join(path).display().to_string());
        }
        assert!(
            Cli::try_parse_from(["labforge", "service", "install", "--name", "lab/../x"]).is_err()
        );
    }

    #[test]
    fn the_app_host_is_a_host_name_apart_from_the_notebooks_hosts() {
        let domain = "notebooks.example-lab.net";
        assert_eq!(
            app_host("Lab.Example.com.", domain).unwrap(),
            "lab.example.com"
        );
        assert_eq!(app_host(domain, domain).unwrap(), domain, "the default");
        assert_eq!(
            app_host("example-lab.net", domain).unwrap(),
            "example-lab.net"
        );
        for (host, says) in [
            ("lab--alice.notebooks.example-lab.net", "a notebook's host"),
            ("lab example.com", "not a host name"),
            ("", "not a host name"),
        ] {
            let refused = app_host(host, domain).unwrap_err().to_string();
            assert!(refused.contains(says), "{host}: {refused}");
        }
        // A service keeps it; notebooks on paths have no other host.
        let up = |args: &[&str]| match Cli::try_parse_from([&["labforge", "up"][..], args].concat())
        {
            Ok(Cli {
                command: Command::Up(up),
                ..
            }) => Ok(up),
            Ok(other) => panic!("{:?}", other.command),
            Err(e) => Err(e),
        };
        let separate = up(&["--notebook-domain", domain, "--app-host", "lab.example.com"]).unwrap();
        let args = separate.service_args().unwrap();
        let at = args.iter().position(|a| a == "--app-host").unwrap();
        assert_eq!(args[at + 1], "lab.example.com");
        assert_eq!(
            up_app_host(&separate).unwrap().as_deref(),
            Some("lab.example.com")
        );
        assert!(up(&["--notebook-paths", "--app-host", "lab.example.com"]).is_err());
    }

    #[test]
    fn the_app_path_is_a_plain_absolute_directory_path() {
        for good in ["/", "/jupyter/", "/a/b-c_d.e~/"] {
            assert_eq!(app_path(good).as_deref(), Ok(good));
        }
        for bad in [
            "jupyter/",
            "/jupyter",
            "//evil.example/",
            "/a\"b/",
            "/a b/",
            "",
        ] {
            let error = app_path(bad).unwrap_err();
            assert!(
                error.contains("not a path like /jupyter/"),
                "{bad}: {error}"
            );
        }
    }

    fn parse(args: &[&str]) -> CommitArgs {
        let mut argv = vec![
            "labforge", "build", "commit", "--root", "/r", "--target", "h/i:t",
        ];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Build(BuildCommand::Commit(args)) => *args,
            other => panic!("parsed as {other:?}"),
        }
    }

    fn parse_proxy(args: &[&str]) -> ProxyArgs {
        let mut argv = vec!["labforge", "proxy"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Proxy(args) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn proxy_arguments_become_options() {
        let options = ProxyOptions::try_from(&parse_proxy(&[
            "--access",
            "static",
            "--admin",
            "root@x",
            "--member",
            "alice=alice@x",
            "--upstream",
            "lab.alice.svc.cluster.local:80=127.0.0.1:9999",
        ]))
        .unwrap();
        assert_eq!(
            options.gateway,
            GatewayFilter(Some("kubeflow/kubeflow-gateway".into()))
        );
        let may_use = |user, ns| matches!(options.access.may_use(user, ns), Answer::Now(true));
        assert!(may_use("root@x", "bob"));
        assert!(may_use("alice@x", "alice"));
        assert!(!may_use("alice@x", "bob"));
        assert!(options.access.is_shared("kubeflow"));
        assert!(!options.access.is_shared("alice"));
        assert_eq!(
            options.upstream_addresses["lab.alice.svc.cluster.local:80"],
            "127.0.0.1:9999"
        );
        assert!(options.tls.is_none());
        assert!(options.heap_release);
        assert_eq!(options.upstream_idle_timeout, Duration::from_secs(90));
        assert_eq!(
            options.upstream_connect_timeout,
            labforge_proxy::upstream::DEFAULT_CONNECT_TIMEOUT
        );
        assert_eq!(options.request_head_timeout, Duration::from_secs(30));
        assert_eq!(options.confinement, Confinement::default());
        assert_eq!(
            options.visitor_cookies,
            labforge_proxy::forward::DEFAULT_VISITOR_COOKIES
        );
        assert_eq!(
            options.max_connections,
            labforge_proxy::server::DEFAULT_MAX_CONNECTIONS as usize
        );
        assert_eq!(
            options.body_pace,
            labforge_proxy::server::BodyPace::default()
        );
        let any = ProxyOptions::try_from(&parse_proxy(&[
            "--any-gateway",
            "--upstream-idle-timeout",
            "5",
            "--upstream-connect-timeout",
            "3",
            "--request-head-timeout",
            "7",
            "--trusted-namespace",
            "platform",
            "--trusted-namespace",
            "kubeflow",
            "--tenant-root",
            "/user/",
            "--user-header",
            "X-User",
            "--strip-cookie",
            "sso",
            "--max-connections",
            "100",
            "--request-body-timeout",
            "9",
            "--request-body-min-rate",
            "10",
            "--no-heap-release",
        ]))
        .unwrap();
        assert!(!any.heap_release);
        assert_eq!(
            any.confinement.trusted_namespaces,
            ["kubeflow".to_owned(), "platform".to_owned()].into()
        );
        assert_eq!(any.confinement.tenant_roots, ["/user/"]);
        assert_eq!(any.confinement.identity_headers[0], "x-user");
        assert_eq!(any.visitor_cookies.last().map(String::as_str), Some("sso"));
        assert_eq!(any.max_connections, 100);
        assert_eq!(
            any.body_pace,
            labforge_proxy::server::BodyPace {
                grace: Duration::from_secs(9),
                min_rate: 10
            }
        );
        assert_eq!(any.gateway, GatewayFilter(None));
        assert_eq!(any.upstream_idle_timeout, Duration::from_secs(5));
        assert_eq!(any.upstream_connect_timeout, Duration::from_secs(3));
        assert_eq!(any.request_head_timeout, Duration::from_secs(7));
    }

    #[test]
    fn malformed_proxy_arguments_are_refused() {
        for bad in [
            &["--access", "static", "--member", "alice"][..],
            &["--member", "alice=alice@x"],
            &["--admin", "root@x"],
            &["--upstream", "nowhere"],
            &["--user-header", "bad header"],
            &["--tenant-root", "notebook"],
        ] {
            assert!(
                ProxyOptions::try_from(&parse_proxy(bad)).is_err(),
                "{bad:?}"
            );
        }
        assert!(
            Cli::try_parse_from(["labforge", "proxy", "--tls-cert", "c.pem"]).is_err(),
            "a certificate without its key"
        );
        for flag in [
            "--upstream-idle-timeout",
            "--upstream-connect-timeout",
            "--request-head-timeout",
            "--max-connections",
            "--request-body-timeout",
            "--request-body-min-rate",
        ] {
            let zero = Cli::try_parse_from(["labforge", "proxy", flag, "0"])
                .unwrap_err()
                .to_string();
            assert!(zero.contains(flag), "{zero}");
        }
    }

    #[test]
    fn defaults_are_zstd_level_3_and_anonymous() {
        let options = SaveOptions::try_from(&parse(&[])).unwrap();
        assert_eq!(options.compression, Compression::Zstd { level: 3 });
        assert!(options.registry.credentials.is_none());
    }

    #[test]
    fn out_of_range_level_is_refused_with_the_flag_named() {
        let err =
            SaveOptions::try_from(&parse(&["--compression", "gzip", "--level", "12"])).unwrap_err();
        assert!(err.to_string().contains("--level 12"), "{err}");
        let ok = SaveOptions::try_from(&parse(&["--compression", "gzip", "--level", "1"])).unwrap();
        assert_eq!(ok.compression, Compression::Gzip { level: 1 });
    }

    #[test]
    fn secrets_from_the_environment_never_show_in_debug_output() {
        let mut args = parse(&["--cache-s3", "s3://bucket/prefix"]);
        args.storage.registry_user = Some("alice".into());
        args.storage.registry_password = Some(Secret("registry-pa55".into()));
        args.storage.s3_credentials = Some(Secret(("AKID".into(), "s3-s3cret".into())));
        let shown = format!("{args:?}");
        assert!(
            shown.contains("alice") && shown.contains("<redacted>"),
            "{shown}"
        );
        assert!(
            !shown.contains("registry-pa55") && !shown.contains("s3-s3cret"),
            "{shown}"
        );
        // And the options built from them still carry the values.
        let options = SaveOptions::try_from(&args).unwrap();
        assert_eq!(
            options.registry.credentials,
            Some(("alice".to_owned(), "registry-pa55".to_owned()))
        );
        assert!(matches!(options.cache, Some(BlobCache::S3(_))));
    }

    #[test]
    fn user_without_password_is_refused() {
        let mut args = parse(&[]);
        args.storage.registry_user = Some("alice".into());
        args.storage.registry_password = None;
        let err = SaveOptions::try_from(&args).unwrap_err();
        assert!(
            err.to_string().contains("LABFORGE_REGISTRY_PASSWORD"),
            "{err}"
        );
    }
}
