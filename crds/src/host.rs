//! A notebook's own host: `<label>.<notebook domain>`, so that each notebook is an origin of its
//! own and a page it serves cannot act on the web app or on another notebook as its visitor.
//!
//! The label is `<name>--<namespace>` when that is a valid DNS label with exactly one `--`, so
//! people can read it; otherwise (longer than 63 characters, `--` in a part, characters a label
//! cannot hold) it is a readable prefix of the name, `---`, and a hash of `namespace/name`. A
//! natural label never holds `---` and a hashed one always does, so the two never collide, and
//! the proxy never has to parse a label: it computes the label of the notebook a path names and
//! compares.

use sha2::{Digest, Sha256};

/// Longest DNS label (RFC 1035 §2.3.4).
pub const MAX_LABEL: usize = 63;

/// Hex digits of the hash in a hashed label: 80 bits.
const HASH_DIGITS: usize = 20;

/// Whether notebook `namespace/name` has the readable label `<name>--<namespace>`.
fn has_natural_label(namespace: &str, name: &str) -> bool {
    let plain = |part: &str| {
        !part.is_empty()
            && !part.contains("--")
            && !part.starts_with('-')
            && !part.ends_with('-')
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    // `xn--` starts a punycode label, which browsers would decode.
    plain(name) && plain(namespace) && name.len() + 2 + namespace.len() <= MAX_LABEL && name != "xn"
}

/// Whether `label` is notebook `namespace/name`'s host label; without building the label when
/// it is a readable one, as the proxy asks this of every request to a notebook's host.
pub fn is_label_of(label: &str, namespace: &str, name: &str) -> bool {
    if has_natural_label(namespace, name) {
        label
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix("--"))
            == Some(namespace)
    } else {
        label.contains("---") && notebook_host_label(namespace, name) == label
    }
}

