//! VirtualServices → an immutable [`RouteTable`] with Istio's gateway semantics.
//!
//! Pure: no I/O, so every matching rule is unit-tested without a server. The table is built once
//! per change and swapped in whole by `source`; lookups read it without locks.
//!
//! Semantics kept from Istio's gateway: only VirtualServices bound to the configured gateway;
//! hosts matched exactly, then by the longest `*.suffix`, then `*`; the `http[]` rules of every
//! VirtualService for a host merged in creation order (then namespace/name), catch-all rules moved
//! last; inside that list the first matching rule wins. `uri.prefix` is a plain string prefix,
//! `exact` is whole-path equality, `regex` (RE2 syntax) must match the whole path; the query is
//! never part of the URI match. A match may also hold `method`, `headers`, `withoutHeaders`,
//! `queryParams` (the raw value of a parameter's first occurrence), `authority` (as sent, port
//! included) and `scheme`, and its own `gateways`, which replace the VirtualService's for it; an
//! empty string match (`{}`) asks only that the value be there (a header's presence). A
//! condition this proxy does not evaluate (`port`, `sourceLabels`, `sourceNamespace`) leaves its
//! match out, reported: dropping the condition instead would send the rule requests Istio does
//! not. `rewrite.uri` replaces the matched prefix (the whole path for the other match kinds) and
//! the query is kept; `rewrite.uriRegexRewrite` replaces every match of its regex in the path;
//! `rewrite.authority` replaces the `Host` the destination gets; `timeout` (whole milliseconds,
//! `0s` for none) bounds a forwarded request until its response's last byte. A rule with
//! `directResponse` or `redirect` answers itself (`Location` built as Envoy builds it: the
//! request's scheme, host, port and query unless replaced); one that `delegate`s cannot be served
//! here and answers 404, so that its requests do not fall through to a later rule.
//!
//! Kubeflow clusters hold one rule per notebook, all plain prefixes, so a table of 10,000
//! notebooks must not be scanned rule by rule: pure-prefix and pure-exact matches are indexed by
//! prefix length, and only the other rules are tried in order, each only while it could still
//! come before the best indexed candidate.

use crate::FastMap;
use crate::activity::{Activity, ActivityCell};
use http::uri::Authority;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use labforge_crds::VirtualService;
use labforge_crds::istio::{HeaderOperations, HttpMatchRequest, HttpRoute, StringMatch};
use smallvec::SmallVec;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Port a destination without `port.number` is reached on (a Service's usual HTTP port).
pub const DEFAULT_DESTINATION_PORT: u32 = 80;

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

/// An Istio StringMatch, compiled.
#[derive(Clone, Debug)]
pub enum Matcher {
    /// Shared with the host's index of pure exact and prefix matches, which would otherwise copy
    /// every notebook's prefix.
    Exact(Arc<str>),
    Prefix(Arc<str>),
    /// Anchored at both ends: Istio (Envoy's safe_regex) requires a full match. Boxed: a
    /// `Regex` is larger than the other variants, and every notebook rule has two matcher slots
    /// (URI, a prefix, and method, empty), so inline it would enlarge every match condition.
    Regex(Box<regex::Regex>),
    /// `{}`: any value, as long as there is one (a header's or parameter's presence).
    Present,
}

impl Matcher {
    fn compile(m: &StringMatch) -> Result<Self, regex::Error> {
        Ok(match m {
            StringMatch::Exact(s) => Matcher::Exact(s.as_str().into()),
            StringMatch::Prefix(s) => Matcher::Prefix(s.as_str().into()),
            StringMatch::Regex(r) => {
                Matcher::Regex(Box::new(regex::Regex::new(&format!("^(?:{r})$"))?))
            }
            StringMatch::Present => Matcher::Present,
        })
    }

    fn matches(&self, value: &str) -> bool {
        match self {
            Matcher::Exact(s) => value == &**s,
            Matcher::Prefix(s) => value.starts_with(&**s),
            Matcher::Regex(r) => r.is_match(value),
            Matcher::Present => true,
        }
    }

    fn lowercased(self) -> Self {
        match self {
            Matcher::Exact(s) => Matcher::Exact(s.to_lowercase().into()),
            Matcher::Prefix(s) => Matcher::Prefix(s.to_lowercase().into()),
            other @ (Matcher::Regex(_) | Matcher::Present) => other,
        }
    }
}

/// One `match` entry: every condition must hold.
#[derive(Clone, Debug, Default)]
pub struct MatchCondition {
    pub uri: Option<Matcher>,
    pub ignore_uri_case: bool,
    pub method: Option<Matcher>,
    /// The conditions few routes have; boxed, so that a notebook's match holds a pointer for them.
    pub other: Option<Box<OtherConditions>>,
}

/// A match's conditions on headers, the authority, scheme and query.
#[derive(Clone, Debug, Default)]
pub struct OtherConditions {
    pub headers: Box<[(HeaderName, Matcher)]>,
    /// On the authority as sent (port included), case-sensitively, as Istio's `authority`.
    pub authority: Option<Matcher>,
    /// On `http` or `https`.
    pub scheme: Option<Matcher>,
    /// On the raw value of the query parameter's first occurrence; a missing one never matches.
    pub query_params: Box<[(Box<str>, Matcher)]>,
    /// Headers none of whose values may match (`withoutHeaders`); a missing one passes.
    pub without_headers: Box<[(HeaderName, Matcher)]>,
}

impl OtherConditions {
    fn compile(m: &HttpMatchRequest) -> Result<Option<Box<Self>>, String> {
        if m.headers.is_empty()
            && m.authority.is_none()
            && m.scheme.is_none()
            && m.query_params.is_empty()
            && m.without_headers.is_empty()
        {
            return Ok(None);
        }
        let compile = |what: &str, matcher: &StringMatch| {
            Matcher::compile(matcher).map_err(|e| format!("{what} regex: {e}"))
        };
        Ok(Some(Box::new(Self {
            headers: compile_header_matches(&m.headers)?,
            authority: m
                .authority
                .as_ref()
                .map(|a| compile("authority", a))
                .transpose()?,
            scheme: m
                .scheme
                .as_ref()
                .map(|s| compile("scheme", s))
                .transpose()?,
            query_params: m
                .query_params
                .iter()
                .map(|(name, matcher)| {
                    Ok((
                        name.as_str().into(),
                        compile(&format!("query {name}"), matcher)?,
                    ))
                })
                .collect::<Result<_, String>>()?,
            without_headers: compile_header_matches(&m.without_headers)?,
        })))
    }

    fn matches(&self, request: &RequestView<'_>) -> bool {
        self.headers
            .iter()
            .all(|(name, m)| header_matches(request.headers, name, m))
            && self
                .authority
                .as_ref()
                .is_none_or(|m| m.matches(request.authority))
            && self
                .scheme
                .as_ref()
                .is_none_or(|m| m.matches(request.scheme))
            && self.query_params.iter().all(|(name, m)| {
                request
                    .query
                    .and_then(|query| query_param(query, name))
                    .is_some_and(|value| m.matches(value))
            })
            && self
                .without_headers
                .iter()
                .all(|(name, m)| !header_matches(request.headers, name, m))
    }
}

/// The raw value of `name`'s first occurrence in `query` (`""` for a bare `name`), as Envoy's
/// query parameter matching reads it: not percent-decoded.
fn query_param<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then_some(value)
    })
}

