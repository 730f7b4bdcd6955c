//! `labforge up`: everything on one machine, and `labforge status` about it.

use anyhow::Context as _;
use clap::Args;
use labforge_proxy::server::TlsFiles;
use std::path::PathBuf;

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
    pub(crate) fn service_args(&self) -> anyhow::Result<Vec<String>> {
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

    pub(crate) fn tls(&self) -> Option<labforge_embedded::up::TlsSource> {
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

/// The agent next to this binary: `<target>/agent/labforge-agent` beside `<target>/<profile>/labforge`.
pub(crate) fn default_agent() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let candidate = exe.parent()?.parent()?.join("agent").join("labforge-agent");
    candidate.is_file().then_some(candidate)
}

/// The domain `labforge up` serves the web app on and notebooks below, or `None` for paths.
pub(crate) fn notebook_domain(args: &UpArgs) -> anyhow::Result<Option<String>> {
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
pub(crate) fn up_app_host(args: &UpArgs) -> anyhow::Result<Option<String>> {
    match (&args.app_host, notebook_domain(args)?) {
        (Some(host), Some(domain)) => Ok(Some(app_host(host, &domain)?)),
        _ => Ok(None),
    }
}

/// The web app's host as given, lowercased: a host name that is not a notebook's host
/// (`<label>.<domain>`), where requests would be taken for that notebook's.
pub(crate) fn app_host(host: &str, domain: &str) -> anyhow::Result<String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

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
}
