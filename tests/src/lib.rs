//! Test support: launchers for the real services labforge talks to.
//!
//! Suites run against real parts: the Debian `docker-registry` (an OCI registry), the moto S3 server
//! and podman. Each launcher starts its service on a free loopback port with its own temporary
//! state and stops it on `Drop`, so tests stay independent and leave nothing running. When a tool
//! is missing the error names it and the setup command to run, instead of hanging.

pub mod agent;
pub mod browser;
pub mod embedded;
pub mod faulty;
pub mod images;
pub mod jupyter;
pub mod notebook;
pub mod podman;
pub mod services;
pub mod tools;

pub use images::{cached_layout, push_layout};
/// The fake Kubernetes API server, a crate of its own; here under its old path for the suites.
pub use labforge_fake_kube as fake_kube;
pub use podman::{Container, Podman};
pub use services::{Registry, S3Server};
pub use tools::{SupportError, locate};

/// Installs the crypto provider the labforge binary uses (ring) for this test process; every HTTP
/// client here, like the product's, relies on the process default.
pub use labforge_fake_kube::init_crypto;

/// The repository root (the suites run scripts and write artifacts relative to it).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default()
}

/// Where suites keep screenshots and logs for people to look at (git-ignored).
pub fn artifacts_dir() -> Result<std::path::PathBuf, SupportError> {
    let dir = repo_root().join("tests/artifacts");
    std::fs::create_dir_all(&dir).map_err(|source| SupportError::Io {
        doing: format!("creating {}", dir.display()),
        source,
    })?;
    Ok(dir)
}

/// Deterministic bytes with no short period that compressors cannot shrink (xorshift): a misplaced
/// part of a blob is noticed, and a layer's size follows its content's.
pub fn noise(len: usize, seed: u32) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state.to_le_bytes()[0]
        })
        .collect()
}

/// Polls `check` every 50 ms until it gives a value, and returns it; fails the test, naming
/// `what`, once `timeout` has passed.
pub async fn eventually<T, F, Fut>(what: &str, timeout: std::time::Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Sends a JSON API request (`body` as JSON when given) and reads the answer as the suites do:
/// its status, and its body as JSON, or as a JSON string when it is not JSON. Both API clients
/// (the embedded mode's signed-in session, the cluster's header-identified user) send through it.
pub async fn send_json(
    request: reqwest::RequestBuilder,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let request = match body {
        Some(body) => request.json(&body),
        None => request,
    };
    let response = request.send().await.expect("the API answers");
    let status = response.status().as_u16();
    let text = response.text().await.expect("the API's answer is read");
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}
