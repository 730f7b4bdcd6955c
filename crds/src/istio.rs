//! Istio's VirtualService, reduced to what labforge writes (one route per notebook) and what its
//! proxy implements (Istio's gateway matching semantics). Fields we do not model are kept by the
//! API server, not by us: labforge never updates a VirtualService it did not build.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `networking.istio.io` VirtualService. The version written is v1beta1, which every Istio release
/// since 1.5 serves (v1 needs Istio 1.22+); the proxy reads all served versions through it.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "networking.istio.io",
    version = "v1beta1",
    kind = "VirtualService",
    plural = "virtualservices",
    namespaced,
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualServiceSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<HttpRoute>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRoute {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(rename = "match", default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<HttpMatchRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<HttpRewrite>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub route: Vec<HttpRouteDestination>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
    /// Istio duration (`300s`); labforge writes none: notebooks keep long-lived connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Answered with a redirect instead of forwarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<HttpRedirect>,
    /// Answered with this response instead of forwarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_response: Option<HttpDirectResponse>,
    /// Handed to another VirtualService's rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegate: Option<Delegate>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Delegate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRedirect {
    /// Replaces the whole path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// Replaces the matched prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_rewrite: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// `FROM_PROTOCOL_DEFAULT` or `FROM_REQUEST_PORT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derive_port: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// 301 unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_code: Option<u32>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct HttpDirectResponse {
    pub status: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<HttpBody>,
}

/// A direct response's body: text, or base64 bytes.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct HttpBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpMatchRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<StringMatch>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, StringMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<StringMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_uri_case: Option<bool>,
    /// The request's authority (`Host`, or HTTP/2's `:authority`) as sent, port included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<StringMatch>,
    /// `http` or `https`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<StringMatch>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub query_params: BTreeMap<String, StringMatch>,
    /// Headers that must not match.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub without_headers: BTreeMap<String, StringMatch>,
    /// Gateways this match applies at, in place of the VirtualService's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    /// Every other field (`port`, `sourceLabels`, `sourceNamespace`, `name`, ...), kept so that a
    /// reader can tell a condition it does not evaluate from no condition: serde would otherwise
    /// drop it, and the match would apply to more requests than Istio's does.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// Istio's StringMatch: one of exact, prefix, regex (RE2 syntax), or none (`{}`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(try_from = "StringMatchFields", into = "StringMatchFields")]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
    Regex(String),
    /// `{}`: the value is there, whatever it is. For a header or query parameter that is
    /// presence (absence under `withoutHeaders`); the URI, method, authority and scheme every
    /// request has, so there it matches every request.
    Present,
}

/// StringMatch as written: at most one field.
#[derive(Deserialize, Serialize, Clone, Debug, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
struct StringMatchFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    regex: Option<String>,
}

impl TryFrom<StringMatchFields> for StringMatch {
    type Error = &'static str;

    fn try_from(fields: StringMatchFields) -> Result<Self, Self::Error> {
        match (fields.exact, fields.prefix, fields.regex) {
            (Some(exact), None, None) => Ok(Self::Exact(exact)),
            (None, Some(prefix), None) => Ok(Self::Prefix(prefix)),
            (None, None, Some(regex)) => Ok(Self::Regex(regex)),
            (None, None, None) => Ok(Self::Present),
            _ => Err("a string match has at most one of exact, prefix and regex"),
        }
    }
}

impl From<StringMatch> for StringMatchFields {
    fn from(value: StringMatch) -> Self {
        match value {
            StringMatch::Exact(exact) => Self {
                exact: Some(exact),
                ..Self::default()
            },
            StringMatch::Prefix(prefix) => Self {
                prefix: Some(prefix),
                ..Self::default()
            },
            StringMatch::Regex(regex) => Self {
                regex: Some(regex),
                ..Self::default()
            },
            StringMatch::Present => Self::default(),
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRewrite {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// Replaces the `Host` the destination gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    /// A regex substitution on the path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri_regex_rewrite: Option<RegexRewrite>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct RegexRewrite {
    /// RE2 syntax, not anchored: every match in the path is replaced.
    #[serde(rename = "match", default)]
    pub pattern: String,
    /// The replacement; `\1` names the first group.
    #[serde(default)]
    pub rewrite: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct HttpRouteDestination {
    pub destination: Destination,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Destination {
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct PortSelector {
    pub number: u32,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Headers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<HeaderOperations>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<HeaderOperations>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct HeaderOperations {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub add: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}
