//! A VirtualService into the rules this proxy serves, compiled once per change of it, so that a
//! table rebuild only merges and indexes.
//!
//! Only VirtualServices bound to the configured gateway are taken; a match's own `gateways`
//! replace the VirtualService's for it. `timeout` (whole milliseconds, `0s` for none) bounds a
//! forwarded request until its response's last byte. A rule that cannot be used (bad regex, no
//! destination) is left out and reported, without losing the others.

use super::{
    Confinement, DEFAULT_DESTINATION_PORT, Destination, Few, FixedAnswer, HeaderEdits, HeaderOps,
    MatchCondition, Matcher, OtherRewrites, Refusal, RegexRewrite, RouteOwner, Rule, SharedNames,
    Skipped, activity_key, confinement::confine_rule, matching::unevaluated_condition,
};
use crate::activity::Activity;
use http::HeaderValue;
use labforge_crds::VirtualService;
use labforge_crds::istio::{HttpMatchRequest, HttpRoute};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// Which VirtualServices a table takes: those naming `gateway` (`<namespace>/<name>`, or a bare
/// `<name>` in the VirtualService's own namespace). `None` takes every VirtualService bound to
/// any gateway; `mesh`-only VirtualServices are never taken (they are sidecar routes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GatewayFilter(pub Option<String>);

impl GatewayFilter {
    fn accepts(&self, vs_namespace: &str, gateways: &[String]) -> bool {
        let bound = gateways.iter().filter(|g| g.as_str() != "mesh");
        match &self.0 {
            None => bound.count() > 0,
            Some(wanted) => bound.into_iter().any(|g| {
                if g.contains('/') {
                    g == wanted
                } else {
                    wanted.split_once('/') == Some((vs_namespace, g.as_str()))
                }
            }),
        }
    }
}

/// One VirtualService compiled once (matchers, regexes, header operations): a table rebuild only
/// merges and indexes these, so a change to one of 10,000 routes does not recompile the others,
/// and the raw objects need not be kept.
#[derive(Debug)]
pub struct CompiledVirtualService {
    /// Lowercase.
    pub(super) hosts: Few<Arc<str>>,
    /// At least one.
    pub(super) rules: Few<Arc<Rule>>,
}

impl CompiledVirtualService {
    /// `None` when the VirtualService is not bound to the gateway or has no usable rule; rules
    /// that cannot be used (bad regex, no destination) are skipped and reported.
    ///
    /// `confinement` is `None` for a VirtualService trusted as a whole (one the embedded runtime
    /// registers itself); otherwise its rules are confined unless its namespace is trusted.
    pub fn compile(
        vs: &VirtualService,
        gateway: &GatewayFilter,
        confinement: Option<&Confinement>,
        activity: &Activity,
        names: &SharedNames,
    ) -> (Option<Self>, Vec<Skipped>) {
        let mut skipped = Vec::new();
        let namespace = vs.metadata.namespace.clone().unwrap_or_default();
        let name = vs.metadata.name.clone().unwrap_or_default();
        let confinement = confinement.filter(|c| !c.is_trusted(&namespace));
        let binding = Binding {
            gateway,
            namespace: &namespace,
            bound_here: gateway.accepts(&namespace, &vs.spec.gateways),
        };
        if !binding.bound_here && !binding.any_match_bound_here(vs) {
            return (None, skipped);
        }
        let owner = route_owner(vs, &namespace, name, confinement, activity, names);
        let mut rules = compile_rules(vs, &binding, confinement, &owner, &mut skipped);
        if rules.is_empty() {
            return (None, skipped);
        }
        rules.shrink_to_fit();
        let hosts = served_hosts(vs, &namespace, confinement, &owner, names, &mut skipped);
        if hosts.is_empty() {
            return (None, skipped);
        }
        (Some(Self { hosts, rules }), skipped)
    }

    /// The activity key of its routes.
    pub fn key(&self) -> &str {
        &self.owner().activity_key
    }

