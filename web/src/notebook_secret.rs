//! Per-notebook secrets: the proxy adds its notebook's secret to every request it forwards there,
//! and the notebook's server refuses requests without it. The proxy is then the one way in, even
//! for a process that can reach the server's port (another notebook, a local user).
//!
//! A secret is derived from a key kept in the data dir (mode 0600) and the notebook's namespace
//! and name, so it is the same on every start and after a restart of labforge, and the container
//! plan that carries it stays the same. labforge's images take it from [`SECRET_ENV`]: JupyterLab
//! as its token (the proxy sends `Authorization: token …`), code-server as its hashed password
//! (the proxy sends code-server's session cookie with that value). Other images ignore it.

use base64::Engine as _;
use hmac::{Hmac, Mac as _};
use std::io::{Read as _, Write as _};
use std::path::Path;

/// The environment variable labforge's images read the secret from.
pub const SECRET_ENV: &str = "LABFORGE_NOTEBOOK_SECRET";
/// code-server's session cookie.
const CODE_SERVER_COOKIE: &str = "code-server-session";
const KEY_FILE: &str = "notebook-secrets.key";
const KEY_BYTES: usize = 32;

/// The key notebook secrets are derived from.
pub struct NotebookSecrets {
    key: [u8; KEY_BYTES],
}

impl NotebookSecrets {
    /// Reads the key from `data_dir`, or creates it there on first use.
    pub fn open(data_dir: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = data_dir.join(KEY_FILE);
        let mut key = [0u8; KEY_BYTES];
        match std::fs::File::open(&path) {
            Ok(mut file) => {
                file.read_exact(&mut key).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
                })?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                getrandom::fill(&mut key).map_err(std::io::Error::other)?;
                let temporary = path.with_extension("key.tmp");
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&temporary)?;
                file.write_all(&key)?;
                file.sync_all()?;
                std::fs::rename(&temporary, &path)?;
            }
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", path.display()),
                ));
            }
        }
        Ok(Self { key })
    }

    /// The secret of notebook `namespace/name`: HMAC-SHA256 of both names, URL-safe base64
    /// (valid in a header, a cookie and an environment variable as it is).
    pub fn of(&self, namespace: &str, name: &str) -> String {
        let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(&self.key) else {
            unreachable!("HMAC takes keys of any length");
        };
        mac.update(namespace.as_bytes());
        mac.update(b"/");
        mac.update(name.as_bytes());
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    }
}

/// The request headers that present `secret` to the notebook's server: Jupyter's token header
/// for every server, and for code-server its session cookie, which replaces the browser's
/// cookies (code-server keeps its state in the browser's storage, not in cookies).
pub fn upstream_headers(secret: &str, code_server: bool) -> Vec<(String, String)> {
    let mut headers = vec![("authorization".to_owned(), format!("token {secret}"))];
    if code_server {
        headers.push((
            "cookie".to_owned(),
            format!("{CODE_SERVER_COOKIE}={secret}"),
        ));
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_per_notebook_and_stable_across_opens() {
        let dir = tempfile::tempdir().unwrap();
        let secrets = NotebookSecrets::open(dir.path()).unwrap();
        let alice = secrets.of("alice", "lab");
        assert_eq!(alice.len(), 43);
        assert_ne!(alice, secrets.of("alice", "lab2"));
        assert_ne!(secrets.of("alice-x", "lab"), secrets.of("alice", "x-lab"));
        let again = NotebookSecrets::open(dir.path()).unwrap();
        assert_eq!(again.of("alice", "lab"), alice);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // Another data dir, another key.
        let other = tempfile::tempdir().unwrap();
        assert_ne!(
            NotebookSecrets::open(other.path())
                .unwrap()
                .of("alice", "lab"),
            alice
        );
    }
}
