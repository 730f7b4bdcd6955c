//! The notebook proxy, run until a stop signal or until one of its parts ends.

use crate::cli::UsageError;
use crate::cli::proxy::{ProxyAccess, ProxyArgs};
use crate::commands::{kubernetes_client, stop_signal};
use labforge_proxy::review::{ReviewCache, ReviewedAccess};
use labforge_proxy::{ProxyOptions, RoutesFrom};
use std::process::ExitCode;

/// `labforge proxy` and `labforge-proxy`.
pub async fn run(args: &ProxyArgs) -> anyhow::Result<ExitCode> {
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
    let mut running = labforge_proxy::start(options, routes).await?;
    tokio::select! {
        stopped = running.wait() => Err(stopped.into()),
        () = stop_signal() => {
            tracing::info!("stopping");
            Ok(ExitCode::SUCCESS)
        }
    }
}