    /// Namespace and name of the VirtualService.
    pub fn namespace_and_name(&self) -> (&str, &str) {
        let owner = self.owner();
        (&owner.namespace, &owner.virtual_service)
    }

    /// The owner all its rules share: [`CompiledVirtualService::compile`] makes none without rules.
    fn owner(&self) -> &RouteOwner {
        &self.rules[0].owner
    }
}

/// Whether a VirtualService's matches apply at this proxy's gateway.
struct Binding<'a> {
    gateway: &'a GatewayFilter,
    /// The VirtualService's namespace, which its gateway names are relative to.
    namespace: &'a str,
    /// The VirtualService's own `gateways` accept this proxy's.
    bound_here: bool,
}

impl Binding<'_> {
    /// A match's own `gateways` replace the VirtualService's for that match.
    fn accepts(&self, m: &HttpMatchRequest) -> bool {
        if m.gateways.is_empty() {
            self.bound_here
        } else {
            self.gateway.accepts(self.namespace, &m.gateways)
        }
    }

    /// Whether a match of `vs` is bound here by gateways of its own: the VirtualService is then
    /// served even where its own gateways are not.
    fn any_match_bound_here(&self, vs: &VirtualService) -> bool {
        vs.spec
            .http
            .iter()
            .flat_map(|route| &route.matches)
            .any(|m| !m.gateways.is_empty() && self.accepts(m))
    }
}

/// The owner the rules of `vs` (named `name`, of `namespace`) share, with its activity cell.
fn route_owner(
    vs: &VirtualService,
    namespace: &str,
    name: String,
    confinement: Option<&Confinement>,
    activity: &Activity,
    names: &SharedNames,
) -> Arc<RouteOwner> {
    let notebook = notebook_of(vs, namespace, &name);
    let (activity_key, activity) = activity.cell(&activity_key(
        namespace,
        notebook.as_deref().unwrap_or(&name),
    ));
    Arc::new(RouteOwner {
        activity_key,
        activity,
        namespace: names.intern(namespace),
        virtual_service: name.into(),
        shared_with: labforge_crds::notebook::shared_with(
            vs.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(labforge_crds::notebook::SHARED_WITH_ANNOTATION))
                .map(String::as_str),
        )
        .into_iter()
        .map(Arc::from)
        .collect(),
        created: vs.metadata.creation_timestamp.as_ref().map(|t| t.0),
        allowed_paths: confinement
            .map(|c| c.allowed_paths(namespace, names))
            .unwrap_or_default(),
    })
}

/// The rules of `vs` that apply here, in order; those left out are added to `skipped`.
fn compile_rules(
    vs: &VirtualService,
    binding: &Binding<'_>,
    confinement: Option<&Confinement>,
    owner: &Arc<RouteOwner>,
    skipped: &mut Vec<Skipped>,
) -> Few<Arc<Rule>> {
    let mut rules = Few::new();
    for (position, route) in vs.spec.http.iter().enumerate() {
        let Some(applicable) = applicable_matches(route, position, binding, owner, skipped) else {
            continue;
        };
        let compiled = compile_rule(route, &applicable, owner, position);
        let confined = match (compiled, confinement) {
            (Ok(mut rule), Some(confinement)) => {
                match confine_rule(&mut rule, route, confinement) {
                    Ok(()) => Ok(rule),
                    Err((refusal, reason)) => {
                        skipped.push(Skipped {
                            refused: Some(refusal),
                            ..owner.skipped(format!(
                                "http[{position}]: refused, namespace {:?} is not trusted: \
                                 {reason}",
                                binding.namespace
                            ))
                        });
                        continue;
                    }
                }
            }
            (compiled, _) => compiled,
        };
        match confined {
            Ok(rule) => {
                if matches!(rule.answer.as_deref(), Some(FixedAnswer::NotServed)) {
                    skipped.push(owner.skipped(format!(
                        "http[{position}]: delegation is not served by this proxy; the \
                         requests this rule matches get 404"
                    )));
                }
                rules.push(Arc::new(rule));
            }
            Err(reason) => skipped.push(owner.skipped(format!("http[{position}]: {reason}"))),
        }
    }
    rules
}

