//! Each notebook on its own host, as JupyterHub's subdomains: a page a notebook serves runs on an
//! origin of its own, where neither the web app's session nor another notebook's cookie is sent,
//! so it cannot act as its visitor on them.
//!
//! `<label>.<domain>` ([`labforge_crds::host`]) serves only `/notebook/<ns>/<name>/…` of the one
//! notebook whose label it is, and only by routes of that notebook's namespace; the path stays,
//! so NB_PREFIX, Kubeflow's images and VirtualServices are unchanged. Other hosts send old
//! `/notebook/…` URLs to the notebook's host. A request to a notebook's host from a page of
//! another origin ([`from_own_pages`]: its `Origin`, or `Sec-Fetch-Site`) is refused whatever
//! cookie it carries, reads, writes, websockets, images and frames alike; only a top-level
//! navigation may come from elsewhere.
//!
//! Who is visiting: in a cluster, the auth proxy in front (which must cover `*.<domain>`) says,
//! as on every host. In embedded mode, whose session cookie is host-only, the notebook's host
//! signs its visitor in itself ([`HostSignIn`]): a visit without its cookie is sent to the web
//! app with a random state, also set as a cookie on the notebook's host; the web app checks
//! access and sends the browser back to `<SIGN_IN_PATH>/<state>` with a one-time code bound to the
//! notebook, that state and the visitor's session; the proxy trades it for the notebook's own
//! cookie ([`GRANT_COOKIE`]), which lasts as long as that session, and sends the browser on.

use crate::authz::Revocation;
use bytes::Bytes;
use cookie::{Cookie, SameSite};
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::Full;
use std::sync::Arc;

/// Where a notebook's host takes sign-in codes: `<SIGN_IN_PATH>/<state>?code=…`. The state cookie
/// is scoped to that path, so that sign-ins in several tabs at once each keep their own.
pub const SIGN_IN_PATH: &str = "/_labforge/sign-in";
/// Where the web app signs a visitor in to a notebook's host.
pub const WEB_SIGN_IN_PATH: &str = "/notebook-sign-in";
/// The cookie a notebook's host knows its visitor by; never forwarded to the notebook.
pub const GRANT_COOKIE: &str = "labforge_notebook";
/// The cookie binding a sign-in code to the browser that was sent for it.
pub const STATE_COOKIE: &str = "labforge_notebook_state";
/// How long a browser has to come back from the web app with a code.
const STATE_LIFETIME_SECONDS: i64 = 600;

/// Serving notebooks on hosts of their own.
#[derive(Clone)]
pub struct NotebookHosts {
    /// Notebooks are served at `<label>.<domain>` (`localhost` in embedded mode).
    pub domain: String,
    /// The web app's host, where visitors sign in and error pages link back to (the request's
    /// port kept): `domain` itself, or a host of another site, whose cookies no notebook's page
    /// can set.
    pub app_host: String,
    /// Embedded mode's own sign-in to notebook hosts; `None` when the identity source knows the
    /// visitor on every host (an auth proxy in front).
    pub sign_in: Option<Arc<dyn HostSignIn>>,
    /// Web servers users run in their notebooks, each at a port host of its own
    /// ([`crate::ports`]); `None` where they are not served.
    pub ports: Option<Arc<dyn crate::ports::NotebookPorts>>,
}

impl std::fmt::Debug for NotebookHosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotebookHosts")
            .field("domain", &self.domain)
            .field("app_host", &self.app_host)
            .field("sign_in", &self.sign_in.is_some())
            .field("ports", &self.ports.is_some())
            .finish()
    }
}

