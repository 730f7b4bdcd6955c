//! Who is asking ([`IdentitySource`]) and whether they may reach a route ([`authorize`]).
//!
//! Kubeflow's model: a notebook belongs to its namespace (a user's profile), so its owner and
//! the people the owner shared the profile with are that namespace's members; admins reach every
//! notebook. A route is guarded by the namespace of its VirtualService and the namespaces of its
//! destinations (`<svc>.<ns>.svc…`), so a VirtualService in one's own namespace cannot open a path
//! to somebody else's notebook. Shared namespaces (`kubeflow`: the dashboard and its APIs, which
//! do their own authorization) need an authenticated user and nothing more.
//!
//! Both halves are traits so the deployment decides: in a cluster the user comes from a header
//! the auth proxy in front sets (`kubeflow-userid`), in single-machine mode from labforge's own
//! session cookie; membership from a static map ([`StaticAccess`]), labforge's local users, or
//! Kubernetes RBAC through SubjectAccessReviews ([`crate::review::ReviewedAccess`]), which is why
//! an answer may come later.

use http::{HeaderMap, HeaderName};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// An authenticated user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
}

/// Resolves when an identity stops being valid (its session ended).
pub type Revocation = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Finds the user a request carries; `None` is anonymous.
pub trait IdentitySource: Send + Sync {
    fn identify(&self, headers: &HeaderMap) -> Option<Identity>;

    /// What ends when the identity `headers` carry is revoked (a signed-out or removed user's
    /// session): the proxy closes the websocket tunnels opened with it then. Asked only for
    /// upgrades. `None` by default: an identity from a header lasts as long as its request, and
    /// the auth proxy in front decides what the next one carries.
    fn revocation(&self, headers: &HeaderMap) -> Option<Revocation> {
        let _ = headers;
        None
    }

    /// The user's name, borrowed from the request where the source can: what the proxy asks for
    /// every request, where a copy of the name would cost an allocation each time.
    fn user<'h>(&self, headers: &'h HeaderMap) -> Option<Cow<'h, str>> {
        self.identify(headers)
            .map(|identity| Cow::Owned(identity.user))
    }
}

/// The user from a header set by a trusted auth proxy (Kubeflow: `kubeflow-userid`, with an
/// optional prefix such as `accounts.google.com:` to strip). Only safe when clients cannot reach
/// the proxy except through that auth proxy, which overwrites the header.
#[derive(Clone, Debug)]
pub struct TrustedHeader {
    pub header: HeaderName,
    pub prefix: String,
}

impl Default for TrustedHeader {
    fn default() -> Self {
        Self {
            header: HeaderName::from_static("kubeflow-userid"),
            prefix: String::new(),
        }
    }
}

impl IdentitySource for TrustedHeader {
    fn identify(&self, headers: &HeaderMap) -> Option<Identity> {
        self.user(headers).map(|user| Identity {
            user: user.into_owned(),
        })
    }

    fn user<'h>(&self, headers: &'h HeaderMap) -> Option<Cow<'h, str>> {
        // Several values would mean someone appended their own: trust none of them.
        let mut values = headers.get_all(&self.header).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        let user = value.to_str().ok()?.trim();
        let user = user.strip_prefix(self.prefix.as_str())?;
        (!user.is_empty()).then_some(Cow::Borrowed(user))
    }
}

/// Who may use which namespace.
pub trait NamespaceAccess: Send + Sync {
    /// Whether `user` may reach routes into `namespace`: its members and admins may.
    fn may_use(&self, user: &str, namespace: &str) -> Answer;
    /// Whether `user` may open a notebook of `namespace` that its owners shared with the users
    /// `shared_with` (the `labforge.dev/shared-with` annotation its VirtualService carries).
    fn may_open(&self, user: &str, namespace: &str, shared_with: &[Arc<str>]) -> Answer {
        if shared_with.iter().any(|u| **u == *user) {
            Answer::Now(true)
        } else {
            self.may_use(user, namespace)
        }
    }
    /// Routes into this namespace are open to every authenticated user.
    fn is_shared(&self, namespace: &str) -> bool;
}

/// An access answer: known at once (a static map, a cached review) or once someone was asked, so
/// the common case costs no allocation.
pub enum Answer {
    Now(bool),
    Later(Pin<Box<dyn Future<Output = Result<bool, AccessUnknown>> + Send>>),
}

/// Nobody could say whether the user has access (the review failed or timed out): the request
/// is refused as unavailable, not as forbidden, and the next one asks again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessUnknown;

impl Answer {
    pub async fn resolve(self) -> Result<bool, AccessUnknown> {
        match self {
            Answer::Now(allowed) => Ok(allowed),
            Answer::Later(pending) => pending.await,
        }
    }
}

/// Membership from configuration: `--admin <user>`, `--member <namespace>=<user>` and
/// `--shared-namespace <namespace>`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StaticAccess {
    pub admins: BTreeSet<String>,
    /// Namespace → its members.
    pub members: BTreeMap<String, BTreeSet<String>>,
    pub shared: BTreeSet<String>,
}