/// The matches of `route` (the `position`th of its VirtualService) that apply here, or `None`
/// when the route itself does not; matches left out are added to `skipped`.
fn applicable_matches<'r>(
    route: &'r HttpRoute,
    position: usize,
    binding: &Binding<'_>,
    owner: &RouteOwner,
    skipped: &mut Vec<Skipped>,
) -> Option<Vec<&'r HttpMatchRequest>> {
    let mut applicable = Vec::new();
    for (index, m) in route.matches.iter().enumerate() {
        if !binding.accepts(m) {
            continue;
        }
        // Left out rather than matched without the condition: that would send the rule
        // requests Istio does not.
        if let Some(field) = unevaluated_condition(m) {
            skipped.push(owner.skipped(format!(
                "http[{position}].match[{index}]: `{field}` is not evaluated by this proxy, so \
                 this match never applies"
            )));
            continue;
        }
        applicable.push(m);
    }
    // A rule without matches takes every request where its VirtualService is bound; one whose
    // matches all were left out takes none.
    let applies = if route.matches.is_empty() {
        binding.bound_here
    } else {
        !applicable.is_empty()
    };
    applies.then_some(applicable)
}

/// The hosts of `vs`, lowercase, that its namespace may serve; the others are added to
/// `skipped`.
fn served_hosts(
    vs: &VirtualService,
    namespace: &str,
    confinement: Option<&Confinement>,
    owner: &RouteOwner,
    names: &SharedNames,
    skipped: &mut Vec<Skipped>,
) -> Few<Arc<str>> {
    vs.spec
        .hosts
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .filter(|host| {
            let allowed =
                confinement.is_none_or(|c| c.may_name_host(namespace, host, &vs.spec.http));
            if !allowed {
                skipped.push(Skipped {
                    refused: Some(Refusal::Host),
                    ..owner.skipped(format!(
                        "host {host:?} is not one of this namespace's notebooks; not served there"
                    ))
                });
            }
            allowed
        })
        .map(|host| names.intern(&host))
        .collect()
}

/// The Notebook behind a VirtualService: its owner reference, else Kubeflow's naming.
fn notebook_of(vs: &VirtualService, namespace: &str, name: &str) -> Option<String> {
    let owned = vs
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Notebook" && o.api_version.starts_with("kubeflow.org/"))
        .map(|o| o.name.clone());
    owned.or_else(|| {
        name.strip_prefix(&format!("notebook-{namespace}-"))
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
    })
}

/// The namespace of a Kubernetes Service host (`svc.ns`, `svc.ns.svc`, `svc.ns.svc.<domain>`);
/// `None` for a short name (the VirtualService's own namespace), an IP or an outside name. A
/// two-label outside name (`example.com`) reads as `svc.ns`: that fails closed (a namespace
/// nobody is a member of), never open.
fn destination_namespace(host: &str) -> Option<&str> {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    let labels: Vec<&str> = host.split('.').collect();
    match labels.as_slice() {
        [_, ns] => Some(ns),
        [_, ns, "svc", ..] => Some(ns),
        _ => None,
    }
}

