//! The one `labforge` binary. It only parses arguments, turns them into each library's typed
//! options and calls one library function per subcommand; the work lives in the crates.

mod cli;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    // One rustls crypto provider for the whole binary: ring (kube, oci-client's reqwest and the
    // S3 client all use the process default). Installing twice is harmless, so the error is moot.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("labforge: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("labforge: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
