//! Pushing images to an OCI registry through `oci-client`.
//!
//! Order matters for readers of the registry: every blob goes in first (skipped when the registry
//! already has it), then the config, and the manifest, which writes the tag, last. A push that fails
//! part-way therefore never leaves a tag pointing at a missing blob.

use crate::digest::Digest;
use crate::image::{CONFIG_MEDIA_TYPE, ImageConfig, MANIFEST_MEDIA_TYPE};
use crate::layer::LayerDescriptor;
use crate::stall::{self, DEFAULT_STALL_TIMEOUT, Progress, Stalled};
use crate::upload::{BlobSink, StreamedUpload};
use base64::Engine as _;
use futures::{StreamExt, TryStreamExt};
use http::HeaderValue;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::errors::OciErrorCode;
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_CONFIG_MEDIA_TYPE: &str = "application/vnd.docker.container.image.v1+json";
pub const DOCKER_LAYER_MEDIA_TYPE: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
const ACCEPTED_MANIFESTS: &[&str] = &[
    MANIFEST_MEDIA_TYPE,
    "application/vnd.oci.image.index.v1+json",
    DOCKER_MANIFEST_MEDIA_TYPE,
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
/// Attempts per registry request; transient failures (a reset connection, a 5xx) are common.
const ATTEMPTS: u32 = 3;
/// How long connecting to a registry may take. A registry behind an address that drops packets
/// then fails a save in under a minute instead of the system's two minutes per attempt.
/// Requests themselves have no timeout: layers can be large.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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
        source: RegistryAnswer,
    },
    /// No connection (refused, unreachable, timed out): the registry is down or the address is
    /// wrong, whatever the step was.
    #[error(
        "registry {registry} is unreachable ({operation}); check that it runs and the address is right"
    )]
    Unreachable {
        registry: String,
        operation: &'static str,
        #[source]
        source: RegistryAnswer,
    },
    /// The registry wants other credentials than it was given (or some, when it had none).
    /// Registries answer a repository that does not exist this way too when asked anonymously.
    #[error(
        "registry {registry} refused access ({operation}); check the image's name or set \
         LABFORGE_REGISTRY_USER and LABFORGE_REGISTRY_PASSWORD"
    )]
    Refused {
        registry: String,
        operation: &'static str,
        #[source]
        source: RegistryAnswer,
    },
    /// The image (or its repository) is not in the registry.
    #[error(
        "image {reference} is not in registry {registry} ({operation}); check its name and tag"
    )]
    NotFound {
        reference: String,
        registry: String,
        operation: &'static str,
        #[source]
        source: RegistryAnswer,
    },
    /// Connected, but then silent (or no longer taking an upload's bytes) for the stall timeout.
    #[error("registry {registry} stopped answering ({operation})")]
    Stalled {
        registry: String,
        operation: &'static str,
        #[source]
        source: Stalled,
    },
    #[error("image {reference} {problem}")]
    Manifest { reference: String, problem: String },
    #[error("--registry-token-realm {realm:?} is not a URL with a host (https://auth.example.com)")]
    TokenRealm { realm: String },
    #[error("opening layer blob {path}")]
    BlobFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl RegistryError {
    /// `operation` on `registry` (for `reference`) failed with `source`, sorted by what a person
    /// can do about it.
    fn failed(
        registry: String,
        reference: String,
        operation: &'static str,
        source: OciDistributionError,
    ) -> Self {
        let status = answer_status(&source);
        let unreachable = matches!(
            &source,
            OciDistributionError::RequestError(e) if e.is_connect() || e.is_timeout()
        );
        let refused = matches!(
            &source,
            OciDistributionError::AuthenticationFailure(_)
                | OciDistributionError::UnauthorizedError { .. }
        ) || matches!(status, Some(401 | 403))
            || has_code(&source, &[OciErrorCode::Unauthorized, OciErrorCode::Denied]);
        let not_found = matches!(source, OciDistributionError::ImageManifestNotFoundError(_))
            || (status == Some(404) && operation_reads_the_image(operation))
            || has_code(
                &source,
                &[OciErrorCode::ManifestUnknown, OciErrorCode::NameUnknown],
            );
        let source = RegistryAnswer(source);
        if unreachable {
            RegistryError::Unreachable {
                registry,
                operation,
                source,
            }
        } else if refused {
            RegistryError::Refused {
                registry,
                operation,
                source,
            }
        } else if not_found {
            RegistryError::NotFound {
                reference,
                registry,
                operation,
                source,
            }
        } else {
            RegistryError::Registry {
                registry,
                operation,
                source,
            }
        }
    }
}