/// `route` as a rule with the `applicable` ones of its matches.
fn compile_rule(
    route: &HttpRoute,
    applicable: &[&HttpMatchRequest],
    owner: &Arc<RouteOwner>,
    position: usize,
) -> Result<Rule, String> {
    let matches = applicable
        .iter()
        .map(|m| MatchCondition::compile(m))
        .collect::<Result<Few<_>, _>>()?;
    let weighted = route.route.iter().any(|d| d.weight.is_some());
    let destinations: Few<Destination> = route
        .route
        .iter()
        .map(|d| Destination {
            authority: format!(
                "{}:{}",
                d.destination.host,
                d.destination
                    .port
                    .as_ref()
                    .map_or(DEFAULT_DESTINATION_PORT, |p| p.number)
            )
            .into(),
            // Without weights, traffic is split evenly (Istio requires weights on several).
            weight: if weighted {
                d.weight.unwrap_or(0).max(0).unsigned_abs()
            } else {
                1
            },
        })
        .collect();
    let answer = FixedAnswer::compile(route)?.map(Box::new);
    if destinations.is_empty() && answer.is_none() {
        return Err("no route destination, redirect or direct response".into());
    }
    let total_weight = destinations.iter().map(|d| d.weight).sum();
    let mut other_namespaces: Vec<Arc<str>> = route
        .route
        .iter()
        .filter_map(|d| destination_namespace(&d.destination.host))
        .filter(|ns| *ns != &*owner.namespace)
        .map(Arc::from)
        .collect();
    other_namespaces.sort();
    other_namespaces.dedup();
    if total_weight == 0 && answer.is_none() {
        return Err("every destination has weight 0".into());
    }
    let rewrite = route.rewrite.as_ref();
    let other_rewrites = OtherRewrites {
        regex: rewrite
            .and_then(|r| r.uri_regex_rewrite.as_ref())
            .map(RegexRewrite::compile)
            .transpose()?,
        authority: rewrite
            .and_then(|r| r.authority.as_deref())
            .map(|authority| {
                HeaderValue::from_str(authority).map_err(|e| format!("rewrite authority: {e}"))
            })
            .transpose()?,
    };
    let other_rewrites = (other_rewrites.regex.is_some() || other_rewrites.authority.is_some())
        .then(|| Box::new(other_rewrites));
    let rewrite_uri = route
        .rewrite
        .as_ref()
        .and_then(|r| r.uri.as_deref())
        .map(|uri| {
            matches
                .iter()
                .find_map(|m| match &m.uri {
                    Some(Matcher::Prefix(prefix)) if &**prefix == uri => Some(prefix.clone()),
                    _ => None,
                })
                .unwrap_or_else(|| uri.into())
        });
    let headers = route.headers.as_ref();
    let header_edits = HeaderEdits {
        request: HeaderOps::compile(headers.and_then(|h| h.request.as_ref()))?,
        response: HeaderOps::compile(headers.and_then(|h| h.response.as_ref()))?,
    };
    let header_edits = (!header_edits.request.is_empty() || !header_edits.response.is_empty())
        .then(|| Box::new(header_edits));
    let timeout_ms = route
        .timeout
        .as_deref()
        .map(route_timeout_ms)
        .transpose()?
        .flatten();
    Ok(Rule {
        owner: owner.clone(),
        matches,
        rewrite_uri,
        other_rewrites,
        answer,
        header_edits,
        destinations,
        other_namespaces: other_namespaces.into_boxed_slice(),
        total_weight,
        next: AtomicU64::new(0),
        // Beyond u32::MAX rules, the table's order is the least of the problems.
        position: u32::try_from(position).unwrap_or(u32::MAX),
        timeout_ms,
        path_guard: false,
    })
}

