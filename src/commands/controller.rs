//! The cluster's two reconcilers, run until a stop signal.

use crate::cli::UsageError;
use crate::cli::controller::{ControllerArgs, ImageBuildsArgs};
use crate::commands::{kubernetes_client, stop_signal};
use anyhow::Context as _;
use labforge_builder::save::SaveOptions;
use labforge_notebook_controller::service::{ServeOptions, serve};
use std::process::ExitCode;

pub(crate) async fn run(args: &ControllerArgs) -> anyhow::Result<ExitCode> {
    let options = ServeOptions::try_from(args).map_err(UsageError)?;
    let client = kubernetes_client().await?;
    tokio::select! {
        result = serve(client, options) => result?,
        () = stop_signal() => tracing::info!("stopping"),
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn image_builds(args: &ImageBuildsArgs) -> anyhow::Result<ExitCode> {
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
