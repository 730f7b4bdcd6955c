//! VirtualServices → an immutable [`RouteTable`] with Istio's gateway semantics.
//!
//! Pure: no I/O, so every matching rule is unit-tested without a server. The table is built once
//! per change and swapped in whole by `source`; lookups read it without locks.
//!
//! Semantics kept from Istio's gateway: only VirtualServices bound to the configured gateway;
//! hosts matched exactly, then by the longest `*.suffix`, then `*`; the `http[]` rules of every
//! VirtualService for a host merged in creation order (then namespace/name), catch-all rules moved
//! last; inside that list the first matching rule wins.
//!
//! Kubeflow clusters hold one rule per notebook, all plain prefixes, so a table of 10,000
//! notebooks must not be scanned rule by rule: pure-prefix and pure-exact matches are indexed by
//! prefix length, and only the other rules are tried in order, each only while it could still
//! come before the best indexed candidate.
//!
//! The parts: `matching` (what a match asks of a request), `edits` (what a matched rule does
//! to the request and response, or answers itself), `confinement` (what a VirtualService may do
//! outside the trusted namespaces), `compile` (a VirtualService into rules, once). This module
//! holds the rules and the table, and every public name stays `crate::routes::X`.

mod compile;
mod confinement;
mod edits;
mod matching;
#[cfg(test)]
mod test_support;

pub use compile::{CompiledVirtualService, GatewayFilter};
pub use confinement::{
    Confinement, DEFAULT_TENANT_ROOTS, DEFAULT_TRUSTED_NAMESPACES, KUBEFLOW_GROUPS_HEADER, Refusal,
};
pub use edits::{
    FixedAnswer, HeaderEdits, HeaderOps, OtherRewrites, Redirect, RedirectPort, RegexRewrite,
};
pub use matching::{MatchCondition, Matcher, OtherConditions};