/// An HTTP route's `timeout` in milliseconds, `None` for `0s` (no timeout). Istio takes a
/// protobuf duration (`2.5s`) and, written by hand, Go's (`1m30s`, `500ms`); it refuses
/// durations under a millisecond or with a finer part, and so does this.
fn route_timeout_ms(text: &str) -> Result<Option<NonZeroU32>, String> {
    let bad = |why: &str| format!("timeout `{text}`: {why}");
    let duration: jiff::SignedDuration = text
        .trim()
        .parse()
        .map_err(|e| bad(&format!("not a duration ({e})")))?;
    if duration.is_negative() {
        return Err(bad("negative"));
    }
    if duration.subsec_nanos() % 1_000_000 != 0 {
        return Err(bad("only whole milliseconds are supported"));
    }
    let ms = duration.as_millis();
    if ms == 0 {
        return Ok(None);
    }
    u32::try_from(ms)
        .map(NonZeroU32::new)
        .map_err(|_| bad("longer than 49 days"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::RouteTable;
    use crate::routes::test_support::*;
    use serde_json::json;
    use std::time::Duration;

    #[test]
    fn a_rule_is_guarded_by_its_own_and_its_destinations_namespaces() {
        let t = table(&[vs(
            "bob",
            "sneaky",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"match": [{"uri": {"prefix": "/a/"}}],
                 "route": [{"destination": {"host": "lab.alice.svc.cluster.local"}}]},
                {"match": [{"uri": {"prefix": "/b/"}}],
                 "route": [{"destination": {"host": "web"}, "weight": 50},
                           {"destination": {"host": "api.carol"}, "weight": 50}]},
                {"match": [{"uri": {"prefix": "/c/"}}],
                 "route": [{"destination": {"host": "127.0.0.1", "port": {"number": 8888}}},
                           {"destination": {"host": "www.example.com"}}]},
            ]}),
        )]);
        let namespaces = |path: &str| {
            t.lookup(&req(path).view())
                .unwrap()
                .rule
                .namespaces()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(namespaces("/a/"), ["bob", "alice"]);
        assert_eq!(namespaces("/b/"), ["bob", "carol"]);
        assert_eq!(namespaces("/c/"), ["bob"]);
    }

    #[test]
    fn gateway_filter_takes_only_bound_virtual_services() {
        let make = |ns: &str, name: &str, gateways: serde_json::Value| {
            vs(
                ns,
                name,
                "2026-01-01T00:00:00Z",
                json!({"hosts": ["*"], "gateways": gateways, "http": [
                    {"match": [{"uri": {"prefix": format!("/{name}/")}}],
                     "route": [{"destination": {"host": name}}]}
                ]}),
            )
        };
        let list = [
            make("alice", "full", json!([GATEWAY])),
            make("kubeflow", "short", json!(["kubeflow-gateway"])),
            make("alice", "short-elsewhere", json!(["kubeflow-gateway"])),
            make("alice", "other", json!(["istio-system/ingress"])),
            make("alice", "mesh", json!(["mesh"])),
            make("alice", "none", json!([])),
        ];
        let t = table(&list);
        let served: Vec<_> = ["full", "short", "short-elsewhere", "other", "mesh", "none"]
            .into_iter()
            .filter(|n| route(&t, &req(&format!("/{n}/"))).is_some())
            .collect();
        assert_eq!(served, ["full", "short"]);
        let (any, _) = RouteTable::build(&list, &GatewayFilter(None), &Activity::default());
        assert_eq!(
            any.virtual_service_count(),
            4,
            "all but mesh-only and unbound"
        );
    }

    #[test]
    fn a_match_with_its_own_gateways_applies_only_at_those() {
        let t = table(&[
            vs(
                "x",
                "mixed",
                "2026-01-01T00:00:00Z",
                json!({"hosts": ["*"], "gateways": ["mesh", GATEWAY], "http": [
                    {"match": [{"uri": {"prefix": "/internal/"}, "gateways": ["mesh"]}],
                     "route": [{"destination": {"host": "internal"}}]},
                    {"route": [{"destination": {"host": "public"}}]}
                ]}),
            ),
            vs(
                "y",
                "mesh-only",
                "2026-01-01T00:00:00Z",
                json!({"hosts": ["special.example.com"], "gateways": ["mesh"], "http": [
                    {"match": [{"uri": {"prefix": "/edge/"}, "gateways": [GATEWAY]}],
                     "route": [{"destination": {"host": "edge"}}]},
                    {"route": [{"destination": {"host": "sidecar-only"}}]}
                ]}),
            ),
        ]);
        assert_eq!(route(&t, &req("/internal/x")).unwrap().1, "public:80");
        let special = |path: &str| route(&t, &req(path).host("special.example.com"));
        assert_eq!(special("/edge/x").unwrap().1, "edge:80");
        // The rest of a mesh-only VirtualService stays with the mesh.
        assert!(special("/other").is_none());
    }

    #[test]
    fn bad_rules_are_skipped_and_reported_without_losing_the_others() {
        let list = [
            vs(
                "x",
                "broken",
                "2026-01-01T00:00:00Z",
                json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                    {"match": [{"uri": {"regex": "(unclosed"}}], "route": [{"destination": {"host": "b"}}]},
                    {"match": [{"uri": {"prefix": "/ok/"}}], "route": [{"destination": {"host": "ok"}}]},
                    {"match": [{"uri": {"prefix": "/nowhere/"}}]}
                ]}),
            ),
            notebook_vs("alice", "lab", "2026-01-01T00:00:00Z"),
        ];
        let (t, skipped) = RouteTable::build(
            &list,
            &GatewayFilter(Some(GATEWAY.into())),
            &Activity::default(),
        );
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped[0].reason.starts_with("http[0]: uri regex"));
        assert!(
            skipped[1]
                .reason
                .starts_with("http[2]: no route destination, redirect or direct response")
        );
        assert_eq!(route(&t, &req("/ok/")).unwrap().1, "ok:80");
        assert!(route(&t, &req("/notebook/alice/lab/")).is_some());
    }

    #[test]
    fn route_timeouts_are_read_as_istio_reads_them_and_bad_ones_are_reported() {
        let rule_with = |timeout: &str| {
            json!({"match": [{"uri": {"prefix": format!("/t/{timeout}/")}}], "timeout": timeout,
                   "route": [{"destination": {"host": "api"}}]})
        };
        let accepted = ["2.5s", "1m30s", "500ms", "0s", "PT2S"];
        let refused = ["soon", "-1s", "1.0005s", "1200h"];
        let rules: Vec<_> = accepted
            .iter()
            .chain(&refused)
            .map(|t| rule_with(t))
            .collect();
        let list = [vs(
            "ops",
            "api",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": rules}),
        )];
        let (t, skipped) = RouteTable::build(
            &list,
            &GatewayFilter(Some(GATEWAY.into())),
            &Activity::default(),
        );
        let timeout = |text: &str| {
            let request = req(&format!("/t/{text}/x"));
            let view = request.view();
            t.lookup(&view).map(|found| found.rule.timeout())
        };
        assert_eq!(timeout("2.5s"), Some(Some(Duration::from_millis(2500))));
        assert_eq!(timeout("1m30s"), Some(Some(Duration::from_secs(90))));
        assert_eq!(timeout("500ms"), Some(Some(Duration::from_millis(500))));
        assert_eq!(timeout("0s"), Some(None), "0s is no timeout");
        assert_eq!(timeout("PT2S"), Some(Some(Duration::from_secs(2))));
        let reasons: Vec<_> = skipped.iter().map(|s| s.reason.as_str()).collect();
        assert_eq!(reasons.len(), refused.len(), "{reasons:?}");
        for (reason, (text, why)) in reasons.iter().zip([
            ("soon", "not a duration"),
            ("-1s", "negative"),
            ("1.0005s", "whole milliseconds"),
            ("1200h", "49 days"),
        ]) {
            assert!(
                reason.contains(&format!("timeout `{text}`")) && reason.contains(why),
                "{reason}"
            );
            assert_eq!(timeout(text), None, "a refused rule takes no request");
        }
        // A notebook's rule has none.
        let nb = table(&[notebook_vs("alice", "lab", "2026-01-01T00:00:00Z")]);
        let request = req("/notebook/alice/lab/");
        assert_eq!(nb.lookup(&request.view()).unwrap().rule.timeout(), None);
    }
}
