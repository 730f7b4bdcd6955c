//! Per-notebook secrets: the route to a notebook presents its secret to the notebook's server,
//! and labforge's images refuse requests without it, so the route (the proxy, Istio's gateway) is
//! the one way in, even for a pod or process that can reach the server's port.
//!
//! A secret is an HMAC of the notebook's namespace and name under a key only the platform holds
//! (embedded: a file in the data dir; a cluster: the controller's `LABFORGE_NOTEBOOK_SECRET_KEY`),
//! so it never has to be stored or read back. labforge's images take it from [`SECRET_ENV`]:
//! JupyterLab as its token (the route sends `Authorization: token …`), code-server as its hashed
//! password (the route sends code-server's session cookie with that value). Other images ignore
//! both. A notebook's owner can read it (their pod's environment); it guards their server from
//! everyone else.

use base64::Engine as _;
use hmac::{Hmac, Mac as _};

/// The environment variable labforge's images read the secret from.
pub const SECRET_ENV: &str = "LABFORGE_NOTEBOOK_SECRET";
/// code-server's session cookie.
const CODE_SERVER_COOKIE: &str = "code-server-session";

/// The key notebook secrets are derived from; its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretKey(Vec<u8>);

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(…)")
    }
}

impl SecretKey {
    pub fn new(key: impl Into<Vec<u8>>) -> Self {
        Self(key.into())
    }

    /// The secret of notebook `namespace/name`: HMAC-SHA256 of both names, URL-safe base64
    /// (valid in a header, a cookie and an environment variable as it is).
    pub fn of(&self, namespace: &str, name: &str) -> String {
        let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(&self.0) else {
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
    fn secrets_are_per_notebook_and_keyed() {
        let key = SecretKey::new(b"k".to_vec());
        let alice = key.of("alice", "lab");
        assert_eq!(alice.len(), 43);
        assert_ne!(alice, key.of("alice", "lab2"));
        assert_ne!(key.of("alice-x", "lab"), key.of("alice", "x-lab"));
        assert_ne!(SecretKey::new(b"other".to_vec()).of("alice", "lab"), alice);
        assert_eq!(format!("{key:?}"), "SecretKey(…)");
    }
}