/// Steps whose 404 means the image is missing (elsewhere a 404 is a blob the registry lacks, or
/// a push it refused).
fn operation_reads_the_image(operation: &str) -> bool {
    operation.contains("manifest") && !operation.contains("writing") && !operation.contains("push")
}

/// The HTTP status the registry answered with, when the error carries one.
fn answer_status(err: &OciDistributionError) -> Option<u16> {
    match err {
        OciDistributionError::ServerError { code, .. } => Some(*code),
        OciDistributionError::UnauthorizedError { .. } => Some(401),
        OciDistributionError::RequestError(e) => e.status().map(|s| s.as_u16()),
        _ => None,
    }
}

fn has_code(err: &OciDistributionError, codes: &[OciErrorCode]) -> bool {
    matches!(err, OciDistributionError::RegistryError { envelope, .. }
        if envelope.errors.iter().any(|e| codes.contains(&e.code)))
}

/// What a registry answered, on one line: its error codes and messages, or the HTTP status, or
/// the transport's error (whose causes follow as the error's sources).
#[derive(Debug)]
pub struct RegistryAnswer(pub OciDistributionError);

impl std::fmt::Display for RegistryAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let first_line = |text: &str| -> String {
            let line = text.lines().next().unwrap_or_default().trim();
            line.chars().take(160).collect()
        };
        match &self.0 {
            OciDistributionError::RegistryError { envelope, .. } => {
                let errors: Vec<String> = envelope
                    .errors
                    .iter()
                    .map(|e| {
                        let code = serde_json::to_value(&e.code)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default();
                        format!("{code}: {}", first_line(&e.message))
                    })
                    .collect();
                f.write_str(&errors.join(", "))
            }
            OciDistributionError::ServerError { code, message, .. } => {
                write!(f, "HTTP {code}: {}", first_line(message))
            }
            OciDistributionError::UnauthorizedError { .. } => f.write_str("HTTP 401"),
            OciDistributionError::AuthenticationFailure(detail) => {
                write!(f, "authentication failed: {}", first_line(detail))
            }
            OciDistributionError::GenericError(detail) => {
                f.write_str(&first_line(detail.as_deref().unwrap_or("no detail")))
            }
            // The status, not reqwest's "HTTP status client error (...) for url (...)".
            OciDistributionError::RequestError(e) => match e.status() {
                Some(status) => write!(f, "HTTP {status}"),
                None => {
                    let text = e.to_string();
                    f.write_str(&first_line(
                        text.split(" for url (").next().unwrap_or(&text),
                    ))
                }
            },
            other => f.write_str(&first_line(&other.to_string())),
        }
    }
}

impl std::error::Error for RegistryAnswer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            // "error sending request" alone does not say what went wrong: its causes do.
            OciDistributionError::RequestError(e) if e.status().is_none() => {
                std::error::Error::source(e)
            }
            OciDistributionError::IoError(e) => std::error::Error::source(e),
            _ => None,
        }
    }
}

/// How to reach registries.
#[derive(Clone, Default)]
pub struct RegistryOptions {
    /// Registries (`host[:port]`) spoken to over plain HTTP, like a local test registry.
    pub insecure: Vec<String>,
    /// Basic-auth credentials for the registry a save pushes to, and only for it: a base image
    /// on another registry is read anonymously (see [`RegistryClient::new`]). Anonymous when
    /// absent.
    pub credentials: Option<(String, String)>,
    /// Token services (`scheme://host[:port]`) on another origin than the target registry that
    /// may receive the credentials when the registry names one as its realm (Docker Hub's
    /// `https://auth.docker.io`). A realm on the registry's own origin needs no entry; any other
    /// is asked for a token anonymously.
    pub trusted_token_realms: Vec<String>,
    /// How long a registry may be silent before the save fails (see [`crate::stall`]);
    /// [`DEFAULT_STALL_TIMEOUT`] when absent.
    pub stall_timeout: Option<Duration>,
}

// Written by hand so that the password never reaches a log line.
impl std::fmt::Debug for RegistryOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryOptions")
            .field("insecure", &self.insecure)
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .field("trusted_token_realms", &self.trusted_token_realms)
            .field("stall_timeout", &self.stall_timeout)
            .finish_non_exhaustive()
    }
}

/// A layer to push: its descriptor, the compressed blob on disk, and the upload that carried it
/// to the registry while it was written, if one was started.
pub struct LayerBlob {
    pub descriptor: LayerDescriptor,
    pub path: PathBuf,
    pub streamed: Option<StreamedUpload>,
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
    /// The credentials and the registry (`host[:port]`, as references resolve it) they are for.
    credentials: Option<BoundCredentials>,
    /// Origins of token services outside the target registry trusted with the credentials.
    trusted_token_realms: Vec<reqwest::Url>,
    /// What the target registry gets, decided once (see [`RegistryClient::target_auth`]):
    /// oci-client keeps the first `RegistryAuth` it is given for a registry, so every request
    /// to one registry must carry the same.
    target_auth: tokio::sync::OnceCell<RegistryAuth>,
    protocol: ClientProtocol,
    stall_timeout: Duration,
}