impl StaticAccess {
    /// Parses `namespace=user` pairs.
    pub fn with_members<'a>(
        admins: impl IntoIterator<Item = &'a str>,
        members: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, BadMember> {
        let mut access = StaticAccess {
            admins: admins.into_iter().map(str::to_owned).collect(),
            ..Default::default()
        };
        for pair in members {
            match pair.split_once('=') {
                Some((ns, user)) if !ns.is_empty() && !user.is_empty() => {
                    access
                        .members
                        .entry(ns.to_owned())
                        .or_default()
                        .insert(user.to_owned());
                }
                _ => return Err(BadMember(pair.to_owned())),
            }
        }
        Ok(access)
    }

    pub fn is_admin(&self, user: &str) -> bool {
        self.admins.contains(user)
    }

    pub fn is_member(&self, user: &str, namespace: &str) -> bool {
        self.members
            .get(namespace)
            .is_some_and(|users| users.contains(user))
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not <namespace>=<user>")]
pub struct BadMember(pub String);

impl NamespaceAccess for StaticAccess {
    fn may_use(&self, user: &str, namespace: &str) -> Answer {
        Answer::Now(self.is_admin(user) || self.is_member(user, namespace))
    }

    fn is_shared(&self, namespace: &str) -> bool {
        self.shared.contains(namespace)
    }
}

/// The outcome for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// No user: 401.
    Unauthenticated,
    /// A user without access: 403.
    Forbidden,
    /// Access could not be checked: 503.
    Unknown,
}

/// The question asked of `access` for one of a route's namespaces: the first is the
/// VirtualService's own, whose notebook may be shared with some users; the others are its
/// destinations'.
fn ask(
    access: &dyn NamespaceAccess,
    user: &str,
    position: usize,
    namespace: &str,
    shared_with: &[Arc<str>],
) -> Answer {
    if position == 0 {
        access.may_open(user, namespace, shared_with)
    } else {
        access.may_use(user, namespace)
    }
}

/// What [`authorize`] decides, when every answer it needs is known now (a static map, cached
/// reviews); `None` when one must be waited for. The proxy decides most requests this way, with
/// the user's name borrowed from the request.
pub fn authorize_now<'n>(
    user: &str,
    namespaces: impl IntoIterator<Item = &'n str>,
    shared_with: &[Arc<str>],
    access: &dyn NamespaceAccess,
) -> Option<Decision> {
    for (position, namespace) in namespaces.into_iter().enumerate() {
        if access.is_shared(namespace) {
            continue;
        }
        // A pending answer is dropped unawaited: asked again, the source joins the same
        // question (a review in flight stays in its cache).
        match ask(access, user, position, namespace, shared_with) {
            Answer::Now(true) => {}
            Answer::Now(false) => return Some(Decision::Forbidden),
            Answer::Later(_) => return None,
        }
    }
    Some(Decision::Allow)
}

