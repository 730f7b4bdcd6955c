//! The command line of labforge's binaries: clap structs that only parse and their conversion
//! into each library's typed options ([`cli`]), what each command does with them ([`commands`]),
//! and the process setup every binary shares (logging, the rustls crypto provider, the runtime).
//! The work lives in the crates.
//!
//! Two binaries are built from it: `labforge`, every subcommand, and `labforge-proxy`, the
//! proxy alone. The proxy's Deployment runs the second one: it carries none of the builder,
//! controller, web app or S3 code, so less of its own file is resident under load.

pub mod cli;
pub mod commands;
mod for_people;
pub mod service;

use std::future::Future;
use std::process::ExitCode;

/// How the process reports what it logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Logging {
    /// For a person at a terminal: warnings and errors only, as `warning: …` and `error: …`
    /// lines, with no time or module path.
    ForPeople,
    /// Log lines (time, level, target, fields) of what the EnvFilter keeps, for services and for
    /// whoever asks with `--log` or `LABFORGE_LOG`.
    Log(String),
}

/// Sets up logging and the crypto provider, runs `work` on a runtime (its blocking pool's idle
/// threads kept for `blocking_keep_alive`, else tokio's default), and turns its error into a
/// message naming `program` and a failing exit code ([`cli::EXIT_USAGE`] for a
/// [`cli::UsageError`]).
pub fn run_main<W>(
    program: &str,
    logging: &Logging,
    blocking_keep_alive: Option<std::time::Duration>,
    work: impl FnOnce() -> W,
) -> ExitCode
where
    W: Future<Output = anyhow::Result<ExitCode>>,
{
    match logging {
        Logging::ForPeople => tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
            .with_writer(std::io::stderr)
            .event_format(for_people::Lines)
            .init(),
        Logging::Log(filter) => tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_new(filter)
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
            )
            .with_writer(std::io::stderr)
            // Colours for a terminal only: a log file or a pod's log gets plain text.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    // One rustls crypto provider for the whole binary: ring (kube, oci-client's reqwest and the
    // S3 client all use the process default). Installing twice is harmless, so the error is moot.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(keep_alive) = blocking_keep_alive {
        builder.thread_keep_alive(keep_alive);
    }
    let runtime = match builder.build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("{program}: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work()) {
        Ok(code) => code,
        Err(err) => {
            let message = labforge_messages::error_chain(err.as_ref());
            eprintln!("{program}: error: {message}");
            if err.is::<cli::UsageError>() {
                ExitCode::from(cli::EXIT_USAGE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
