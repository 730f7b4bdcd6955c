//! What the proxy takes out of the messages it forwards: the headers that belong to one
//! connection (hop-by-hop, and whatever `Connection` names), and what identifies the visitor to
//! the platform (its session cookies, credentials) that a notebook must never see or set.
//!
//! Every request and response goes through these, so each looks at the few headers once and
//! does nothing more when there is nothing to take out, which is the common case.

use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue};

/// Headers that belong to one connection, never forwarded (RFC 9110 §7.6.1, plus the
/// non-standard ones proxies have always dropped).
const HOP_BY_HOP_COUNT: usize = 8;
static HOP_BY_HOP: [HeaderName; HOP_BY_HOP_COUNT] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

pub(super) fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
}

/// Where `name` is in [`HOP_BY_HOP`]: a match on the name's text, which compiles to a switch on
/// its length, where comparing with each name in turn costs a comparison per name and header.
fn hop_by_hop_index(name: &HeaderName) -> Option<usize> {
    match name.as_str() {
        "connection" => Some(0),
        "keep-alive" => Some(1),
        "proxy-connection" => Some(2),
        "proxy-authorization" => Some(3),
        "te" => Some(4),
        "trailer" => Some(5),
        "transfer-encoding" => Some(6),
        "upgrade" => Some(7),
        _ => None,
    }
}

/// Whether a `Connection` option names nothing beyond what is dropped anyway: `close`, or a
/// hop-by-hop header (options are case-insensitive, header names are stored in lowercase).
fn is_dropped_anyway(option: &str) -> bool {
    option.eq_ignore_ascii_case("close")
        || HOP_BY_HOP
            .iter()
            .any(|name| option.eq_ignore_ascii_case(name.as_str()))
}

