//! The JSON API (`/api/...`), documented by the OpenAPI document utoipa generates from these
//! handlers and their types ([`crate::openapi`]). Paths follow Kubeflow's jupyter web
//! app where they fit (`/api/namespaces/<ns>/notebooks...`).
//!
//! Every route but login, health and the OpenAPI document needs a signed-in user. A namespace's
//! routes need a role there ([`extract::Allowed`]); a notebook's own routes (read, events, logs,
//! SSH, ports, shares) are also open to those it is shared with ([`SignedIn::notebook`]); the
//! admin routes need an admin. Bad input is answered 4xx with an
//! [`crate::model::ApiError`] naming the field, before anything is stored. Requests that change
//! something must be JSON, which a cross-site form cannot send, and come from the app's own pages
//! ([`crate::same_origin`]), which keeps out the pages of notebooks that share its site.

pub(crate) mod admin;
pub(crate) mod extract;
mod failure;
pub(crate) mod images;
pub(crate) mod kubeflow;
pub(crate) mod notebooks;
pub(crate) mod ports;
pub(crate) mod quotas;
pub(crate) mod saves;
pub(crate) mod session;
pub(crate) mod ssh;
pub(crate) mod teams;
pub(crate) mod tokens;
mod views;
pub(crate) mod volumes;
pub(crate) mod watch;

use crate::backend::{Access, Backend};
use crate::config::SpawnerConfig;
use crate::saves::Saves;
use crate::sign_in::SignIn;
use crate::users::{LocalAuth, User};
use crate::validate::FieldError;
use crate::workloads::Workloads;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use labforge_proxy::activity::Activity;
use std::sync::Arc;

pub(crate) use extract::ApiQuery;
pub use extract::SignedIn;
pub(crate) use failure::ApiResult;
pub use failure::Failure;
pub(crate) use notebooks::find;
pub(crate) use session::client_address;
pub use views::{WAITING_TO_START, state_of, view};

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 64 * 1024;
/// Set on a notebook stopped by the culler, so users see "culled" rather than "stopped".
pub const STOPPED_BY_ANNOTATION: &str = "labforge.dev/stopped-by";

#[derive(Clone)]
pub struct ApiState {
    pub backend: Arc<dyn Backend>,
    pub access: Arc<dyn Access>,
    /// Local users (embedded mode); `None` where an auth proxy signs users in.
    pub local_users: Option<Arc<LocalAuth>>,
    /// Password checks for [`Self::local_users`].
    pub sign_in: Option<Arc<SignIn>>,
    /// Saves: run here (embedded mode) or as ImageBuilds (a cluster with `--save-registry`);
    /// `None` where saving is not set up.
    pub saves: Option<Arc<dyn Saves>>,
    pub config: Arc<SpawnerConfig>,
    /// Where notebooks run: their logs and volumes are read there.
    pub workloads: Arc<dyn Workloads>,
    pub activity: Arc<Activity>,
    /// Mark cookies `Secure` (served over TLS).
    pub secure_cookies: bool,
    /// Each notebook on its own host; `None`: on the web app's host, under its path.
    pub notebook_links: Option<crate::notebook_sign_in::NotebookLinks>,
    /// Checks an image a user names (neither in the catalog nor saved) before a notebook is made
    /// or moved onto it; `None`: not checked.
    pub image_check: Option<Arc<dyn crate::image_check::ImageCheck>>,
    /// The running notebooks' last sampled resource use; `None`: not measured here.
    pub usage: Option<Arc<crate::usage::UsageBoard>>,
    /// How long without activity a notebook counts as idle (the culling idle time).
    pub idle_after: std::time::Duration,
    /// The path the app is served under; pages link relative to it.
    pub base_path: crate::base_path::BasePath,
    /// Where saves push, `<registry>/<namespace>/…`: an image there belongs to its namespace
    /// ([`crate::image_access`]); `None`: saving is not set up, and no image is anyone's.
    pub saves_registry: Option<crate::image_access::SavesRegistry>,
    /// The catalog's images not ready to run here yet.
    pub preparing: Arc<crate::preparing::ImagesBeingPrepared>,
    /// Where every change and notebook sign-in is recorded ([`crate::audit`]).
    pub audit: Arc<dyn crate::audit::AuditSink>,
}

/// The images a namespace may pick besides the catalog's: its own saves, and those other
/// namespaces shared with it.
struct Runnable {
    shared: Vec<crate::model::SavedImage>,
    /// Every one of them, own and shared.
    images: Vec<String>,
    /// Their manifest digests.
    digests: Vec<String>,
}

impl ApiState {
    async fn runnable_images(&self, ns: &str) -> ApiResult<Runnable> {
        let own = self.backend.saved_images(ns).await?;
        let shared = self.backend.images_shared_with(ns).await?;
        let images = own.iter().chain(&shared).map(|i| i.image.clone()).collect();
        let digests = own
            .iter()
            .chain(&shared)
            .map(|i| i.digest.clone())
            .collect();
        Ok(Runnable {
            shared,
            images,
            digests,
        })
    }

    /// `image` as the engine is to be given it: a catalog image, or one of the namespace's own or
    /// shared saves, as it is; any other fully qualified (`python:3` is
    /// `docker.io/library/python:3`). podman looks a short name or an image ID prefix up among
    /// its local images, another namespace's saves among them, before any registry.
    fn qualified_image(&self, image: &str, runnable: &Runnable) -> String {
        if self.config.in_catalog(image) || runnable.images.iter().any(|i| i == image) {
            return image.to_owned();
        }
        crate::validate::qualified_image(image)
    }

