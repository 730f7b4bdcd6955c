//! Fuzzing, time-bounded, of what reads untrusted input: the agent's protocol, layer tars, request
//! paths, VirtualServices and quantities (`fuzz/`, cargo-fuzz on nightly). Each target starts from
//! its corpus in the repository; what it finds new goes to a scratch directory, so a run leaves
//! the repository as it was. A crash fails the row, its input kept under `fuzz/artifacts/`.

use crate::Row;
use anyhow::{Context, bail};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const DRILL: &str = "fuzzing";
const TARGETS: &[&str] = &[
    "agent_protocol",
    "layer_tar",
    "path_normalization",
    "virtual_service",
    "quantity",
];

pub async fn run(per_target: Duration) -> Vec<Row> {
    let fuzz_dir = labforge_tests::repo_root().join("fuzz");
    if let Err(error) = tools() {
        return vec![Row::of(
            DRILL,
            "install cargo-fuzz and nightly",
            "installed",
            Err(error),
        )];
    }
    TARGETS
        .iter()
        .map(|target| {
            Row::of(
                DRILL,
                &format!("{target} for {} s", per_target.as_secs()),
                "no crash, no failed assertion",
                fuzz(&fuzz_dir, target, per_target),
            )
        })
        .collect()
}

/// The nightly toolchain and cargo-fuzz, installed when missing (this drill's own tools).
fn tools() -> anyhow::Result<()> {
    let has = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has("cargo", &["+nightly", "--version"]) {
        let installed = Command::new("rustup")
            .args(["toolchain", "install", "nightly", "--profile", "minimal"])
            .status()?;
        anyhow::ensure!(installed.success(), "rustup could not install nightly");
    }
    if !has("cargo", &["fuzz", "--version"]) {
        let installed = Command::new("cargo")
            .args(["install", "cargo-fuzz", "--locked"])
            .status()?;
        anyhow::ensure!(installed.success(), "cargo install cargo-fuzz failed");
    }
    Ok(())
}

fn fuzz(fuzz_dir: &Path, target: &str, per_target: Duration) -> anyhow::Result<String> {
    let scratch = tempfile::tempdir()?;
    let corpus = fuzz_dir.join("corpus").join(target);
    let output = Command::new("cargo")
        .current_dir(fuzz_dir)
        .args(["+nightly", "fuzz", "run", target])
        .arg(scratch.path())
        .arg(&corpus)
        .arg("--")
        .arg(format!("-max_total_time={}", per_target.as_secs()))
        .arg("-rss_limit_mb=2048")
        .output()
        .context("running cargo fuzz")?;
    let log = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let cause = log
            .lines()
            .filter(|l| l.contains("panicked") || l.contains("ERROR") || l.contains("artifact"))
            .collect::<Vec<_>>()
            .join(" / ");
        bail!("{target} failed: {cause}");
    }
    let runs = log
        .lines()
        .rev()
        .find_map(|l| {
            l.strip_prefix("Done ")
                .and_then(|r| r.split_whitespace().next())
        })
        .unwrap_or("?");
    let found = std::fs::read_dir(scratch.path()).map_or(0, |d| d.count());
    Ok(format!(
        "{runs} inputs run, {found} new corpus entries, no crash"
    ))
}