/// Whether `label` is an RFC 1123 label, as Kubernetes names namespaces and notebooks.
pub fn is_dns_label(label: &str) -> bool {
    (1..=MAX_LABEL).contains(&label.len())
        && !label.starts_with('-')
        && !label.ends_with('-')
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The host label of notebook `namespace/name`.
pub fn notebook_host_label(namespace: &str, name: &str) -> String {
    if has_natural_label(namespace, name) {
        return format!("{name}--{namespace}");
    }
    hashed_label(namespace, name, MAX_LABEL - 3 - HASH_DIGITS)
}

/// `<prefix>---<hash>`, the prefix (a readable part of the name) at most `room` long.
fn hashed_label(namespace: &str, name: &str, room: usize) -> String {
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let hash = hex::encode(digest);
    let prefix: String = name
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
        .take(room)
        .collect();
    let prefix = prefix.trim_matches('-');
    let prefix = if prefix.is_empty() || prefix.starts_with("xn-") || prefix == "xn" {
        "nb"
    } else {
        prefix
    };
    format!("{prefix}---{}", &hash[..HASH_DIGITS])
}

/// The host label of port `port` of notebook `namespace/name`: `<port>--<name>--<namespace>`,
/// or `<port>--<prefix>---<hash>` where the notebook's label is a hashed one or the readable form
/// would be too long. A port label holds `--` at least twice (a readable notebook label once),
/// and a hashed notebook label that reads like one differs in its hash; the proxy takes a label
/// for a port's only after no notebook's own label matched.
pub fn port_host_label(namespace: &str, name: &str, port: u16) -> String {
    let readable = format!("{port}--{name}--{namespace}");
    if has_natural_label(namespace, name) && readable.len() <= MAX_LABEL {
        return readable;
    }
    let room = MAX_LABEL - 3 - HASH_DIGITS - (port.to_string().len() + 2);
    format!("{port}--{}", hashed_label(namespace, name, room))
}

/// The port a port host label starts with (`<port>--…`), before checking whose it is.
pub fn port_in_label(label: &str) -> Option<u16> {
    let (digits, rest) = label.split_once("--")?;
    if digits.starts_with('0') || !rest.contains("--") {
        return None;
    }
    digits.parse().ok().filter(|port| *port > 0)
}

/// The host of notebook `namespace/name` under `domain`.
pub fn notebook_host(namespace: &str, name: &str, domain: &str) -> String {
    format!("{}.{domain}", notebook_host_label(namespace, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_plain_name_reads_as_name_and_namespace() {
        assert_eq!(notebook_host_label("alice", "lab"), "lab--alice");
        assert_eq!(
            notebook_host("team-a", "my-lab", "nb.example.com"),
            "my-lab--team-a.nb.example.com"
        );
    }

    #[test]
    fn names_that_cannot_form_a_label_get_a_stable_distinct_one() {
        let long = "n".repeat(60);
        let awkward = [
            ("alice", long.as_str()),
            ("a", "b--c"),
            ("a--b", "c"),
            ("alice", "Lab.v2"),
            ("alice", "---"),
            ("alice", "xn"),
            ("alice", "xn--abc"),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (ns, name) in awkward {
            let label = notebook_host_label(ns, name);
            assert!(is_dns_label(&label), "{label:?} for {ns}/{name}");
            assert!(label.contains("---"), "{label:?} is hashed");
            assert!(
                !label.starts_with("xn--"),
                "{label:?} would read as punycode"
            );
            assert_eq!(label, notebook_host_label(ns, name), "stable");
            assert!(seen.insert(label), "distinct");
        }
        // `b--c` in `a` and `b` in `c--a`... would both read `b--c--a`: hashing keeps them apart.
        assert_ne!(
            notebook_host_label("a", "b--c"),
            notebook_host_label("c--a", "b")
        );
    }

    #[test]
    fn a_label_is_recognised_as_its_notebooks_only() {
        for (ns, name) in [
            ("alice", "lab"),
            ("a", "b--c"),
            ("alice", "x".repeat(70).as_str()),
        ] {
            let label = notebook_host_label(ns, name);
            assert!(is_label_of(&label, ns, name), "{label}");
            assert!(!is_label_of(&label, ns, "other"), "{label}");
            assert!(!is_label_of(&label, "other", name), "{label}");
        }
        assert!(
            !is_label_of("b--c--a", "a", "b--c"),
            "the readable form of a hashed name"
        );
        assert!(!is_label_of("lab--alice", "lice", "lab--a"));
    }

    #[test]
    fn a_ports_label_names_its_port_and_is_no_notebooks() {
        assert_eq!(port_host_label("alice", "lab", 8050), "8050--lab--alice");
        assert_eq!(port_in_label("8050--lab--alice"), Some(8050));
        // A notebook named 8050 in namespace lab has the readable label `8050--lab`.
        assert_eq!(notebook_host_label("lab", "8050"), "8050--lab");
        assert_eq!(port_in_label("8050--lab"), None);
        for label in [
            "08050--lab--alice",
            "0--lab--alice",
            "99999--lab--alice",
            "x--a--b",
        ] {
            assert_eq!(port_in_label(label), None, "{label}");
        }
        let long = "n".repeat(58);
        for (ns, name) in [("alice", long.as_str()), ("a", "b--c"), ("alice", "Lab.v2")] {
            let label = port_host_label(ns, name, 65535);
            assert!(is_dns_label(&label), "{label:?}");
            assert_eq!(port_in_label(&label), Some(65535), "{label:?}");
            assert!(label.contains("---"), "{label:?}");
            assert_ne!(label, port_host_label(ns, name, 8080));
            // No notebook's own label.
            assert!(!is_label_of(&label, ns, name));
        }
    }

    #[test]
    fn dns_labels_are_short_lowercase_and_dash_free_at_the_ends() {
        let longest = "a".repeat(MAX_LABEL);
        for good in ["a", "0", "a-b", "a--b", "0lab", longest.as_str()] {
            assert!(is_dns_label(good), "{good:?}");
        }
        let too_long = "a".repeat(MAX_LABEL + 1);
        for bad in [
            "",
            "-a",
            "a-",
            "-",
            "Lab",
            "a_b",
            "a.b",
            "é",
            too_long.as_str(),
        ] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
    }

    #[test]
    fn natural_labels_never_hold_three_dashes() {
        for (ns, name) in [("a-b", "c-d"), ("x", "y"), ("team-1", "nb-2")] {
            let label = notebook_host_label(ns, name);
            assert!(is_dns_label(&label));
            assert!(!label.contains("---"), "{label}");
        }
    }
}
