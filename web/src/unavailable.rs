//! A platform that did not answer (the Kubernetes API, the container engine, the store's
//! files), kept with its cause: the API answers with the whole message, and logs and
//! `error_chain` can still walk to the error the platform gave.

/// What could not be done, and the platform's error when there is one.
#[derive(Debug, thiserror::Error)]
#[error("{what}{}", cause_text(.source))]
pub struct Unavailable {
    what: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Unavailable {
    /// `what` failed because of `source`.
    pub fn new(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            what: what.into(),
            source: Some(source.into()),
        }
    }

    /// `what` failed, and that says all there is.
    pub fn said(what: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            source: None,
        }
    }
}

fn cause_text(source: &Option<Box<dyn std::error::Error + Send + Sync>>) -> String {
    source
        .as_ref()
        .map(|source| format!(": {source}"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn the_message_names_the_cause_and_keeps_it_as_the_source() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let unavailable = Unavailable::new("the Kubernetes API", refused);
        assert_eq!(unavailable.to_string(), "the Kubernetes API: refused");
        let source = unavailable.source().expect("the cause is kept");
        assert_eq!(
            source
                .downcast_ref::<std::io::Error>()
                .map(std::io::Error::kind),
            Some(std::io::ErrorKind::ConnectionRefused)
        );
        assert_eq!(
            labforge_messages::error_chain(&unavailable),
            "the Kubernetes API: refused"
        );
        let said = Unavailable::said("exec gave no stdin or stdout");
        assert_eq!(said.to_string(), "exec gave no stdin or stdout");
        assert!(said.source().is_none());
    }
}
