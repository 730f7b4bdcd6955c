//! The proxy as the suites start it: in-process, its routes pushed or from VirtualServices,
//! alice's notebook routed to an upstream of the test's.

use super::cluster::notebook;
use crate::init_crypto;
use labforge_crds::VirtualService;
use labforge_notebook_controller::BuilderConfig;
use labforge_notebook_controller::builders::virtual_service;
use labforge_proxy::ProxyOptions;
use labforge_proxy::RoutesFrom;
use labforge_proxy::RunningProxy;
use labforge_proxy::authz::NamespaceAccess;
use labforge_proxy::authz::StaticAccess;
use labforge_proxy::authz::TrustedHeader;
use labforge_proxy::routes::GatewayFilter;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
pub const ALICE: &str = "alice@example.com";

/// A proxy serving alice's notebook `lab` at `upstream`, with the test options changed by `adjust`.
pub async fn proxy_for_alice_lab(
    upstream: SocketAddr,
    adjust: impl FnOnce(ProxyOptions) -> ProxyOptions,
) -> RunningProxy {
    init_crypto();
    let defaults = options(HashMap::from([(
        service_authority("alice", "lab"),
        upstream.to_string(),
    )]));
    let proxy = labforge_proxy::start(adjust(defaults), RoutesFrom::Pushed)
        .await
        .unwrap();
    proxy.routes.replace_all(vec![notebook_vs("alice", "lab")]);
    proxy
}

pub async fn start_proxy(routes: RoutesFrom, upstreams: HashMap<String, String>) -> RunningProxy {
    init_crypto();
    labforge_proxy::start(options(upstreams), routes)
        .await
        .unwrap()
}

/// The VirtualService the controller writes for `namespace/name`.
pub fn notebook_vs(namespace: &str, name: &str) -> VirtualService {
    virtual_service(&notebook(namespace, name), &BuilderConfig::default()).unwrap()
}

/// `name.namespace.svc.cluster.local:80`, the controller's destination.
pub fn service_authority(namespace: &str, name: &str) -> String {
    format!("{name}.{namespace}.svc.cluster.local:80")
}

pub fn options(upstreams: HashMap<String, String>) -> ProxyOptions {
    ProxyOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin: "127.0.0.1:0".parse().unwrap(),
        gateway: GatewayFilter(Some("kubeflow/kubeflow-gateway".into())),
        identity: Arc::new(TrustedHeader::default()),
        access: static_access(),
        tls: None,
        upstream_addresses: upstreams,
        threads: 2,
        upstream_idle_timeout: labforge_proxy::upstream::DEFAULT_IDLE_TIMEOUT,
        upstream_connect_timeout: labforge_proxy::upstream::DEFAULT_CONNECT_TIMEOUT,
        request_head_timeout: labforge_proxy::server::DEFAULT_REQUEST_HEAD_TIMEOUT,
        fallback: None,
        confinement: Default::default(),
        visitor_cookies: labforge_proxy::forward::DEFAULT_VISITOR_COOKIES
            .map(String::from)
            .into(),
        max_connections: labforge_proxy::server::DEFAULT_MAX_CONNECTIONS as usize,
        body_pace: Default::default(),
        notebook_hosts: None,
        app_path: None,
        heap_release: true,
    }
}

/// alice owns namespace alice and shares it with carol; bob owns bob; root is an admin.
pub fn static_access() -> Arc<dyn NamespaceAccess> {
    Arc::new(
        StaticAccess::with_members(
            [ROOT],
            [
                &*format!("alice={ALICE}"),
                &format!("alice={CAROL}"),
                &format!("bob={BOB}"),
            ],
        )
        .unwrap(),
    )
}

pub const CAROL: &str = "carol@example.com";

pub const BOB: &str = "bob@example.com";

pub const ROOT: &str = "root@example.com";