/// Credentials with the one registry they may be sent to.
struct BoundCredentials {
    registry: String,
    user: String,
    password: String,
}

impl RegistryClient {
    /// A client for a save that pushes to `target`: the credentials, if any, are bound to
    /// `target`'s registry. Every other registry (a base image's, say, which the notebook's
    /// owner chose) is spoken to anonymously, and so is a token service that the target
    /// registry names on another origin unless `options` trusts it.
    pub fn new(options: &RegistryOptions, target: &str) -> Result<Self, RegistryError> {
        let target = parse_reference(target)?;
        let protocol = if options.insecure.is_empty() {
            ClientProtocol::Https
        } else {
            ClientProtocol::HttpsExcept(options.insecure.clone())
        };
        let credentials = options
            .credentials
            .as_ref()
            .map(|(user, password)| BoundCredentials {
                registry: target.resolve_registry().to_owned(),
                user: user.clone(),
                password: password.clone(),
            });
        let trusted_token_realms = options
            .trusted_token_realms
            .iter()
            .map(|realm| {
                reqwest::Url::parse(realm)
                    .ok()
                    .filter(|url| url.has_host())
                    .map(|url| origin(&url))
                    .ok_or_else(|| RegistryError::TokenRealm {
                        realm: realm.clone(),
                    })
            })
            .collect::<Result<_, _>>()?;
        let client = Client::new(ClientConfig {
            protocol: protocol.clone(),
            // One streamed PUT per blob: chunked uploads cost a round trip per chunk, which made
            // pushing a large layer several times slower than writing it (see bench/README.md).
            use_monolithic_push: true,
            connect_timeout: Some(CONNECT_TIMEOUT),
            ..Default::default()
        });
        Ok(Self {
            client,
            credentials,
            trusted_token_realms,
            target_auth: tokio::sync::OnceCell::new(),
            protocol,
            stall_timeout: options.stall_timeout.unwrap_or(DEFAULT_STALL_TIMEOUT),
        })
    }

    /// What `reference`'s registry is given: the credentials only when it is the registry they
    /// are bound to (and its token realm may have them), anonymous otherwise.
    async fn auth_for(&self, reference: &Reference) -> Result<RegistryAuth, RegistryError> {
        match &self.credentials {
            Some(credentials) if credentials.registry == reference.resolve_registry() => self
                .target_auth
                .get_or_try_init(|| self.target_auth(reference, credentials))
                .await
                .cloned(),
            _ => Ok(RegistryAuth::Anonymous),
        }
    }

