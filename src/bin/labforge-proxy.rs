//! `labforge-proxy`: the proxy alone, with the arguments of `labforge proxy`, for the proxy's
//! Deployment (a smaller binary, so less of it resident; see [`labforge_cli`]).

use clap::Parser;
use labforge_cli::cli::proxy::ProxyArgs;
use labforge_cli::commands::proxy::run;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "labforge-proxy",
    version,
    about = "The labforge notebook proxy: routes from Istio VirtualServices (a Kubernetes watch, \
             or --routes-file), every request authenticated and authorized per notebook"
)]
struct ProxyCli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `labforge_proxy=debug`.
    #[arg(long, env = "LABFORGE_LOG", default_value = "warn")]
    log: String,
    #[command(flatten)]
    proxy: ProxyArgs,
}

fn main() -> ExitCode {
    let cli = ProxyCli::parse();
    let logging = labforge_cli::Logging::Log(cli.log.clone());
    labforge_cli::run_main("labforge-proxy", &logging, None, || run(&cli.proxy))
}
