//! Per-notebook secrets in embedded mode ([`labforge_notebook_controller::secret`]): the proxy
//! adds its notebook's secret to every request it forwards there, and the notebook's server
//! refuses requests without it. The proxy is then the one way in, even for a process that can
//! reach the server's port (another notebook, a local user).
//!
//! The key is kept in the data dir (mode 0600), so a notebook's secret is the same on every start
//! and after a restart of labforge, and the container plan that carries it stays the same.

use labforge_notebook_controller::secret::SecretKey;
use std::io::{Read as _, Write as _};
use std::path::Path;

const KEY_FILE: &str = "notebook-secrets.key";
const KEY_BYTES: usize = 32;

/// The key notebook secrets are derived from, read from the data dir.
pub struct NotebookSecrets {
    key: SecretKey,
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
        Ok(Self {
            key: SecretKey::new(key.to_vec()),
        })
    }

    /// The secret of notebook `namespace/name`.
    pub fn of(&self, namespace: &str, name: &str) -> String {
        self.key.of(namespace, name)
    }
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
