//! Whether an image a user names exists, before a notebook is made or moved onto it: a typo in a
//! tag would otherwise show only as a failed pull, after the notebook exists.
//!
//! Only a definite answer refuses: the registry says it has no such image, or the image has
//! nothing this machine can run. A registry that cannot be reached, or wants credentials this
//! check does not have, is left to whoever pulls (podman with its own logins, or the kubelet with
//! the namespace's pull secrets), which knows more.

use labforge_builder::registry::{RegistryClient, RegistryError, RegistryOptions};
use std::path::PathBuf;
use std::time::Duration;

/// How long a registry may take to answer before the check gives up and lets the image through.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

#[async_trait::async_trait]
pub trait ImageCheck: Send + Sync {
    /// `None` when `image` may be run; else why not, for the `image` field.
    async fn refusal(&self, image: &str) -> Option<String>;
}

/// Asks the image's registry (anonymously, except for the registries `options` names as plain
/// HTTP), after the container engine's own images when there is one.
pub struct RegistryImageCheck {
    pub options: RegistryOptions,
    /// `podman`/`docker`: an image it already holds runs without a pull.
    pub engine: Option<PathBuf>,
}

impl RegistryImageCheck {
    async fn held_by_engine(&self, image: &str) -> bool {
        let Some(engine) = &self.engine else {
            return false;
        };
        tokio::process::Command::new(engine)
            .args(["image", "inspect", "--format", "{{.Id}}", image])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await
            .is_ok_and(|status| status.success())
    }
}

#[async_trait::async_trait]
impl ImageCheck for RegistryImageCheck {
    async fn refusal(&self, image: &str) -> Option<String> {
        if self.held_by_engine(image).await {
            return None;
        }
        let answer = async {
            let client = RegistryClient::new(&self.options, image)?;
            client.resolve(image).await
        };
        match tokio::time::timeout(ANSWER_TIMEOUT, answer).await {
            Ok(Ok(_)) => None,
            Ok(Err(RegistryError::NotFound { registry, .. })) => Some(format!(
                "{image}: registry {registry} has no such image; check its name and tag"
            )),
            Ok(Err(RegistryError::Manifest { problem, .. })) => Some(format!("{image} {problem}")),
            Ok(Err(other)) => {
                tracing::debug!(%image, error = %labforge_messages::error_chain(&other), "image not checked; left to the pull");
                None
            }
            Err(_) => {
                tracing::debug!(%image, "image not checked: its registry did not answer in time");
                None
            }
        }
    }
}
