//! The statically linked `labforge-agent`, built the way `make agent` builds it, for suites that
//! mount it into containers.

use crate::tools::SupportError;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Builds (or finds up to date) the agent in this test run's target dir and returns its path.
pub fn agent_binary() -> Result<PathBuf, SupportError> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(build)
        .clone()
        .map_err(|detail| SupportError::Start {
            service: "labforge-agent build",
            detail,
        })
}

fn build() -> Result<PathBuf, String> {
    // Build into the target dir this program was built in (a test binary's, or the drills'):
    // the nearest directory above it that Cargo marked as its own.
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let target = exe
        .ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .ok_or("cannot find the Cargo target dir above this program")?
        .to_owned();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(crate::repo_root())
        .env("CARGO_TARGET_DIR", &target)
        .args([
            "rustc",
            "-q",
            "-p",
            "labforge-agent",
            "--profile",
            "agent",
            "--bin",
            "labforge-agent",
            "--",
            "-C",
            "target-feature=+crt-static",
        ])
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Ok(target.join("agent/labforge-agent"))
}
