//! Signing in to a labforge server and writing SSH config for its notebooks (`labforge-remote`).

use crate::cli::remote::{ConfigSshArgs, LoginArgs};
use std::process::ExitCode;

pub(crate) async fn login(args: LoginArgs) -> anyhow::Result<ExitCode> {
    let signed_in = labforge_remote::commands::login(labforge_remote::commands::Login {
        url: args.url,
        token: args.token,
        user: args.user,
        password_stdin: args.password_stdin,
        expires_in: args.expires_in,
    })
    .await?;
    let expiry = signed_in
        .expires
        .map(|at| format!("; it expires {at}"))
        .unwrap_or_default();
    eprintln!(
        "Signed in to {} as {}. The token is in {}{expiry}.",
        signed_in.url,
        signed_in.user,
        signed_in.saved_to.display()
    );
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn config_ssh(args: ConfigSshArgs) -> anyhow::Result<ExitCode> {
    let program = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "labforge".into());
    let (path, hosts) = labforge_remote::commands::config_ssh(args.ssh_config, &program).await?;
    eprintln!("Wrote {} host(s) to {}:", hosts.len(), path.display());
    for host in &hosts {
        eprintln!("  ssh {host}");
    }
    Ok(ExitCode::SUCCESS)
}
