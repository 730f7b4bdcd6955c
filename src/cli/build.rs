//! `labforge build commit` and `labforge render`: images without a daemon, and the objects a
//! Notebook becomes.

use super::{Secret, env_var};
use clap::{Args, Subcommand, ValueEnum};
use labforge_builder::cache::{BlobCache, S3Cache, S3CacheConfig};
use labforge_builder::image::RuntimeConfig;
use labforge_builder::layer::Compression;
use labforge_builder::registry::RegistryOptions;
use labforge_builder::save::SaveOptions;
use labforge_builder::source::ChangeSource;
use labforge_builder::stall::DEFAULT_STALL_TIMEOUT;
use labforge_notebook_controller::BuilderConfig;
use labforge_snapshot::ScanOptions;
use std::path::PathBuf;
use std::time::Duration;

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
    pub(crate) fn with_secrets(mut self) -> Self {
        self.registry_password = env_var("LABFORGE_REGISTRY_PASSWORD").map(Secret);
        self.s3_credentials = env_var("AWS_ACCESS_KEY_ID")
            .zip(env_var("AWS_SECRET_ACCESS_KEY"))
            .map(Secret);
        self
    }

    pub(crate) fn registry(&self) -> anyhow::Result<RegistryOptions> {
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

pub(crate) fn blob_cache(args: &StorageArgs) -> anyhow::Result<Option<BlobCache>> {
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
pub(crate) fn s3_cache(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Secret;
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

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
