//! How a failure reads wherever a person sees it (the CLI, the web app, events, an ImageBuild's
//! status, logs): one line, `what failed; caused by: why; caused by: ...`.
//!
//! Every component formats errors through [`error_chain`], so that a message never depends on
//! which layer happened to print it and never falls back to a `Debug` dump; the web app and the
//! proxy answer JSON clients with [`kubeflow_failure`] in their errors.

/// An error and its causes as one line, each cause once (a message that already quotes its cause
/// does not repeat it); line breaks inside a cause become spaces.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = one_line(&err.to_string());
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = one_line(&cause.to_string());
        if !text.contains(&cause_text) {
            text.push_str("; caused by: ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Kubeflow's failure envelope, which clients written for its web apps read beside the rest of
/// an error answer: `success: false`, the HTTP status, and the message as `log`.
pub fn kubeflow_failure(status: u16, message: &str) -> serde_json::Map<String, serde_json::Value> {
    let mut fields = serde_json::Map::new();
    fields.insert("success".into(), false.into());
    fields.insert("status".into(), status.into());
    fields.insert("log".into(), message.into());
    fields
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[derive(Debug, thiserror::Error)]
    #[error("saving failed")]
    struct Saving(#[source] Uploading);

    #[derive(Debug, thiserror::Error)]
    #[error("upload failed: connection refused")]
    struct Uploading(#[source] io::Error);

    #[test]
    fn each_cause_is_told_once_on_one_line() {
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused");
        assert_eq!(
            error_chain(&Saving(Uploading(refused))),
            "saving failed; caused by: upload failed: connection refused"
        );
        let multi = io::Error::other("line one\n  line two");
        assert_eq!(error_chain(&multi), "line one line two");
    }

    #[test]
    fn kubeflows_failure_envelope_says_it_failed_with_the_status_and_message() {
        let fields = kubeflow_failure(403, "admins only");
        assert_eq!(
            serde_json::Value::Object(fields),
            serde_json::json!({"success": false, "status": 403, "log": "admins only"})
        );
    }
}
