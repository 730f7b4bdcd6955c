//! Signing in to a labforge server and reaching its notebooks over SSH: the client side, in
//! `labforge-remote`.

use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The web app's address, e.g. http://localhost:8080.
    pub url: String,
    /// Sign in as this user (asked when not given).
    #[arg(long)]
    pub user: Option<String>,
    /// Read the password from the first line of stdin.
    #[arg(long)]
    pub password_stdin: bool,
    /// Keep this token (made on the web app's Tokens page) rather than sign in with a password.
    #[arg(long)]
    pub token: Option<String>,
    /// How long the token made for this CLI lasts: 90m, 12h, 30d (up to 366d).
    #[arg(long, default_value = "30d")]
    pub expires_in: String,
}

#[derive(Debug, Args)]
pub struct SshArgs {
    /// Carry the SSH connection on stdin and stdout (OpenSSH's ProxyCommand).
    #[arg(long)]
    pub stdio: bool,
    /// The notebook: NAMESPACE/NAME, or NAME.NAMESPACE.labforge.
    pub notebook: String,
    /// The command to run, after `--`; a shell when none.
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ConfigSshArgs {
    /// The OpenSSH config file to write the entries into.
    #[arg(long, default_value = None)]
    pub ssh_config: Option<PathBuf>,
}