/// The web app's half of signing in to a notebook's host: it issues the codes and knows the
/// sessions they came from.
pub trait HostSignIn: Send + Sync {
    /// Trades `code`, presented on the host labelled `label` by a browser whose state cookie is
    /// `state`, for a grant. A code is used up by its first presentation, accepted or not.
    fn redeem(&self, code: &str, label: &str, state: &str) -> Result<Redeemed, CodeRefused>;
    /// The user `grant` lets into notebook `namespace/name`, while the session it came from
    /// lasts.
    fn user(&self, grant: &str, namespace: &str, name: &str) -> Option<String>;
    /// The user `grant` lets into port `target`, while the session it came from lasts.
    fn port_user(&self, grant: &str, target: &crate::ports::PortTarget) -> Option<String> {
        let _ = (grant, target);
        None
    }
    /// Resolves when `grant` ends (its session was signed out, its user removed or reset).
    fn revocation(&self, grant: &str) -> Option<Revocation>;
}

/// An accepted code: the grant cookie's value and where the browser was going.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redeemed {
    pub grant: String,
    /// A path and query on the notebook's host, under its prefix.
    pub return_to: String,
}

/// Why a code was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CodeRefused {
    #[error("the code was used already or never issued")]
    Unknown,
    #[error("the code expired")]
    Expired,
    #[error("the code is for another notebook")]
    OtherNotebook,
    #[error("the code was issued to another browser")]
    OtherBrowser,
}

impl NotebookHosts {
    /// The notebook label of `host` (lowercase, without port) when it is a notebook's host.
    pub fn label_of<'h>(&self, host: &'h str) -> Option<&'h str> {
        let label = host.strip_suffix(self.domain.as_str())?.strip_suffix('.')?;
        (!label.is_empty() && !label.contains('.')).then_some(label)
    }

    /// Whether `host`, no notebook's, is the notebook domain or below it while the web app has
    /// a host of its own: the web app is not served there, where notebooks' pages share the
    /// site and could set its cookies.
    pub fn is_notebook_site_only(&self, host: &str) -> bool {
        self.app_host != self.domain
            && host != self.app_host
            && (host == self.domain
                || host
                    .strip_suffix(self.domain.as_str())
                    .is_some_and(|rest| rest.ends_with('.')))
    }

    /// `//<notebook's host>[:port]` for a request that came to `authority`.
    pub fn notebook_origin(&self, namespace: &str, name: &str, authority: &str) -> String {
        let host = labforge_crds::host::notebook_host(namespace, name, &self.domain);
        format!("//{host}{}", port_of(authority))
    }

    /// Where a visitor without a grant goes to sign in, and the state cookie to set.
    pub fn sign_in_redirect(
        &self,
        namespace: &str,
        name: &str,
        return_to: &str,
        authority: &str,
        tls: bool,
    ) -> Response<Full<Bytes>> {
        self.sign_in_redirect_to(namespace, name, None, return_to, authority, tls)
    }

    /// [`Self::sign_in_redirect`] for a notebook's port host.
    pub fn port_sign_in_redirect(
        &self,
        target: &crate::ports::PortTarget,
        return_to: &str,
        authority: &str,
        tls: bool,
    ) -> Response<Full<Bytes>> {
        let port = Some(target.port);
        self.sign_in_redirect_to(
            &target.namespace,
            &target.name,
            port,
            return_to,
            authority,
            tls,
        )
    }

    fn sign_in_redirect_to(
        &self,
        namespace: &str,
        name: &str,
        port: Option<u16>,
        return_to: &str,
        authority: &str,
        tls: bool,
    ) -> Response<Full<Bytes>> {
        let state = random_hex(16);
        let mut query = form_urlencoded::Serializer::new(String::new());
        query
            .append_pair("namespace", namespace)
            .append_pair("name", name)
            .append_pair("state", &state)
            .append_pair("return", return_to);
        if let Some(port) = port {
            query.append_pair("port", &port.to_string());
        }
        let query = query.finish();
        let location = format!(
            "//{}{}{WEB_SIGN_IN_PATH}?{query}",
            self.app_host,
            port_of(authority)
        );
        let cookie = Cookie::build((STATE_COOKIE, state.clone()))
            .path(format!("{SIGN_IN_PATH}/{state}"))
            .http_only(true)
            .same_site(SameSite::Lax)
            .secure(tls)
            .max_age(cookie::time::Duration::seconds(STATE_LIFETIME_SECONDS));
        redirect(&location, [cookie.build()])
    }

    /// Answers `<SIGN_IN_PATH>/<state>` (`state` here) on the host labelled `label`: the code
    /// traded for a grant cookie and a redirect to where the visitor was going, when this
    /// browser holds that state's cookie.
    pub fn redeem(
        &self,
        sign_in: &dyn HostSignIn,
        label: &str,
        state: &str,
        query: Option<&str>,
        headers: &HeaderMap,
        tls: bool,
    ) -> Result<Response<Full<Bytes>>, CodeRefused> {
        let code = form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .find(|(key, _)| key == "code")
            .map(|(_, value)| value.into_owned())
            .ok_or(CodeRefused::Unknown)?;
        if state.is_empty() || !cookies(headers, STATE_COOKIE).any(|held| held == state) {
            return Err(CodeRefused::OtherBrowser);
        }
        let redeemed = sign_in.redeem(&code, label, state)?;
        // Only a path of this host: the code's issuer promised one, and an open redirect here
        // would send a signed-in visitor anywhere.
        if !redeemed.return_to.starts_with('/') || redeemed.return_to.starts_with("//") {
            return Err(CodeRefused::OtherNotebook);
        }
        let grant = Cookie::build((GRANT_COOKIE, redeemed.grant))
            .path("/")
            .http_only(true)
            .same_site(SameSite::Lax)
            .secure(tls);
        let used_state = Cookie::build(STATE_COOKIE)
            .path(format!("{SIGN_IN_PATH}/{state}"))
            .removal();
        Ok(redirect(
            &redeemed.return_to,
            [grant.build(), used_state.build()],
        ))
    }
}

