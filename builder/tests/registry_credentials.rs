//! Registry credentials go only to the registry they were given for.
//!
//! A real registry never tells who sent it what, so these registries are fakes that record the
//! `Authorization` header of every request: a base registry the notebook's owner could run, and
//! token services on and off the target registry's origin.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use labforge_builder::Digest;
use labforge_builder::registry::{RegistryClient, RegistryOptions};
use sha2::{Digest as _, Sha256};
use std::sync::{Arc, Mutex};

const USER: &str = "pusher";
const PASSWORD: &str = "only-for-the-target";

/// Every request a fake received: its path and `Authorization` header.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

#[derive(Clone)]
struct Fake {
    seen: Seen,
    /// The `WWW-Authenticate` value `/v2/` answers 401 with; `{origin}` becomes the fake's own.
    challenge: Arc<Mutex<String>>,
    origin: String,
}

/// A registry and token service in one: `/v2/` challenges, `/token` hands out a token, and one
/// image (`lib/base:1`, a config and no layers) is served to anyone.
struct FakeRegistry {
    fake: Fake,
    task: tokio::task::JoinHandle<()>,
}

const CONFIG: &str =
    r#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},"config":{}}"#;

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn manifest() -> String {
    format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":{}}},"layers":[]}}"#,
        sha256(CONFIG.as_bytes()),
        CONFIG.len()
    )
}

impl FakeRegistry {
    async fn start(challenge: &str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let origin = format!(
            "127.0.0.1:{}",
            listener.local_addr().expect("bound address").port()
        );
        let fake = Fake {
            seen: Seen::default(),
            challenge: Arc::new(Mutex::new(challenge.to_owned())),
            origin,
        };
        let app = Router::new()
            .route("/v2/", get(version))
            .route("/token", get(token))
            .route("/v2/{*rest}", get(content).head(content))
            .with_state(fake.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { fake, task }
    }

    /// `host:port`, the registry part of references.
    fn host(&self) -> &str {
        &self.fake.origin
    }

    fn seen(&self) -> Vec<(String, Option<String>)> {
        self.fake.seen.lock().expect("seen").clone()
    }

    /// Requests that carried the credentials (as Basic auth; a Bearer token is no password).
    fn credentialed(&self) -> Vec<String> {
        self.seen()
            .into_iter()
            .filter(|(_, auth)| auth.as_deref().is_some_and(carries_password))
            .map(|(path, _)| path)
            .collect()
    }
}

impl Drop for FakeRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn carries_password(authorization: &str) -> bool {
    use base64::Engine as _;
    let Some(encoded) = authorization.strip_prefix("Basic ") else {
        return false;
    };
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .is_ok_and(|decoded| decoded == format!("{USER}:{PASSWORD}").as_bytes())
}

fn record(fake: &Fake, path: &str, headers: &HeaderMap) {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    fake.seen
        .lock()
        .expect("seen")
        .push((path.to_owned(), auth));
}

async fn version(State(fake): State<Fake>, headers: HeaderMap) -> Response {
    record(&fake, "/v2/", &headers);
    if headers.contains_key(header::AUTHORIZATION) {
        return StatusCode::OK.into_response();
    }
    let challenge = fake
        .challenge
        .lock()
        .expect("challenge")
        .replace("{origin}", &fake.origin);
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, challenge)],
    )
        .into_response()
}

async fn token(State(fake): State<Fake>, headers: HeaderMap) -> Response {
    record(&fake, "/token", &headers);
    (
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"token":"t0ken"}"#,
    )
        .into_response()
}

async fn content(
    State(fake): State<Fake>,
    Path(rest): Path<String>,
    headers: HeaderMap,
) -> Response {
    record(&fake, &format!("/v2/{rest}"), &headers);
    let manifest = manifest();
    if rest.ends_with("/manifests/1") {
        let digest = sha256(manifest.as_bytes());
        return (
            [
                (
                    header::CONTENT_TYPE,
                    "application/vnd.oci.image.manifest.v1+json".to_owned(),
                ),
                (
                    header::HeaderName::from_static("docker-content-digest"),
                    digest,
                ),
            ],
            manifest,
        )
            .into_response();
    }
    if rest.ends_with(&format!("/blobs/{}", sha256(CONFIG.as_bytes()))) {
        return CONFIG.into_response();
    }
    StatusCode::NOT_FOUND.into_response()
}

