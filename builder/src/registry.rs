//! Pushing images to an OCI registry through `oci-client`.
//!
//! Order matters for readers of the registry: every blob goes in first (skipped when the registry
//! already has it), then the config, and the manifest, which writes the tag, last. A push that fails
//! part-way therefore never leaves a tag pointing at a missing blob.

use crate::digest::Digest;
use crate::image::{ImageConfig, MANIFEST_MEDIA_TYPE, manifest};
use crate::layer::LayerDescriptor;
use futures::TryStreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("invalid image reference {reference:?}")]
    Reference {
        reference: String,
        #[source]
        source: oci_client::ParseError,
    },
    #[error("registry {registry}: {operation} failed")]
    Registry {
        registry: String,
        operation: &'static str,
        #[source]
        source: OciDistributionError,
    },
    #[error("opening layer blob {path}")]
    BlobFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// How to reach registries.
#[derive(Clone, Default)]
pub struct RegistryOptions {
    /// Registries (`host[:port]`) spoken to over plain HTTP, like a local test registry.
    pub insecure: Vec<String>,
    /// Basic-auth credentials; anonymous when absent.
    pub credentials: Option<(String, String)>,
}

// Written by hand so that the password never reaches a log line.
impl std::fmt::Debug for RegistryOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryOptions")
            .field("insecure", &self.insecure)
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .finish_non_exhaustive()
    }
}

/// A layer to push: its descriptor and the compressed blob on disk.
#[derive(Clone, Debug)]
pub struct LayerBlob {
    pub descriptor: LayerDescriptor,
    pub path: PathBuf,
}

/// What a push did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushedImage {
    pub reference: String,
    pub manifest_digest: Digest,
    /// Layers uploaded by this push; the others were already in the registry.
    pub uploaded_layers: usize,
}

pub struct RegistryClient {
    client: Client,
    auth: RegistryAuth,
}

impl RegistryClient {
    pub fn new(options: &RegistryOptions) -> Self {
        let protocol = if options.insecure.is_empty() {
            ClientProtocol::Https
        } else {
            ClientProtocol::HttpsExcept(options.insecure.clone())
        };
        let auth = match &options.credentials {
            Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
            None => RegistryAuth::Anonymous,
        };
        let client = Client::new(ClientConfig {
            protocol,
            ..Default::default()
        });
        Self { client, auth }
    }

    /// Pushes `layers` (base first), then `config`, then the manifest that tags `target`.
    pub async fn push_image(
        &self,
        target: &str,
        config: &ImageConfig,
        layers: &[LayerBlob],
    ) -> Result<PushedImage, RegistryError> {
        let reference = parse_reference(target)?;
        let failed = |operation| {
            let registry = reference.resolve_registry().to_owned();
            move |source| RegistryError::Registry {
                registry,
                operation,
                source,
            }
        };
        self.client
            .auth(&reference, &self.auth, RegistryOperation::Push)
            .await
            .map_err(failed("authentication"))?;

        let mut uploaded_layers = 0;
        for layer in layers {
            if self.push_blob_file(&reference, layer).await? {
                uploaded_layers += 1;
            }
        }

        let config_bytes = config.to_bytes();
        let config_digest = Digest::of(&config_bytes);
        if !self
            .client
            .blob_exists(&reference, config_digest.as_str())
            .await
            .map_err(failed("checking the config blob"))?
        {
            self.client
                .push_blob(&reference, config_bytes.clone(), config_digest.as_str())
                .await
                .map_err(failed("uploading the config blob"))?;
        }

        let descriptors: Vec<_> = layers.iter().map(|l| l.descriptor.clone()).collect();
        let manifest_bytes =
            serde_json::to_vec(&manifest(&config_bytes, &descriptors)).unwrap_or_default();
        let manifest_digest = Digest::of(&manifest_bytes);
        self.client
            .push_manifest_raw(
                &reference,
                manifest_bytes,
                http::HeaderValue::from_static(MANIFEST_MEDIA_TYPE),
            )
            .await
            .map_err(failed("writing the manifest"))?;
        Ok(PushedImage {
            reference: reference.whole(),
            manifest_digest,
            uploaded_layers,
        })
    }

    /// Streams one blob from disk unless the registry has it. Returns whether it was uploaded.
    async fn push_blob_file(
        &self,
        reference: &Reference,
        layer: &LayerBlob,
    ) -> Result<bool, RegistryError> {
        let registry = || reference.resolve_registry().to_owned();
        let digest = layer.descriptor.digest.as_str();
        let present = self
            .client
            .blob_exists(reference, digest)
            .await
            .map_err(|source| RegistryError::Registry {
                registry: registry(),
                operation: "checking a layer blob",
                source,
            })?;
        if present {
            tracing::debug!(%digest, "layer already in the registry");
            return Ok(false);
        }
        let file = open_blob(&layer.path).await?;
        let stream = tokio_util::io::ReaderStream::with_capacity(file, 1 << 20)
            .map_err(OciDistributionError::IoError);
        self.client
            .push_blob_stream(reference, stream, digest, Some(layer.descriptor.size))
            .await
            .map_err(|source| RegistryError::Registry {
                registry: registry(),
                operation: "uploading a layer blob",
                source,
            })?;
        Ok(true)
    }
}

async fn open_blob(path: &Path) -> Result<tokio::fs::File, RegistryError> {
    tokio::fs::File::open(path)
        .await
        .map_err(|source| RegistryError::BlobFile {
            path: path.to_owned(),
            source,
        })
}

fn parse_reference(target: &str) -> Result<Reference, RegistryError> {
    target
        .parse::<Reference>()
        .map_err(|source| RegistryError::Reference {
            reference: target.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_password() {
        let options = RegistryOptions {
            insecure: vec![],
            credentials: Some(("alice".into(), "s3cret-pa55".into())),
        };
        let shown = format!("{options:?}");
        assert!(
            shown.contains("alice") && !shown.contains("s3cret-pa55"),
            "{shown}"
        );
    }

    #[test]
    fn malformed_reference_is_named() {
        let err = parse_reference("Not A Reference!").unwrap_err();
        assert!(err.to_string().contains("Not A Reference!"), "{err}");
    }
}
