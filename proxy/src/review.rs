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
//! The cache is moka's synchronous one: a cached answer is read on every proxied request without
//! a future (`Answer::Now`). Each answer expires on its own (an allowed one later than a denied
//! one), counted from when it was asked for; a review under way does not expire, so that however
//! short the answers are kept, a burst shares it. Past `MAX_CACHED` answers, the ones used
//! longest ago go, one at a time.

use crate::authz::{AccessUnknown, Answer, NamespaceAccess};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use moka::Equivalent;
use moka::ops::compute::Op;
use moka::policy::EvictionPolicy;
use moka::sync::Cache;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;

/// Answers kept at most; past it, the ones used longest ago go.
const MAX_CACHED: u64 = 10_000;

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

impl ReviewCache {
    /// How much longer `cached` is trusted at `now`; `None` while its review is under way, and
    /// after it failed: whoever comes next joins it, or runs it again.
    fn trusted_for(&self, cached: &Cached, now: Instant) -> Option<Duration> {
        let kept = if *cached.answer.get()? {
            self.allowed_for
        } else {
            self.denied_for
        };
        // Past what an Instant holds: trusted for as long as it stays cached.
        let until = cached.asked.checked_add(kept)?;
        Some(until.saturating_duration_since(now))
    }

    fn fresh(&self, cached: &Cached, now: Instant) -> bool {
        self.trusted_for(cached, now)
            .is_none_or(|left| !left.is_zero())
    }
}

/// Each answer expires when it is no longer trusted, a review under way never.
impl moka::Expiry<(String, String), Cached> for ReviewCache {
    fn expire_after_create(
        &self,
        _: &(String, String),
        cached: &Cached,
        created_at: Instant,
    ) -> Option<Duration> {
        self.trusted_for(cached, created_at)
    }

    fn expire_after_update(
        &self,
        _: &(String, String),
        cached: &Cached,
        updated_at: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        self.trusted_for(cached, updated_at)
    }
}

/// [`NamespaceAccess`] by SubjectAccessReview.
pub struct ReviewedAccess {
    client: kube::Client,
    shared: BTreeSet<String>,
    answers: Answers,
}

/// Hashed as [`crate::FastMap`]s are: a lookup on every request.
type AnswerCache = Cache<(String, String), Cached, foldhash::fast::RandomState>;

/// The answers of reviews, by (user, namespace).
struct Answers {
    cache: AnswerCache,
    trust: ReviewCache,
}

#[derive(Clone)]
struct Cached {
    asked: Instant,
    /// Empty while the review is under way; a failed review leaves it empty.
    answer: Arc<OnceCell<bool>>,
}

/// A (user, namespace) key, borrowed: a lookup needs no owned key. Hashed as the owned one is
/// (each `str` in turn).
#[derive(Hash)]
struct UserNamespace<'a>(&'a str, &'a str);

impl Equivalent<(String, String)> for UserNamespace<'_> {
    fn equivalent(&self, key: &(String, String)) -> bool {
        self.0 == key.0 && self.1 == key.1
    }
}

impl Answers {
    fn new(trust: ReviewCache, max: u64) -> Self {
        Self {
            cache: Cache::builder()
                .max_capacity(max)
                // Least recently used out, never a new pair refused: moka's default (TinyLFU)
                // may not admit a new entry into a full cache, and a burst could then not share
                // the review of its pair.
                .eviction_policy(EvictionPolicy::lru())
                .expire_after(trust)
                .build_with_hasher(foldhash::fast::RandomState::default()),
            trust,
        }
    }

    /// The trusted answer for `user` in `namespace`, or the review to join (or to run, when
    /// nobody has yet).
    fn lookup(&self, user: &str, namespace: &str) -> Result<bool, Pending> {
        let now = Instant::now();
        let cached = match self.cache.get(&UserNamespace(user, namespace)) {
            Some(cached) if self.trust.fresh(&cached, now) => cached,
            _ => self
                .cache
                .entry((user.to_owned(), namespace.to_owned()))
                .or_insert_with_if(
                    || Cached {
                        asked: now,
                        answer: Arc::new(OnceCell::new()),
                    },
                    |cached| !self.trust.fresh(cached, now),
                )
                .into_value(),
        };
        match cached.answer.get() {
            Some(&allowed) => Ok(allowed),
            None => Err(Pending {
                cache: self.cache.clone(),
                key: (user.to_owned(), namespace.to_owned()),
                answer: cached.answer,
            }),
        }
    }
}

/// A review under way, or to run.
struct Pending {
    cache: AnswerCache,
    key: (String, String),
    answer: Arc<OnceCell<bool>>,
}

impl Pending {
    /// The review's answer: the one under way, or `review` run now.
    async fn resolve(
        self,
        review: impl Future<Output = Result<bool, AccessUnknown>>,
    ) -> Result<bool, AccessUnknown> {
        let Pending { cache, key, answer } = self;
        let mut ran = false;
        // Fail closed: no answer is no access (as unavailable, not forbidden), and the next
        // request asks again.
        let answered = answer
            .get_or_try_init(|| {
                ran = true;
                review
            })
            .await
            .copied();
        if ran && answered.is_ok() {
            // Stored again now that it holds its answer, which gives it its expiry; unless it
            // was replaced or evicted meanwhile.
            cache.entry(key).and_compute_with(|entry| match entry {
                Some(entry) if Arc::ptr_eq(&entry.value().answer, &answer) => {
                    Op::Put(entry.into_value())
                }
                _ => Op::Nop,
            });
        }
        answered
    }
}

