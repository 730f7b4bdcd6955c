//! What a VirtualService may do outside the namespaces the admin trusts: a tenant's rules keep
//! to its own namespace's Services, paths and notebook hosts, and leave the headers that say who
//! the visitor is alone. A rule that cannot is refused, reported with its [`Refusal`].

use super::{DEFAULT_DESTINATION_PORT, Matcher, Rule, SharedNames};
use http::HeaderName;
use labforge_crds::istio::{HeaderOperations, HttpRoute, StringMatch};
use std::collections::BTreeSet;
use std::sync::Arc;

/// What a confined VirtualService's rule tried that only a trusted namespace may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Set, added or removed a header that says who the visitor is.
    IdentityHeader,
    /// Sent requests outside its namespace: an IP, a pod, another namespace's Service, an
    /// outside name.
    Destination,
    /// Matched paths that only another namespace's routes may serve.
    Path,
    /// Named another namespace's notebook host (`<label>.<notebook domain>`).
    Host,
}

impl Refusal {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::IdentityHeader => "identity_header",
            Refusal::Destination => "destination",
            Refusal::Path => "path",
            Refusal::Host => "host",
        }
    }
}

/// What a VirtualService may do depends on whose namespace it is in: profile owners create
/// VirtualServices in their own namespace, and a notebook's server (and so what its rules send
/// requests to) belongs to its owner. Outside the namespaces the admin trusts, a rule is
/// confined to its namespace: it may not touch identity headers, may send requests only to
/// Services of its namespace (a short name is that namespace's, not the proxy's), and serves only
/// paths under each tenant root's `<root><namespace>/`; a rule that cannot keep to that is
/// refused, and a regex or catch-all match is held to it at lookup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confinement {
    /// Namespaces whose VirtualServices are not confined (the platform's own, `kubeflow`).
    pub trusted_namespaces: BTreeSet<String>,
    /// Paths under which each namespace has its own subtree: `/notebook/` → `/notebook/<ns>/`.
    pub tenant_roots: Vec<String>,
    /// Headers that say who the visitor is (the auth proxy's user and groups headers);
    /// `forwarded` and `x-forwarded-*` always are.
    pub identity_headers: Vec<HeaderName>,
    /// The cluster's DNS domain: `<svc>.<ns>.svc.<domain>` names a Service.
    pub cluster_domain: String,
    /// Notebooks' own hosts are `<label>.<domain>` ([`crate::notebook_host`]): a host there may
    /// be named only by a VirtualService of the namespace whose notebook it is.
    pub notebook_domain: Option<String>,
}

/// Namespaces trusted unless configured: Kubeflow's own, where the dashboard, the auth proxy's
/// routes and labforge run, and where only admins create VirtualServices.
pub const DEFAULT_TRUSTED_NAMESPACES: [&str; 1] = ["kubeflow"];
/// Tenant roots unless configured.
pub const DEFAULT_TENANT_ROOTS: [&str; 1] = ["/notebook/"];
/// Kubeflow's groups header, an identity header beside the configured user header.
pub const KUBEFLOW_GROUPS_HEADER: &str = "kubeflow-groups";

impl Default for Confinement {
    fn default() -> Self {
        Self {
            trusted_namespaces: DEFAULT_TRUSTED_NAMESPACES.map(String::from).into(),
            tenant_roots: DEFAULT_TENANT_ROOTS.map(String::from).into(),
            identity_headers: vec![
                HeaderName::from_static("kubeflow-userid"),
                HeaderName::from_static(KUBEFLOW_GROUPS_HEADER),
            ],
            cluster_domain: "cluster.local".into(),
            notebook_domain: None,
        }
    }
}

impl Confinement {
    pub fn is_trusted(&self, namespace: &str) -> bool {
        self.trusted_namespaces.contains(namespace)
    }

