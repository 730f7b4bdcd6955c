//! `labforge controller` and `labforge image-builds`: the cluster's two reconcilers.

use super::build::{StorageArgs, blob_cache};
use super::env_var;
use clap::Args;
use labforge_builder::image::RuntimeConfig;
use labforge_builder::layer::Compression;
use labforge_builder::save::SaveOptions;
use labforge_notebook_controller::BuilderConfig;
use labforge_notebook_controller::culler::CullingConfig;
use labforge_notebook_controller::service::{LeaderElection, ServeOptions};
use std::time::Duration;

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
