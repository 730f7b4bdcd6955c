//! `labforge`: every subcommand. It only parses arguments and hands them to [`labforge_cli`].

use clap::Parser;
use labforge_cli::cli::Cli;
use labforge_cli::commands::run;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logging = cli.logging();
    let keep_alive = cli
        .blocking_thread_keep_alive_ms
        .map(std::time::Duration::from_millis);
    labforge_cli::run_main("labforge", &logging, keep_alive, || run(cli))
}
