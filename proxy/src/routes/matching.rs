//! What a rule's `match` asks of a request, compiled once.
//!
//! `uri.prefix` is a plain string prefix, `exact` is whole-path equality, `regex` (RE2 syntax)
//! must match the whole path; the query is never part of the URI match. A match may also hold
//! `method`, `headers`, `withoutHeaders`, `queryParams` (the raw value of a parameter's first
//! occurrence), `authority` (as sent, port included) and `scheme`; an empty string match (`{}`)
//! asks only that the value be there (a header's presence). A condition this proxy does not
//! evaluate (`port`, `sourceLabels`, `sourceNamespace`) leaves its match out, reported: dropping
//! the condition instead would send the rule requests Istio does not.

use super::RequestView;
use http::{HeaderMap, HeaderName};
use labforge_crds::istio::{HttpMatchRequest, StringMatch};
use std::sync::Arc;

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
pub(super) fn unevaluated_condition(m: &HttpMatchRequest) -> Option<&str> {
    m.other
        .keys()
        .map(String::as_str)
        .find(|field| !DESCRIPTIVE_MATCH_FIELDS.contains(field))
}

impl MatchCondition {
    pub(super) fn compile(m: &HttpMatchRequest) -> Result<Self, String> {
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
    pub(super) fn pure_prefix(&self) -> Option<&Arc<str>> {
        match self.pure_uri()? {
            Matcher::Prefix(p) => Some(p),
            _ => None,
        }
    }

    pub(super) fn pure_exact(&self) -> Option<&Arc<str>> {
        match self.pure_uri()? {
            Matcher::Exact(p) => Some(p),
            _ => None,
        }
    }

    /// Matches everything (`{}` or `uri.prefix: /`): such rules go last when merging.
    pub(super) fn is_catch_all(&self) -> bool {
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

    pub(super) fn matches(&self, request: &RequestView<'_>) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activity::Activity;
    use crate::routes::test_support::*;
    use crate::routes::{GatewayFilter, RouteTable};
    use http::Method;
    use serde_json::json;

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
}
