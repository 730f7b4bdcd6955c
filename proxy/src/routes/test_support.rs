//! Fixtures the routes' tests share: VirtualServices as the notebook controller and users write
//! them, tables built from them, and requests to look up.

use super::{Confinement, GatewayFilter, RequestView, RouteTable, Skipped};
use crate::activity::Activity;
use http::{HeaderMap, HeaderValue, Method};
use labforge_crds::VirtualService;
use serde_json::json;

pub(super) const GATEWAY: &str = "kubeflow/kubeflow-gateway";

pub(super) fn vs(
    namespace: &str,
    name: &str,
    created: &str,
    spec: serde_json::Value,
) -> VirtualService {
    serde_json::from_value(json!({
        "apiVersion": "networking.istio.io/v1beta1",
        "kind": "VirtualService",
        "metadata": { "name": name, "namespace": namespace, "creationTimestamp": created },
        "spec": spec,
    }))
    .unwrap()
}

/// What the notebook controller writes for `namespace/name`.
pub(super) fn notebook_vs(namespace: &str, name: &str, created: &str) -> VirtualService {
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

pub(super) fn table(list: &[VirtualService]) -> RouteTable {
    let (table, skipped) = RouteTable::build(
        list,
        &GatewayFilter(Some(GATEWAY.into())),
        &Activity::default(),
    );
    assert!(skipped.is_empty(), "{skipped:?}");
    table
}

pub(super) struct Req {
    host: String,
    authority: String,
    scheme: &'static str,
    query: Option<String>,
    path: String,
    method: Method,
    headers: HeaderMap,
}

pub(super) fn req(path: &str) -> Req {
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
    pub(super) fn host(mut self, host: &str) -> Self {
        self.host = host.into();
        self.authority = host.into();
        self
    }
    pub(super) fn authority(mut self, authority: &str) -> Self {
        self.authority = authority.into();
        self
    }
    pub(super) fn https(mut self) -> Self {
        self.scheme = "https";
        self
    }
    pub(super) fn query(mut self, query: &str) -> Self {
        self.query = Some(query.into());
        self
    }
    pub(super) fn method(mut self, method: Method) -> Self {
        self.method = method;
        self
    }
    pub(super) fn header(mut self, name: &'static str, value: &'static str) -> Self {
        self.headers.insert(name, HeaderValue::from_static(value));
        self
    }
    pub(super) fn view(&self) -> RequestView<'_> {
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
pub(super) fn route(table: &RouteTable, request: &Req) -> Option<(String, String, String)> {
    let found = table.lookup(&request.view())?;
    let rule = found.rule;
    Some((
        rule.owner.virtual_service.to_string(),
        rule.pick_destination()?.authority.to_string(),
        rule.rewritten_path(&found, &request.path).into_owned(),
    ))
}

/// bob's VirtualService with one rule `http`, created before alice's notebook route.
pub(super) fn bobs(name: &str, http: serde_json::Value) -> VirtualService {
    vs(
        "bob",
        name,
        "2020-01-01T00:00:00Z",
        json!({ "hosts": ["*"], "gateways": [GATEWAY], "http": [http] }),
    )
}

pub(super) fn confined_table(list: &[VirtualService]) -> (RouteTable, Vec<Skipped>) {
    RouteTable::build_confined(
        list,
        &GatewayFilter(Some(GATEWAY.into())),
        Some(&Confinement::default()),
        &Activity::default(),
    )
}

pub(super) fn to(host: &str) -> serde_json::Value {
    json!([{ "destination": { "host": host } }])
}
