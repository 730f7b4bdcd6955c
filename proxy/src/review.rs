//! Namespace access from Kubernetes RBAC, for the proxy deployed in a cluster.
//!
//! The question is: may this user `update` `notebooks.kubeflow.org` in the namespace? Opening a
//! notebook runs code as its owner, which is what changing it allows: Kubeflow's
//! `kubeflow-edit` contributors and the profile owner may, a `kubeflow-view` contributor (who
//! may only `get` and `list`) may not. RBAC decides, with cluster-wide admins, without a list
//! kept in the proxy's flags. Answers are cached
//! per user and namespace (allowed for longer than denied, so a new grant works within seconds),
//! and concurrent requests for one uncached pair share one review: opening JupyterLab fires a
//! burst of requests that must not become a burst of SubjectAccessReviews.
//!
//! The cache is this module's own rather than moka's: a cached answer is read on every proxied
//! request without a future (`Answer::Now`), which moka's async cache does not offer.

use crate::FastMap;
use crate::authz::{AccessUnknown, Answer, NamespaceAccess};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;

/// Answers kept at most; past it, expired ones go, and if that is not enough, all of them.
const MAX_CACHED: usize = 10_000;

/// How long a review may take before the request is refused (and the next one asks again).
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// How long answers are trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReviewCache {
    pub allowed_for: Duration,
    pub denied_for: Duration,
}

impl Default for ReviewCache {
    fn default() -> Self {
        Self {
            allowed_for: Duration::from_secs(30),
            denied_for: Duration::from_secs(3),
        }
    }
}

/// [`NamespaceAccess`] by SubjectAccessReview.
pub struct ReviewedAccess {
    client: kube::Client,
    shared: BTreeSet<String>,
    cache: ReviewCache,
    /// user → namespace → answer (nested so a lookup needs no owned key).
    answers: Mutex<FastMap<String, FastMap<String, Cached>>>,
}

struct Cached {
    asked: Instant,
    /// Empty while the review is under way; a failed review leaves it empty.
    answer: Arc<OnceCell<bool>>,
}

impl ReviewedAccess {
    pub fn new(client: kube::Client, shared: BTreeSet<String>, cache: ReviewCache) -> Self {
        Self {
            client,
            shared,
            cache,
            answers: Mutex::default(),
        }
    }

    fn fresh(&self, cached: &Cached, now: Instant) -> bool {
        match cached.answer.get() {
            Some(true) => now - cached.asked < self.cache.allowed_for,
            Some(false) => now - cached.asked < self.cache.denied_for,
            // In flight: join it. After a failed review it is empty too, and whoever joins runs
            // the review again.
            None => true,
        }
    }
}

impl NamespaceAccess for ReviewedAccess {
    fn may_use(&self, user: &str, namespace: &str) -> Answer {
        let now = Instant::now();
        let cell = {
            let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(cached) = answers.get(user).and_then(|by_ns| by_ns.get(namespace))
                && self.fresh(cached, now)
            {
                match cached.answer.get() {
                    Some(&allowed) => return Answer::Now(allowed),
                    None => cached.answer.clone(),
                }
            } else {
                if answers.values().map(FastMap::len).sum::<usize>() >= MAX_CACHED {
                    answers.retain(|_, by_ns| {
                        by_ns.retain(|_, cached| self.fresh(cached, now));
                        !by_ns.is_empty()
                    });
                    if answers.values().map(FastMap::len).sum::<usize>() >= MAX_CACHED {
                        answers.clear();
                    }
                }
                let answer = Arc::new(OnceCell::new());
                answers.entry(user.to_owned()).or_default().insert(
                    namespace.to_owned(),
                    Cached {
                        asked: now,
                        answer: answer.clone(),
                    },
                );
                answer
            }
        };
        let client = self.client.clone();
        let (user, namespace) = (user.to_owned(), namespace.to_owned());
        Answer::Later(Box::pin(async move {
            // Fail closed: no answer is no access (as unavailable, not forbidden), and the next
            // request asks again.
            cell.get_or_try_init(|| review(client, &user, &namespace))
                .await
                .copied()
        }))
    }

    fn is_shared(&self, namespace: &str) -> bool {
        self.shared.contains(namespace)
    }
}

/// "May `user` `verb` notebooks.kubeflow.org in `namespace` (every namespace: `None`)?", the
/// question Kubeflow's web apps ask; the web app asks it too.
pub fn notebook_access_review(
    user: &str,
    verb: &str,
    namespace: Option<&str>,
) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            resource_attributes: Some(ResourceAttributes {
                group: Some("kubeflow.org".into()),
                resource: Some("notebooks".into()),
                verb: Some(verb.to_owned()),
                namespace: namespace.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The audit line of a decision on opening `namespace`'s notebooks, in the web app's audit
/// record shape (`labforge_web::audit::AuditRecord`): one per review, so once per user and
/// namespace while the answer is cached, not once per request.
pub fn audit_line(user: &str, namespace: &str, allowed: bool, at: jiff::Timestamp) -> String {
    serde_json::json!({
        "time": at.to_string(),
        "user": user,
        "from": "",
        "action": "notebook access",
        "namespace": namespace,
        "status": if allowed { 200 } else { 403 },
        "result": if allowed { "ok" } else { "refused" },
    })
    .to_string()
}

/// What opening a namespace's notebooks asks of RBAC: to change them (see the module doc).
pub const OPEN_VERB: &str = "update";

/// A review that brings no answer is logged here and returns [`AccessUnknown`].
async fn review(client: kube::Client, user: &str, namespace: &str) -> Result<bool, AccessUnknown> {
    let review = notebook_access_review(user, OPEN_VERB, Some(namespace));
    let api: Api<SubjectAccessReview> = Api::all(client);
    let params = PostParams::default();
    let answer = match tokio::time::timeout(REVIEW_TIMEOUT, api.create(&params, &review)).await {
        Ok(answer) => answer,
        Err(_) => {
            tracing::warn!(
                user,
                namespace,
                "SubjectAccessReview timed out; request refused as unavailable"
            );
            return Err(AccessUnknown);
        }
    };
    match answer {
        Ok(answer) => {
            let allowed = answer.status.is_some_and(|s| s.allowed);
            tracing::debug!(user, namespace, allowed, "SubjectAccessReview");
            tracing::info!(target: "audit", "{}", audit_line(user, namespace, allowed, jiff::Timestamp::now()));
            Ok(allowed)
        }
        Err(err) => {
            tracing::warn!(user, namespace, error = %err, "SubjectAccessReview failed; request refused as unavailable");
            Err(AccessUnknown)
        }
    }
}