impl ReviewedAccess {
    pub fn new(client: kube::Client, shared: BTreeSet<String>, cache: ReviewCache) -> Self {
        Self {
            client,
            shared,
            answers: Answers::new(cache, MAX_CACHED),
        }
    }
}

impl NamespaceAccess for ReviewedAccess {
    fn may_use(&self, user: &str, namespace: &str) -> Answer {
        let pending = match self.answers.lookup(user, namespace) {
            Ok(allowed) => return Answer::Now(allowed),
            Err(pending) => pending,
        };
        let client = self.client.clone();
        let (user, namespace) = pending.key.clone();
        Answer::Later(Box::pin(
            pending.resolve(async move { review(client, &user, &namespace).await }),
        ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// `user`'s answer in namespace `team`, reviewed (and counted in `reviews`) as `allowed`
    /// when not cached.
    async fn ask(answers: &Answers, reviews: &AtomicUsize, user: &str, allowed: bool) -> bool {
        match answers.lookup(user, "team") {
            Ok(cached) => cached,
            Err(pending) => pending
                .resolve(async {
                    reviews.fetch_add(1, Ordering::SeqCst);
                    Ok(allowed)
                })
                .await
                .unwrap(),
        }
    }

    #[tokio::test]
    async fn an_answer_is_trusted_for_its_time_and_then_asked_again() {
        let answers = Answers::new(
            ReviewCache {
                allowed_for: Duration::from_secs(600),
                denied_for: Duration::from_millis(250),
            },
            100,
        );
        let reviews = AtomicUsize::new(0);
        assert!(ask(&answers, &reviews, "alice", true).await);
        assert!(!ask(&answers, &reviews, "bob", false).await);
        assert!(ask(&answers, &reviews, "alice", true).await);
        assert!(!ask(&answers, &reviews, "bob", false).await);
        assert_eq!(reviews.load(Ordering::SeqCst), 2, "both answers cached");

        tokio::time::sleep(Duration::from_millis(500)).await;
        answers.cache.run_pending_tasks();
        assert!(
            !answers.cache.contains_key(&UserNamespace("bob", "team")),
            "the denied answer expired"
        );
        assert!(ask(&answers, &reviews, "alice", true).await);
        assert_eq!(reviews.load(Ordering::SeqCst), 2, "alice's still trusted");
        assert!(!ask(&answers, &reviews, "bob", false).await);
        assert_eq!(reviews.load(Ordering::SeqCst), 3, "bob asked again");
    }

    #[tokio::test]
    async fn a_full_cache_lets_only_its_least_recently_used_answers_go() {
        let answers = Answers::new(
            ReviewCache {
                allowed_for: Duration::from_secs(600),
                denied_for: Duration::from_secs(600),
            },
            10,
        );
        let reviews = AtomicUsize::new(0);
        let users: Vec<String> = (0..11).map(|i| format!("user{i}")).collect();
        for user in &users[..10] {
            ask(&answers, &reviews, user, true).await;
        }
        // The second half used again, then one more pair than there is room for.
        for user in &users[5..10] {
            ask(&answers, &reviews, user, true).await;
        }
        assert_eq!(reviews.load(Ordering::SeqCst), 10);
        answers.cache.run_pending_tasks();
        ask(&answers, &reviews, &users[10], true).await;
        answers.cache.run_pending_tasks();
        assert_eq!(answers.cache.entry_count(), 10, "one answer made room");

        // Emptied whole, these would all be asked again.
        for user in &users[5..] {
            ask(&answers, &reviews, user, true).await;
        }
        assert_eq!(
            reviews.load(Ordering::SeqCst),
            11,
            "the recent answers kept"
        );
        assert!(
            !answers.cache.contains_key(&UserNamespace("user0", "team")),
            "the one used longest ago went"
        );
    }

    #[tokio::test]
    async fn a_review_under_way_is_shared_even_when_answers_are_not_kept() {
        let answers = Answers::new(
            ReviewCache {
                allowed_for: Duration::ZERO,
                denied_for: Duration::ZERO,
            },
            10,
        );
        let reviews = AtomicUsize::new(0);
        let burst: Vec<Pending> = (0..3)
            .map(|_| answers.lookup("dave", "team").err().unwrap())
            .collect();
        let review = || async {
            reviews.fetch_add(1, Ordering::SeqCst);
            Ok(false)
        };
        let resolved =
            futures::future::join_all(burst.into_iter().map(|p| p.resolve(review()))).await;
        assert_eq!(resolved, [Ok(false); 3]);
        assert_eq!(
            reviews.load(Ordering::SeqCst),
            1,
            "one review for the burst"
        );
        // Its answer is not kept: the next request asks again.
        assert!(!ask(&answers, &reviews, "dave", false).await);
        assert_eq!(reviews.load(Ordering::SeqCst), 2);
    }
}
