//! One request's way through the proxy: normalize, identify, route, authorize, forward.
//!
//! Nothing reaches a notebook before the route is known and the user allowed on it. Forwarding
//! streams bodies both ways (hyper `Incoming` in and out, never buffered) over this thread's
//! [`crate::upstream::UpstreamPool`], preserves the Host, adds `X-Forwarded-*`, strips hop-by-hop
//! headers, and sets no timeout (notebooks hold long requests) unless the route has one (Istio's
//! `timeout`). Upgrades (websockets: kernels, terminals) are forwarded as upgrades and then
//! tunnelled byte for byte ([`crate::tunnel`], which adds a close frame when the server goes
//! away without one); every tunnelled read counts as activity, as in CHP. A websocket whose
//! upstream cannot be reached, or whose upgrade answer is later than its route's timeout, gets a
//! close frame (1013) rather than a failed handshake.

mod strip;

pub use strip::{strip_hop_by_hop, strip_visitor, strip_visitor_set_cookies};

use crate::FastMap;
use crate::activity::ActivityCell;
use crate::authz::{
    Decision, Identity, IdentitySource, NamespaceAccess, Revocation, authorize, authorize_now,
};
use crate::metrics::{ErrorLabels, Metrics, ThreadMetrics};
use crate::normalize::normalize_path;
use crate::notebook_host::{self, NotebookHosts};
use crate::ports::{NotebookPorts, PortTarget};
use crate::respond::{ProxyError, error_response, wants_json};
use crate::routes::{FixedAnswer, RequestView, Rule};
use crate::server::{BodyPace, PacedBody};
use crate::source::RouteStore;
use crate::upstream::{PooledBody, UpstreamError, UpstreamPool};
use bytes::Bytes;
use futures::future;
use http::header::{self, HeaderName};
use http::uri::Authority;
use http::{HeaderValue, Request, Response, StatusCode, Uri, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::borrow::Cow;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use strip::is_upgrade;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bodies the proxy sends: the upstream's, streamed, or one of its own pages.
pub type ProxyBody = Either<PooledBody, Full<Bytes>>;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Everything a request needs, shared by all connections.
pub struct Forwarder {
    /// This serving thread's upstream connections.
    upstreams: Arc<UpstreamPool>,
    routes: Arc<RouteStore>,
    identity: Arc<dyn IdentitySource>,
    access: Arc<dyn NamespaceAccess>,
    metrics: Arc<Metrics>,
    /// This serving thread's share of the per-request metrics.
    thread_metrics: Arc<ThreadMetrics>,
    /// Destination `host:port` → address to connect to instead (embedded mode, tests).
    upstream_addresses: FastMap<String, Arc<str>>,
    /// Where requests outside [`NOTEBOOK_PATHS`] go, unauthenticated (the embedded web app).
    fallback: Option<Arc<str>>,
    /// Cookies never forwarded to a route ([`strip_visitor`]).
    visitor_cookies: Box<[Box<[u8]>]>,
    /// How fast request bodies must come.
    body_pace: BodyPace,
    /// Notebooks on hosts of their own, when they are.
    notebook_hosts: Option<NotebookHosts>,
    /// The web app's root path ([`crate::ProxyOptions::app_path`]).
    app_path: Option<Arc<str>>,
    /// Where the proxy's error pages link back to: the web app's root.
    app_link: Arc<str>,
}

/// Cookies that identify the visitor, never forwarded to a route unless configured otherwise:
/// labforge's session (both its names), oauth2-proxy's (split into `_oauth2_proxy_0`, `_1`…
/// when large) and Kubeflow's authservice's.
pub const DEFAULT_VISITOR_COOKIES: [&str; 4] = [
    "labforge_session",
    "__Host-labforge_session",
    "_oauth2_proxy",
    "authservice_session",
];

/// Paths only routes serve, never the fallback: every notebook's prefix is below it.
pub const NOTEBOOK_PATHS: &str = "/notebook/";

impl Forwarder {
    /// A serving thread's forwarder, with its own `upstreams`, for the proxy `options` configure.
    pub fn new(
        routes: Arc<RouteStore>,
        metrics: Arc<Metrics>,
        options: &crate::ProxyOptions,
        upstreams: UpstreamPool,
    ) -> Self {
        Self {
            upstreams: Arc::new(upstreams),
            routes,
            identity: options.identity.clone(),
            access: options.access.clone(),
            thread_metrics: metrics.thread_shard(),
            metrics,
            upstream_addresses: options
                .upstream_addresses
                .iter()
                .map(|(destination, address)| (destination.clone(), address.as_str().into()))
                .collect(),
            fallback: options.fallback.as_deref().map(Arc::from),
            // A notebook host's own cookies are the visitor's too.
            visitor_cookies: options
                .visitor_cookies
                .iter()
                .map(String::as_str)
                .chain([notebook_host::GRANT_COOKIE, notebook_host::STATE_COOKIE])
                .map(|name| name.as_bytes().into())
                .collect(),
            body_pace: options.body_pace,
            notebook_hosts: options.notebook_hosts.clone(),
            app_path: options.app_path.as_deref().map(Arc::from),
            app_link: match (&options.notebook_hosts, &options.app_path) {
                (Some(hosts), Some(path)) => {
                    format!("//{}:{}{path}", hosts.app_host, options.listen.port()).into()
                }
                (None, Some(path)) => path.as_str().into(),
                (_, None) => "/".into(),
            },
        }
    }

    /// A browser opening a notebook that has no route: sent to the web app's page of that
    /// notebook (its state, why, Start), on the app's host. Anything else: no route.
    fn notebook_page(
        &self,
        request: &Request<Incoming>,
        path: &str,
        authority: &str,
    ) -> Result<Step, ProxyError> {
        let (Some(app_path), Some((ns, name))) =
            (&self.app_path, notebook_host::notebook_of_path(path))
        else {
            return Err(ProxyError::NoRoute);
        };
        // Only names a notebook could have go into the app's URL.
        if !labforge_crds::host::is_dns_label(ns) || !labforge_crds::host::is_dns_label(name) {
            return Err(ProxyError::NoRoute);
        }
        let wants_page = request
            .headers()
            .get(http::header::ACCEPT)
            .is_some_and(|accept| accept.to_str().is_ok_and(|a| a.contains("text/html")));
        if !is_navigation(request) || !wants_page {
            return Err(ProxyError::NoRoute);
        }
        let origin = match &self.notebook_hosts {
            Some(hosts) => format!("//{}{}", hosts.app_host, notebook_host::port_of(authority)),
            None => String::new(),
        };
        let location = format!("{origin}{app_path}notebooks/{ns}/{name}");
        Ok(Step::Answer(notebook_host::redirect(&location, [])))
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// This thread's upstream connections.
    pub fn upstreams(&self) -> &Arc<UpstreamPool> {
        &self.upstreams
    }

    /// Answers one request; errors become the proxy's own pages here and nowhere else.
    ///
    /// The request is routed before the returned future exists, and that future holds it once:
    /// an async fn keeps its arguments for its whole life, so a chain of them taking the request
    /// by value held a copy per step, and hyper keeps a slot that size for every connection.
    pub fn handle(
        self: &Arc<Self>,
        request: Request<Incoming>,
        peer: Arc<Peer>,
        tls: bool,
    ) -> impl Future<Output = Response<ProxyBody>> + Send + use<> {
        let json = wants_json(request.headers(), request.uri().path());
        match self.route(request, tls) {
            Ok(Step::Forward(routed)) => {
                future::Either::Left(self.clone().answer(routed, peer, tls, json))
            }
            Ok(Step::Answer(response)) => future::Either::Right(future::Either::Left(
                future::ready(self.respond(Ok(response.map(Either::Right)), json)),
            )),
            Ok(Step::Port(request, target, ports)) => future::Either::Right(future::Either::Right(
                Box::pin(self.clone().to_port(request, target, ports)),
            )),
            Err(error) => future::Either::Right(future::Either::Left(future::ready(
                self.respond(Err(error), json),
            ))),
        }
    }

    /// A request to a port inside a notebook: over a connection [`NotebookPorts`] opens, its
    /// visitor's labforge cookies left out.
    async fn to_port(
        self: Arc<Self>,
        mut request: Request<Incoming>,
        target: PortTarget,
        ports: Arc<dyn NotebookPorts>,
    ) -> Response<ProxyBody> {
        strip_visitor(request.headers_mut(), &self.visitor_cookies);
        let answer = match ports.connect(&target).await {
            Ok(stream) => crate::ports::exchange(stream, request).await,
            Err(error) => Err(error),
        };
        let response = match answer {
            Ok(mut response) => {
                strip_visitor_set_cookies(response.headers_mut(), &self.visitor_cookies);
                response.map(|body| Either::Left(PooledBody::unpooled(body)))
            }
            Err(error) => {
                tracing::debug!(%error, namespace = %target.namespace, name = %target.name, port = target.port, "notebook port");
                crate::ports::error_page(&error, &self.app_link).map(Either::Right)
            }
        };
        self.thread_metrics.response(response.status().as_u16());
        response
    }

    /// The rest of a routed request's way. A block rather than an async fn: an async fn copies
    /// its arguments into its body's state (rust-lang/rust#62958), and the routed request is
    /// large; the block uses what it captured in place.
    fn answer(
        self: Arc<Self>,
        routed: Routed,
        peer: Arc<Peer>,
        tls: bool,
        json: bool,
    ) -> impl Future<Output = Response<ProxyBody>> + Send + use<> {
        let Routed {
            request,
            sent_to,
            target,
            via,
        } = routed;
        // Early returns rather than nested matches: a value a match holds stays in the future's
        // state while the arm awaits.
        async move {
            let address = match self.admit(&via).await {
                Ok(address) => address,
                Err(error) => return self.respond(Err(error), json),
            };
            if let (Address::Answered, Via::Rule(_, rule)) = (&address, &via) {
                return self.respond(rule_answer(rule, target), json);
            }
            let outgoing = match self.outgoing(request, sent_to, target, via, address, &peer, tls) {
                Ok(outgoing) => outgoing,
                Err(error) => return self.respond(Err(error), json),
            };
            let result = self.exchange(outgoing).await;
            self.respond(result, json)
        }
    }

    /// The response the client gets: the upstream's, or the proxy's page for `error`; counted.
    fn respond(
        &self,
        result: Result<Response<ProxyBody>, ProxyError>,
        json: bool,
    ) -> Response<ProxyBody> {
        let response = match result {
            Ok(response) => response,
            Err(error) => {
                match &error {
                    ProxyError::UpstreamUnavailable(e) | ProxyError::UpstreamFailed(e) => {
                        tracing::warn!(error = %error, cause = %labforge_messages::error_chain(e), "upstream")
                    }
                    ProxyError::UpstreamTimeout => tracing::warn!(error = %error, "upstream"),
                    _ => tracing::debug!(error = %error, "refused"),
                }
                error_response(&error, json, &self.app_link).map(Either::Right)
            }
        };
        self.thread_metrics.response(response.status().as_u16());
        response
    }

    /// Where the request goes and, when every access answer is at hand, whether it may: nothing
    /// here waits (an answer that must be waited for is left to [`Self::admit`]).
    fn route(&self, request: Request<Incoming>, tls: bool) -> Result<Step, ProxyError> {
        let sent_to = SentTo::of(&request).ok_or(ProxyError::NoHost)?;
        let authority = sent_to.authority.as_str();
        let path = normalize_path(request.uri().path())?;
        let host = lowercase(authority_host(&sent_to.authority));
        match self.port_visit(&request, &path, &host, authority, tls)? {
            Some(PortVisit::Answer(answer)) => return Ok(Step::Answer(answer)),
            Some(PortVisit::Let(target, ports)) => return Ok(Step::Port(request, target, ports)),
            None => {}
        }
        let on_notebook_host =
            match self.notebook_host_visit(&request, &path, &host, authority, tls)? {
                ControlFlow::Break(answer) => return Ok(Step::Answer(answer)),
                ControlFlow::Continue(on_notebook_host) => on_notebook_host,
            };
        // The web app (embedded mode) authenticates its own requests; notebook paths never go there.
        if let Some(fallback) = &self.fallback
            && !path.starts_with(NOTEBOOK_PATHS)
        {
            let target = upstream_target(request.uri(), &path);
            return Ok(Step::Forward(Routed {
                request,
                sent_to,
                target,
                via: Via::Fallback(fallback.clone()),
            }));
        }
        // Authentication first: an anonymous client learns nothing about which routes exist.
        let user = match self.authenticate(&request, &path, authority, on_notebook_host, tls)? {
            ControlFlow::Break(answer) => return Ok(Step::Answer(answer)),
            ControlFlow::Continue(user) => user,
        };
        let view = RequestView {
            host: &host,
            authority,
            scheme: if tls { "https" } else { "http" },
            query: request.uri().query(),
            path: &path,
            method: request.method(),
            headers: request.headers(),
        };
        let notebook_namespace = on_notebook_host.map(|(_, (ns, _))| ns);
        let Some((target, via)) = self.by_rule(&view, request.uri(), user, notebook_namespace)?
        else {
            return self.notebook_page(&request, &path, authority);
        };
        Ok(Step::Forward(Routed {
            request,
            sent_to,
            target,
            via,
        }))
    }

    /// A visit to a port host ([`crate::ports`]): its visitor signed in (or sent to sign in) and
    /// let in as the notebook's owner shared the port. `None` for any other host, and for a port
    /// host's sign-in path, which [`Self::notebook_host_visit`] answers as a notebook host's.
    fn port_visit(
        &self,
        request: &Request<Incoming>,
        path: &str,
        host: &str,
        authority: &str,
        tls: bool,
    ) -> Result<Option<PortVisit>, ProxyError> {
        let Some(hosts) = &self.notebook_hosts else {
            return Ok(None);
        };
        let (Some(label), Some(ports)) = (hosts.label_of(host), &hosts.ports) else {
            return Ok(None);
        };
        if labforge_crds::host::port_in_label(label).is_none()
            || path.starts_with(notebook_host::SIGN_IN_PATH)
        {
            return Ok(None);
        }
        let Some(target) = ports.resolve(label) else {
            return Ok(None);
        };
        if !notebook_host::from_own_pages(request.headers(), authority) {
            return Err(ProxyError::CrossOrigin);
        }
        let Some(sign_in) = &hosts.sign_in else {
            return Err(ProxyError::NoRoute);
        };
        let user = notebook_host::cookies(request.headers(), notebook_host::GRANT_COOKIE)
            .find_map(|grant| sign_in.port_user(grant, &target));
        let Some(user) = user else {
            if !is_navigation(request) {
                return Err(ProxyError::Unauthenticated);
            }
            let mut return_to = path.to_owned();
            if let Some(query) = request.uri().query() {
                return_to.push('?');
                return_to.push_str(query);
            }
            let redirect = hosts.port_sign_in_redirect(&target, &return_to, authority, tls);
            return Ok(Some(PortVisit::Answer(redirect)));
        };
        if !ports.may_open(&user, &target) {
            return Err(ProxyError::Forbidden);
        }
        Ok(Some(PortVisit::Let(target, ports.clone())))
    }

    /// What a request's host says before any route is looked at: on a notebook's own host, the
    /// notebook (or the end of its sign-in); on any other, a notebook's path URL (old links,
    /// bookmarks) is sent to the notebook's host.
    fn notebook_host_visit<'s, 'p>(
        &'s self,
        request: &Request<Incoming>,
        path: &'p str,
        host: &str,
        authority: &str,
        tls: bool,
    ) -> Result<ControlFlow<Response<Full<Bytes>>, Option<OnNotebookHost<'s, 'p>>>, ProxyError>
    {
        let Some(hosts) = &self.notebook_hosts else {
            return Ok(ControlFlow::Continue(None));
        };
        match hosts.label_of(host) {
            Some(label) => {
                if let Some(sign_in) = &hosts.sign_in
                    && let Some(state) = path
                        .strip_prefix(notebook_host::SIGN_IN_PATH)
                        .and_then(|rest| rest.strip_prefix('/'))
                {
                    let query = request.uri().query();
                    return hosts
                        .redeem(
                            sign_in.as_ref(),
                            label,
                            state,
                            query,
                            request.headers(),
                            tls,
                        )
                        .map(ControlFlow::Break)
                        .map_err(|refused| {
                            tracing::info!(reason = %refused, "notebook sign-in code refused");
                            ProxyError::CodeRefused
                        });
                }
                let notebook = notebook_host::notebook_of_path(path)
                    .filter(|(ns, name)| labforge_crds::host::is_label_of(label, ns, name))
                    .ok_or(ProxyError::NoRoute)?;
                if !notebook_host::from_own_pages(request.headers(), authority) {
                    return Err(ProxyError::CrossOrigin);
                }
                Ok(ControlFlow::Continue(Some((hosts, notebook))))
            }
            None if path.starts_with(NOTEBOOK_PATHS) => {
                let (ns, name) =
                    notebook_host::notebook_of_path(path).ok_or(ProxyError::NoRoute)?;
                let mut location = hosts.notebook_origin(ns, name, authority);
                location.push_str(path);
                if let Some(query) = request.uri().query() {
                    location.push('?');
                    location.push_str(query);
                }
                Ok(ControlFlow::Break(notebook_host::redirect(&location, [])))
            }
            // The web app is not served on the notebooks' site when it has a site of its own.
            None if hosts.is_notebook_site_only(host) => {
                let mut location = format!(
                    "//{}{}{path}",
                    hosts.app_host,
                    notebook_host::port_of(authority)
                );
                if let Some(query) = request.uri().query() {
                    location.push('?');
                    location.push_str(query);
                }
                Ok(ControlFlow::Break(notebook_host::redirect(&location, [])))
            }
            None => Ok(ControlFlow::Continue(None)),
        }
    }

    /// Who the visitor is. On a notebook's host that signs in itself, the user its grant names,
    /// and a browser without one is sent to sign in; anywhere else, the identity source's user.
    fn authenticate<'r>(
        &self,
        request: &'r Request<Incoming>,
        path: &str,
        authority: &str,
        on_notebook_host: Option<OnNotebookHost<'_, '_>>,
        tls: bool,
    ) -> Result<ControlFlow<Response<Full<Bytes>>, Cow<'r, str>>, ProxyError> {
        match on_notebook_host {
            Some((hosts, (ns, name))) if let Some(sign_in) = &hosts.sign_in => {
                let granted =
                    notebook_host::cookies(request.headers(), notebook_host::GRANT_COOKIE)
                        .find_map(|grant| sign_in.user(grant, ns, name));
                match granted {
                    Some(user) => Ok(ControlFlow::Continue(Cow::Owned(user))),
                    None if is_navigation(request) => {
                        let mut return_to = path.to_owned();
                        if let Some(query) = request.uri().query() {
                            return_to.push('?');
                            return_to.push_str(query);
                        }
                        Ok(ControlFlow::Break(
                            hosts.sign_in_redirect(ns, name, &return_to, authority, tls),
                        ))
                    }
                    None => Err(ProxyError::Unauthenticated),
                }
            }
            _ => self
                .identity
                .user(request.headers())
                .map(ControlFlow::Continue)
                .ok_or(ProxyError::Unauthenticated),
        }
    }

    /// The rule the table routes `view` by, as the target its upstream gets and the way there
    /// (with whether `user` may go, when that is known now); `None` when no route matches.
    fn by_rule(
        &self,
        view: &RequestView<'_>,
        uri: &Uri,
        user: Cow<'_, str>,
        notebook_namespace: Option<&str>,
    ) -> Result<Option<(Option<String>, Via)>, ProxyError> {
        let table = self.routes.table();
        let Some(found) = table.lookup(view) else {
            return Ok(None);
        };
        // A notebook's host serves routes of its namespace only: a VirtualService elsewhere
        // naming that host must not put its own server on the notebook's origin.
        if let Some(ns) = notebook_namespace
            && found.rule.namespaces().any(|guard| guard != ns)
        {
            return Err(ProxyError::NoRoute);
        }
        let target = match found.rule.answer.as_deref() {
            Some(FixedAnswer::Redirect(redirect)) => {
                Some(redirect.location(view, found.prefix_len))
            }
            _ => upstream_target(uri, &found.rule.rewritten_path(&found, view.path)),
        };
        // Decided here while the name is borrowed from the request; copied only when an answer
        // must be waited for.
        let admission = match authorize_now(
            &user,
            found.rule.namespaces(),
            &found.rule.owner.shared_with,
            self.access.as_ref(),
        ) {
            Some(decision) => Admission::Decided(decision),
            None => Admission::Pending(Identity {
                user: user.into_owned(),
            }),
        };
        let rule = found.rule.clone();
        Ok(Some((target, Via::Rule(admission, rule))))
    }

    /// Whether the user may go where the request was routed (waiting for the access answer if
    /// routing could not decide), and the address it goes to then.
    async fn admit(&self, via: &Via) -> Result<Address, ProxyError> {
        let (admission, rule) = match via {
            Via::Fallback(address) => return Ok(Address::Own(address.clone())),
            Via::Rule(admission, rule) => (admission, rule),
        };
        let decision = match admission {
            Admission::Decided(decision) => *decision,
            Admission::Pending(identity) => {
                authorize(
                    Some(identity),
                    rule.namespaces(),
                    &rule.owner.shared_with,
                    self.access.as_ref(),
                )
                .await
            }
        };
        match decision {
            Decision::Allow => {}
            Decision::Unauthenticated => return Err(ProxyError::Unauthenticated),
            Decision::Forbidden => return Err(ProxyError::Forbidden),
            Decision::Unknown => return Err(ProxyError::AccessUnknown),
        }
        if rule.answer.is_some() {
            return Ok(Address::Answered);
        }
        let index = rule.pick_destination_index().ok_or(ProxyError::NoRoute)?;
        let destination = rule.destinations.get(index).ok_or(ProxyError::NoRoute)?;
        Ok(match self.upstream_addresses.get(&*destination.authority) {
            Some(mapped) => Address::Own(mapped.clone()),
            None => Address::Destination(index),
        })
    }

    /// The request as the upstream at `address` gets it: its target, the rule's header changes,
    /// `X-Forwarded-*`, no hop-by-hop headers; an upgrade stays one.
    #[allow(clippy::too_many_arguments)]
    fn outgoing(
        &self,
        mut request: Request<Incoming>,
        sent_to: SentTo,
        target: Option<String>,
        via: Via,
        address: Address,
        peer: &Peer,
        tls: bool,
    ) -> Result<Outgoing, ProxyError> {
        let rule = match via {
            Via::Rule(_, rule) => Some(rule),
            Via::Fallback(_) => None,
        };
        let uri = target
            .map(|target| Uri::builder().path_and_query(target).build())
            .transpose()
            .map_err(|_| ProxyError::NoRoute)?;

        // Looked up only for an upgrade: each lookup hashes a name, and most requests are not.
        let (upgrade_protocol, client_upgrade, websocket_key, revoked) =
            if request.version() == Version::HTTP_11 && is_upgrade(request.headers()) {
                let headers = request.headers();
                let protocol = headers.get(header::UPGRADE).cloned();
                let key = headers.get(header::SEC_WEBSOCKET_KEY).cloned();
                // Asked before the visitor's cookies are stripped: the session is in them. The
                // web app's own tunnels (fallback) end with its session too; a notebook host's
                // with the grant it was opened with.
                let sign_in = self
                    .notebook_hosts
                    .as_ref()
                    .and_then(|h| h.sign_in.as_ref());
                let revoked = match (&rule, sign_in) {
                    (Some(_), Some(sign_in)) => {
                        notebook_host::cookies(headers, notebook_host::GRANT_COOKIE)
                            .find_map(|grant| sign_in.revocation(grant))
                    }
                    _ => self.identity.revocation(headers),
                };
                (
                    protocol,
                    Some(hyper::upgrade::on(&mut request)),
                    key,
                    revoked,
                )
            } else {
                (None, None, None, None)
            };

        // Edited in place: taking the request apart and putting it together again would move
        // the whole request twice.
        // Only a websocket's frames are followed in its tunnel; another upgrade's bytes are not.
        let websocket = upgrade_protocol
            .as_ref()
            .is_some_and(|p| p.as_bytes().eq_ignore_ascii_case(b"websocket"));
        let headers = request.headers_mut();
        strip_hop_by_hop(headers);
        if let Some(protocol) = upgrade_protocol {
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            headers.insert(header::UPGRADE, protocol);
        }
        // The upstream sees the host the request was routed by: HTTP/2's :authority (there is no
        // Host header) and an absolute-form target both override Host (RFC 9112 §3.2.2); the
        // notebook checks Origin against it.
        let host = match sent_to.host_header {
            Some(host) => Some(host),
            None => HeaderValue::from_str(sent_to.authority.as_str())
                .ok()
                .inspect(|host| {
                    headers.insert(header::HOST, host.clone());
                }),
        };
        // Set, never passed on: what a client sends here is whatever it likes.
        headers.insert(&X_FORWARDED_FOR, peer.forwarded_for.clone());
        headers.insert(
            &X_FORWARDED_PROTO,
            HeaderValue::from_static(if tls { "https" } else { "http" }),
        );
        // The routed authority's value, shared rather than parsed and copied again.
        match host {
            Some(host) => headers.insert(&X_FORWARDED_HOST, host),
            None => headers.remove(&X_FORWARDED_HOST),
        };
        if let Some(rule) = &rule {
            // The notebook's server belongs to its owner: it learns who the visitor is from the
            // user header alone. The rule's own edits come after, so that a trusted route may
            // give its upstream a credential of its own.
            strip_visitor(headers, &self.visitor_cookies);
            // Host only: X-Forwarded-Host keeps the authority the client asked for.
            if let Some(authority) = rule
                .other_rewrites
                .as_ref()
                .and_then(|o| o.authority.as_ref())
            {
                headers.insert(header::HOST, authority.clone());
            }
            if let Some(edits) = &rule.header_edits {
                edits.request.apply(headers);
            }
        }
        if let Some(uri) = uri {
            *request.uri_mut() = uri;
        }
        *request.version_mut() = Version::HTTP_11;
        let body_pace = self.body_pace;
        let request =
            request.map(|body| PacedBody::new(body, body_pace, &self.metrics.slow_bodies));
        Ok(Outgoing {
            request,
            address,
            rule,
            client_upgrade,
            websocket_key,
            websocket,
            revoked,
        })
    }

    /// Sends `outgoing` and turns the upstream's answer into the client's: a response streamed
    /// back, a websocket tunnel, or a close for a websocket whose upstream cannot be reached.
    fn exchange(
        self: &Arc<Self>,
        outgoing: Outgoing,
    ) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send + use<> {
        let Outgoing {
            request,
            address,
            rule,
            client_upgrade,
            websocket_key,
            websocket,
            revoked,
        } = outgoing;
        let timeout = rule.as_ref().and_then(|rule| rule.timeout());
        // This thread's own: its reference count stays in this core's cache, where the shared
        // metrics' would move between the cores on every request.
        let forwarder = self.clone();
        // The send future is made inside: one captured from outside would be held twice, as a
        // capture and as what is awaited.
        async move {
            let started = Instant::now();
            let upstreams = forwarder.upstreams.clone();
            let Some(address) = address.authority(rule.as_deref()) else {
                return Err(ProxyError::NoRoute);
            };
            // The route's timeout runs from here until the response's last byte (Envoy's route
            // timeout); a tunnel, once upgraded, is not held to it. Boxed: few routes have one,
            // and its timer would be part of every request's future, which is moved whole as it
            // starts.
            let deadline = timeout.map(|timeout| tokio::time::Instant::now() + timeout);
            let result = match deadline {
                None => upstreams
                    .send(address, request)
                    .await
                    .map_err(|e| forwarder.upstream_error(e)),
                Some(deadline) => {
                    let sending =
                        tokio::time::timeout_at(deadline, upstreams.send(address, request));
                    match Box::pin(sending).await {
                        Ok(sent) => sent.map_err(|e| forwarder.upstream_error(e)),
                        Err(_) => {
                            forwarder.count_upstream_error("timeout");
                            Err(ProxyError::UpstreamTimeout)
                        }
                    }
                }
            };
            let (mut response, client_upgrade) = match (result, client_upgrade, websocket_key) {
                (Ok(response), client_upgrade, _) => (response, client_upgrade),
                // A websocket client (a kernel or terminal tab) gets a proper close it can act on,
                // not a failed handshake.
                (Err(error), Some(client_upgrade), Some(key)) => {
                    tracing::warn!(error = %error, "websocket upstream");
                    return Ok(close_websocket(client_upgrade, &key, &error));
                }
                (Err(error), _, _) => return Err(error),
            };
            forwarder.thread_metrics.upstream_latency(started.elapsed());
            // Browsers keep the cookies of a websocket handshake's answer too.
            if rule.is_some() {
                strip_visitor_set_cookies(response.headers_mut(), &forwarder.visitor_cookies);
            }
            if response.status() == StatusCode::SWITCHING_PROTOCOLS
                && let Some(client_upgrade) = client_upgrade
            {
                let rule = rule.as_deref();
                return Ok(forwarder.tunnel(response, client_upgrade, rule, websocket, revoked));
            }
            Ok(forwarder.streamed(response, rule.as_deref(), deadline))
        }
    }

    /// Counts a failed exchange with an upstream under `kind`.
    fn count_upstream_error(&self, kind: &'static str) {
        self.metrics
            .upstream_errors
            .get_or_create(&ErrorLabels { kind })
            .inc();
    }

    /// The proxy's error for an upstream's `error`, counted: a connection that could not be
    /// made says the notebook is unavailable, where a later failure says it failed.
    fn upstream_error(&self, error: UpstreamError) -> ProxyError {
        if error.is_connect() {
            self.count_upstream_error("connect");
            ProxyError::UpstreamUnavailable(error)
        } else {
            self.count_upstream_error("upstream");
            ProxyError::UpstreamFailed(error)
        }
    }

    /// The client's answer to an upgrade the upstream accepted (`response`); both sides'
    /// connections are then joined in a tunnel on a task of its own, which ends when either
    /// side is done or the visitor's session ends (`revoked`).
    fn tunnel(
        &self,
        mut response: Response<PooledBody>,
        client_upgrade: hyper::upgrade::OnUpgrade,
        rule: Option<&Rule>,
        websocket: bool,
        revoked: Option<Revocation>,
    ) -> Response<ProxyBody> {
        let upstream_upgrade = hyper::upgrade::on(&mut response);
        let activity = rule.map(|rule| &rule.owner.activity);
        if let Some(activity) = &activity {
            activity.touch();
        }
        let metrics = self.metrics.clone();
        let activity = activity.cloned();
        tokio::spawn(async move {
            let (client_io, upstream_io) = match tokio::try_join!(client_upgrade, upstream_upgrade)
            {
                Ok(pair) => pair,
                Err(err) => {
                    tracing::debug!(error = %err, "upgrade not completed");
                    return;
                }
            };
            metrics.websockets.inc();
            metrics.websockets_active.inc();
            let client_io = Touching {
                io: TokioIo::new(client_io),
                cell: activity.clone(),
            };
            let upstream_io = Touching {
                io: TokioIo::new(upstream_io),
                cell: activity,
            };
            // Ends when both sides are done or one fails, or when the visitor's session ends (a
            // tunnel must not outlive the right to open it); both sockets are dropped with it.
            let copying = crate::tunnel::tunnel(client_io, upstream_io, websocket);
            let revoked = async move {
                match revoked {
                    Some(revoked) => revoked.await,
                    None => future::pending().await,
                }
            };
            tokio::select! {
                copied = copying => {
                    if let Err(err) = copied {
                        tracing::debug!(error = %err, "websocket tunnel ended");
                    }
                }
                () = revoked => {
                    tracing::debug!("websocket tunnel closed: the session ended");
                    metrics.tunnels_revoked.inc();
                }
            }
            metrics.websockets_active.dec();
        });
        let (parts, _) = response.into_parts();
        Response::from_parts(parts, Either::Right(Full::default()))
    }

    /// The upstream's `response` as the client gets it, its body streamed back and held to the
    /// route's `deadline`.
    fn streamed(
        &self,
        mut response: Response<PooledBody>,
        rule: Option<&Rule>,
        deadline: Option<tokio::time::Instant>,
    ) -> Response<ProxyBody> {
        if let Some(rule) = rule
            && response.status().as_u16() < 400
        {
            rule.owner.activity.touch();
        }
        strip_hop_by_hop(response.headers_mut());
        // The visitor's cookies are stripped again after the route's own edits: a
        // VirtualService may not set them either.
        if let Some(edits) = rule.and_then(|rule| rule.header_edits.as_ref()) {
            edits.response.apply(response.headers_mut());
            strip_visitor_set_cookies(response.headers_mut(), &self.visitor_cookies);
        }
        response.map(|body| match deadline {
            Some(deadline) => Either::Left(body.until(deadline)),
            None => Either::Left(body),
        })
    }
}