/// `/notebook/<ns>/<name>` and what follows it, when `path` is below a notebook's prefix.
pub fn notebook_of_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix(crate::forward::NOTEBOOK_PATHS)?;
    let (namespace, rest) = rest.split_once('/')?;
    let name = rest.split('/').next()?;
    (!namespace.is_empty() && !name.is_empty()).then_some((namespace, name))
}

/// Whether a request to a notebook's host may be served: one from a page of that host, from no
/// page (a script outside a browser), or a top-level navigation (a link, the sign-in's
/// redirects), which leaves the answer to the new page. Anything else a page of another origin
/// sends (a fetch, a form, an image, a frame, a websocket) is refused, whatever cookie it
/// carries: on one domain, notebook hosts are one site, and `SameSite` does not keep them apart.
pub fn from_own_pages(headers: &HeaderMap, authority: &str) -> bool {
    same_origin(headers, authority) && {
        let fetch = |name: &str| headers.get(name).map(HeaderValue::as_bytes);
        match fetch("sec-fetch-site") {
            None | Some(b"same-origin" | b"none") => true,
            Some(_) => {
                fetch("sec-fetch-mode") == Some(b"navigate")
                    && fetch("sec-fetch-dest") == Some(b"document")
            }
        }
    }
}

/// Whether the request came from no page or from a page of the host it was sent to (its
/// `Origin`). Schemes are not compared: TLS may end before the proxy.
fn same_origin(headers: &HeaderMap, authority: &str) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let origin = origin.to_str().unwrap_or("");
    let Some((_, origin_authority)) = origin.split_once("://") else {
        // `null` (a sandboxed frame, a redirect across origins) or worse.
        return false;
    };
    without_default_port(origin_authority).eq_ignore_ascii_case(without_default_port(authority))
}

fn without_default_port(authority: &str) -> &str {
    authority
        .strip_suffix(":80")
        .or_else(|| authority.strip_suffix(":443"))
        .unwrap_or(authority)
}

/// `:port` of `authority`, or nothing when it has none.
pub fn port_of(authority: &str) -> &str {
    match authority.rfind(':') {
        Some(at) if !authority[at..].contains(']') => &authority[at..],
        _ => "",
    }
}

