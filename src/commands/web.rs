//! The web app in a cluster.

use crate::cli::web::WebArgs;
use crate::commands::{kubernetes_client, stop_signal};
use anyhow::Context as _;
use std::process::ExitCode;

pub(crate) fn spawner_config(
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

pub(crate) async fn run(args: &WebArgs) -> anyhow::Result<ExitCode> {
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
