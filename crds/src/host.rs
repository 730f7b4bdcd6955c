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
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let hash = hex::encode(digest);
    let room = MAX_LABEL - 3 - HASH_DIGITS;
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
    fn natural_labels_never_hold_three_dashes() {
        for (ns, name) in [("a-b", "c-d"), ("x", "y"), ("team-1", "nb-2")] {
            let label = notebook_host_label(ns, name);
            assert!(is_dns_label(&label));
            assert!(!label.contains("---"), "{label}");
        }
    }
}
