//! What each command does: it builds the crates' options from the parsed arguments ([`crate::cli`]),
//! runs the crate's work, and reports to the person or the log. The work itself lives in the crates.

pub(crate) mod backup;
pub(crate) mod build;
pub(crate) mod controller;
pub mod proxy;
pub(crate) mod remote;
pub(crate) mod service;
pub(crate) mod teams;
pub(crate) mod up;
pub(crate) mod web;

use crate::cli::build::BuildCommand;
use crate::cli::service::ServiceCommand;
use crate::cli::{Cli, Command};
use backup::restore;
use build::{build_commit, render};
use controller::image_builds;
use remote::{config_ssh, login};
use service::service_install;
use teams::{audit, namespace, user};
use up::status;

use anyhow::Context as _;
use std::process::ExitCode;

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
        Command::Controller(args) => controller::run(&args).await,
        Command::Proxy(args) => proxy::run(&args).await,
        Command::Up(args) => up::run(&args).await,
        Command::Service(ServiceCommand::Install(args)) => service_install(&args),
        Command::Backup(args) => backup::run(args).await,
        Command::Status {
            data_dir,
            engine,
            json,
        } => status(&data_dir, &engine, json),
        Command::Restore(args) => restore(&args).await,
        Command::Audit(args) => audit(&args),
        Command::Namespace(command) => namespace(command),
        Command::User(command) => user(command),
        Command::Web(args) => web::run(&args).await,
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
