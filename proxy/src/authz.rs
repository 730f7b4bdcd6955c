//! Who is asking ([`IdentitySource`]) and whether they may reach a route ([`authorize`]).
//!
//! Kubeflow's model: a notebook belongs to its namespace (a user's profile), so its owner and
//! the people the owner shared the profile with are that namespace's members; admins reach every
//! notebook. Routes that are not notebooks (dashboards, APIs behind the same gateway) need an
//! authenticated user and nothing more; they do their own authorization, as under Istio.
//!
//! Both halves are traits so the deployment decides: in a cluster the user comes from a header
//! the auth proxy in front sets (`kubeflow-userid`), in single-machine mode from labforge's own
//! session cookie; membership from a static map today, a SubjectAccessReview-backed cache later.

use http::{HeaderMap, HeaderName};
use std::collections::{BTreeMap, BTreeSet};

/// An authenticated user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
}

/// Finds the user a request carries; `None` is anonymous.
pub trait IdentitySource: Send + Sync {
    fn identify(&self, headers: &HeaderMap) -> Option<Identity>;
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
        // Several values would mean someone appended their own: trust none of them.
        let mut values = headers.get_all(&self.header).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        let user = value.to_str().ok()?.trim();
        let user = user.strip_prefix(self.prefix.as_str())?;
        (!user.is_empty()).then(|| Identity {
            user: user.to_owned(),
        })
    }
}

/// Who may use which namespace.
pub trait NamespaceAccess: Send + Sync {
    fn is_admin(&self, user: &str) -> bool;
    fn is_member(&self, user: &str, namespace: &str) -> bool;
}

/// Membership from configuration: `--admin <user>` and `--member <namespace>=<user>`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StaticAccess {
    pub admins: BTreeSet<String>,
    /// Namespace → its members.
    pub members: BTreeMap<String, BTreeSet<String>>,
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
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not <namespace>=<user>")]
pub struct BadMember(pub String);

impl NamespaceAccess for StaticAccess {
    fn is_admin(&self, user: &str) -> bool {
        self.admins.contains(user)
    }

    fn is_member(&self, user: &str, namespace: &str) -> bool {
        self.members
            .get(namespace)
            .is_some_and(|users| users.contains(user))
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
}

/// What a route needs: `notebook_namespace` is `Some` for notebook routes.
pub fn authorize(
    identity: Option<&Identity>,
    notebook_namespace: Option<&str>,
    access: &dyn NamespaceAccess,
) -> Decision {
    let Some(identity) = identity else {
        return Decision::Unauthenticated;
    };
    match notebook_namespace {
        None => Decision::Allow,
        Some(namespace)
            if access.is_admin(&identity.user) || access.is_member(&identity.user, namespace) =>
        {
            Decision::Allow
        }
        Some(_) => Decision::Forbidden,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn user(name: &str) -> Identity {
        Identity { user: name.into() }
    }

    #[test]
    fn owner_members_and_admins_reach_a_notebook_nobody_else_does() {
        let access = StaticAccess::with_members(
            ["root@example.com"],
            [
                "alice=alice@example.com",
                "alice=carol@example.com",
                "bob=bob@example.com",
            ],
        )
        .unwrap();
        let decide = |who: Option<&str>, ns| authorize(who.map(user).as_ref(), ns, &access);
        assert_eq!(
            decide(Some("alice@example.com"), Some("alice")),
            Decision::Allow
        );
        assert_eq!(
            decide(Some("carol@example.com"), Some("alice")),
            Decision::Allow
        );
        assert_eq!(
            decide(Some("root@example.com"), Some("alice")),
            Decision::Allow
        );
        assert_eq!(
            decide(Some("bob@example.com"), Some("alice")),
            Decision::Forbidden
        );
        assert_eq!(
            decide(Some("ALICE@example.com"), Some("alice")),
            Decision::Forbidden
        );
        assert_eq!(decide(None, Some("alice")), Decision::Unauthenticated);
        // Not a notebook: any authenticated user, still nobody anonymous.
        assert_eq!(decide(Some("bob@example.com"), None), Decision::Allow);
        assert_eq!(decide(None, None), Decision::Unauthenticated);
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
