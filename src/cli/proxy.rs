//! `labforge proxy`: the notebook proxy, its routes from Istio VirtualServices or a file.

use super::up::app_host;
use super::web::app_path;
use anyhow::Context as _;
use clap::Args;
use labforge_proxy::ProxyOptions;
use labforge_proxy::authz::{StaticAccess, TrustedHeader};
use labforge_proxy::routes::{Confinement, GatewayFilter};
use labforge_proxy::server::TlsFiles;
use std::path::PathBuf;
use std::time::Duration;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser as _;
    use labforge_proxy::authz::Answer;

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
}
