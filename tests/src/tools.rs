//! Finding the external tools the suites need, with errors that say how to get them.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The command that installs every tool the suites use.
pub const SETUP_HINT: &str = "run `scripts/setup` as root (or `make setup`)";

#[derive(Debug, thiserror::Error)]
pub enum SupportError {
    #[error("`{tool}` is not installed (not found on PATH): {SETUP_HINT}")]
    MissingTool { tool: String },
    #[error("{what} is missing at {path}: {hint}")]
    MissingFile {
        what: &'static str,
        path: PathBuf,
        hint: &'static str,
    },
    #[error("{service} did not start: {detail}")]
    Start {
        service: &'static str,
        detail: String,
    },
    /// Another process bound the port [`free_port`] had found before the service did.
    #[error("{service} lost port {port} to another process, which answered in its place")]
    PortTaken { service: &'static str, port: u16 },
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    #[error("I/O while {doing}")]
    Io {
        doing: String,
        #[source]
        source: std::io::Error,
    },
}

/// Finds `tool` on the process's PATH.
pub fn locate(tool: &str) -> Result<PathBuf, SupportError> {
    locate_in(
        tool,
        std::env::var_os("PATH").as_deref().unwrap_or_default(),
    )
}

/// Finds `tool` in the directories of a PATH-style list.
pub fn locate_in(tool: &str, path_list: &OsStr) -> Result<PathBuf, SupportError> {
    std::env::split_paths(path_list)
        .map(|dir| dir.join(tool))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| SupportError::MissingTool {
            tool: tool.to_owned(),
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs a command to completion and returns its stdout, or an error carrying its stderr.
pub fn run(command: &mut std::process::Command) -> Result<String, SupportError> {
    let shown = format!("{command:?}");
    let output = command.output().map_err(|source| SupportError::Io {
        doing: format!("starting {shown}"),
        source,
    })?;
    if !output.status.success() {
        return Err(SupportError::Command {
            command: shown,
            detail: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> Result<u16, SupportError> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|source| SupportError::Io {
            doing: "finding a free port".into(),
            source,
        })?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|source| SupportError::Io {
            doing: "finding a free port".into(),
            source,
        })
}

/// A self-signed certificate for `localhost` (P-256, valid for a day) and its key, written as
/// `cert.pem` and `key.pem` in `dir`, by `openssl` (scripts/setup installs it).
pub fn self_signed_certificate(dir: &Path) -> Result<(PathBuf, PathBuf), SupportError> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    run(std::process::Command::new(locate("openssl")?)
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .args(["-addext", "extendedKeyUsage=serverAuth"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert))?;
    Ok((cert, key))
}

/// Reconciles `labforge controller` has finished, read from its metrics at `admin_port` (0 while
/// it does not answer).
pub async fn reconciles_done(admin_port: u16) -> u64 {
    let Ok(response) = reqwest::get(format!("http://127.0.0.1:{admin_port}/metrics")).await else {
        return 0;
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("labforge_notebook_reconcile_duration_seconds_count "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tool_error_names_the_tool_and_the_setup_command() {
        let err = locate_in("podman", OsStr::new("/nonexistent-a:/nonexistent-b")).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("`podman`"), "{message}");
        assert!(message.contains("scripts/setup"), "{message}");
    }

    #[test]
    fn locate_finds_an_executable_and_skips_non_executables() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("tool");
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        assert!(locate_in("tool", dir.path().as_os_str()).is_err());
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(locate_in("tool", dir.path().as_os_str()).unwrap(), plain);
    }
}
