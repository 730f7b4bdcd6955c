//! Kubernetes name rules (apimachinery `validation.IsDNS1123Subdomain` and friends), with the
//! server's own error wording so failures read like a real cluster's.

pub(crate) const DNS1123_SUBDOMAIN_ERROR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
pub(crate) const DNS1123_LABEL_ERROR: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
pub(crate) const DNS1035_LABEL_ERROR: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
pub(crate) const LABEL_VALUE_ERROR: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

fn lower_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub(crate) fn is_dns1123_label(text: &str) -> bool {
    text.len() <= 63
        && text.starts_with(lower_alnum)
        && text.ends_with(lower_alnum)
        && text.chars().all(|c| lower_alnum(c) || c == '-')
}

/// Dot-separated DNS-1123 labels, at most 253 characters.
pub(crate) fn is_dns1123_subdomain(text: &str) -> bool {
    text.len() <= 253 && text.split('.').all(is_dns1123_label)
}

/// `[a-z]([-a-z0-9]*[a-z0-9])?`, at most 63 characters (Service names).
pub(crate) fn is_dns1035_label(text: &str) -> bool {
    is_dns1123_label(text) && text.starts_with(|c: char| c.is_ascii_lowercase())
}

fn alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// `(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?`, at most 63 characters.
pub(crate) fn is_label_value(text: &str) -> bool {
    text.is_empty()
        || (text.len() <= 63
            && text.starts_with(alnum)
            && text.ends_with(alnum)
            && text
                .chars()
                .all(|c| alnum(c) || matches!(c, '-' | '_' | '.')))
}

/// A qualified name (label and annotation keys, finalizers): `[prefix/]name`, where the prefix is a
/// DNS subdomain and the name a label value that is not empty.
pub(crate) fn check_qualified_name(text: &str) -> Result<(), String> {
    let (prefix, name) = match text.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, text),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err("prefix part must be non-empty".to_string());
        }
        if !is_dns1123_subdomain(prefix) {
            return Err(format!("prefix part {DNS1123_SUBDOMAIN_ERROR}"));
        }
    }
    if name.is_empty() {
        return Err("name part must be non-empty".to_string());
    }
    if name.contains('/') || !is_label_value(name) {
        return Err("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".to_string());
    }
    Ok(())
}

/// An IANA service name (named ports): at most 15 lower-case alphanumerics or '-', with a letter,
/// no leading/trailing or double '-'.
pub(crate) fn is_iana_svc_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 15
        && text.chars().all(|c| lower_alnum(c) || c == '-')
        && text.chars().any(|c| c.is_ascii_lowercase())
        && !text.starts_with('-')
        && !text.ends_with('-')
        && !text.contains("--")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        assert!(is_dns1123_subdomain("web.example-1.com"));
        assert!(!is_dns1123_subdomain("Web"));
        assert!(!is_dns1123_subdomain("web-"));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(is_dns1123_label("1web"));
        assert!(!is_dns1123_label("a.b"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1035_label("web"));
        assert!(!is_dns1035_label("1web"));
    }

    #[test]
    fn labels_and_qualified_names() {
        assert!(is_label_value(""));
        assert!(is_label_value("My_value.1"));
        assert!(!is_label_value("-x"));
        assert!(!is_label_value("a b"));
        assert!(check_qualified_name("app").is_ok());
        assert!(check_qualified_name("notebooks.kubeflow.org/last-activity").is_ok());
        assert!(check_qualified_name("Example.com/x").is_err());
        assert!(check_qualified_name("/x").is_err());
        assert!(check_qualified_name("a/b/c").is_err());
        assert!(is_iana_svc_name("notebook-port"));
        assert!(!is_iana_svc_name("notebook-port-too-long"));
        assert!(!is_iana_svc_name("8888"));
    }
}