    /// Asks the target registry how it authenticates (`GET /v2/`), as oci-client is about to,
    /// and gives it the credentials unless it names a token realm on another origin that is not
    /// trusted: oci-client sends them to whatever realm the registry names. A registry that
    /// answers differently later gains nothing it could not have had by asking for Basic auth.
    async fn target_auth(
        &self,
        reference: &Reference,
        credentials: &BoundCredentials,
    ) -> Result<RegistryAuth, RegistryError> {
        let registry = reference.resolve_registry();
        let scheme = scheme_for(&self.protocol, registry);
        let url = format!("{scheme}://{registry}/v2/");
        let registry_origin = reqwest::Url::parse(&url).map_err(|_| RegistryError::Manifest {
            reference: reference.whole(),
            problem: format!("names a registry that is no URL host: {registry:?}"),
        })?;
        // Its own client: oci-client lends none. Redirects are not followed, as oci-client's
        // challenge is read from the first answer too.
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|err| {
                RegistryError::failed(
                    registry.to_owned(),
                    reference.whole(),
                    "signing in",
                    err.into(),
                )
            })?;
        let answer = self
            .exchange(
                reference,
                "signing in",
                None,
                retrying(|| async {
                    http.get(url.as_str())
                        .send()
                        .await
                        .map_err(OciDistributionError::from)
                }),
            )
            .await?;
        let realm = answer
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(bearer_realm);
        let basic = RegistryAuth::Basic(credentials.user.clone(), credentials.password.clone());
        let Some(realm) = realm else {
            // Basic auth, or none: oci-client sends it to this registry's own origin only.
            return Ok(basic);
        };
        match realm_trust(
            &realm,
            &origin(&registry_origin),
            &self.trusted_token_realms,
        ) {
            RealmTrust::Trusted => Ok(basic),
            RealmTrust::Foreign => {
                tracing::warn!(
                    %realm,
                    "registry {registry} sends clients to a token service on another origin: \
                     asking it for a token anonymously; trust it explicitly \
                     (--registry-token-realm) to send it the credentials"
                );
                Ok(RegistryAuth::Anonymous)
            }
        }
    }

    /// `work`, one registry operation (its retries included), failed as
    /// [`RegistryError::Stalled`] once the registry has been silent for the stall timeout;
    /// `progress` is that of the upload the operation carries, if any.
    async fn exchange<T>(
        &self,
        reference: &Reference,
        operation: &'static str,
        progress: Option<&Progress>,
        work: impl Future<Output = Result<T, OciDistributionError>>,
    ) -> Result<T, RegistryError> {
        match stall::within(self.stall_timeout, progress, work).await {
            Ok(done) => done.map_err(failure(reference)(operation)),
            Err(source) => Err(RegistryError::Stalled {
                registry: reference.resolve_registry().to_owned(),
                operation,
                source,
            }),
        }
    }

    /// Opens an upload into `target`'s repository that takes the layer as it is written. `None`
    /// when the registry will not open one; the layer is then uploaded from disk when complete.
    pub async fn start_upload(&self, target: &str) -> Option<(StreamedUpload, BlobSink)> {
        let reference = parse_reference(target).ok()?;
        let auth = match self.auth_for(&reference).await {
            Ok(auth) => auth,
            Err(err) => {
                tracing::debug!("no streamed upload, authentication failed: {err}");
                return None;
            }
        };
        let signed_in = self.client.auth(&reference, &auth, RegistryOperation::Push);
        let authorization = match self
            .exchange(&reference, "signing in", None, signed_in)
            .await
        {
            Ok(Some(token)) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {token}")).ok()?;
                value.set_sensitive(true);
                Some(value)
            }
            Ok(None) => match &auth {
                RegistryAuth::Basic(user, password) => {
                    let encoded = base64::engine::general_purpose::STANDARD
                        .encode(format!("{user}:{password}"));
                    let mut value = HeaderValue::from_str(&format!("Basic {encoded}")).ok()?;
                    value.set_sensitive(true);
                    Some(value)
                }
                _ => None,
            },
            Err(err) => {
                tracing::debug!("no streamed upload, authentication failed: {err}");
                return None;
            }
        };
        let registry = reference.resolve_registry();
        let mut url = reqwest::Url::parse(&format!(
            "{}://{registry}/v2/{}/blobs/uploads/",
            scheme_for(&self.protocol, registry),
            reference.repository()
        ))
        .ok()?;
        if let Some(namespace) = reference.namespace() {
            url.query_pairs_mut().append_pair("ns", namespace);
        }
        // Its own HTTP client, built only by saves that write a layer: oci-client does not
        // offer streamed uploads (see `crate::upload`) nor lend its client.
        let http = match reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
        {
            Ok(http) => http,
            Err(err) => {
                tracing::debug!("no streamed upload, no HTTP client: {err}");
                return None;
            }
        };
        match StreamedUpload::start(http, url, authorization, self.stall_timeout).await {
            Ok(started) => Some(started),
            Err(err) => {
                tracing::debug!("no streamed upload: {err}");
                None
            }
        }
    }

    /// Reads `image`'s manifest (choosing this machine's platform from an index) and config.
    pub async fn resolve(&self, image: &str) -> Result<ParentImage, RegistryError> {
        let reference = parse_reference(image)?;
        let auth = self.auth_for(&reference).await?;
        let (bytes, digest) = self
            .exchange(
                &reference,
                "reading the base image manifest",
                None,
                self.client
                    .pull_manifest_raw(&reference, &auth, ACCEPTED_MANIFESTS),
            )
            .await?;
        let mut manifest: Value =
            serde_json::from_slice(&bytes).map_err(|_| RegistryError::Manifest {
                reference: image.to_owned(),
                problem: "is not JSON".into(),
            })?;
        let mut manifest_digest = digest;
        if manifest["manifests"].is_array() {
            let chosen = manifest["manifests"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|m| {
                    m["platform"]["os"] == "linux"
                        && m["platform"]["architecture"] == crate::image::oci_architecture()
                })
                .and_then(|m| m["digest"].as_str())
                .ok_or_else(|| RegistryError::Manifest {
                    reference: image.to_owned(),
                    problem: format!(
                        "has no linux/{} image in its index",
                        crate::image::oci_architecture()
                    ),
                })?
                .to_owned();
            let by_digest = reference.clone_with_digest(chosen);
            let (bytes, digest) = self
                .exchange(
                    &reference,
                    "reading the platform manifest",
                    None,
                    self.client
                        .pull_manifest_raw(&by_digest, &auth, ACCEPTED_MANIFESTS),
                )
                .await?;
            manifest = serde_json::from_slice(&bytes).map_err(|_| RegistryError::Manifest {
                reference: image.to_owned(),
                problem: "platform manifest is not JSON".into(),
            })?;
            manifest_digest = digest;
        }
        let config_descriptor =
            descriptor_of(&manifest["config"]).ok_or_else(|| RegistryError::Manifest {
                reference: image.to_owned(),
                problem: "has no config descriptor".into(),
            })?;
        let mut config_bytes = Vec::new();
        self.exchange(
            &reference,
            "reading the base image config",
            None,
            self.client
                .pull_blob(&reference, &config_descriptor, &mut config_bytes),
        )
        .await?;
        let config =
            ImageConfig::from_json(&config_bytes).map_err(|err| RegistryError::Manifest {
                reference: image.to_owned(),
                problem: err.to_string(),
            })?;
        let docker = manifest["mediaType"] == DOCKER_MANIFEST_MEDIA_TYPE
            || manifest["config"]["mediaType"] == DOCKER_CONFIG_MEDIA_TYPE;
        Ok(ParentImage {
            reference,
            manifest_digest: Digest::parse(&manifest_digest).ok_or_else(|| {
                RegistryError::Manifest {
                    reference: image.to_owned(),
                    problem: format!("has a malformed digest {manifest_digest:?}"),
                }
            })?,
            manifest,
            config,
            docker,
        })
    }

    /// The compressed bytes of one of `parent`'s layers, as a stream.
    pub async fn layer_stream(
        &self,
        parent: &ParentImage,
        layer: &Value,
    ) -> Result<futures::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>, RegistryError>
    {
        let descriptor = descriptor_of(layer).ok_or_else(|| RegistryError::Manifest {
            reference: parent.reference.whole(),
            problem: "has a malformed layer descriptor".into(),
        })?;
        let sized = self
            .exchange(
                &parent.reference,
                "downloading a base layer",
                None,
                self.client.pull_blob_stream(&parent.reference, &descriptor),
            )
            .await?;
        let registry = parent.reference.resolve_registry();
        Ok(stall::moving(
            self.stall_timeout,
            sized.stream,
            format!("registry {registry} stopped sending a base layer"),
        )
        .boxed())
    }

    /// Pushes an image: `parent`'s layers (present already, mounted across repositories, or
    /// copied from another registry), the new layer, the config, and last the manifest that tags
    /// `target`. Each blob upload is retried; the tag is written only when every blob is in.
    pub async fn push_image(
        &self,
        target: &str,
        config: &ImageConfig,
        parent: Option<&ParentImage>,
        layer: Option<LayerBlob>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<PushedImage, RegistryError> {
        let reference = parse_reference(target)?;
        let auth = self.auth_for(&reference).await?;
        self.exchange(
            &reference,
            "signing in",
            None,
            retrying(|| self.client.auth(&reference, &auth, RegistryOperation::Push)),
        )
        .await?;

        let mut layers: Vec<Value> = Vec::new();
        if let Some(parent) = parent {
            for descriptor in parent.manifest["layers"].as_array().into_iter().flatten() {
                self.ensure_parent_blob(&reference, parent, descriptor)
                    .await?;
                layers.push(descriptor.clone());
            }
        }
        let mut uploaded_layers = 0;
        if let Some(layer) = layer {
            // The caller picks the layer's media type with its compression (Docker's for a
            // Docker parent, see `save`): the descriptor is written as given.
            layers.push(json!({
                "mediaType": layer.descriptor.media_type,
                "digest": layer.descriptor.digest.as_str(),
                "size": layer.descriptor.size,
            }));
            if self.push_layer_blob(&reference, layer).await? {
                uploaded_layers += 1;
            }
        }

        let docker = parent.is_some_and(|p| p.docker);
        let config_bytes = config.to_bytes();
        let config_digest = Digest::of(&config_bytes);
        let exists = self
            .exchange(
                &reference,
                "checking the config blob",
                None,
                retrying(|| self.client.blob_exists(&reference, config_digest.as_str())),
            )
            .await?;
        if !exists {
            self.exchange(
                &reference,
                "uploading the config blob",
                None,
                retrying(|| {
                    self.client
                        .push_blob(&reference, config_bytes.clone(), config_digest.as_str())
                }),
            )
            .await?;
        }

        let mut manifest = json!({
            "schemaVersion": 2,
            "mediaType": if docker { DOCKER_MANIFEST_MEDIA_TYPE } else { MANIFEST_MEDIA_TYPE },
            "config": {
                "mediaType": if docker { DOCKER_CONFIG_MEDIA_TYPE } else { CONFIG_MEDIA_TYPE },
                "digest": config_digest.as_str(),
                "size": config_bytes.len(),
            },
            "layers": layers,
        });
        if !docker && !annotations.is_empty() {
            manifest["annotations"] = json!(annotations);
        }
        let manifest_bytes = serde_json::to_vec(&manifest).unwrap_or_default();
        let manifest_digest = Digest::of(&manifest_bytes);
        let media_type = if docker {
            DOCKER_MANIFEST_MEDIA_TYPE
        } else {
            MANIFEST_MEDIA_TYPE
        };
        self.exchange(
            &reference,
            "writing the manifest",
            None,
            retrying(|| {
                self.client.push_manifest_raw(
                    &reference,
                    manifest_bytes.clone(),
                    http::HeaderValue::from_static(media_type),
                )
            }),
        )
        .await?;
        Ok(PushedImage {
            reference: reference.whole(),
            manifest_digest,
            uploaded_layers,
        })
    }

    /// Makes one of the parent's layers present in `target`'s repository without re-uploading it
    /// when the registry can avoid that: HEAD, then a cross-repository mount, then a copy.
    async fn ensure_parent_blob(
        &self,
        target: &Reference,
        parent: &ParentImage,
        descriptor: &Value,
    ) -> Result<(), RegistryError> {
        let digest = descriptor["digest"].as_str().unwrap_or_default();
        if self
            .exchange(
                target,
                "checking a base layer",
                None,
                retrying(|| self.client.blob_exists(target, digest)),
            )
            .await?
        {
            return Ok(());
        }
        if parent.reference.resolve_registry() == target.resolve_registry()
            && self
                .exchange(
                    target,
                    "mounting a base layer",
                    None,
                    self.client.mount_blob(target, &parent.reference, digest),
                )
                .await
                .is_ok()
            && self
                .exchange(
                    target,
                    "checking a mounted base layer",
                    None,
                    self.client.blob_exists(target, digest),
                )
                .await
                .unwrap_or(false)
        {
            tracing::debug!(%digest, "base layer mounted from {}", parent.reference.repository());
            return Ok(());
        }
        let size = descriptor["size"].as_u64();
        let progress = Progress::default();
        self.exchange(
            target,
            "copying a base layer",
            Some(&progress),
            retrying(|| async {
                let stream = self
                    .layer_stream(parent, descriptor)
                    .await
                    .map_err(|err| OciDistributionError::GenericError(Some(err.to_string())))?;
                let progress = progress.clone();
                self.client
                    .push_blob_stream(
                        target,
                        stream
                            .inspect(move |_| progress.mark())
                            .map_err(OciDistributionError::IoError),
                        digest,
                        size,
                    )
                    .await
            }),
        )
        .await?;
        Ok(())
    }

    /// Whether `target`'s repository has the blob (any failure counts as no).
    pub async fn has_blob(&self, target: &str, digest: &Digest) -> bool {
        let Ok(reference) = parse_reference(target) else {
            return false;
        };
        let Ok(auth) = self.auth_for(&reference).await else {
            return false;
        };
        let signed_in = self.client.auth(&reference, &auth, RegistryOperation::Push);
        self.exchange(&reference, "signing in", None, signed_in)
            .await
            .is_ok()
            && self
                .exchange(
                    &reference,
                    "checking a blob",
                    None,
                    self.client.blob_exists(&reference, digest.as_str()),
                )
                .await
                .unwrap_or(false)
    }

    /// Completes the layer's streamed upload or, failing that, streams it from disk unless the
    /// registry has it. Returns whether it was uploaded.
    async fn push_layer_blob(
        &self,
        reference: &Reference,
        layer: LayerBlob,
    ) -> Result<bool, RegistryError> {
        let digest = layer.descriptor.digest.as_str();
        if let Some(streamed) = layer.streamed {
            match streamed
                .finish(&layer.descriptor.digest, layer.descriptor.size)
                .await
            {
                Ok(()) => {
                    tracing::info!(%digest, "layer uploaded while it was written");
                    return Ok(true);
                }
                Err(err) => tracing::warn!(
                    "streamed upload of the layer failed ({err}); uploading it again from disk"
                ),
            }
        }
        let present = self
            .exchange(
                reference,
                "checking the layer blob",
                None,
                self.client.blob_exists(reference, digest),
            )
            .await?;
        if present {
            tracing::debug!(%digest, "layer already in the registry");
            return Ok(false);
        }
        open_blob(&layer.path).await?;
        let progress = Progress::default();
        self.exchange(
            reference,
            "uploading a layer blob",
            Some(&progress),
            retrying(|| async {
                let file = tokio::fs::File::open(&layer.path)
                    .await
                    .map_err(OciDistributionError::IoError)?;
                let progress = progress.clone();
                let stream = tokio_util::io::ReaderStream::with_capacity(file, 1 << 20)
                    .inspect(move |_| progress.mark())
                    .map_err(OciDistributionError::IoError);
                self.client
                    .push_blob_stream(reference, stream, digest, Some(layer.descriptor.size))
                    .await
            }),
        )
        .await?;
        Ok(true)
    }
}