/// The values of cookie `name` among the request's cookies: a browser sends one per path and
/// domain it was set for, and a page may have planted its own beside the proxy's.
///
/// Read as browsers write the header (RFC 6265 §5.4): pairs split at `;`, only spaces and tabs
/// trimmed, the name up to the first `=` compared byte for byte. A parser that trimmed more
/// (Unicode whitespace, as `str::trim` does) would take a cookie a page set as
/// `\u{2000}__Host-x`, which the browser let it set for a parent domain because it has no
/// prefix, for `__Host-x`. Pair by pair, so that one cookie with bytes a header string cannot
/// hold does not hide the others.
pub fn cookies<'h>(headers: &'h HeaderMap, name: &str) -> impl Iterator<Item = &'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b';'))
        .filter_map(move |pair| {
            let at = pair.iter().position(|&b| b == b'=')?;
            let (pair_name, value) = (trim_space_and_tab(&pair[..at]), &pair[at + 1..]);
            (pair_name == name.as_bytes())
                .then(|| std::str::from_utf8(trim_space_and_tab(value)).ok())
                .flatten()
        })
}

fn trim_space_and_tab(bytes: &[u8]) -> &[u8] {
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !blank(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !blank(b))
        .map_or(start, |at| at + 1);
    &bytes[start..end]
}