    /// Why `user` may not run `image` in namespace `ns` because it is another namespace's
    /// saved image, not shared with `ns`; asked before anything is asked of the registry, so
    /// the answer is the same whether or not the image exists.
    async fn foreign_image_refusal(
        &self,
        user: &User,
        ns: &str,
        image: &str,
        runnable: &Runnable,
    ) -> ApiResult<Option<FieldError>> {
        let request = crate::image_access::ImageRequest {
            image,
            namespace: ns,
            admin: user.admin,
            in_catalog: self.config.in_catalog(image),
        };
        if request.admin || request.in_catalog {
            return Ok(None);
        }
        let Some(owner) =
            crate::image_access::foreign_owner(self.saves_registry.as_ref(), &request)
        else {
            return Ok(self
                .foreign_digest_owner(ns, image, runnable)
                .await?
                .map(|owner| crate::image_access::refusal(image, &owner, ns)));
        };
        let shared = runnable
            .shared
            .iter()
            .any(|s| s.namespace == owner && s.image == image);
        if shared || !self.keeps_saves(&owner) {
            return Ok(None);
        }
        Ok(Some(crate::image_access::refusal(image, &owner, ns)))
    }

    /// Whether `namespace`'s repositories in the saves registry are that namespace's. In a
    /// cluster, every repository below the saves prefix is. On one machine the registry also
    /// holds the platform's images, under `labforge/` (no user has that name; the catalog's
    /// images elsewhere there pass as the catalog's): every other name is a namespace's, whether
    /// or not such a user exists, so that the answer tells nobody which users do.
    fn keeps_saves(&self, namespace: &str) -> bool {
        self.local_users.is_none() || namespace != crate::users::RESERVED_NAMESPACE
    }

    /// In embedded mode, the namespace whose saved image has the manifest digest `image` is
    /// pinned to, when it is not `ns`'s and was not shared with it: podman runs
    /// `any/name@sha256:<digest>` from whichever local image has that digest.
    async fn foreign_digest_owner(
        &self,
        ns: &str,
        image: &str,
        runnable: &Runnable,
    ) -> ApiResult<Option<String>> {
        let Some((_, digest)) = image.split_once('@') else {
            return Ok(None);
        };
        if self.local_users.is_none() || runnable.digests.iter().any(|d| d == digest) {
            return Ok(None);
        }
        Ok(self
            .backend
            .saved_image_namespaces_with_digest(digest)
            .await?
            .into_iter()
            .find(|owner| owner != ns))
    }

    /// Why `image`, named by a user of `ns`, cannot be run, when the check can tell; catalog
    /// images and the namespace's own and shared saves are trusted.
    async fn image_refusal(&self, image: &str, saved: &[String]) -> Option<FieldError> {
        let check = self.image_check.as_ref()?;
        if self.config.in_catalog(image) || saved.iter().any(|s| s == image) {
            return None;
        }
        check
            .refusal(image)
            .await
            .map(|why| FieldError::new("image", why))
    }
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/api/healthz", get(session::healthz))
        .route("/api/openapi.json", get(session::openapi))
        .route("/api/login", post(session::login))
        .route("/api/logout", post(session::logout))
        .route("/api/whoami", get(session::whoami))
        .route("/api/config", get(session::config))
        .route("/api/admin/notebooks", get(admin::admin_notebooks))
        .route("/api/admin/quotas", get(quotas::admin_quotas))
        .route("/api/admin/audit", get(admin::admin_audit))
        .route(
            "/api/namespaces/{ns}/notebooks",
            get(notebooks::list_notebooks).post(notebooks::create_notebook),
        )
        .route("/api/namespaces/{ns}/watch", get(watch::watch_namespace))
        .route(
            "/api/namespaces/{ns}/notebooks/{name}",
            get(notebooks::get_notebook)
                .patch(notebooks::patch_notebook)
                .delete(notebooks::delete_notebook),
        )
        .route(
            "/api/namespaces/{ns}/notebooks/{name}/events",
            get(notebooks::events),
        )
        .route(
            "/api/namespaces/{ns}/notebooks/{name}/logs",
            get(notebooks::logs),
        )
        .route(
            "/api/namespaces/{ns}/notebooks/{name}/saves",
            post(saves::start_save),
        )
        .route("/api/namespaces/{ns}/saves/{id}", get(saves::follow_save))
        .route(
            "/api/namespaces/{ns}/images",
            get(images::saved_images).delete(images::delete_saved_image),
        )
        .route(
            "/api/namespaces/{ns}/images/sharing",
            axum::routing::put(images::share_saved_image),
        )
        .route("/api/namespaces/{ns}/volumes", get(volumes::list_volumes))
        .route(
            "/api/namespaces/{ns}/quota",
            get(quotas::get_quota).put(quotas::put_quota),
        )
        .route(
            "/api/namespaces/{ns}/volumes/{name}",
            axum::routing::delete(volumes::delete_volume),
        )
        .merge(kubeflow::routes())
        .merge(teams::routes())
        .merge(tokens::routes())
        .merge(ssh::routes())
        .merge(ports::routes())
        .route(
            "/api/{*rest}",
            axum::routing::any(|| async {
                Failure::new(StatusCode::NOT_FOUND, "no such API path")
            }),
        )
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}