/// An image a new layer goes on top of.
#[derive(Clone, Debug)]
pub struct ParentImage {
    pub reference: Reference,
    /// The platform manifest (never an index), as JSON so that layer annotations survive.
    pub manifest: Value,
    pub manifest_digest: Digest,
    pub config: ImageConfig,
    /// Docker schema 2 media types: the new layer must be gzip with Docker's media type.
    pub docker: bool,
}

impl ParentImage {
    pub fn layers(&self) -> Vec<Value> {
        self.manifest["layers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

fn descriptor_of(value: &Value) -> Option<OciDescriptor> {
    Some(OciDescriptor {
        media_type: value["mediaType"].as_str()?.to_owned(),
        digest: value["digest"].as_str()?.to_owned(),
        size: value["size"].as_i64()?,
        ..Default::default()
    })
}

/// The realm of the first Bearer challenge in a `WWW-Authenticate` value, read the way
/// oci-client reads it (same parser, first header, first Bearer challenge), so that the realm
/// judged here is the one oci-client would send the credentials to.
fn bearer_realm(value: &HeaderValue) -> Option<String> {
    let text = value.to_str().ok()?;
    http_auth::parser::ChallengeParser::new(text)
        .filter_map(Result::ok)
        .filter(|challenge| challenge.scheme.eq_ignore_ascii_case("Bearer"))
        .find_map(|challenge| {
            // The last `realm` parameter, as oci-client's loop keeps overwriting it.
            challenge
                .params
                .iter()
                .rev()
                .find(|(key, _)| key.eq_ignore_ascii_case("realm"))
                .map(|(_, value)| value.to_unescaped())
        })
}

/// Whether a token realm may receive the target registry's credentials.
#[derive(Debug, PartialEq, Eq)]
enum RealmTrust {
    /// On the registry's own origin (scheme, host and port), or explicitly trusted.
    Trusted,
    /// Anywhere else, including a realm that is no URL.
    Foreign,
}

fn realm_trust(
    realm: &str,
    registry_origin: &reqwest::Url,
    trusted: &[reqwest::Url],
) -> RealmTrust {
    let Ok(realm) = reqwest::Url::parse(realm) else {
        return RealmTrust::Foreign;
    };
    let realm = origin(&realm);
    if realm == *registry_origin || trusted.contains(&realm) {
        RealmTrust::Trusted
    } else {
        RealmTrust::Foreign
    }
}

/// `scheme://host:port/` of a URL (the default port left out, as `Url` does).
fn origin(url: &reqwest::Url) -> reqwest::Url {
    let mut origin = url.clone();
    origin.set_path("/");
    origin.set_query(None);
    origin.set_fragment(None);
    // Credentials inside a URL are not part of its origin.
    let _ = origin.set_username("");
    let _ = origin.set_password(None);
    origin
}

/// The scheme oci-client speaks to `registry` with, so that streamed uploads go the same way.
fn scheme_for(protocol: &ClientProtocol, registry: &str) -> &'static str {
    match protocol {
        ClientProtocol::Http => "http",
        ClientProtocol::HttpsExcept(plain) if plain.iter().any(|r| r == registry) => "http",
        _ => "https",
    }
}

fn failure(
    reference: &Reference,
) -> impl Fn(&'static str) -> Box<dyn FnOnce(OciDistributionError) -> RegistryError + Send> + use<>
{
    let registry = reference.resolve_registry().to_owned();
    let whole = reference.whole();
    move |operation| {
        let registry = registry.clone();
        let whole = whole.clone();
        Box::new(move |source| RegistryError::failed(registry, whole, operation, source))
    }
}

/// Runs a registry request up to [`ATTEMPTS`] times, waiting twice as long before each retry.
/// Requests that cannot succeed on a retry (a refused credential, a malformed request) fail at
/// once.
async fn retrying<T, F, Fut>(request: F) -> Result<T, OciDistributionError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, OciDistributionError>>,
{
    use backon::Retryable as _;
    let backoff = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(600))
        .with_factor(2.0)
        .with_max_times(ATTEMPTS as usize - 1);
    request
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(is_transient)
        .notify(|err, wait| {
            // With its causes: "error sending request" alone does not say what went wrong.
            let error = labforge_messages::error_chain(err);
            tracing::warn!(?wait, "registry request failed, retrying: {error}");
        })
        .await
}

fn is_transient(err: &OciDistributionError) -> bool {
    !matches!(
        err,
        OciDistributionError::AuthenticationFailure(_)
            | OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::UrlParseError(_)
            | OciDistributionError::ImageManifestNotFoundError(_)
    )
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A request that fails `failures` times with `error`, then answers its attempt number.
    fn failing(
        failures: u32,
        error: fn() -> OciDistributionError,
    ) -> (
        Arc<AtomicU32>,
        impl FnMut() -> std::future::Ready<Result<u32, OciDistributionError>>,
    ) {
        let attempts = Arc::new(AtomicU32::new(0));
        let counted = attempts.clone();
        let request = move || {
            let attempt = counted.fetch_add(1, Ordering::SeqCst) + 1;
            std::future::ready(if attempt <= failures {
                Err(error())
            } else {
                Ok(attempt)
            })
        };
        (attempts, request)
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_with_growing_waits_then_given_up() {
        let transient = || OciDistributionError::GenericError(Some("connection reset".into()));
        let started = tokio::time::Instant::now();
        let (_, request) = failing(ATTEMPTS - 1, transient);
        assert_eq!(retrying(request).await.unwrap(), ATTEMPTS);
        // 0.6 s, then 1.2 s (the clock is paused: only the waits advance it, each to the next
        // millisecond).
        let waited = started.elapsed().as_millis();
        assert!((1800..1810).contains(&waited), "waited {waited} ms");
        let (attempts, request) = failing(ATTEMPTS, transient);
        assert!(retrying(request).await.is_err());
        assert_eq!(attempts.load(Ordering::SeqCst), ATTEMPTS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_credential_is_not_retried() {
        let refused = || OciDistributionError::AuthenticationFailure("denied".into());
        let (attempts, request) = failing(1, refused);
        assert!(matches!(
            retrying(request).await,
            Err(OciDistributionError::AuthenticationFailure(_))
        ));
        assert_eq!(attempts.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn debug_output_never_shows_the_password() {
        let options = RegistryOptions {
            insecure: vec![],
            credentials: Some(("alice".into(), "s3cret-pa55".into())),
            trusted_token_realms: vec![],
            stall_timeout: None,
        };
        let shown = format!("{options:?}");
        assert!(
            shown.contains("alice") && !shown.contains("s3cret-pa55"),
            "{shown}"
        );
    }

    fn url(text: &str) -> reqwest::Url {
        reqwest::Url::parse(text).expect("test URL")
    }

    #[test]
    fn realm_is_read_as_oci_client_reads_it() {
        let header = |text: &'static str| HeaderValue::from_static(text);
        assert_eq!(
            bearer_realm(&header(
                r#"Bearer realm="https://auth.example/token",service="r""#
            )),
            Some("https://auth.example/token".into())
        );
        // The first Bearer challenge with a realm, after any other scheme.
        assert_eq!(
            bearer_realm(&header(
                r#"Basic realm="x", Bearer service="r", Bearer realm="https://b.example/t""#
            )),
            Some("https://b.example/t".into())
        );
        assert_eq!(bearer_realm(&header(r#"Basic realm="registry""#)), None);
    }

    #[test]
    fn only_the_registrys_own_origin_or_a_trusted_one_is_a_trusted_realm() {
        let registry = origin(&url("https://registry.example:5000/v2/"));
        let trusted = [origin(&url("https://auth.example"))];
        for realm in [
            "https://registry.example:5000/token",
            "https://registry.example:5000/auth/token?x=1",
            "https://auth.example/token",
            "https://auth.example:443/token",
        ] {
            assert_eq!(
                realm_trust(realm, &registry, &trusted),
                RealmTrust::Trusted,
                "{realm}"
            );
        }
        for realm in [
            // Another port, a downgrade to plain HTTP, another host, a look-alike, no URL.
            "https://registry.example:5001/token",
            "http://registry.example:5000/token",
            "https://registry.example.evil/token",
            "https://user@evil.example/token",
            "http://auth.example/token",
            "/token",
        ] {
            assert_eq!(
                realm_trust(realm, &registry, &trusted),
                RealmTrust::Foreign,
                "{realm}"
            );
        }
    }

    #[test]
    fn malformed_reference_is_named() {
        let err = parse_reference("Not A Reference!").unwrap_err();
        assert!(err.to_string().contains("Not A Reference!"), "{err}");
    }
}