use crate::FastMap;
use crate::activity::{Activity, ActivityCell};
use http::{HeaderMap, Method};
use labforge_crds::VirtualService;
use smallvec::SmallVec;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Port a destination without `port.number` is reached on (a Service's usual HTTP port).
pub const DEFAULT_DESTINATION_PORT: u32 = 80;

/// What a route belongs to: its VirtualService, and the notebook behind it when it is one.
#[derive(Debug)]
pub struct RouteOwner {
    /// Namespace of the VirtualService (a notebook's namespace = its owner's profile). Shared
    /// with the route store's key of the VirtualService rather than copied for it.
    pub namespace: Arc<str>,
    /// Name of the VirtualService.
    pub virtual_service: Arc<str>,
    /// `<namespace>/<notebook>`, the key of the activity endpoint, shared with it. The notebook
    /// is the one this VirtualService routes to (ownerReference, or Kubeflow's name
    /// `notebook-<ns>-<name>`); other routes (dashboards, APIs) have their VirtualService's name.
    pub activity_key: Arc<str>,
    /// Last activity of this route, shared with the activity endpoint.
    pub activity: Arc<ActivityCell>,
    /// Users the notebook behind it is shared with (the VirtualService's
    /// `labforge.dev/shared-with`, copied from its Notebook): they may open it.
    pub shared_with: Box<[Arc<str>]>,
    /// Creation time of the VirtualService, for merging several for one host.
    created: Option<jiff::Timestamp>,
    /// The paths a confined VirtualService's rules may serve (`/notebook/<ns>/` for each tenant
    /// root, [`Confinement`]); empty, and never looked at, for a trusted one.
    allowed_paths: Box<[Arc<str>]>,
}

impl RouteOwner {
    /// Whether a confined rule of this VirtualService may serve `path` (normalized).
    fn serves(&self, path: &str) -> bool {
        self.allowed_paths
            .iter()
            .any(|root| path.starts_with(&**root))
    }

    /// This VirtualService, or a part of it, left out for `reason`.
    fn skipped(&self, reason: String) -> Skipped {
        Skipped {
            namespace: self.namespace.to_string(),
            name: self.virtual_service.to_string(),
            reason,
            refused: None,
        }
    }
}

/// The namespace names and hosts of a store's routes, one string each: 10,000 notebooks live in a
/// handful of namespaces behind one or two hosts (`*` in Kubeflow), and each route's owner, guard
/// and VirtualService would otherwise hold a copy.
#[derive(Debug, Default)]
pub struct SharedNames(Mutex<HashSet<Arc<str>>>);

impl SharedNames {
    pub fn intern(&self, name: &str) -> Arc<str> {
        let mut names = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = names.get(name) {
            return known.clone();
        }
        let name: Arc<str> = name.into();
        names.insert(name.clone());
        name
    }

    /// Forgets the names no route holds anymore.
    pub fn forget_unused(&self) {
        let mut names = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        names.retain(|name| Arc::strong_count(name) > 1);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// `<namespace>/<name>`.
pub fn activity_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Items of which there is one in the common case, kept inline then: a notebook's VirtualService
/// has one host and one rule, its rule one match and one destination, and a separate allocation
/// for each costs more than the item.
pub type Few<T> = SmallVec<[T; 1]>;

/// A destination as `host:port` (a Service's DNS name in a cluster).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    /// `host:port`, shared with every request that goes there (the upstream pool's key).
    pub authority: Arc<str>,
    pub weight: u32,
}

/// One `http[]` rule of a VirtualService.
#[derive(Debug)]
pub struct Rule {
    pub owner: Arc<RouteOwner>,
    /// Empty: matches every request. Boxed slices or [`Few`] here and below: a table holds a
    /// rule per notebook, and a vector's spare capacity would be most of a rule's memory.
    pub matches: Few<MatchCondition>,
    /// Shared with the rule's prefix matcher when it is the same text (Kubeflow rewrites a
    /// notebook's prefix to itself), as the host index shares it.
    pub rewrite_uri: Option<Arc<str>>,
    /// `rewrite.uriRegexRewrite` and `rewrite.authority`, which few rules have: boxed, so that a
    /// notebook's rule holds a pointer for them.
    pub other_rewrites: Option<Box<OtherRewrites>>,
    /// What the rule answers itself (`redirect`, `directResponse`) instead of forwarding.
    pub answer: Option<Box<FixedAnswer>>,
    /// `headers.request` and `headers.response`, which few rules have: boxed, so that a
    /// notebook's rule holds a pointer for them.
    pub header_edits: Option<Box<HeaderEdits>>,
    pub destinations: Few<Destination>,
    /// Namespaces of its destinations other than its VirtualService's, sorted; empty for a
    /// notebook's rule, whose destination is in its own namespace, so that it holds no list.
    other_namespaces: Box<[Arc<str>]>,
    total_weight: u32,
    /// Round-robin position for weighted destinations (exact proportions, no randomness).
    next: AtomicU64,
    /// Its position in its VirtualService's `http[]`, for merging.
    position: u32,
    /// `timeout` in milliseconds (Istio takes no finer one); `None` when there is none or it is
    /// `0s`, as in Istio: a notebook's route has none, since kernels hold requests open.
    timeout_ms: Option<NonZeroU32>,
    /// A confined rule whose matches could take a path outside its namespace's
    /// ([`RouteOwner::serves`]): checked at lookup, and never indexed, so that a refused path
    /// falls through to the rules after it. False for a notebook's own prefix rule.
    path_guard: bool,
}

impl Rule {
    /// How long a request routed by this rule may take, from when it is sent until its response
    /// has been received whole (Envoy's route timeout); none by default.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout_ms
            .map(|ms| Duration::from_millis(u64::from(ms.get())))
    }

    /// Namespaces guarding this rule: its VirtualService's, then its destinations' others.
    pub fn namespaces(&self) -> impl Iterator<Item = &str> + Send {
        std::iter::once(&*self.owner.namespace).chain(self.other_namespaces.iter().map(|ns| &**ns))
    }

    /// The destination for the next request: weights are honoured exactly over every
    /// `total_weight` requests.
    pub fn pick_destination(&self) -> Option<&Destination> {
        self.destinations.get(self.pick_destination_index()?)
    }

    /// Where the destination for the next request is in [`Rule::destinations`].
    pub fn pick_destination_index(&self) -> Option<usize> {
        match &*self.destinations {
            [] => None,
            [_] => Some(0),
            all => {
                if self.total_weight == 0 {
                    return None;
                }
                let n = self.next.fetch_add(1, Ordering::Relaxed) % u64::from(self.total_weight);
                let mut acc = 0u64;
                all.iter().position(|d| {
                    acc += u64::from(d.weight);
                    n < acc
                })
            }
        }
    }

    fn is_catch_all(&self) -> bool {
        self.matches.is_empty() || self.matches.iter().any(MatchCondition::is_catch_all)
    }
}

/// The parts of a request routing looks at.
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a> {
    /// Host without port, lowercase.
    pub host: &'a str,
    /// The authority as sent (`Host` or `:authority`), port included.
    pub authority: &'a str,
    /// `http` or `https`.
    pub scheme: &'a str,
    /// The raw query, without `?`.
    pub query: Option<&'a str>,
    /// Normalized path, without query.
    pub path: &'a str,
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
}

/// A matched rule, and how much of the path its prefix covered.
#[derive(Debug)]
pub struct Found<'t> {
    pub rule: &'t Arc<Rule>,
    /// Length of the matched `uri.prefix` (`None` for exact, regex and match-less rules).
    pub prefix_len: Option<usize>,
}

