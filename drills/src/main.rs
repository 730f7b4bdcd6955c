//! Reliability drills: `labforge up` under load, faults and hostile input, each drill on its own
//! instance (spare ports, its own data dir), traffic to loopback only. Prints one table row per
//! drill: what was done, what was expected, the figures, PASS or FAIL; exits non-zero on a FAIL.
//! Not part of `make test`: `make drills` runs them all, `labforge-drills <drill>` one.

mod class;
mod disk;
mod engine;
mod fuzz;
mod hostile;
mod kill;
mod lab;
mod schema;
mod soak;
mod upstream;

use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
#[command(about = "Reliability drills against labforge up")]
struct Args {
    /// The labforge binary to drill; default: `labforge` beside this program.
    #[arg(long)]
    labforge: Option<PathBuf>,
    /// Users in the class-at-9:00 drill.
    #[arg(long, default_value_t = 30)]
    class_size: usize,
    /// Websockets in the soak.
    #[arg(long, default_value_t = 100)]
    soak_sockets: usize,
    /// How long the soak runs, in seconds.
    #[arg(long, default_value_t = 600)]
    soak_seconds: u64,
    /// How long each fuzz target runs, in seconds.
    #[arg(long, default_value_t = 60)]
    fuzz_seconds: u64,
    /// Drills to run (class, kill, engine, upstream, soak, disk, hostile, schema, fuzz); default: all.
    drills: Vec<String>,
}

/// One line of the results table.
pub struct Row {
    pub drill: String,
    pub done: String,
    pub expected: String,
    pub figures: String,
    pub pass: bool,
}

impl Row {
    /// A row from a check's outcome: its figures, or why it failed.
    pub fn of(drill: &str, done: &str, expected: &str, outcome: anyhow::Result<String>) -> Row {
        let (figures, pass) = match outcome {
            Ok(figures) => (figures, true),
            Err(error) => (format!("{error:#}"), false),
        };
        Row {
            drill: drill.to_owned(),
            done: done.to_owned(),
            expected: expected.to_owned(),
            figures,
            pass,
        }
    }

    fn print(&self) {
        let cell = |text: &str| text.replace('|', "\\|").replace('\n', " ");
        println!(
            "| {} | {} | {} | {} | {} |",
            cell(&self.drill),
            cell(&self.done),
            cell(&self.expected),
            cell(&self.figures),
            if self.pass { "PASS" } else { "FAIL" }
        );
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    let args = Args::parse();
    // One rustls provider for the HTTP clients here, as in the product.
    labforge_tests::init_crypto();
    let labforge = match args.labforge {
        Some(path) => path,
        None => std::env::current_exe()?
            .parent()
            .map(|dir| dir.join("labforge"))
            .ok_or_else(|| anyhow::anyhow!("no directory around this program"))?,
    };
    anyhow::ensure!(
        labforge.is_file(),
        "{} is missing: build it (cargo build --bin labforge) or pass --labforge",
        labforge.display()
    );
    let all = [
        "class", "kill", "engine", "upstream", "soak", "disk", "hostile", "schema", "fuzz",
    ];
    let chosen: Vec<String> = if args.drills.is_empty() {
        all.iter().map(|d| d.to_string()).collect()
    } else {
        args.drills
    };
    if let Some(unknown) = chosen.iter().find(|d| !all.contains(&d.as_str())) {
        anyhow::bail!("no drill {unknown:?}; the drills are {}", all.join(", "));
    }
    println!("| drill | done | expected | figures | result |");
    println!("|---|---|---|---|---|");
    let mut failed = false;
    for drill in chosen {
        let rows = match drill.as_str() {
            "class" => class::run(&labforge, args.class_size).await,
            "kill" => kill::run(&labforge).await,
            "engine" => engine::run(&labforge).await,
            "upstream" => upstream::run(&labforge).await,
            "disk" => disk::run(&labforge).await,
            "schema" => schema::run(&labforge).await,
            "fuzz" => fuzz::run(std::time::Duration::from_secs(args.fuzz_seconds)).await,
            "soak" => {
                let duration = std::time::Duration::from_secs(args.soak_seconds);
                soak::run(&labforge, args.soak_sockets, duration).await
            }
            _ => hostile::run(&labforge).await,
        };
        for row in rows {
            failed |= !row.pass;
            row.print();
        }
    }
    Ok(if failed {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    })
}
