//! Log events as a person at a terminal reads them: `warning: the message: the error`, with no
//! time, level column or module path (those are for logs, which `--log` asks for).

use std::fmt::Write as _;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The event format of [`crate::Logging::ForPeople`].
pub struct Lines;

/// An event's message and its fields, as text.
#[derive(Default)]
struct Said {
    message: String,
    /// `error` fields: what went wrong, said after the message.
    causes: Vec<String>,
    /// Other fields, said in brackets.
    details: Vec<String>,
}

impl Visit for Said {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record(field, format!("{value:?}"));
    }
}

impl Said {
    fn record(&mut self, field: &Field, value: String) {
        match field.name() {
            "message" => self.message = value,
            "error" | "err" | "source" | "cause" => self.causes.push(value),
            name => self.details.push(format!("{name} {value}")),
        }
    }

    fn line(&self) -> String {
        let mut line = self.message.clone();
        for cause in &self.causes {
            let _ = write!(line, ": {cause}");
        }
        if !self.details.is_empty() {
            let _ = write!(line, " ({})", self.details.join(", "));
        }
        line
    }
}

/// The word a line starts with for an event of `level`.
fn word(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "note",
        _ => "debug",
    }
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut said = Said::default();
        event.record(&mut said);
        writeln!(
            writer,
            "{}: {}",
            word(*event.metadata().level()),
            said.line()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// What `Lines` writes for the events `log` emits.
    fn lines(log: impl FnOnce()) -> String {
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || Sink(sink.clone()))
            .event_format(Lines)
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let bytes = out.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_warning_reads_as_a_sentence_with_its_cause_and_no_time_or_module() {
        let text = lines(|| {
            let error = "connection refused";
            tracing::warn!(error = %error, "cache unavailable, saving without it");
            tracing::error!(notebook = "alice/lab", "the save failed");
        });
        assert_eq!(
            text,
            "warning: cache unavailable, saving without it: connection refused\n\
             error: the save failed (notebook alice/lab)\n"
        );
    }
}
