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