/// Whether any value of header `name` matches `m` (none does when it is missing).
fn header_matches(headers: &HeaderMap, name: &HeaderName, m: &Matcher) -> bool {
    headers
        .get_all(name)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| m.matches(v)))
}

fn compile_header_matches(
    headers: &std::collections::BTreeMap<String, StringMatch>,
) -> Result<Box<[(HeaderName, Matcher)]>, String> {
    headers
        .iter()
        .map(|(name, matcher)| {
            let name = HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                .map_err(|e| format!("header {name:?}: {e}"))?;
            let matcher =
                Matcher::compile(matcher).map_err(|e| format!("header {name} regex: {e}"))?;
            Ok((name, matcher))
        })
        .collect()
}

/// Match fields that say nothing about which requests match.
const DESCRIPTIVE_MATCH_FIELDS: [&str; 2] = ["name", "statPrefix"];

/// The first condition of `m` this proxy does not evaluate (`port`, `sourceLabels`,
/// `sourceNamespace`, or one newer than this code), if any.
fn unevaluated_condition(m: &HttpMatchRequest) -> Option<&str> {
    m.other
        .keys()
        .map(String::as_str)
        .find(|field| !DESCRIPTIVE_MATCH_FIELDS.contains(field))
}

impl MatchCondition {
    fn compile(m: &HttpMatchRequest) -> Result<Self, String> {
        let ignore_uri_case = m.ignore_uri_case.unwrap_or(false);
        let uri = m
            .uri
            .as_ref()
            .map(Matcher::compile)
            .transpose()
            .map_err(|e| format!("uri regex: {e}"))?
            .map(|u| if ignore_uri_case { u.lowercased() } else { u });
        let method = m
            .method
            .as_ref()
            .map(Matcher::compile)
            .transpose()
            .map_err(|e| format!("method regex: {e}"))?;
        Ok(Self {
            uri,
            ignore_uri_case,
            method,
            other: OtherConditions::compile(m)?,
        })
    }

    /// The URI matcher of a condition that is nothing but a case-sensitive URI match.
    fn pure_uri(&self) -> Option<&Matcher> {
        let only_uri = !self.ignore_uri_case && self.method.is_none() && self.other.is_none();
        self.uri.as_ref().filter(|_| only_uri)
    }

    /// The prefix of a condition that is nothing but a case-sensitive `uri.prefix`.
    fn pure_prefix(&self) -> Option<&Arc<str>> {
        match self.pure_uri()? {
            Matcher::Prefix(p) => Some(p),
            _ => None,
        }
    }

    fn pure_exact(&self) -> Option<&Arc<str>> {
        match self.pure_uri()? {
            Matcher::Exact(p) => Some(p),
            _ => None,
        }
    }

    /// Matches everything (`{}` or `uri.prefix: /`): such rules go last when merging.
    fn is_catch_all(&self) -> bool {
        self.method.is_none()
            && self.other.is_none()
            && match &self.uri {
                None => true,
                Some(Matcher::Prefix(p)) => &**p == "/",
                Some(Matcher::Regex(r)) => r.as_str() == "^(?:.*)$",
                Some(Matcher::Present) => true,
                Some(Matcher::Exact(_)) => false,
            }
    }

