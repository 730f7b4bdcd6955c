//! The bodies of `labforge login`, `logout`, `ssh` and `config-ssh`: the CLI parses their
//! arguments and calls these.

use crate::RemoteError;
use crate::api::Api;
use crate::credentials::{self, Credentials};
use crate::tunnel::{self, Target};
use std::io::{BufRead as _, IsTerminal as _};
use std::path::PathBuf;

/// How `labforge login` is to sign in.
pub struct Login {
    pub url: String,
    /// A token made on the Tokens page; else one is made by signing in with a password.
    pub token: Option<String>,
    /// The user to sign in as; asked on the terminal when not given.
    pub user: Option<String>,
    /// Read the password from stdin's first line (scripts) rather than ask for it.
    pub password_stdin: bool,
    /// How long a token made here lasts (`30d`).
    pub expires_in: String,
}

/// What `labforge login` did.
pub struct SignedIn {
    pub user: String,
    pub url: String,
    pub saved_to: PathBuf,
    /// When the token made for it expires; `None` for a token given.
    pub expires: Option<String>,
}

fn ask(prompt: &str) -> Result<String, RemoteError> {
    if !std::io::stdin().is_terminal() {
        return Err(RemoteError::Usage(format!(
            "{} is needed and stdin is no terminal to ask on: give --user, and the password with --password-stdin",
            prompt.trim_end_matches(": ")
        )));
    }
    eprint!("{prompt}");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(line.trim().to_owned())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "this machine".into())
}

/// Signs in to a server and keeps a token for the CLI.
pub async fn login(request: Login) -> Result<SignedIn, RemoteError> {
    let url = credentials::normalize_url(&request.url)?;
    let (token, expires) = match request.token {
        Some(token) => (token, None),
        None => {
            let user = match request.user {
                Some(user) => user,
                None => ask("User: ")?,
            };
            let password = if request.password_stdin {
                let mut line = String::new();
                std::io::stdin().lock().read_line(&mut line)?;
                line.trim_end_matches(['\r', '\n']).to_owned()
            } else if std::io::stdin().is_terminal() {
                rpassword::prompt_password(format!("Password for {user} at {url}: "))?
            } else {
                return Err(RemoteError::Usage(
                    "stdin is no terminal to ask for the password on: give it with --password-stdin".into(),
                ));
            };
            let session = Api::sign_in(&url, &user, &password).await?;
            let name = format!(
                "labforge CLI on {} at {}",
                hostname(),
                jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M:%S")
            );
            let made = session.make_token(&name, &request.expires_in).await;
            session.sign_out().await;
            let made = made?;
            (made.token, Some(made.expires))
        }
    };
    let credentials = Credentials { url, token };
    let user = Api::with_token(&credentials).whoami().await?;
    let saved_to = credentials::save(&credentials)?;
    Ok(SignedIn {
        user,
        url: credentials.url,
        saved_to,
        expires,
    })
}

/// Forgets the kept token, revoking it on its server first when it can; says whether there was
/// one.
pub async fn logout() -> Result<bool, RemoteError> {
    if let Ok(credentials) = credentials::load() {
        let api = Api::with_token(&credentials);
        if let Ok(tokens) = api.get("/api/tokens").await {
            // The token in use is the one whose last use is now: revoke the newest used.
            let newest = tokens
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| Some((t["lastUsed"].as_str()?, t["id"].as_str()?)))
                .max();
            if let Some((_, id)) = newest {
                let _ = api
                    .send(api.request(reqwest::Method::DELETE, &format!("/api/tokens/{id}")))
                    .await;
            }
        }
    }
    credentials::forget()
}

/// `labforge ssh`: a shell or `command` in `target`, returning its exit status; with `stdio`,
/// the SSH connection itself on stdin and stdout (0 when it ends).
pub async fn ssh(target: &str, stdio: bool, command: &[String]) -> Result<u32, RemoteError> {
    let target: Target = target.parse()?;
    let api = Api::with_token(&credentials::load()?);
    if stdio {
        if !command.is_empty() {
            return Err(RemoteError::Usage(
                "--stdio carries the SSH connection itself: it takes no command".into(),
            ));
        }
        tunnel::stdio(&api, &target).await?;
        return Ok(0);
    }
    let line = (!command.is_empty()).then(|| labforge_ssh::client::command_line(command));
    tunnel::run(&api, &target, line.as_deref()).await
}

/// `labforge config-ssh`: writes the block for the user's notebooks into `ssh_config` (default
/// `~/.ssh/config`), calling `program`; returns the file and the host names.
pub async fn config_ssh(
    ssh_config: Option<PathBuf>,
    program: &str,
) -> Result<(PathBuf, Vec<String>), RemoteError> {
    let api = Api::with_token(&credentials::load()?);
    let notebooks = api.notebooks().await?;
    let path = match ssh_config {
        Some(path) => path,
        None => std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".ssh").join("config"))
            .ok_or_else(|| RemoteError::Usage("HOME is not set: give --ssh-config".into()))?,
    };
    let hosts = crate::ssh_config::write(&path, program, &notebooks)?;
    Ok((path, hosts))
}