/// Drops hop-by-hop headers, including every header the Connection header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the message's few headers instead of a hashed removal per name: most
    // messages have none, and the rest mostly just `Connection: keep-alive`.
    let mut present = [false; HOP_BY_HOP_COUNT];
    for key in headers.keys() {
        if let Some(at) = hop_by_hop_index(key) {
            present[at] = true;
        }
    }
    if !present.contains(&true) {
        return;
    }
    // The options are read where they are and a name is made only for an option that names
    // another header, which almost none does: `keep-alive` alone took a header name's
    // allocation and a vector's per response.
    let options = || {
        headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .map(str::trim)
            .filter(|option| {
                // Host is kept whatever Connection says: HTTP/1.1 requires it, and the upstream
                // gets the one the request was routed by.
                !option.is_empty()
                    && !is_dropped_anyway(option)
                    && !option.eq_ignore_ascii_case("host")
            })
    };
    if options().next().is_some() {
        let named: Vec<HeaderName> = options()
            .filter_map(|option| HeaderName::from_bytes(option.as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for (name, present) in HOP_BY_HOP.iter().zip(present) {
        if present {
            headers.remove(name);
        }
    }
}

/// Removes from a request to a route what identifies the visitor beyond the user header: the
/// `visitor_cookies` (and their split parts `<name>_<n>`) from `Cookie`, which is dropped when
/// nothing is left, `Authorization` (a bearer ID token) and `Forwarded`. The other cookies (the
/// notebook's own, Jupyter's `_xsrf`) stay as they were.
pub fn strip_visitor(headers: &mut HeaderMap, visitor_cookies: &[Box<[u8]>]) {
    // One pass over the request's few headers: most carry none of these.
    let (mut cookie, mut authorization, mut forwarded) = (false, false, false);
    for key in headers.keys() {
        match key.as_str() {
            "cookie" => cookie = true,
            "authorization" => authorization = true,
            "forwarded" => forwarded = true,
            _ => {}
        }
    }
    if authorization {
        headers.remove(header::AUTHORIZATION);
    }
    if forwarded {
        headers.remove(header::FORWARDED);
    }
    if cookie {
        strip_cookies(headers, visitor_cookies);
    }
}

/// Removes from a route's response the `Set-Cookie`s of the visitor's cookies: a notebook's
/// server must not set, replace or (for a parent domain) plant the platform's, a notebook
/// host's or the auth proxy's cookies. Nameless ones go too: a browser sends `=a=b` back as
/// `a=b`. The name is read as browsers read it (RFC 6265 §5.2), by hand: a cookie parser that
/// refused a value the browser takes would let it through.
pub fn strip_visitor_set_cookies(headers: &mut HeaderMap, visitor_cookies: &[Box<[u8]>]) {
    let visitor = |value: &HeaderValue| {
        let bytes = value.as_bytes();
        let pair = bytes.split(|&b| b == b';').next().unwrap_or_default();
        match pair.iter().position(|&b| b == b'=') {
            Some(at) => {
                let name = pair[..at].trim_ascii();
                name.is_empty() || is_visitor_cookie(name, visitor_cookies)
            }
            None => true,
        }
    };
    if !headers.get_all(header::SET_COOKIE).iter().any(visitor) {
        return;
    }
    let kept: Vec<HeaderValue> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter(|value| !visitor(value))
        .cloned()
        .collect();
    headers.remove(header::SET_COOKIE);
    for value in kept {
        headers.append(header::SET_COOKIE, value);
    }
}

/// Whether cookie `name` is one of `names`, or a split part of one (`_oauth2_proxy_1`).
fn is_visitor_cookie(name: &[u8], names: &[Box<[u8]>]) -> bool {
    names.iter().any(|visitor| {
        name.strip_prefix(&**visitor).is_some_and(|rest| {
            rest.is_empty()
                || rest
                    .strip_prefix(b"_")
                    .is_some_and(|part| !part.is_empty() && part.iter().all(u8::is_ascii_digit))
        })
    })
}

/// Drops the visitor's cookies from every `Cookie` header (HTTP/2 clients send one per cookie),
/// read as bytes so that no value can hide a pair; what is left becomes one header, or none.
fn strip_cookies(headers: &mut HeaderMap, names: &[Box<[u8]>]) {
    let mut kept: Vec<u8> = Vec::new();
    let mut dropped = false;
    for value in headers.get_all(header::COOKIE) {
        for pair in value.as_bytes().split(|&b| b == b';') {
            let pair = pair.trim_ascii();
            if pair.is_empty() {
                continue;
            }
            let name = pair
                .iter()
                .position(|&b| b == b'=')
                .map_or(pair, |at| &pair[..at])
                .trim_ascii();
            if is_visitor_cookie(name, names) {
                dropped = true;
                continue;
            }
            if !kept.is_empty() {
                kept.extend_from_slice(b"; ");
            }
            kept.extend_from_slice(pair);
        }
    }
    if !dropped {
        return;
    }
    // The kept pairs came from header values, so they make one again.
    match HeaderValue::from_bytes(&kept) {
        Ok(value) if !kept.is_empty() => {
            headers.insert(header::COOKIE, value);
        }
        _ => {
            headers.remove(header::COOKIE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::DEFAULT_VISITOR_COOKIES;

    #[test]
    fn hop_by_hop_headers_and_the_ones_connection_names_are_dropped() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Private"),
        );
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert("kubeflow-userid", HeaderValue::from_static("alice"));
        strip_hop_by_hop(&mut headers);
        let left: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["kubeflow-userid"]);

        // Options name no header; a message with nothing hop-by-hop keeps everything.
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, Upgrade"),
        );
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(header::HOST, HeaderValue::from_static("lab"));
        strip_hop_by_hop(&mut headers);
        let left: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["host"]);
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);

        // Several Connection headers are one list, options in any case.
        let mut headers = HeaderMap::new();
        headers.append(header::CONNECTION, HeaderValue::from_static("Keep-Alive"));
        headers.append(header::CONNECTION, HeaderValue::from_static("X-Trace"));
        headers.insert("x-trace", HeaderValue::from_static("1"));
        headers.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut headers);
        let left: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-kept"]);

        // A Connection header naming Host does not take the Host away.
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("HOST, x-a"));
        headers.insert(header::HOST, HeaderValue::from_static("lab"));
        headers.insert("x-a", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut headers);
        let left: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["host"]);
    }

    #[test]
    fn every_hop_by_hop_name_is_found_where_it_stands() {
        for (at, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(name), Some(at), "{name}");
        }
        assert_eq!(hop_by_hop_index(&header::HOST), None);
        assert_eq!(hop_by_hop_index(&HeaderName::from_static("tee")), None);
    }

    #[test]
    fn upgrade_needs_both_headers() {
        let mut headers = HeaderMap::new();
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(!is_upgrade(&headers));
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        assert!(is_upgrade(&headers));
    }

    fn defaults() -> Vec<Box<[u8]>> {
        DEFAULT_VISITOR_COOKIES
            .iter()
            .map(|name| name.as_bytes().into())
            .collect()
    }

    fn cookies(headers: &HeaderMap) -> Vec<&str> {
        headers
            .get_all(header::COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    #[test]
    fn a_notebook_cannot_set_the_visitors_cookies() {
        let names: Vec<Box<[u8]>> = DEFAULT_VISITOR_COOKIES
            .iter()
            .chain(&[crate::notebook_host::GRANT_COOKIE])
            .map(|name| name.as_bytes().into())
            .collect();
        let mut headers = HeaderMap::new();
        for cookie in [
            "_xsrf=2|abc; Path=/notebook/alice/lab",
            "labforge_session=planted; Domain=example.com; Path=/",
            "labforge_notebook=planted",
            "_oauth2_proxy_1 = part; Domain=.example.com",
            "=labforge_session=nameless",
            "theme=dark",
        ] {
            headers.append(header::SET_COOKIE, HeaderValue::from_static(cookie));
        }
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html"));
        strip_visitor_set_cookies(&mut headers, &names);
        let kept: Vec<&str> = headers
            .get_all(header::SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(
            kept,
            ["_xsrf=2|abc; Path=/notebook/alice/lab", "theme=dark"]
        );
        assert_eq!(headers[header::CONTENT_TYPE], "text/html");
    }

    #[test]
    fn the_visitors_cookies_and_credentials_are_stripped_and_the_notebooks_kept() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static(
                "_xsrf=2|abc; labforge_session=SECRET;_oauth2_proxy=o; theme=dark; __Host-labforge_session=S",
            ),
        );
        // HTTP/2 clients send a header per cookie.
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("_oauth2_proxy_0=a"),
        );
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("_oauth2_proxy_12=b"),
        );
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("authservice_session=c; _oauth2_proxy_x=kept"),
        );
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer id"));
        headers.insert(header::FORWARDED, HeaderValue::from_static("for=1.2.3.4"));
        headers.insert("kubeflow-userid", HeaderValue::from_static("alice"));
        strip_visitor(&mut headers, &defaults());
        assert_eq!(
            cookies(&headers),
            ["_xsrf=2|abc; theme=dark; _oauth2_proxy_x=kept"]
        );
        assert!(!headers.contains_key(header::AUTHORIZATION));
        assert!(!headers.contains_key(header::FORWARDED));
        assert_eq!(headers["kubeflow-userid"], "alice");

        // Nothing but the visitor's: no Cookie header at all.
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("labforge_session=s; _oauth2_proxy_1=x"),
        );
        strip_visitor(&mut headers, &defaults());
        assert!(!headers.contains_key(header::COOKIE));

        // Nothing to strip: the headers stay exactly as they came, several or not.
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("a=1"));
        headers.append(header::COOKIE, HeaderValue::from_static("b=2;;  "));
        strip_visitor(&mut headers, &defaults());
        assert_eq!(cookies(&headers), ["a=1", "b=2;;  "]);

        // A value that is not text hides nothing; a configured name is stripped too.
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_bytes(b"x=\xff\xfe; labforge_session=s; my_sso=t").unwrap(),
        );
        let mut names = defaults();
        names.push(b"my_sso".as_slice().into());
        strip_visitor(&mut headers, &names);
        assert_eq!(headers[header::COOKIE].as_bytes(), b"x=\xff\xfe");
    }

    #[test]
    fn split_cookie_parts_are_numbered_only() {
        let names = defaults();
        for stripped in ["_oauth2_proxy", "_oauth2_proxy_0", "_oauth2_proxy_10"] {
            assert!(is_visitor_cookie(stripped.as_bytes(), &names), "{stripped}");
        }
        for kept in [
            "_oauth2_proxy_",
            "_oauth2_proxyx",
            "_oauth2_proxy_1a",
            "_xsrf",
            "labforge",
        ] {
            assert!(!is_visitor_cookie(kept.as_bytes(), &names), "{kept}");
        }
    }
}