    fn matches(&self, request: &RequestView<'_>) -> bool {
        let uri_ok = match &self.uri {
            None => true,
            Some(m) if self.ignore_uri_case => m.matches(&request.path.to_lowercase()),
            Some(m) => m.matches(request.path),
        };
        uri_ok
            && self
                .method
                .as_ref()
                .is_none_or(|m| m.matches(request.method.as_str()))
            && self.other.as_deref().is_none_or(|o| o.matches(request))
    }
}

/// One header edit.
#[derive(Clone, Debug)]
enum HeaderOp {
    Remove(HeaderName),
    Set(HeaderName, HeaderValue),
    Add(HeaderName, HeaderValue),
}

/// Header edits of a rule (`headers.request` or `headers.response`), validated once and kept in
/// the order Envoy applies them: removals, then replacements, then appends. One boxed slice, so
/// the common rule without edits holds one empty slice, not three empty vectors.
#[derive(Clone, Debug, Default)]
pub struct HeaderOps(Box<[HeaderOp]>);

impl HeaderOps {
    fn compile(ops: Option<&HeaderOperations>) -> Result<Self, String> {
        let Some(ops) = ops else {
            return Ok(Self::default());
        };
        let name = |k: &String| {
            HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes())
                .map_err(|e| format!("header name {k:?}: {e}"))
        };
        let value = |k: &String, v: &String| {
            HeaderValue::from_str(v).map_err(|e| format!("header {k} value: {e}"))
        };
        let removals = ops.remove.iter().map(|k| Ok(HeaderOp::Remove(name(k)?)));
        let sets = ops
            .set
            .iter()
            .map(|(k, v)| Ok(HeaderOp::Set(name(k)?, value(k, v)?)));
        let adds = ops
            .add
            .iter()
            .map(|(k, v)| Ok(HeaderOp::Add(name(k)?, value(k, v)?)));
        Ok(Self(
            removals
                .chain(sets)
                .chain(adds)
                .collect::<Result<_, String>>()?,
        ))
    }

    pub fn apply(&self, headers: &mut HeaderMap) {
        for op in &self.0 {
            match op {
                HeaderOp::Remove(name) => {
                    headers.remove(name);
                }
                HeaderOp::Set(name, value) => {
                    headers.insert(name.clone(), value.clone());
                }
                HeaderOp::Add(name, value) => {
                    headers.append(name.clone(), value.clone());
                }
            }
        }
    }
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

/// The header edits of a rule.
#[derive(Debug, Default)]
pub struct HeaderEdits {
    pub request: HeaderOps,
    pub response: HeaderOps,
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

    /// The path the upstream sees: `rewrite.uri` in place of the matched prefix (or of the whole
    /// path for exact, regex and match-less rules).
    pub fn rewritten_path<'p>(
        &self,
        found: &Found<'_>,
        path: &'p str,
    ) -> std::borrow::Cow<'p, str> {
        if let Some(rewrite) = self.other_rewrites.as_ref().and_then(|o| o.regex.as_ref()) {
            return rewrite
                .regex
                .replace_all(path, rewrite.replacement.as_str());
        }
        let Some(rewrite) = &self.rewrite_uri else {
            return std::borrow::Cow::Borrowed(path);
        };
        match found.prefix_len {
            // Kubeflow's VirtualServices rewrite a notebook's prefix to itself.
            Some(len) if path.get(..len) == Some(&**rewrite) => std::borrow::Cow::Borrowed(path),
            Some(len) => {
                let rest = path.get(len..).unwrap_or_default();
                let mut rewritten = String::with_capacity(rewrite.len() + rest.len());
                rewritten.push_str(rewrite);
                rewritten.push_str(rest);
                std::borrow::Cow::Owned(rewritten)
            }
            None => std::borrow::Cow::Owned(rewrite.to_string()),
        }
    }
}

/// A rule's rewrites besides `rewrite.uri`.
#[derive(Debug, Default)]
pub struct OtherRewrites {
    /// `uriRegexRewrite`: every match of the regex in the path replaced.
    pub regex: Option<RegexRewrite>,
    /// `authority`: the `Host` the destination gets.
    pub authority: Option<HeaderValue>,
}

/// Istio's `uriRegexRewrite`, with the replacement in the regex crate's syntax.
#[derive(Debug)]
pub struct RegexRewrite {
    pub regex: regex::Regex,
    pub replacement: String,
}

impl RegexRewrite {
    fn compile(rewrite: &labforge_crds::istio::RegexRewrite) -> Result<Self, String> {
        let regex = regex::Regex::new(&rewrite.pattern)
            .map_err(|e| format!("uriRegexRewrite regex: {e}"))?;
        Ok(Self {
            regex,
            replacement: re2_replacement(&rewrite.rewrite),
        })
    }
}

/// An RE2 substitution (`\1` for a group) in the regex crate's syntax (`${1}`, `$$` for `$`).
fn re2_replacement(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '$' => out.push_str("$$"),
            '\\' => match chars.peek() {
                Some(d) if d.is_ascii_digit() => {
                    out.push_str("${");
                    out.push(*d);
                    out.push('}');
                    chars.next();
                }
                Some('\\') => {
                    out.push('\\');
                    chars.next();
                }
                _ => out.push('\\'),
            },
            c => out.push(c),
        }
    }
    out
}

