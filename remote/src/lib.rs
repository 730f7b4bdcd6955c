//! The client side of a labforge server, for the CLI: where its URL and API token are kept
//! ([`credentials`]), signing in for one and calling the API with it ([`api`]), SSH into a
//! notebook through the server's websocket ([`tunnel`]) and the OpenSSH config entries that
//! make `ssh`, `scp`, `rsync` and editors use it ([`ssh_config`]).

pub mod api;
pub mod commands;
pub mod credentials;
pub mod ssh_config;
pub mod tunnel;

/// Why talking to a labforge server failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// Nothing says which server or token to use.
    #[error(
        "not signed in: run `labforge login URL` first, or set LABFORGE_URL and LABFORGE_TOKEN"
    )]
    NotSignedIn,
    #[error("{0}")]
    Usage(String),
    /// The server answered with an error: its status and message.
    #[error("{status}: {message}")]
    Refused { status: u16, message: String },
    #[error("cannot reach {url}: {source}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{path}: {source}")]
    File {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Ssh(#[from] labforge_ssh::client::ClientError),
    /// The server closed the connection, and said why.
    #[error("the connection was closed: {0}")]
    Closed(String),
    #[error("the websocket: {0}")]
    WebSocket(#[from] tokio_tungstenite::tungstenite::Error),
}

/// Replaces the file at `path` with `bytes`, readable by this user alone (mode 0600, in a
/// directory of mode 0700 made when missing): written beside it, then renamed over it.
pub(crate) fn write_private(path: &std::path::Path, bytes: &[u8]) -> Result<(), RemoteError> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let io = |source| RemoteError::File {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
    }
    let temporary = path.with_extension("labforge.tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    std::fs::rename(&temporary, path).map_err(io)
}