/// A 302 to `location` setting `cookies`.
pub(crate) fn redirect<'c>(
    location: &str,
    cookies: impl IntoIterator<Item = Cookie<'c>>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::default());
    *response.status_mut() = StatusCode::FOUND;
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(location) {
        headers.insert(header::LOCATION, location);
    }
    for cookie in cookies {
        if let Ok(cookie) = HeaderValue::from_str(&cookie.to_string()) {
            headers.append(header::SET_COOKIE, cookie);
        }
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `bytes` random bytes as hex.
pub fn random_hex(bytes: usize) -> String {
    let mut buffer = vec![0u8; bytes];
    // The OS's generator does not fail on Linux once booted; zeros would only make a state
    // guessable, which the code's own randomness and single use still guard.
    if getrandom::fill(&mut buffer).is_err() {
        tracing::error!("no randomness for a notebook sign-in state");
    }
    buffer.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts() -> NotebookHosts {
        NotebookHosts {
            domain: "localhost".into(),
            app_host: "localhost".into(),
            sign_in: None,
            ports: None,
        }
    }

    #[test]
    fn a_notebook_host_is_one_label_under_the_domain() {
        let hosts = hosts();
        assert_eq!(hosts.label_of("lab--alice.localhost"), Some("lab--alice"));
        assert_eq!(hosts.label_of("localhost"), None, "the main host");
        assert_eq!(hosts.label_of("a.b.localhost"), None);
        assert_eq!(hosts.label_of(".localhost"), None);
        assert_eq!(hosts.label_of("evillocalhost"), None);
    }

    #[test]
    fn paths_name_their_notebook() {
        assert_eq!(
            notebook_of_path("/notebook/alice/lab/api/x"),
            Some(("alice", "lab"))
        );
        assert_eq!(
            notebook_of_path("/notebook/alice/lab"),
            Some(("alice", "lab"))
        );
        assert_eq!(notebook_of_path("/notebook/alice/"), None);
        assert_eq!(notebook_of_path("/notebook/alice"), None);
        assert_eq!(notebook_of_path("/api/x"), None);
    }

    #[test]
    fn only_the_hosts_own_pages_and_navigations_pass_the_origin_check() {
        let with = |origin: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
            headers
        };
        let me = "lab--alice.localhost:8080";
        assert!(from_own_pages(&HeaderMap::new(), me));
        assert!(from_own_pages(
            &with("http://lab--alice.localhost:8080"),
            me
        ));
        assert!(same_origin(
            &with("https://lab--alice.example.com"),
            "lab--alice.example.com:443"
        ));
        assert!(!from_own_pages(&with("http://lab--bob.localhost:8080"), me));
        assert!(!from_own_pages(&with("http://localhost:8080"), me));
        assert!(!from_own_pages(&with("null"), me));
        assert!(!from_own_pages(
            &with("http://lab--alice.localhost:9090"),
            me
        ));

        // Without Origin: a navigation to a document may come from anywhere, nothing else may.
        let fetch = |site: &str, mode: &str, dest: &str| {
            let mut headers = HeaderMap::new();
            for (name, value) in [
                ("sec-fetch-site", site),
                ("sec-fetch-mode", mode),
                ("sec-fetch-dest", dest),
            ] {
                headers.insert(name, HeaderValue::from_str(value).unwrap());
            }
            from_own_pages(&headers, me)
        };
        assert!(fetch("same-origin", "no-cors", "image"));
        assert!(fetch("none", "navigate", "document"));
        assert!(fetch("cross-site", "navigate", "document"));
        assert!(!fetch("same-site", "no-cors", "image"));
        assert!(!fetch("same-site", "navigate", "iframe"));
        assert!(!fetch("cross-site", "no-cors", "script"));
    }

    #[test]
    fn with_an_app_host_of_its_own_the_notebooks_site_serves_no_web_app() {
        let own = NotebookHosts {
            domain: "notebooks.example-lab.net".into(),
            app_host: "lab.example.com".into(),
            sign_in: None,
            ports: None,
        };
        for host in ["notebooks.example-lab.net", "a.b.notebooks.example-lab.net"] {
            assert!(own.is_notebook_site_only(host), "{host}");
        }
        for host in ["lab.example.com", "127.0.0.1", "xnotebooks.example-lab.net"] {
            assert!(!own.is_notebook_site_only(host), "{host}");
        }
        assert!(
            !hosts().is_notebook_site_only("localhost"),
            "the app on the domain itself"
        );
    }

    #[test]
    fn a_cookie_is_read_by_its_exact_name_as_browsers_send_it() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_bytes(
                &[
                    "a=1;b = 2 ;\u{2000}__Host-s=planted; \u{a0}__Host-s=planted; \
                     __host-s=planted; =__Host-s=planted; __Host-s\u{2000}=planted;\t\
                     __Host-s=real; x="
                        .as_bytes(),
                    &[0xff],
                ]
                .concat(),
            )
            .unwrap(),
        );
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("c=3; __Host-s=second"),
        );
        let values = |name| cookies(&headers, name).collect::<Vec<_>>();
        assert_eq!(values("__Host-s"), ["real", "second"]);
        assert_eq!(values("a"), ["1"]);
        assert_eq!(values("b"), ["2"]);
        assert_eq!(values("c"), ["3"]);
        assert!(values("x").is_empty(), "a value that is no text is skipped");
    }

    #[test]
    fn a_visitor_without_a_grant_is_sent_to_the_web_app_with_a_state_cookie() {
        let response = hosts().sign_in_redirect(
            "alice",
            "lab",
            "/notebook/alice/lab/lab?reset&x=1",
            "lab--alice.localhost:8080",
            false,
        );
        assert_eq!(response.status(), StatusCode::FOUND);
        let location = response.headers()[header::LOCATION].to_str().unwrap();
        let (base, query) = location.split_once('?').unwrap();
        assert_eq!(base, "//localhost:8080/notebook-sign-in");
        let pairs: std::collections::HashMap<_, _> = form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect();
        assert_eq!(pairs["return"], "/notebook/alice/lab/lab?reset&x=1");
        let cookie = response.headers()[header::SET_COOKIE].to_str().unwrap();
        assert!(cookie.starts_with(&format!("{STATE_COOKIE}={}; ", pairs["state"])));
        assert!(cookie.contains("HttpOnly"));
        assert_eq!(pairs["state"].len(), 32);
        assert!(cookie.contains(&format!("Path={SIGN_IN_PATH}/{}", pairs["state"])));
    }
}