/// The merged rules of one host, with the index that makes prefix lookups independent of the
/// number of rules.
#[derive(Debug, Default)]
struct HostRules {
    rules: Vec<Arc<Rule>>,
    /// Pure prefix → first rule index with it.
    prefixes: FastMap<Arc<str>, usize>,
    /// Distinct prefix lengths, ascending.
    prefix_lengths: Vec<usize>,
    /// Pure exact path → first rule index.
    exact: FastMap<Arc<str>, usize>,
    /// Indices of rules with any non-indexable condition, ascending.
    scanned: Vec<usize>,
}

impl HostRules {
    fn index(rules: Vec<Arc<Rule>>) -> Self {
        let mut host = HostRules {
            rules,
            ..Default::default()
        };
        let mut lengths = BTreeSet::new();
        for (i, rule) in host.rules.iter().enumerate() {
            if rule.matches.is_empty() || rule.path_guard {
                host.scanned.push(i);
                continue;
            }
            let mut needs_scan = false;
            for condition in &rule.matches {
                if let Some(prefix) = condition.pure_prefix() {
                    host.prefixes.entry(prefix.clone()).or_insert(i);
                    lengths.insert(prefix.len());
                } else if let Some(exact) = condition.pure_exact() {
                    host.exact.entry(exact.clone()).or_insert(i);
                } else {
                    needs_scan = true;
                }
            }
            if needs_scan {
                host.scanned.push(i);
            }
        }
        host.prefix_lengths = lengths.into_iter().collect();
        host
    }

    fn lookup(&self, request: &RequestView<'_>) -> Option<Found<'_>> {
        let path = request.path;
        let mut best: Option<(usize, Option<usize>)> = None;
        fn consider(best: &mut Option<(usize, Option<usize>)>, index: usize, len: Option<usize>) {
            if best.is_none_or(|(b, _)| index < b) {
                *best = Some((index, len));
            }
        }
        for &len in &self.prefix_lengths {
            if len > path.len() {
                break;
            }
            if let Some(candidate) = path.get(..len)
                && let Some(&index) = self.prefixes.get(candidate)
            {
                consider(&mut best, index, Some(len));
            }
        }
        if let Some(&index) = self.exact.get(path) {
            consider(&mut best, index, None);
        }
        for &index in &self.scanned {
            if best.is_some_and(|(b, _)| b < index) {
                break;
            }
            let rule = &self.rules[index];
            // A confined rule outside its namespace's paths does not match: the rules after it
            // may still (alice's own route after bob's `/notebook/.*`).
            if rule.path_guard && !rule.owner.serves(path) {
                continue;
            }
            if rule.matches.is_empty() {
                consider(&mut best, index, None);
                break;
            }
            if let Some(condition) = rule.matches.iter().find(|c| c.matches(request)) {
                let prefix_len = match &condition.uri {
                    Some(Matcher::Prefix(p)) => Some(p.len()),
                    _ => None,
                };
                consider(&mut best, index, prefix_len);
                break;
            }
        }
        best.map(|(index, prefix_len)| Found {
            rule: &self.rules[index],
            prefix_len,
        })
    }
}

/// Why a VirtualService (or one of its rules) was left out of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub namespace: String,
    pub name: String,
    pub reason: String,
    /// Set when the rule was refused for reaching beyond its namespace ([`Confinement`]).
    pub refused: Option<Refusal>,
}