/// A rule's own answer, sent without reaching any upstream (after authorization, like any).
#[derive(Debug)]
pub enum FixedAnswer {
    Redirect(Redirect),
    Respond {
        status: http::StatusCode,
        body: bytes::Bytes,
    },
    /// A rule this proxy cannot serve (`delegate`): the requests it matches get the proxy's
    /// 404 rather than reaching a later rule, which Istio would not send them to.
    NotServed,
}

/// Istio's `HTTPRedirect`.
#[derive(Debug)]
pub struct Redirect {
    pub status: http::StatusCode,
    /// Replaces the whole path.
    pub uri: Option<Box<str>>,
    /// Replaces the matched prefix.
    pub prefix_rewrite: Option<Box<str>>,
    /// The host of `authority`, which replaces the request's.
    pub host: Option<Box<str>>,
    pub scheme: Option<Box<str>>,
    pub port: RedirectPort,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedirectPort {
    /// Neither `port` nor `derivePort`: the request's port, unless `authority` replaced the host.
    Unset,
    /// The port the request named, if any.
    FromRequest,
    /// None: the scheme's default.
    ProtocolDefault,
    Number(u16),
}

impl FixedAnswer {
    fn compile(route: &HttpRoute) -> Result<Option<Self>, String> {
        use base64::Engine as _;
        if route.delegate.is_some() {
            return Ok(Some(Self::NotServed));
        }
        if let Some(direct) = &route.direct_response {
            let status = u16::try_from(direct.status)
                .ok()
                .and_then(|code| http::StatusCode::from_u16(code).ok())
                .ok_or_else(|| {
                    format!(
                        "directResponse status {} is not an HTTP status",
                        direct.status
                    )
                })?;
            let body = match direct.body.as_ref().map(|b| (&b.string, &b.bytes)) {
                Some((Some(text), _)) => bytes::Bytes::from(text.clone()),
                Some((None, Some(encoded))) => base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|e| format!("directResponse body bytes: {e}"))?
                    .into(),
                _ => bytes::Bytes::new(),
            };
            return Ok(Some(Self::Respond { status, body }));
        }
        let Some(redirect) = &route.redirect else {
            return Ok(None);
        };
        let code = redirect.redirect_code.unwrap_or(301);
        let status = u16::try_from(code)
            .ok()
            .and_then(|code| http::StatusCode::from_u16(code).ok())
            .filter(http::StatusCode::is_redirection)
            .ok_or_else(|| format!("redirectCode {code} is not a redirection"))?;
        let port = match (redirect.port, redirect.derive_port.as_deref()) {
            (Some(number), _) => RedirectPort::Number(
                u16::try_from(number).map_err(|_| format!("redirect port {number}"))?,
            ),
            (None, Some("FROM_PROTOCOL_DEFAULT")) => RedirectPort::ProtocolDefault,
            (None, Some("FROM_REQUEST_PORT")) => RedirectPort::FromRequest,
            (None, None) => RedirectPort::Unset,
            (None, Some(other)) => return Err(format!("redirect derivePort {other:?}")),
        };
        let host = redirect
            .authority
            .as_deref()
            .map(|authority| {
                authority
                    .parse::<Authority>()
                    .map(|parsed| Box::from(parsed.host()))
                    .map_err(|e| format!("redirect authority {authority:?}: {e}"))
            })
            .transpose()?;
        let boxed = |text: &Option<String>| text.as_deref().map(Box::from);
        Ok(Some(Self::Redirect(Redirect {
            status,
            uri: boxed(&redirect.uri),
            prefix_rewrite: boxed(&redirect.prefix_rewrite),
            host,
            scheme: boxed(&redirect.scheme),
            port,
        })))
    }
}

