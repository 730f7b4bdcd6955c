//! The API against its own document: schemathesis (PyPI) reads `/api/openapi.json` and sends
//! generated requests, valid and not, as a signed-in user and as an admin. No answer may be a 5xx,
//! and every answer must be one the document lists, with the content type and body it says.

use crate::Row;
use crate::lab::{Lab, Session};
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

const DRILL: &str = "hostile input";
/// The schemathesis release this drill was written against; its checks' names are part of the
/// command line below.
const SCHEMATHESIS: &str = "schemathesis==4.32.5";
/// Generated requests per operation and phase.
const EXAMPLES: u32 = 40;
/// The checks: no 5xx, and status, content type, headers and body as documented.
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
response_headers_conformance,response_schema_conformance";

pub async fn run(labforge: &Path) -> Vec<Row> {
    let namespace = format!("schema-{:x}", std::process::id());
    let checked = |role: &str, outcome| {
        Row::of(
            DRILL,
            &format!(
                "schemathesis against /api/openapi.json as {role}, {EXAMPLES} cases per operation and phase"
            ),
            "no 5xx; every status, content type, header and body as documented",
            outcome,
        )
    };
    let schemathesis = match tool().await {
        Ok(path) => path,
        Err(error) => return vec![checked("anyone", Err(error))],
    };
    let lab = match Lab::start(labforge, std::slice::from_ref(&namespace), &[]).await {
        Ok(lab) => lab,
        Err(error) => return vec![checked("anyone", Err(error))],
    };
    let user = lab.user(&namespace).await;
    let admin = match &lab.up.admin_password {
        Some(password) => Session::sign_in(&lab.up.url, "admin", password).await,
        None => Err(anyhow::anyhow!("labforge up printed no admin password")),
    };
    let mut rows = Vec::new();
    for (role, session) in [("a user", user), ("an admin", admin)] {
        let outcome = match session {
            Ok(session) => check(&schemathesis, &lab, &session, &namespace, role).await,
            Err(error) => Err(error),
        };
        rows.push(checked(role, outcome));
    }
    rows
}

/// schemathesis in a virtualenv under the target directory (this drill's own tool), installed
/// when missing.
async fn tool() -> anyhow::Result<PathBuf> {
    let venv = labforge_tests::repo_root().join("target/drills/schemathesis");
    let program = venv.join("bin/schemathesis");
    let version = || {
        Command::new(&program)
            .arg("--version")
            .output()
            .is_ok_and(|o| {
                let wanted = SCHEMATHESIS.trim_start_matches("schemathesis==");
                o.status.success() && String::from_utf8_lossy(&o.stdout).contains(wanted)
            })
    };
    if version() {
        return Ok(program);
    }
    let venv_made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .context("python3 -m venv")?;
    anyhow::ensure!(
        venv_made.success(),
        "python3 -m venv {} failed",
        venv.display()
    );
    let installed = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", SCHEMATHESIS])
        .status()
        .context("pip install schemathesis")?;
    anyhow::ensure!(installed.success(), "pip could not install {SCHEMATHESIS}");
    anyhow::ensure!(version(), "{} does not run", program.display());
    Ok(program)
}

/// One schemathesis run as `session`, with every `{ns}` the session's namespace so that what it
/// creates is removed with the lab; the figures from its summary.
async fn check(
    schemathesis: &Path,
    lab: &Lab,
    session: &Session,
    namespace: &str,
    role: &str,
) -> anyhow::Result<String> {
    let scratch = tempfile::tempdir()?;
    let config = scratch.path().join("schemathesis.toml");
    std::fs::write(
        &config,
        format!(
            // A followed log streams for as long as the notebook runs: never an answer to check.
            "[parameters]\n\"path.ns\" = \"{namespace}\"\n\"query.follow\" = false\n\n\
             [headers]\nCookie = \"{}\"\n",
            session.cookie
        ),
    )?;
    let mut command = tokio::process::Command::new(schemathesis);
    command
        .arg("--config-file")
        .arg(&config)
        .arg("run")
        .arg(format!("{}/api/openapi.json", lab.up.url))
        .args(["--checks", CHECKS])
        .args(["--max-examples", &EXAMPLES.to_string()])
        .args(["--workers", "2", "--seed", "1", "--request-timeout", "30"])
        // Signing out would end the session the rest of the run signs in with; the watch is an
        // event stream that does not end.
        .args(["--exclude-path", "/api/logout"])
        .args(["--exclude-path", "/api/namespaces/{ns}/watch"])
        .env("NO_COLOR", "1")
        .current_dir(scratch.path());
    let output = command.output().await.context("run schemathesis")?;
    let printed = String::from_utf8_lossy(&output.stdout);
    let mut summary = summary(&printed);
    let failures = listed(&printed, "Failures:");
    let errors = listed(&printed, "Errors:");
    // schemathesis's own faults (an internal exception) say nothing about labforge: shown, and
    // not held against it. Every other error (a connection reset or timed out) is.
    let (own, others): (Vec<&str>, Vec<&str>) = errors
        .into_iter()
        .partition(|error| error.contains("Runtime Error"));
    if !own.is_empty() {
        summary.push_str(&format!("; schemathesis's own faults: {}", own.join(", ")));
    }
    let held = !failures.is_empty() || !others.is_empty();
    if held || (!output.status.success() && own.is_empty()) {
        let kept = keep_report(
            &format!("{printed}\n\nlabforge's log:\n{}", lab.up.log()),
            role,
        )?;
        bail!("{summary}; its report: {}", kept.display());
    }
    Ok(summary)
}

/// The figures of a schemathesis run: operations tested and test cases, from its report.
fn summary(printed: &str) -> String {
    let lines: Vec<&str> = printed.lines().map(str::trim).collect();
    let after = |heading: &str| {
        lines
            .iter()
            .position(|line| line.starts_with(heading))
            .and_then(|at| lines.get(at + 1))
            .copied()
    };
    let operations = lines
        .iter()
        .find_map(|line| line.strip_prefix("Operations:"))
        .map(str::trim);
    match (operations, after("Test cases:")) {
        (Some(operations), Some(cases)) => format!("operations {operations}; test cases {cases}"),
        _ => lines
            .iter()
            .rev()
            .find(|line| !line.is_empty())
            .unwrap_or(&"no output")
            .to_string(),
    }
}

/// The lines of the summary's section `heading` ("Failures:", "Errors:"), trimmed.
fn listed<'a>(printed: &'a str, heading: &str) -> Vec<&'a str> {
    printed
        .lines()
        .skip_while(|line| line.trim() != heading)
        .skip(1)
        .map(str::trim)
        .take_while(|line| !line.is_empty())
        .collect()
}

/// Keeps schemathesis's output and labforge's log for reading after the drill (under the target
/// directory).
fn keep_report(printed: &str, role: &str) -> anyhow::Result<PathBuf> {
    let dir = labforge_tests::repo_root().join("target/drills");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("schemathesis-{}.txt", role.replace(' ', "-")));
    std::fs::write(&path, printed)?;
    Ok(path)
}
