//! What a matched rule changes on its way through, or answers itself.
//!
//! `rewrite.uri` replaces the matched prefix (the whole path for the other match kinds) and the
//! query is kept; `rewrite.uriRegexRewrite` replaces every match of its regex in the path;
//! `rewrite.authority` replaces the `Host` the destination gets; `headers` edits the request and
//! response as Envoy does. A rule with `directResponse` or `redirect` answers itself (`Location`
//! built as Envoy builds it: the request's scheme, host, port and query unless replaced); one
//! that `delegate`s cannot be served here and answers 404, so that its requests do not fall
//! through to a later rule.

use super::{Found, RequestView, Rule};
use http::uri::Authority;
use http::{HeaderMap, HeaderName, HeaderValue};
use labforge_crds::istio::{HeaderOperations, HttpRoute};

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
    pub(super) fn compile(ops: Option<&HeaderOperations>) -> Result<Self, String> {
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

    /// Whether there are no edits.
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
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

/// The header edits of a rule.
#[derive(Debug, Default)]
pub struct HeaderEdits {
    pub request: HeaderOps,
    pub response: HeaderOps,
}

impl Rule {
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
    pub(super) fn compile(rewrite: &labforge_crds::istio::RegexRewrite) -> Result<Self, String> {
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
    pub(super) fn compile(route: &HttpRoute) -> Result<Option<Self>, String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activity::Activity;
    use crate::routes::test_support::*;
    use crate::routes::{GatewayFilter, Matcher, RouteTable};
    use serde_json::json;
    use std::sync::Arc;

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
}