/// Whether `identity` may use a route guarded by `namespaces`: only if it may use every one of
/// them that is not shared; the first one's notebook is shared with `shared_with`.
pub async fn authorize<'n>(
    identity: Option<&Identity>,
    namespaces: impl IntoIterator<Item = &'n str>,
    shared_with: &[Arc<str>],
    access: &dyn NamespaceAccess,
) -> Decision {
    let Some(identity) = identity else {
        return Decision::Unauthenticated;
    };
    for (position, namespace) in namespaces.into_iter().enumerate() {
        if access.is_shared(namespace) {
            continue;
        }
        match ask(access, &identity.user, position, namespace, shared_with)
            .resolve()
            .await
        {
            Ok(true) => {}
            Ok(false) => return Decision::Forbidden,
            Err(AccessUnknown) => return Decision::Unknown,
        }
    }
    Decision::Allow
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn user(name: &str) -> Identity {
        Identity { user: name.into() }
    }

    #[tokio::test]
    async fn owner_members_and_admins_reach_a_notebook_nobody_else_does() {
        let mut access = StaticAccess::with_members(
            ["root@example.com"],
            [
                "alice=alice@example.com",
                "alice=carol@example.com",
                "bob=bob@example.com",
            ],
        )
        .unwrap();
        access.shared.insert("kubeflow".into());
        let decide = |who: Option<&str>, ns: &'static [&'static str]| {
            let who = who.map(user);
            let access = &access;
            async move { authorize(who.as_ref(), ns.iter().copied(), &[], access).await }
        };
        assert_eq!(
            decide(Some("alice@example.com"), &["alice"]).await,
            Decision::Allow
        );
        assert_eq!(
            decide(Some("carol@example.com"), &["alice"]).await,
            Decision::Allow
        );
        assert_eq!(
            decide(Some("root@example.com"), &["alice"]).await,
            Decision::Allow
        );
        assert_eq!(
            decide(Some("bob@example.com"), &["alice"]).await,
            Decision::Forbidden
        );
        assert_eq!(
            decide(Some("ALICE@example.com"), &["alice"]).await,
            Decision::Forbidden
        );
        assert_eq!(decide(None, &["alice"]).await, Decision::Unauthenticated);
        // bob's VirtualService leading to alice's service needs both namespaces.
        assert_eq!(
            decide(Some("bob@example.com"), &["alice", "bob"]).await,
            Decision::Forbidden
        );
        assert_eq!(
            decide(Some("root@example.com"), &["alice", "bob"]).await,
            Decision::Allow
        );
        // The shared namespace: any authenticated user, still nobody anonymous.
        assert_eq!(
            decide(Some("bob@example.com"), &["kubeflow"]).await,
            Decision::Allow
        );
        assert_eq!(decide(None, &["kubeflow"]).await, Decision::Unauthenticated);
    }

    /// Members of `alice` known at once; every other namespace must be asked.
    struct AliceKnown;

    impl NamespaceAccess for AliceKnown {
        fn may_use(&self, user: &str, namespace: &str) -> Answer {
            match namespace {
                "alice" => Answer::Now(user == "alice@example.com"),
                _ => Answer::Later(Box::pin(async { Ok(true) })),
            }
        }

        fn is_shared(&self, namespace: &str) -> bool {
            namespace == "kubeflow"
        }
    }

    #[tokio::test]
    async fn decided_now_where_the_answers_are_known_and_left_to_wait_for_otherwise() {
        let now = |who: &str, ns: &'static [&'static str]| {
            authorize_now(who, ns.iter().copied(), &[], &AliceKnown)
        };
        assert_eq!(now("alice@example.com", &["alice"]), Some(Decision::Allow));
        assert_eq!(
            now("bob@example.com", &["alice"]),
            Some(Decision::Forbidden)
        );
        assert_eq!(now("bob@example.com", &["kubeflow"]), Some(Decision::Allow));
        // A refusal known at once needs no wait for the other namespace's answer.
        assert_eq!(
            now("bob@example.com", &["alice", "bob"]),
            Some(Decision::Forbidden)
        );
        assert_eq!(now("alice@example.com", &["alice", "bob"]), None);
        assert_eq!(now("alice@example.com", &["bob"]), None);
        // What is left to wait for, `authorize` decides.
        assert_eq!(
            authorize(
                Some(&user("alice@example.com")),
                ["alice", "bob"],
                &[],
                &AliceKnown
            )
            .await,
            Decision::Allow
        );
        // A notebook shared with bob: its own namespace's route opens to him, and only that
        // one (a route from another namespace to it still needs that namespace).
        let shared: &[Arc<str>] = &["bob@example.com".into()];
        assert_eq!(
            authorize_now("bob@example.com", ["alice"], shared, &AliceKnown),
            Some(Decision::Allow)
        );
        assert_eq!(
            authorize_now("carol@example.com", ["alice"], shared, &AliceKnown),
            Some(Decision::Forbidden)
        );
        assert_eq!(
            authorize_now("bob@example.com", ["carol", "alice"], shared, &AliceKnown),
            Some(Decision::Forbidden)
        );
    }

    #[test]
    fn trusted_header_lends_the_user_it_identifies() {
        let source = TrustedHeader::default();
        let mut headers = HeaderMap::new();
        headers.insert(
            "kubeflow-userid",
            HeaderValue::from_static(" alice@example.com "),
        );
        assert!(matches!(
            source.user(&headers),
            Some(Cow::Borrowed("alice@example.com"))
        ));
        assert_eq!(source.identify(&headers), Some(user("alice@example.com")));
    }

    #[test]
    fn member_pairs_must_name_both_sides() {
        for bad in ["alice", "=alice@x", "alice=", ""] {
            assert_eq!(
                StaticAccess::with_members([], [bad]),
                Err(BadMember(bad.into()))
            );
        }
    }

    #[test]
    fn trusted_header_strips_its_prefix_and_refuses_ambiguity() {
        let source = TrustedHeader {
            header: HeaderName::from_static("kubeflow-userid"),
            prefix: "accounts.google.com:".into(),
        };
        let mut headers = HeaderMap::new();
        assert_eq!(source.identify(&headers), None);
        headers.insert(
            "kubeflow-userid",
            HeaderValue::from_static("accounts.google.com:alice@example.com"),
        );
        assert_eq!(source.identify(&headers), Some(user("alice@example.com")));
        headers.append(
            "kubeflow-userid",
            HeaderValue::from_static("accounts.google.com:root"),
        );
        assert_eq!(source.identify(&headers), None, "two values: trust neither");
        headers.insert(
            "kubeflow-userid",
            HeaderValue::from_static("alice@example.com"),
        );
        assert_eq!(source.identify(&headers), None, "without the prefix");
        headers.insert(
            "kubeflow-userid",
            HeaderValue::from_static("accounts.google.com:"),
        );
        assert_eq!(source.identify(&headers), None, "empty user");
    }
}