/// What routing decided: forward the request, or answer it here (redirects of notebook hosts).
// The large variant is nearly every request's: boxing it would cost each an allocation.
#[allow(clippy::large_enum_variant)]
enum Step {
    Forward(Routed),
    Answer(Response<Full<Bytes>>),
    /// To a port inside a notebook, its visitor let in.
    Port(Request<Incoming>, PortTarget, Arc<dyn NotebookPorts>),
}

/// What a port host's visit comes to.
enum PortVisit {
    Answer(Response<Full<Bytes>>),
    Let(PortTarget, Arc<dyn NotebookPorts>),
}

/// A request on a notebook's own host: the hosts' settings, and that notebook's namespace and
/// name.
type OnNotebookHost<'s, 'p> = (&'s NotebookHosts, (&'p str, &'p str));

/// Whether a browser would show the answer to `request` as a page: only such a visit is sent
/// to sign in, not a script's request (which could not follow it across origins anyway).
fn is_navigation(request: &Request<Incoming>) -> bool {
    let headers = request.headers();
    (request.method() == http::Method::GET || request.method() == http::Method::HEAD)
        && !is_upgrade(headers)
        && headers
            .get("sec-fetch-mode")
            .is_none_or(|mode| mode.as_bytes() == b"navigate")
}

/// A request the table routed, with its admission decided or still to be asked.
struct Routed {
    request: Request<Incoming>,
    sent_to: SentTo,
    /// The target the upstream gets when the request's own will not do; for a rule that
    /// redirects, the `Location`.
    target: Option<String>,
    via: Via,
}

/// What a routed request goes through.
enum Via {
    /// The web app (embedded mode) at this address, which authenticates its own requests.
    Fallback(Arc<str>),
    /// A route's rule, and whether the user may use it.
    Rule(Admission, Arc<Rule>),
}

/// Whether the user may use the rule a request was routed by.
enum Admission {
    /// Known when the request was routed: most requests, whose access answers are at hand.
    Decided(Decision),
    /// To be asked for this user (a review not cached yet).
    Pending(Identity),
}

/// The address a request goes to, named without a reference count that other threads share:
/// each clone of one would move its cache line between the cores.
enum Address {
    /// This serving thread's own copy (the fallback, a mapped destination).
    Own(Arc<str>),
    /// The routed rule's destination at this index in [`Rule::destinations`].
    Destination(usize),
    /// Nowhere: the rule answers itself ([`Rule::answer`]).
    Answered,
}

impl Address {
    /// The `host:port` to connect to, given the `rule` the request was routed by; `None` when
    /// there is none to connect to.
    fn authority<'a>(&'a self, rule: Option<&'a Rule>) -> Option<&'a str> {
        match self {
            Address::Own(address) => Some(address),
            Address::Destination(index) => rule
                .and_then(|rule| rule.destinations.get(*index))
                .map(|destination| &*destination.authority),
            Address::Answered => None,
        }
    }
}

/// The response of a rule that answers itself; `location` is its redirect's.
fn rule_answer(rule: &Rule, location: Option<String>) -> Result<Response<ProxyBody>, ProxyError> {
    let (status, location, body) = match rule.answer.as_deref() {
        Some(FixedAnswer::Redirect(redirect)) => (redirect.status, location, Bytes::new()),
        Some(FixedAnswer::Respond { status, body }) => (*status, None, body.clone()),
        Some(FixedAnswer::NotServed) | None => return Err(ProxyError::NoRoute),
    };
    let has_body = !body.is_empty();
    let mut response = Response::new(Either::Right(Full::new(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    if let Some(location) = location.and_then(|l| HeaderValue::from_str(&l).ok()) {
        headers.insert(header::LOCATION, location);
    }
    if has_body {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    }
    if let Some(edits) = &rule.header_edits {
        edits.response.apply(headers);
    }
    Ok(response)
}

/// A request ready for its upstream.
struct Outgoing {
    request: Request<PacedBody>,
    address: Address,
    /// The rule it was routed by (its response header changes and activity), if any.
    rule: Option<Arc<Rule>>,
    /// The client's side of an upgrade it asked for.
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    websocket_key: Option<HeaderValue>,
    /// The upgrade is to a websocket (`Upgrade: websocket`).
    websocket: bool,
    /// For an upgrade: resolves when the identity it was opened with is revoked.
    revoked: Option<Revocation>,
}

/// A close frame's payload is at most 125 bytes: the code's two and the reason.
const CLOSE_REASON_MAX: usize = 123;

/// A close frame with code 1013, "try again later" (the notebook is stopped or starting), and
/// `reason` cut at a character boundary to what the frame holds.
fn try_again_later_frame(reason: &str) -> Vec<u8> {
    use tungstenite::protocol::frame::coding::CloseCode;
    use tungstenite::protocol::frame::{CloseFrame, Frame};
    let mut end = reason.len().min(CLOSE_REASON_MAX);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let frame = Frame::close(Some(CloseFrame {
        code: CloseCode::Again,
        reason: reason[..end].to_owned().into(),
    }));
    let mut bytes = Vec::with_capacity(2 + 2 + end);
    // Writing into a Vec cannot fail.
    let _ = frame.format(&mut bytes);
    bytes
}

/// Accepts the websocket handshake and closes it at once with 1013 and the error as reason.
fn close_websocket(
    client_upgrade: hyper::upgrade::OnUpgrade,
    key: &HeaderValue,
    error: &ProxyError,
) -> Response<ProxyBody> {
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let frame = try_again_later_frame(&error.to_string());
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt as _;
        if let Ok(upgraded) = client_upgrade.await {
            let mut io = TokioIo::new(upgraded);
            let _ = io.write_all(&frame).await;
            let _ = io.shutdown().await;
        }
    });
    let mut response = Response::new(Either::Right(Full::default()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    response
}

/// The request target (origin form: the connection is to the destination already) for `path`
/// and the request's query; `None` when the request's own target is exactly that, which it is
/// for most notebook requests (Kubeflow rewrites a notebook's prefix to itself).
fn upstream_target(uri: &Uri, path: &str) -> Option<String> {
    if uri.authority().is_none() && uri.path() == path {
        return None;
    }
    let query = uri.query();
    let mut target = String::with_capacity(path.len() + query.map_or(0, |q| q.len() + 1));
    target.push_str(path);
    if let Some(query) = query {
        target.push('?');
        target.push_str(query);
    }
    Some(target)
}

/// `text` in lowercase, copied only when it has an uppercase letter (host names rarely do).
fn lowercase(text: &str) -> std::borrow::Cow<'_, str> {
    if text.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(text.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// The authority a request was sent to: the absolute URI's (HTTP/2, absolute-form) or Host.
struct SentTo {
    authority: Authority,
    /// The Host header it was read from, which the upstream gets as it is: kept rather than
    /// looked up again. `None` when it came from the URI, which overrides Host.
    host_header: Option<HeaderValue>,
}

impl SentTo {
    fn of<B>(request: &Request<B>) -> Option<Self> {
        if let Some(authority) = request.uri().authority() {
            return Some(SentTo {
                authority: authority.clone(),
                host_header: None,
            });
        }
        let host = request.headers().get(header::HOST)?;
        Some(SentTo {
            authority: host.to_str().ok()?.parse().ok()?,
            host_header: Some(host.clone()),
        })
    }
}

/// The host of `authority` as [`Authority::host`] gives it (after any userinfo, an IPv6 literal
/// with its brackets, no port), found by scanning bytes: `host()` splits on `char` patterns, which
/// costs as much as parsing the authority.
fn authority_host(authority: &Authority) -> &str {
    let text = authority.as_str();
    let bytes = text.as_bytes();
    let start = bytes
        .iter()
        .rposition(|&b| b == b'@')
        .map_or(0, |at| at + 1);
    let host_port = &bytes[start..];
    let len = if host_port.first() == Some(&b'[') {
        host_port
            .iter()
            .position(|&b| b == b']')
            .map_or(host_port.len(), |at| at + 1)
    } else {
        host_port
            .iter()
            .position(|&b| b == b':')
            .unwrap_or(host_port.len())
    };
    // Both ends are at ASCII bytes (or the ends of the text), so on character boundaries.
    &text[start..start + len]
}

/// The client a connection comes from, with its address as `X-Forwarded-For` names it, made
/// once per connection rather than per request.
#[derive(Clone, Debug)]
pub struct Peer {
    pub address: SocketAddr,
    forwarded_for: HeaderValue,
}

impl Peer {
    pub fn new(address: SocketAddr) -> Self {
        let forwarded_for = HeaderValue::from_str(&address.ip().to_string())
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        Self {
            address,
            forwarded_for,
        }
    }
}

/// An upgraded connection whose reads count as the route's activity.
struct Touching<T> {
    io: T,
    cell: Option<Arc<ActivityCell>>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Touching<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(())))
            && buf.filled().len() > before
            && let Some(cell) = &self.cell
        {
            cell.touch();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Touching<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_frame_holds_1013_and_a_reason_cut_at_a_character_boundary() {
        let frame = try_again_later_frame("notebook alice/lab is stopped");
        assert_eq!(
            frame[..2],
            [0x88, 2 + 29],
            "FIN + close, unmasked, its length"
        );
        assert_eq!(frame[2..4], 1013u16.to_be_bytes());
        assert_eq!(&frame[4..], b"notebook alice/lab is stopped");

        // 122 ASCII bytes and then a 3-byte character: cut before it, not inside it.
        let long = format!("{}…and more", "x".repeat(122));
        let frame = try_again_later_frame(&long);
        assert_eq!(usize::from(frame[1]), 2 + 122);
        assert!(
            frame.len() <= 2 + 125,
            "a control frame's payload is at most 125 bytes"
        );
        assert!(std::str::from_utf8(&frame[4..]).is_ok());
    }

    #[test]
    fn the_request_target_is_rebuilt_only_when_the_upstream_needs_another() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        assert_eq!(
            upstream_target(&uri("/notebook/a/b/lab?x=1"), "/notebook/a/b/lab"),
            None
        );
        assert_eq!(
            upstream_target(&uri("/notebook/a/b/lab?x=1"), "/lab").as_deref(),
            Some("/lab?x=1")
        );
        // Normalized away: the upstream gets the path that was authorized.
        assert_eq!(
            upstream_target(&uri("/notebook/a/b//lab"), "/notebook/a/b/lab").as_deref(),
            Some("/notebook/a/b/lab")
        );
        // Absolute form (and HTTP/2's :authority) becomes origin form.
        assert_eq!(
            upstream_target(&uri("http://lab/notebook/a/b/?k"), "/notebook/a/b/").as_deref(),
            Some("/notebook/a/b/?k")
        );
    }

    #[test]
    fn the_host_is_found_as_the_http_crate_finds_it() {
        for text in [
            "example.com",
            "Notebooks.Example.COM:8443",
            "127.0.0.1:18080",
            "[::1]",
            "[::1]:8080",
            "[fe80::1%25eth0]:80",
            "alice@example.com:80",
            "alice:secret@[::1]:80",
            "host:",
            "xn--bcher-kva.example",
        ] {
            let authority: Authority = text.parse().unwrap();
            assert_eq!(authority_host(&authority), authority.host(), "{text}");
        }
    }
}