impl Redirect {
    /// The `Location` for a request to `scheme://authority` + `path` (normalized) `?query`,
    /// whose matched prefix (if the match was one) was `prefix_len` long.
    pub fn location(&self, request: &RequestView<'_>, prefix_len: Option<usize>) -> String {
        let scheme = self.scheme.as_deref().unwrap_or(request.scheme);
        // The request's authority came parsed from the request: parsing it again cannot fail.
        let request_authority = request.authority.parse::<Authority>().ok();
        let request_port = request_authority.as_ref().and_then(Authority::port_u16);
        let host = self.host.as_deref().unwrap_or_else(|| {
            request_authority
                .as_ref()
                .map_or(request.authority, Authority::host)
        });
        let is_default =
            |scheme: &str, port: u16| matches!((scheme, port), ("http", 80) | ("https", 443));
        let port = match self.port {
            RedirectPort::Number(port) => Some(port),
            RedirectPort::Unset if self.host.is_some() => None,
            // The old scheme's default port does not go with a new scheme.
            RedirectPort::Unset | RedirectPort::FromRequest => request_port
                .filter(|&port| scheme == request.scheme || !is_default(request.scheme, port)),
            RedirectPort::ProtocolDefault => None,
        }
        .filter(|&port| !is_default(scheme, port));
        let path = match (&self.uri, &self.prefix_rewrite, prefix_len) {
            (Some(uri), _, _) => std::borrow::Cow::Borrowed(&**uri),
            (None, Some(prefix), Some(len)) => std::borrow::Cow::Owned(format!(
                "{prefix}{}",
                request.path.get(len..).unwrap_or_default()
            )),
            (None, Some(prefix), None) => std::borrow::Cow::Borrowed(&**prefix),
            (None, None, _) => std::borrow::Cow::Borrowed(request.path),
        };
        let mut location = format!("{scheme}://{host}");
        if let Some(port) = port {
            location.push_str(&format!(":{port}"));
        }
        location.push_str(&path);
        if let Some(query) = request.query {
            location.push('?');
            location.push_str(query);
        }
        location
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
    fn may_name_host(&self, namespace: &str, host: &str, http: &[HttpRoute]) -> bool {
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

    fn allowed_paths(&self, namespace: &str, names: &SharedNames) -> Box<[Arc<str>]> {
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

/// One VirtualService compiled once (matchers, regexes, header operations): a table rebuild only
/// merges and indexes these, so a change to one of 10,000 routes does not recompile the others,
/// and the raw objects need not be kept.
#[derive(Debug)]
pub struct CompiledVirtualService {
    /// Lowercase.
    hosts: Few<Arc<str>>,
    /// At least one.
    rules: Few<Arc<Rule>>,
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

/// Holds `rule` (compiled from `route`) to its namespace, or says why it cannot be: its header
/// edits, destinations (made fully qualified, so that a short name is its namespace's Service)
/// and paths. A match that could take another namespace's paths sets the lookup's guard.
fn confine_rule(
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
    let header_edits = (!header_edits.request.0.is_empty() || !header_edits.response.0.is_empty())
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
    use serde_json::json;

    const GATEWAY: &str = "kubeflow/kubeflow-gateway";

    fn vs(namespace: &str, name: &str, created: &str, spec: serde_json::Value) -> VirtualService {
        serde_json::from_value(json!({
            "apiVersion": "networking.istio.io/v1beta1",
            "kind": "VirtualService",
            "metadata": { "name": name, "namespace": namespace, "creationTimestamp": created },
            "spec": spec,
        }))
        .unwrap()
    }

    /// What the notebook controller writes for `namespace/name`.
    fn notebook_vs(namespace: &str, name: &str, created: &str) -> VirtualService {
        vs(
            namespace,
            &format!("notebook-{namespace}-{name}"),
            created,
            json!({
                "hosts": ["*"],
                "gateways": [GATEWAY],
                "http": [{
                    "match": [{ "uri": { "prefix": format!("/notebook/{namespace}/{name}/") } }],
                    "rewrite": { "uri": format!("/notebook/{namespace}/{name}/") },
                    "route": [{ "destination": {
                        "host": format!("{name}.{namespace}.svc.cluster.local"),
                        "port": { "number": 80 }
                    } }]
                }]
            }),
        )
    }

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

    fn table(list: &[VirtualService]) -> RouteTable {
        let (table, skipped) = RouteTable::build(
            list,
            &GatewayFilter(Some(GATEWAY.into())),
            &Activity::default(),
        );
        assert!(skipped.is_empty(), "{skipped:?}");
        table
    }

    struct Req {
        host: String,
        authority: String,
        scheme: &'static str,
        query: Option<String>,
        path: String,
        method: Method,
        headers: HeaderMap,
    }

    fn req(path: &str) -> Req {
        Req {
            host: "lab.example.com".into(),
            authority: "lab.example.com".into(),
            scheme: "http",
            query: None,
            path: path.into(),
            method: Method::GET,
            headers: HeaderMap::new(),
        }
    }

    impl Req {
        fn host(mut self, host: &str) -> Self {
            self.host = host.into();
            self.authority = host.into();
            self
        }
        fn authority(mut self, authority: &str) -> Self {
            self.authority = authority.into();
            self
        }
        fn https(mut self) -> Self {
            self.scheme = "https";
            self
        }
        fn query(mut self, query: &str) -> Self {
            self.query = Some(query.into());
            self
        }
        fn method(mut self, method: Method) -> Self {
            self.method = method;
            self
        }
        fn header(mut self, name: &'static str, value: &'static str) -> Self {
            self.headers.insert(name, HeaderValue::from_static(value));
            self
        }
        fn view(&self) -> RequestView<'_> {
            RequestView {
                host: &self.host,
                authority: &self.authority,
                scheme: self.scheme,
                query: self.query.as_deref(),
                path: &self.path,
                method: &self.method,
                headers: &self.headers,
            }
        }
    }

    /// (VirtualService name, destination, upstream path) of the route a request takes.
    fn route(table: &RouteTable, request: &Req) -> Option<(String, String, String)> {
        let found = table.lookup(&request.view())?;
        let rule = found.rule;
        Some((
            rule.owner.virtual_service.to_string(),
            rule.pick_destination()?.authority.to_string(),
            rule.rewritten_path(&found, &request.path).into_owned(),
        ))
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
    fn plain_string_prefix_is_istio_semantics() {
        let t = table(&[vs(
            "x",
            "a",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"match": [{"uri": {"prefix": "/app"}}], "route": [{"destination": {"host": "a"}}]}
            ]}),
        )]);
        assert_eq!(route(&t, &req("/apple")).unwrap().1, "a:80");
        assert!(route(&t, &req("/ap")).is_none());
    }

    #[test]
    fn rewrite_replaces_the_matched_prefix_or_the_whole_path() {
        let t = table(&[vs(
            "x",
            "rw",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"match": [{"uri": {"exact": "/exact"}}], "rewrite": {"uri": "/other"},
                 "route": [{"destination": {"host": "e"}}]},
                {"match": [{"uri": {"regex": "/re/[0-9]+"}}], "rewrite": {"uri": "/numbered"},
                 "route": [{"destination": {"host": "r"}}]},
                {"match": [{"uri": {"prefix": "/notebook/alice/code/"}}], "rewrite": {"uri": "/"},
                 "route": [{"destination": {"host": "c", "port": {"number": 8080}}}]},
            ]}),
        )]);
        assert_eq!(route(&t, &req("/exact")).unwrap().2, "/other");
        assert!(route(&t, &req("/exact/more")).is_none());
        assert_eq!(route(&t, &req("/re/42")).unwrap().2, "/numbered");
        // The regex must match the whole path.
        assert!(route(&t, &req("/re/42/x")).is_none());
        assert!(route(&t, &req("/x/re/42")).is_none());
        assert_eq!(
            route(&t, &req("/notebook/alice/code/static/app.js")).unwrap(),
            ("rw".into(), "c:8080".into(), "/static/app.js".into())
        );
        assert_eq!(route(&t, &req("/notebook/alice/code/")).unwrap().2, "/");

        // Kubeflow's shape: the prefix rewritten to itself keeps the path, and the rule holds
        // one string for both.
        let t = table(&[vs(
            "x",
            "same",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"match": [{"uri": {"prefix": "/notebook/x/nb/"}}],
                 "rewrite": {"uri": "/notebook/x/nb/"},
                 "route": [{"destination": {"host": "nb.x.svc.cluster.local", "port": {"number": 80}}}]},
            ]}),
        )]);
        assert_eq!(
            route(&t, &req("/notebook/x/nb/lab")).unwrap().2,
            "/notebook/x/nb/lab"
        );
        let found = t.lookup(&req("/notebook/x/nb/lab").view()).unwrap();
        let Some(Matcher::Prefix(prefix)) = &found.rule.matches[0].uri else {
            panic!("a prefix matcher");
        };
        assert!(Arc::ptr_eq(
            prefix,
            found.rule.rewrite_uri.as_ref().unwrap()
        ));
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
    fn ignore_uri_case_matches_any_case() {
        let t = table(&[vs(
            "x",
            "ci",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"match": [{"uri": {"prefix": "/Docs/"}, "ignoreUriCase": true}],
                 "route": [{"destination": {"host": "docs"}}]},
            ]}),
        )]);
        assert!(route(&t, &req("/DOCS/a")).is_some());
        assert!(route(&t, &req("/docs/a")).is_some());
        assert!(route(&t, &req("/doc/a")).is_none());
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
    fn header_operations_remove_set_add() {
        let t = table(&[vs(
            "x",
            "hdr",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"headers": {"request": {
                    "set": {"X-RStudio-Root-Path": "/notebook/x/r/", "x-both": "set"},
                    "add": {"x-extra": "two", "x-both": "added"},
                    "remove": ["x-secret", "x-extra"]
                }}, "route": [{"destination": {"host": "r"}}]}
            ]}),
        )]);
        let request = req("/");
        let found = t.lookup(&request.view()).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("x-secret", HeaderValue::from_static("s"));
        headers.insert("x-rstudio-root-path", HeaderValue::from_static("/wrong/"));
        headers.insert("x-extra", HeaderValue::from_static("one"));
        headers.insert("x-both", HeaderValue::from_static("sent"));
        found
            .rule
            .header_edits
            .as_ref()
            .unwrap()
            .request
            .apply(&mut headers);
        assert!(headers.get("x-secret").is_none());
        assert_eq!(headers["x-rstudio-root-path"], "/notebook/x/r/");
        // Envoy's order: a removal does not undo an append of the same header, and a
        // replacement does not undo one either.
        let all = |name| headers.get_all(name).iter().collect::<Vec<_>>();
        assert_eq!(all("x-extra"), ["two"]);
        assert_eq!(all("x-both"), ["set", "added"]);
    }

    #[test]
    fn authority_scheme_query_and_absent_header_conditions_narrow_a_match() {
        let rule = |condition: serde_json::Value, host: &str| {
            let mut condition = condition;
            condition["uri"] = json!({"prefix": "/app/"});
            json!({"match": [condition], "route": [{"destination": {"host": host}}]})
        };
        let t = table(&[vs(
            "x",
            "conditions",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                rule(json!({"authority": {"exact": "lab.example.com:8443"}}), "by-authority"),
                rule(json!({"scheme": {"exact": "https"}}), "by-scheme"),
                rule(json!({"queryParams": {"debug": {"exact": "1"}, "v": {"regex": "[0-9]+"}}}), "by-query"),
                rule(json!({"withoutHeaders": {"x-canary": {"prefix": ""}}}), "not-canary"),
                {"match": [{"uri": {"prefix": "/app/"}}], "route": [{"destination": {"host": "canary"}}]}
            ]}),
        )]);
        let dest = |request: Req| route(&t, &request).unwrap().1;
        // The authority as sent, port included, case-sensitively.
        assert_eq!(
            dest(req("/app/").authority("lab.example.com:8443").https()),
            "by-authority:80"
        );
        assert_eq!(
            dest(req("/app/").authority("LAB.example.com:8443").https()),
            "by-scheme:80"
        );
        // Every listed parameter, raw, first occurrence; anything else goes past the rule.
        assert_eq!(dest(req("/app/").query("a=b&debug=1&v=22")), "by-query:80");
        assert_eq!(
            dest(req("/app/").query("debug=1&v=22&debug=0")),
            "by-query:80"
        );
        assert_eq!(
            dest(req("/app/").query("debug=0&debug=1&v=22")),
            "not-canary:80"
        );
        assert_eq!(dest(req("/app/").query("debug=1&v=2x")), "not-canary:80");
        assert_eq!(dest(req("/app/").query("debug=1")), "not-canary:80");
        assert_eq!(dest(req("/app/").query("debug%3D1&v=1")), "not-canary:80");
        // A header that must be absent: present with any value, it is not.
        assert_eq!(dest(req("/app/")), "not-canary:80");
        assert_eq!(dest(req("/app/").header("x-canary", "yes")), "canary:80");
        // None of the conditions made its rule take other paths.
        assert!(route(&t, &req("/elsewhere/")).is_none());
    }

    #[test]
    fn an_empty_string_match_asks_for_presence() {
        let t = table(&[vs(
            "x",
            "presence",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"match": [{"uri": {"prefix": "/a/"}, "headers": {"x-team": {}}}],
                 "route": [{"destination": {"host": "with-team"}}]},
                {"match": [{"uri": {"prefix": "/a/"}, "queryParams": {"debug": {}}}],
                 "route": [{"destination": {"host": "debug"}}]},
                {"match": [{"uri": {"prefix": "/a/"}, "withoutHeaders": {"cookie": {}}}],
                 "route": [{"destination": {"host": "anonymous"}}]},
                {"match": [{"uri": {}, "method": {}}], "route": [{"destination": {"host": "rest"}}]}
            ]}),
        )]);
        let dest = |request: Req| route(&t, &request).unwrap().1;
        assert_eq!(dest(req("/a/").header("x-team", "")), "with-team:80");
        assert_eq!(dest(req("/a/").query("debug")), "debug:80");
        assert_eq!(dest(req("/a/").query("debugging=1")), "anonymous:80");
        assert_eq!(dest(req("/a/")), "anonymous:80");
        assert_eq!(dest(req("/a/").header("cookie", "s=1")), "rest:80");
        assert_eq!(dest(req("/b/").method(Method::POST)), "rest:80");
        let two: Result<StringMatch, _> =
            serde_json::from_value(json!({"exact": "a", "prefix": "b"}));
        assert!(two.is_err());
        assert_eq!(
            serde_json::to_value(StringMatch::Present).unwrap(),
            json!({})
        );
    }

    #[test]
    fn matches_with_conditions_not_evaluated_never_apply_and_are_reported() {
        let list = [vs(
            "x",
            "unevaluated",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"match": [{"uri": {"prefix": "/a/"}, "sourceLabels": {"app": "client"}}],
                 "route": [{"destination": {"host": "labelled"}}]},
                {"match": [{"uri": {"prefix": "/a/"}, "port": 8080}, {"uri": {"prefix": "/b/"}, "name": "b"}],
                 "route": [{"destination": {"host": "ported"}}]},
                {"match": [{"uri": {"prefix": "/"}, "statPrefix": "rest"}], "route": [{"destination": {"host": "rest"}}]}
            ]}),
        )];
        let (t, skipped) = RouteTable::build(
            &list,
            &GatewayFilter(Some(GATEWAY.into())),
            &Activity::default(),
        );
        let reasons: Vec<&str> = skipped.iter().map(|s| s.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "http[0].match[0]: `sourceLabels` is not evaluated by this proxy, so this match never applies",
                "http[1].match[0]: `port` is not evaluated by this proxy, so this match never applies",
            ]
        );
        // Not "every request matches": the rules go without those matches.
        assert_eq!(route(&t, &req("/a/x")).unwrap().1, "rest:80");
        // The rule's other match, with a name only, still applies.
        assert_eq!(route(&t, &req("/b/x")).unwrap().1, "ported:80");
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
    fn redirects_build_their_location_as_envoy_does() {
        let redirect = |spec: serde_json::Value| {
            let route: HttpRoute = serde_json::from_value(json!({"redirect": spec})).unwrap();
            match FixedAnswer::compile(&route).unwrap() {
                Some(FixedAnswer::Redirect(redirect)) => redirect,
                other => panic!("{other:?}"),
            }
        };
        let request = req("/old/page")
            .authority("lab.example.com:8080")
            .query("a=1");
        let view = request.view();
        let at = |spec: serde_json::Value, prefix_len: Option<usize>| {
            redirect(spec).location(&view, prefix_len)
        };
        // The path replaced whole, the query kept, scheme, host and port as requested.
        assert_eq!(
            at(json!({"uri": "/new"}), Some(5)),
            "http://lab.example.com:8080/new?a=1"
        );
        // Only the matched prefix replaced.
        assert_eq!(
            at(json!({"prefixRewrite": "/fresh/"}), Some(5)),
            "http://lab.example.com:8080/fresh/page?a=1"
        );
        assert_eq!(
            at(
                json!({"authority": "other.example.com", "scheme": "https", "derivePort": "FROM_PROTOCOL_DEFAULT"}),
                None
            ),
            "https://other.example.com/old/page?a=1"
        );
        // A scheme's default port is not written.
        assert_eq!(
            at(json!({"scheme": "https", "port": 443}), None),
            "https://lab.example.com/old/page?a=1"
        );
        assert_eq!(
            at(json!({"port": 9000}), None),
            "http://lab.example.com:9000/old/page?a=1"
        );
        // A new host takes no port but the one given; the request's goes only when asked for.
        assert_eq!(
            at(json!({"authority": "other.example.com"}), None),
            "http://other.example.com/old/page?a=1"
        );
        assert_eq!(
            at(
                json!({"authority": "other.example.com", "derivePort": "FROM_REQUEST_PORT"}),
                None
            ),
            "http://other.example.com:8080/old/page?a=1"
        );
        let plain = req("/x").authority("lab.example.com:80");
        assert_eq!(
            redirect(json!({"scheme": "https"})).location(&plain.view(), None),
            "https://lab.example.com/x"
        );
        // An IPv6 host keeps its brackets, apart from its port.
        let ipv6 = req("/x").authority("[::1]:8080");
        assert_eq!(
            redirect(json!({"port": 9000})).location(&ipv6.view(), None),
            "http://[::1]:9000/x"
        );
        let bad: HttpRoute =
            serde_json::from_value(json!({"redirect": {"authority": "a b"}})).unwrap();
        assert!(
            FixedAnswer::compile(&bad)
                .unwrap_err()
                .contains("redirect authority \"a b\"")
        );
        assert_eq!(
            redirect(json!({})).status,
            http::StatusCode::MOVED_PERMANENTLY
        );
        assert_eq!(
            redirect(json!({"redirectCode": 307})).status,
            http::StatusCode::TEMPORARY_REDIRECT
        );
        let refused = |spec: serde_json::Value| {
            let route: HttpRoute = serde_json::from_value(spec).unwrap();
            FixedAnswer::compile(&route).unwrap_err()
        };
        assert_eq!(
            refused(json!({"redirect": {"redirectCode": 200}})),
            "redirectCode 200 is not a redirection"
        );
        assert_eq!(
            refused(json!({"directResponse": {"status": 1000}})),
            "directResponse status 1000 is not an HTTP status"
        );
    }

    #[test]
    fn a_delegating_rule_is_reported_and_keeps_its_requests() {
        let list = [vs(
            "x",
            "delegating",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [
                {"match": [{"uri": {"prefix": "/team/"}}], "delegate": {"name": "team", "namespace": "x"}},
                {"route": [{"destination": {"host": "rest"}}]}
            ]}),
        )];
        let (t, skipped) = RouteTable::build(
            &list,
            &GatewayFilter(Some(GATEWAY.into())),
            &Activity::default(),
        );
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert!(
            skipped[0]
                .reason
                .starts_with("http[0]: delegation is not served")
        );
        let view = req("/team/a");
        let found = t.lookup(&view.view()).unwrap();
        assert!(matches!(
            found.rule.answer.as_deref(),
            Some(FixedAnswer::NotServed)
        ));
        assert_eq!(route(&t, &req("/other")).unwrap().1, "rest:80");
    }

    #[test]
    fn regex_rewrites_take_re2_substitutions() {
        assert_eq!(re2_replacement(r"/v2/\1/$x\\"), r"/v2/${1}/$$x\");
        let t = table(&[vs(
            "x",
            "regex",
            "2026-01-01T00:00:00Z",
            json!({"hosts": ["*"], "gateways": [GATEWAY], "http": [{
                "match": [{"uri": {"prefix": "/api/"}}],
                "rewrite": {"uriRegexRewrite": {"match": "^/api/v([0-9]+)/(.*)$", "rewrite": "/\\2/v\\1"}},
                "route": [{"destination": {"host": "api"}}]
            }]}),
        )]);
        assert_eq!(route(&t, &req("/api/v3/items")).unwrap().2, "/items/v3");
        assert_eq!(route(&t, &req("/api/other")).unwrap().2, "/api/other");
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

    /// bob's VirtualService with one rule `http`, created before alice's notebook route.
    fn bobs(name: &str, http: serde_json::Value) -> VirtualService {
        vs(
            "bob",
            name,
            "2020-01-01T00:00:00Z",
            json!({ "hosts": ["*"], "gateways": [GATEWAY], "http": [http] }),
        )
    }

    fn confined_table(list: &[VirtualService]) -> (RouteTable, Vec<Skipped>) {
        RouteTable::build_confined(
            list,
            &GatewayFilter(Some(GATEWAY.into())),
            Some(&Confinement::default()),
            &Activity::default(),
        )
    }

    fn to(host: &str) -> serde_json::Value {
        json!([{ "destination": { "host": host } }])
    }

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