    /// Whether a VirtualService of `namespace` with routes `http` may name `host`: any host
    /// outside the notebook domain; there, only the host of a notebook of `namespace` whose
    /// prefix its routes match (a wildcard over the domain is nobody's).
    pub(super) fn may_name_host(&self, namespace: &str, host: &str, http: &[HttpRoute]) -> bool {
        let Some(label) = self
            .notebook_domain
            .as_deref()
            .and_then(|domain| host.strip_suffix(domain)?.strip_suffix('.'))
        else {
            return true;
        };
        if label.contains('.') {
            return true;
        }
        let own_prefix = format!("/notebook/{namespace}/");
        http.iter()
            .flat_map(|route| &route.matches)
            .filter_map(|m| match &m.uri {
                Some(StringMatch::Prefix(path) | StringMatch::Exact(path)) => {
                    path.strip_prefix(&own_prefix)
                }
                _ => None,
            })
            .filter_map(|rest| rest.split('/').next())
            .any(|name| labforge_crds::host::is_label_of(label, namespace, name))
    }

    pub(super) fn allowed_paths(&self, namespace: &str, names: &SharedNames) -> Box<[Arc<str>]> {
        self.tenant_roots
            .iter()
            .map(|root| names.intern(&format!("{root}{namespace}/")))
            .collect()
    }

    fn is_identity_header(&self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        name == "forwarded"
            || name.starts_with("x-forwarded-")
            || self.identity_headers.iter().any(|h| h.as_str() == name)
    }

    /// The header a confined rule may not edit, if its operations name one.
    fn identity_header_edited<'o>(&self, ops: &'o HeaderOperations) -> Option<&'o str> {
        ops.remove
            .iter()
            .chain(ops.set.keys())
            .chain(ops.add.keys())
            .map(String::as_str)
            .find(|name| self.is_identity_header(name))
    }

    /// `host` as a Service of `namespace` (`<svc>.<ns>.svc.<domain>`), or why it is not one. A
    /// short name becomes the namespace's Service: resolved as it is, it would be the proxy's
    /// namespace's (labforge's own services, the auth proxy).
    fn service_host(&self, namespace: &str, host: &str) -> Result<String, String> {
        let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
        let refuse = |why: &str| Err(format!("destination {host:?} {why}"));
        if host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok()
        {
            return refuse("is an IP address");
        }
        let labels: Vec<&str> = host.split('.').collect();
        if labels.iter().any(|l| l.is_empty()) {
            return refuse("is not a host name");
        }
        let (service, ns) = match labels.as_slice() {
            [service] => (*service, namespace),
            [service, ns] | [service, ns, "svc"] => (*service, *ns),
            [service, ns, "svc", domain @ ..] if domain.join(".") == self.cluster_domain => {
                (*service, *ns)
            }
            [_, _, "pod", ..] => return refuse("is a pod"),
            _ => return refuse("is not a Service of this cluster"),
        };
        if ns != namespace {
            return refuse(&format!("is in namespace {ns:?}"));
        }
        Ok(format!("{service}.{ns}.svc.{}", self.cluster_domain))
    }
}

