//! Command-line arguments: clap structs that only parse, one module per concern, and their
//! conversion into each crate's typed options. What each command does is in [`crate::commands`].

pub mod backup;
pub mod build;
pub mod controller;
pub mod proxy;
pub mod remote;
pub mod service;
pub mod teams;
pub mod up;
pub mod web;

use backup::{BackupArgs, RestoreArgs};
use build::{BuildCommand, RenderArgs};
use controller::{ControllerArgs, ImageBuildsArgs};
use proxy::ProxyArgs;
use remote::{ConfigSshArgs, LoginArgs, SshArgs};
use service::ServiceCommand;
use teams::{AuditArgs, NamespaceCommand, UserCommand};
use up::UpArgs;
use web::WebArgs;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Exit code for bad configuration (sysexits' EX_USAGE), used before any work starts.
pub const EXIT_USAGE: u8 = 64;

/// Bad configuration, found before any work started; the binary exits with [`EXIT_USAGE`].
#[derive(Debug)]
pub struct UsageError(pub anyhow::Error);

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

/// A value read from the environment that must never reach a log line or a `Debug` print.
#[derive(Clone)]
pub struct Secret<T>(pub T);

impl<T> std::fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Reads a variable of the process environment (the binary's one environment reader).
pub(crate) fn env_var(key: &str) -> Option<String> {
    std::env::var(key).ok()
}
