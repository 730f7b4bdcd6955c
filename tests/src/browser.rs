//! Driving Debian Chromium through Playwright (npm `playwright-core`, installed by setup).

use crate::tools::{SETUP_HINT, SupportError, locate, run};
use std::path::Path;
use std::process::Command;

/// Runs one of the scripts in `tests/browser/` with node and returns its stdout.
pub fn run_script(script: &str, args: &[&str]) -> Result<String, SupportError> {
    let dir = crate::repo_root().join("tests/browser");
    if !dir.join("node_modules/playwright-core").is_dir() {
        return Err(SupportError::MissingFile {
            what: "npm playwright-core",
            path: dir.join("node_modules/playwright-core"),
            hint: SETUP_HINT,
        });
    }
    if !Path::new("/usr/bin/chromium").exists() {
        return Err(SupportError::MissingTool {
            tool: "chromium".into(),
        });
    }
    run(Command::new(locate("node")?)
        .current_dir(&dir)
        .arg(script)
        .args(args))
}

/// Runs `script` with `config` as its one argument (a JSON file in `dir`) and returns the JSON it
/// printed last: what the page showed, for the test to assert on.
pub fn run_with_config(
    script: &str,
    dir: &Path,
    config: &serde_json::Value,
) -> Result<serde_json::Value, SupportError> {
    let file = dir.join(format!("{script}.json"));
    std::fs::write(&file, config.to_string()).map_err(|source| SupportError::Io {
        doing: format!("writing {}", file.display()),
        source,
    })?;
    let output = run_script(script, &[&file.to_string_lossy()])?;
    let last = output.lines().last().unwrap_or_default();
    serde_json::from_str(last).map_err(|e| SupportError::Command {
        command: format!("node {script}"),
        detail: format!("its last line is not JSON ({e}): {last}"),
    })
}