/// Holds `rule` (compiled from `route`) to its namespace, or says why it cannot be: its header
/// edits, destinations (made fully qualified, so that a short name is its namespace's Service)
/// and paths. A match that could take another namespace's paths sets the lookup's guard.
pub(super) fn confine_rule(
    rule: &mut Rule,
    route: &HttpRoute,
    confinement: &Confinement,
) -> Result<(), (Refusal, String)> {
    let namespace = rule.owner.namespace.clone();
    if let Some(headers) = &route.headers
        && let Some(name) = headers
            .request
            .as_ref()
            .and_then(|ops| confinement.identity_header_edited(ops))
    {
        return Err((
            Refusal::IdentityHeader,
            format!("headers.request edits {name:?}, which identifies the visitor"),
        ));
    }
    for (destination, raw) in rule.destinations.iter_mut().zip(&route.route) {
        let host = confinement
            .service_host(&namespace, &raw.destination.host)
            .map_err(|reason| (Refusal::Destination, reason))?;
        let port = raw
            .destination
            .port
            .as_ref()
            .map_or(DEFAULT_DESTINATION_PORT, |p| p.number);
        destination.authority = format!("{host}:{port}").into();
    }
    // A destination in the namespace guards the rule by that namespace alone.
    rule.other_namespaces = Box::default();
    let allowed = &rule.owner.allowed_paths;
    let under = |path: &str| allowed.iter().any(|root| path.starts_with(&**root));
    let mut guard = rule.matches.is_empty();
    for condition in &rule.matches {
        match &condition.uri {
            // Matched against the lowercased path: the guard checks the path itself.
            _ if condition.ignore_uri_case => guard = true,
            Some(Matcher::Prefix(prefix)) if under(prefix) => {}
            Some(Matcher::Exact(path)) if under(path) => {}
            // A prefix above the namespace's subtree (`/`, `/notebook/`) takes others' paths too.
            Some(Matcher::Prefix(prefix))
                if allowed.iter().any(|root| root.starts_with(&**prefix)) =>
            {
                guard = true
            }
            Some(Matcher::Prefix(text) | Matcher::Exact(text)) => {
                return Err((
                    Refusal::Path,
                    format!(
                        "matches {text:?}, outside {}",
                        allowed.iter().map(|a| &**a).collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
            // A regex, or no URI condition: held to the namespace's paths at lookup.
            _ => guard = true,
        }
    }
    rule.path_guard = guard;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::test_support::*;
    use labforge_crds::VirtualService;
    use serde_json::json;

    #[test]
    fn a_confined_rule_may_not_touch_identity_headers_or_leave_its_namespace() {
        let prefix = json!([{ "uri": { "prefix": "/notebook/bob/x/" } }]);
        let refused = [
            (
                "header",
                json!({ "match": prefix, "route": to("lab"),
                        "headers": { "request": { "set": { "Kubeflow-Userid": "admin" } } } }),
                Refusal::IdentityHeader,
            ),
            (
                "groups",
                json!({ "match": prefix, "route": to("lab"),
                        "headers": { "request": { "add": { "kubeflow-groups": "admins" } } } }),
                Refusal::IdentityHeader,
            ),
            (
                "forwarded",
                json!({ "match": prefix, "route": to("lab"),
                        "headers": { "request": { "remove": ["X-Forwarded-For"] } } }),
                Refusal::IdentityHeader,
            ),
            (
                "ip",
                json!({ "match": prefix, "route": to("10.1.2.3") }),
                Refusal::Destination,
            ),
            (
                "ipv6",
                json!({ "match": prefix, "route": to("[fd00::1]") }),
                Refusal::Destination,
            ),
            (
                "pod",
                json!({ "match": prefix, "route": to("10-1-2-3.alice.pod.cluster.local") }),
                Refusal::Destination,
            ),
            (
                "other-ns",
                json!({ "match": prefix, "route": to("lab.alice.svc.cluster.local") }),
                Refusal::Destination,
            ),
            (
                "other-short",
                json!({ "match": prefix, "route": to("lab.alice") }),
                Refusal::Destination,
            ),
            (
                "labforge",
                json!({ "match": prefix, "route": to("labforge-web.kubeflow.svc") }),
                Refusal::Destination,
            ),
            (
                "outside",
                json!({ "match": prefix, "route": to("lab.bob.svc.evil.example") }),
                Refusal::Destination,
            ),
            (
                "squat",
                json!({ "match": [{ "uri": { "prefix": "/notebook/alice/" } }], "route": to("lab") }),
                Refusal::Path,
            ),
            (
                "exact",
                json!({ "match": [{ "uri": { "exact": "/notebook/alice/lab/" } }], "route": to("lab") }),
                Refusal::Path,
            ),
            (
                "dashboard",
                json!({ "match": [{ "uri": { "prefix": "/api/" } }], "route": to("lab") }),
                Refusal::Path,
            ),
        ];
        let list: Vec<VirtualService> = refused
            .iter()
            .map(|(name, http, _)| bobs(name, http.clone()))
            .chain([
                bobs("own", json!({ "match": prefix, "route": to("lab") })),
                notebook_vs("alice", "lab", "2021-01-01T00:00:00Z"),
            ])
            .collect();
        let (table, skipped) = confined_table(&list);
        for (name, _, refusal) in &refused {
            let found = skipped.iter().find(|s| s.name == *name);
            assert_eq!(
                found.and_then(|s| s.refused),
                Some(*refusal),
                "{name}: {skipped:?}"
            );
        }
        assert_eq!(skipped.len(), refused.len(), "{skipped:?}");
        // The rest of the table serves: bob's own rule (its short name his own Service), alice's.
        assert_eq!(
            route(&table, &req("/notebook/bob/x/a")).map(|r| r.1),
            Some("lab.bob.svc.cluster.local:80".into())
        );
        assert_eq!(
            route(&table, &req("/notebook/alice/lab/a")).map(|r| r.0),
            Some("notebook-alice-lab".into())
        );
        // The same rules from a trusted namespace are served as written.
        let trusted: Vec<VirtualService> = refused
            .iter()
            .map(|(name, http, _)| {
                let mut vs = bobs(name, http.clone());
                vs.metadata.namespace = Some("kubeflow".into());
                vs
            })
            .collect();
        let (_, skipped) = confined_table(&trusted);
        assert!(skipped.is_empty(), "{skipped:?}");
    }

    #[test]
    fn a_confined_regex_or_catch_all_serves_only_its_namespaces_paths() {
        let list = [
            bobs(
                "regex",
                json!({ "match": [{ "uri": { "regex": "/notebook/.*" } }], "route": to("lab") }),
            ),
            bobs(
                "root",
                json!({ "match": [{ "uri": { "prefix": "/" } }], "route": to("lab") }),
            ),
            bobs("any", json!({ "route": to("lab") })),
            bobs(
                "nocase",
                json!({ "match": [{ "uri": { "prefix": "/NOTEBOOK/" }, "ignoreUriCase": true }], "route": to("lab") }),
            ),
            notebook_vs("alice", "lab", "2021-01-01T00:00:00Z"),
        ];
        for bob in &list[..4] {
            let name = bob.metadata.name.clone().unwrap();
            let (table, skipped) = confined_table(&[bob.clone(), list[4].clone()]);
            assert!(skipped.is_empty(), "{skipped:?}");
            // alice's paths go to alice's route, older though bob's rule is.
            assert_eq!(
                route(&table, &req("/notebook/alice/lab/a")).map(|r| r.0),
                Some("notebook-alice-lab".into()),
                "{name}"
            );
            // Nothing else outside bob's subtree: another user's, the dashboard's, the root.
            for path in [
                "/notebook/alice/other/",
                "/notebook/",
                "/",
                "/api/workgroup",
                "/notebook/bobby/x",
            ] {
                assert_eq!(route(&table, &req(path)), None, "{name} {path}");
            }
            // bob's own paths it serves.
            assert_eq!(
                route(&table, &req("/notebook/bob/y/")).map(|r| r.0),
                Some(name.clone()),
                "{name}"
            );
        }
        // All four at once, and a trusted catch-all after them still gets the rest.
        let mut dashboard = bobs("dashboard", json!({ "route": to("centraldashboard") }));
        dashboard.metadata.namespace = Some("kubeflow".into());
        let mut all = list.to_vec();
        all.push(dashboard);
        let (table, _) = confined_table(&all);
        assert_eq!(
            route(&table, &req("/notebook/alice/lab/a")).map(|r| r.0),
            Some("notebook-alice-lab".into())
        );
        assert_eq!(
            route(&table, &req("/notebook/alice/other/")).map(|r| r.0),
            Some("dashboard".into())
        );
        assert_eq!(
            route(&table, &req("/")).map(|r| r.0),
            Some("dashboard".into())
        );
    }

    #[test]
    fn a_notebooks_own_route_needs_no_lookup_guard() {
        let (table, skipped) =
            confined_table(&[notebook_vs("alice", "lab", "2021-01-01T00:00:00Z")]);
        assert!(skipped.is_empty(), "{skipped:?}");
        let rules = &table.any_host.as_ref().unwrap();
        assert!(!rules.rules[0].path_guard);
        assert!(rules.scanned.is_empty(), "indexed, not scanned");
    }
}