fn options(insecure: &[&FakeRegistry], trusted: Vec<String>) -> RegistryOptions {
    // As `main` does: the HTTP clients are built without a TLS provider of their own.
    let _ = rustls::crypto::ring::default_provider().install_default();
    RegistryOptions {
        insecure: insecure.iter().map(|r| r.host().to_owned()).collect(),
        credentials: Some((USER.into(), PASSWORD.into())),
        trusted_token_realms: trusted,
        stall_timeout: None,
    }
}

/// A base image on another registry is read without the target's credentials, whichever way
/// that registry asks for them: Basic, or a token service it names (its own here).
#[tokio::test]
async fn base_registry_and_its_token_realm_get_no_credentials() {
    for challenge in [
        r#"Basic realm="base""#,
        r#"Bearer realm="http://{origin}/token",service="base""#,
    ] {
        let base = FakeRegistry::start(challenge).await;
        let target = FakeRegistry::start(r#"Basic realm="target""#).await;
        let client = RegistryClient::new(
            &options(&[&base, &target], vec![]),
            &format!("{}/team/saved:1", target.host()),
        )
        .expect("client");
        let parent = client
            .resolve(&format!("{}/lib/base:1", base.host()))
            .await
            .expect("the base image resolves anonymously");
        assert!(parent.layers().is_empty());
        assert!(
            base.seen()
                .iter()
                .any(|(path, _)| path.ends_with("/manifests/1")),
            "the base registry was asked: {:?}",
            base.seen()
        );
        assert_eq!(
            base.credentialed(),
            Vec::<String>::new(),
            "{challenge}: the base registry received the target's credentials"
        );
    }
}

/// The target registry itself gets them, and so does a token service on its own origin.
#[tokio::test]
async fn target_registry_and_its_own_realm_get_the_credentials() {
    for challenge in [
        r#"Basic realm="target""#,
        r#"Bearer realm="http://{origin}/token",service="target""#,
    ] {
        let target = FakeRegistry::start(challenge).await;
        let client = RegistryClient::new(
            &options(&[&target], vec![]),
            &format!("{}/team/saved:1", target.host()),
        )
        .expect("client");
        client
            .has_blob(
                &format!("{}/team/saved:1", target.host()),
                &Digest::of(b"any"),
            )
            .await;
        assert!(
            !target.credentialed().is_empty(),
            "{challenge}: the credentials were not used: {:?}",
            target.seen()
        );
    }
}

/// A token service the target registry names on another origin is asked anonymously, unless
/// it was trusted explicitly.
#[tokio::test]
async fn foreign_token_realm_gets_credentials_only_when_trusted() {
    let realm = FakeRegistry::start("Basic").await;
    let target = FakeRegistry::start(&format!(
        r#"Bearer realm="http://{}/token",service="target""#,
        realm.host()
    ))
    .await;
    let reference = format!("{}/team/saved:1", target.host());

    let client = RegistryClient::new(&options(&[&target], vec![]), &reference).expect("client");
    client.has_blob(&reference, &Digest::of(b"any")).await;
    let asked: Vec<_> = realm
        .seen()
        .into_iter()
        .filter(|(p, _)| p == "/token")
        .collect();
    assert!(!asked.is_empty(), "the realm was not asked for a token");
    assert!(
        asked.iter().all(|(_, auth)| auth.is_none()),
        "a foreign realm received credentials: {asked:?}"
    );
    assert_eq!(target.credentialed(), Vec::<String>::new());

    let trusted = vec![format!("http://{}", realm.host())];
    let client = RegistryClient::new(&options(&[&target], trusted), &reference).expect("client");
    client.has_blob(&reference, &Digest::of(b"any")).await;
    assert!(
        !realm.credentialed().is_empty(),
        "a trusted realm did not get the credentials: {:?}",
        realm.seen()
    );
}

#[test]
fn a_trusted_realm_must_be_a_url() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut options = RegistryOptions {
        trusted_token_realms: vec!["auth.docker.io".into()],
        ..RegistryOptions::default()
    };
    options.credentials = Some((USER.into(), PASSWORD.into()));
    let err = RegistryClient::new(&options, "registry.example/a:1")
        .err()
        .expect("refused");
    assert!(err.to_string().contains("auth.docker.io"), "{err}");
}