/// Every route the proxy serves, immutable once built.
#[derive(Debug, Default)]
pub struct RouteTable {
    exact_hosts: FastMap<String, HostRules>,
    /// `*.example.com` as `.example.com`, longest first.
    suffix_hosts: Vec<(String, HostRules)>,
    any_host: Option<HostRules>,
    rule_count: usize,
    virtual_services: usize,
}

impl RouteTable {
    /// Compiles and builds in one go (tests, and sources without updates).
    pub fn build<'v>(
        virtual_services: impl IntoIterator<Item = &'v VirtualService>,
        gateway: &GatewayFilter,
        activity: &Activity,
    ) -> (RouteTable, Vec<Skipped>) {
        Self::build_confined(virtual_services, gateway, None, activity)
    }

    /// [`Self::build`] with each VirtualService held to `confinement` (`None`: all trusted).
    pub fn build_confined<'v>(
        virtual_services: impl IntoIterator<Item = &'v VirtualService>,
        gateway: &GatewayFilter,
        confinement: Option<&Confinement>,
        activity: &Activity,
    ) -> (RouteTable, Vec<Skipped>) {
        let mut skipped = Vec::new();
        let names = SharedNames::default();
        let compiled: Vec<CompiledVirtualService> = virtual_services
            .into_iter()
            .filter_map(|vs| {
                let (compiled, mut s) =
                    CompiledVirtualService::compile(vs, gateway, confinement, activity, &names);
                skipped.append(&mut s);
                compiled
            })
            .collect();
        (Self::from_compiled(&compiled), skipped)
    }

    /// Merges compiled VirtualServices per host and indexes them.
    pub fn from_compiled<'c>(
        compiled: impl IntoIterator<Item = &'c CompiledVirtualService>,
    ) -> RouteTable {
        let mut by_host: HashMap<&str, Vec<Arc<Rule>>> = HashMap::new();
        let mut table = RouteTable::default();
        for vs in compiled {
            table.virtual_services += 1;
            for host in &vs.hosts {
                by_host
                    .entry(&**host)
                    .or_default()
                    .extend(vs.rules.iter().cloned());
            }
        }
        for (host, mut rules) in by_host {
            // Creation order, then identity, then position; catch-alls after everything else.
            rules.sort_by(|a, b| {
                a.is_catch_all()
                    .cmp(&b.is_catch_all())
                    .then_with(|| a.owner.created.cmp(&b.owner.created))
                    .then_with(|| a.owner.namespace.cmp(&b.owner.namespace))
                    .then_with(|| a.owner.virtual_service.cmp(&b.owner.virtual_service))
                    .then_with(|| a.position.cmp(&b.position))
            });
            table.rule_count += rules.len();
            let indexed = HostRules::index(rules);
            if host == "*" {
                table.any_host = Some(indexed);
            } else if let Some(suffix) = host.strip_prefix('*') {
                table.suffix_hosts.push((suffix.to_owned(), indexed));
            } else {
                table.exact_hosts.insert(host.to_owned(), indexed);
            }
        }
        table
            .suffix_hosts
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        table
    }

    /// The first rule matching the request, in Istio's order.
    pub fn lookup(&self, request: &RequestView<'_>) -> Option<Found<'_>> {
        let host = if let Some(rules) = self.exact_hosts.get(request.host) {
            Some(rules)
        } else {
            self.suffix_hosts
                .iter()
                .find(|(suffix, _)| request.host.ends_with(suffix.as_str()))
                .map(|(_, rules)| rules)
                .or(self.any_host.as_ref())
        };
        host?.lookup(request)
    }

    /// Rules over all hosts (a VirtualService with two hosts counts twice).
    pub fn rule_count(&self) -> usize {
        self.rule_count
    }

    /// VirtualServices that contributed at least one rule.
    pub fn virtual_service_count(&self) -> usize {
        self.virtual_services
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::test_support::*;
    use serde_json::json;

    #[test]
    fn routes_of_one_namespace_share_its_name_and_host_until_none_holds_them() {
        let names = SharedNames::default();
        let activity = Activity::default();
        let gateway = GatewayFilter(Some(GATEWAY.into()));
        let compile = |name: &str| {
            let vs = notebook_vs("alice", name, "2026-01-01T00:00:00Z");
            CompiledVirtualService::compile(&vs, &gateway, None, &activity, &names)
                .0
                .unwrap()
        };
        let (lab, other) = (compile("lab"), compile("other"));
        let (lab_rule, other_rule) = (&lab.rules[0], &other.rules[0]);
        assert!(Arc::ptr_eq(
            &lab_rule.owner.namespace,
            &other_rule.owner.namespace
        ));
        assert!(Arc::ptr_eq(&lab.hosts[0], &other.hosts[0]));
        drop(lab);
        names.forget_unused();
        assert_eq!(names.len(), 2, "still held by the other route");
        drop(other);
        names.forget_unused();
        assert_eq!(names.len(), 0);
    }

    #[test]
    fn kubeflow_notebook_route_matches_its_prefix_only() {
        let t = table(&[
            notebook_vs("alice", "lab", "2026-01-01T00:00:00Z"),
            notebook_vs("bob", "lab", "2026-01-01T00:00:01Z"),
        ]);
        assert_eq!(
            route(&t, &req("/notebook/alice/lab/api/kernels")),
            Some((
                "notebook-alice-lab".into(),
                "lab.alice.svc.cluster.local:80".into(),
                "/notebook/alice/lab/api/kernels".into()
            ))
        );
        assert_eq!(
            route(&t, &req("/notebook/bob/lab/")).unwrap().0,
            "notebook-bob-lab"
        );
        // The prefix carries the trailing slash: neither the bare name nor a longer name match.
        assert!(route(&t, &req("/notebook/alice/lab")).is_none());
        assert!(route(&t, &req("/notebook/alice/lab2/")).is_none());
        // Istio is case-sensitive unless ignoreUriCase is set.
        assert!(route(&t, &req("/notebook/Alice/lab/")).is_none());
        let owner = &t
            .lookup(&req("/notebook/bob/lab/x").view())
            .unwrap()
            .rule
            .owner;
        assert_eq!(&*owner.activity_key, "bob/lab");
        let rule = t.lookup(&req("/notebook/bob/lab/x").view()).unwrap().rule;
        assert_eq!(rule.namespaces().collect::<Vec<_>>(), ["bob"]);
        assert!(
            rule.other_namespaces.is_empty(),
            "no list for its own namespace"
        );
    }

    #[test]
    fn first_matching_rule_wins_in_order_with_headers_and_methods() {
        let t = table(&[vs(
            "x",
            "ordered",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"match": [{"uri": {"prefix": "/api/"}, "headers": {"x-canary": {"exact": "yes"}}}],
                 "route": [{"destination": {"host": "canary"}}]},
                {"match": [{"uri": {"prefix": "/api/"}, "method": {"regex": "POST|PUT"}}],
                 "route": [{"destination": {"host": "writer"}}]},
                {"match": [{"uri": {"prefix": "/api/"}}], "route": [{"destination": {"host": "reader"}}]},
                {"match": [{"uri": {"prefix": "/api/special"}}], "route": [{"destination": {"host": "never"}}]},
            ]}),
        )]);
        let dest = |r: Req| route(&t, &r).unwrap().1;
        assert_eq!(dest(req("/api/x").header("x-canary", "yes")), "canary:80");
        assert_eq!(dest(req("/api/x").header("x-canary", "no")), "reader:80");
        assert_eq!(dest(req("/api/x").method(Method::PUT)), "writer:80");
        assert_eq!(dest(req("/api/x")), "reader:80");
        // An earlier, shorter prefix wins over a later, longer one: order, not specificity.
        assert_eq!(dest(req("/api/special")), "reader:80");
    }

    #[test]
    fn merged_by_creation_time_with_catch_alls_last() {
        let catch_all = vs(
            "kubeflow",
            "dashboard",
            "2025-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"match": [{"uri": {"prefix": "/"}}], "route": [{"destination": {"host": "dashboard"}}]}
            ]}),
        );
        let older = vs(
            "x",
            "older",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"match": [{"uri": {"prefix": "/shared/"}}], "route": [{"destination": {"host": "older"}}]}
            ]}),
        );
        let newer = vs(
            "x",
            "newer",
            "2026-02-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"match": [{"uri": {"prefix": "/shared/"}}], "route": [{"destination": {"host": "newer"}}]},
                {"match": [{"uri": {"prefix": "/only-newer/"}}], "route": [{"destination": {"host": "newer"}}]}
            ]}),
        );
        // Input order does not matter; creation time does.
        let t = table(&[newer, catch_all, older]);
        assert_eq!(route(&t, &req("/shared/a")).unwrap().1, "older:80");
        assert_eq!(route(&t, &req("/only-newer/a")).unwrap().1, "newer:80");
        // The dashboard was created first but is a catch-all: it only gets what nothing else takes.
        assert_eq!(route(&t, &req("/anything")).unwrap().1, "dashboard:80");
        assert_eq!(t.virtual_service_count(), 3);
    }

    #[test]
    fn hosts_exact_then_longest_wildcard_then_star() {
        let make = |name: &str, host: &str| {
            vs(
                "x",
                name,
                "2026-01-01T00:00:00Z",
                json!({"hosts": [host], "gateways": [GATEWAY], "http": [
                    {"route": [{"destination": {"host": name}}]}
                ]}),
            )
        };
        let t = table(&[
            make("star", "*"),
            make("wild", "*.example.com"),
            make("deeper", "*.lab.example.com"),
            make("exact", "lab.example.com"),
        ]);
        let dest = |host: &str| route(&t, &req("/").host(host)).unwrap().1;
        assert_eq!(dest("lab.example.com"), "exact:80");
        assert_eq!(dest("a.lab.example.com"), "deeper:80");
        assert_eq!(dest("other.example.com"), "wild:80");
        assert_eq!(dest("elsewhere.org"), "star:80");
    }

    #[test]
    fn weighted_destinations_get_exact_shares() {
        let t = table(&[vs(
            "x",
            "split",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"route": [
                    {"destination": {"host": "v1"}, "weight": 70},
                    {"destination": {"host": "v2"}, "weight": 30},
                    {"destination": {"host": "v3"}, "weight": 0}
                ]}
            ]}),
        )]);
        let mut counts = HashMap::new();
        for _ in 0..1000 {
            *counts.entry(route(&t, &req("/")).unwrap().1).or_insert(0) += 1;
        }
        assert_eq!(counts.get("v1:80"), Some(&700));
        assert_eq!(counts.get("v2:80"), Some(&300));
        assert_eq!(counts.get("v3:80"), None);
    }

    #[test]
    fn indexed_lookup_agrees_with_ordered_scan_over_many_routes() {
        // 2,000 notebooks plus rules the index cannot take, interleaved in creation order.
        let mut list: Vec<_> = (0..2000)
            .map(|i| {
                notebook_vs(
                    &format!("ns{}", i % 37),
                    &format!("nb{i}"),
                    "2026-01-01T00:00:00Z",
                )
            })
            .collect();
        list.push(vs(
            "ops",
            "debug",
            "2025-06-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"match": [{"uri": {"prefix": "/notebook/ns1/"}, "headers": {"x-debug": {"exact": "1"}}}],
                 "route": [{"destination": {"host": "debugger"}}]}
            ]}),
        ));
        let t = table(&list);
        assert_eq!(t.rule_count(), 2001);
        assert_eq!(
            route(&t, &req("/notebook/ns1/nb1/x")).unwrap().1,
            "nb1.ns1.svc.cluster.local:80"
        );
        // The older header rule comes first for requests carrying the header.
        assert_eq!(
            route(&t, &req("/notebook/ns1/nb1/x").header("x-debug", "1"))
                .unwrap()
                .1,
            "debugger:80"
        );
        for i in (0..2000).step_by(97) {
            let path = format!("/notebook/ns{}/nb{i}/api", i % 37);
            assert_eq!(
                route(&t, &req(&path)).unwrap().0,
                format!("notebook-ns{}-nb{i}", i % 37)
            );
        }
        assert!(
            route(&t, &req("/notebook/ns1/nb2/")).is_none(),
            "nb2 lives in ns2"
        );
    }
}
