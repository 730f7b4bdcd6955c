//! `labforge-agent`: the part of "save environment" that runs inside the notebook's container.
//!
//! It is mounted read-only (an init container's emptyDir in Kubernetes, a bind mount with podman)
//! and started through exec. It holds no credentials and opens no connection: it reads the image's
//! baseline index on stdin, scans the root against it and writes the change set to stdout (see
//! `labforge_snapshot::protocol`). The builder outside does compression, caching and the push.
//! The same binary is the notebook's SSH server, one connection per exec over stdin and stdout.
//!
//! Usage:
//! - `labforge-agent scan --parent <digest> [--root /] [--ignore PATH]... [--verify-content]
//!   [--output FILE]`: `--output` writes the change set to FILE instead of stdout. With podman
//!   the builder hands the agent a pipe as descriptor 3 (`podman exec --preserve-fds`) and asks
//!   for `--output /proc/self/fd/3`: the layer then bypasses the exec session's stdout relay,
//!   which copies every byte through conmon and then podman.
//! - `labforge-agent ssh`: serves one SSH connection on stdin and stdout (`labforge_ssh::server`),
//!   as the container's user; the web app starts it for each `labforge ssh` and carries its bytes.
//! - `labforge-agent install <dir>`: copies itself into `<dir>` (a Kubernetes init container does
//!   this into an emptyDir the notebook container mounts read-only).

mod ports;

use labforge_snapshot::protocol::ChangeSetHeader;
use labforge_snapshot::{BaselineIndex, ScanOptions, scan, write_change_set};
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

struct Args {
    root: PathBuf,
    parent: String,
    ignore: Vec<PathBuf>,
    verify_content: bool,
    output: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some("scan".as_ref()) {
        return Err("usage: labforge-agent scan --parent <digest> [--root DIR] [--ignore PATH]... [--verify-content] [--output FILE]".into());
    }
    let mut parsed = Args {
        root: PathBuf::from("/"),
        parent: String::new(),
        ignore: Vec::new(),
        verify_content: false,
        output: None,
    };
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.to_str() {
            Some("--root") => parsed.root = value("--root")?.into(),
            Some("--parent") => {
                parsed.parent = value("--parent")?
                    .into_string()
                    .map_err(|_| "--parent is not UTF-8".to_string())?
            }
            Some("--ignore") => parsed.ignore.push(value("--ignore")?.into()),
            Some("--verify-content") => parsed.verify_content = true,
            Some("--output") => parsed.output = Some(value("--output")?.into()),
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    if parsed.parent.is_empty() {
        return Err("--parent <digest> is required".into());
    }
    Ok(parsed)
}

/// Copies this executable to `<dir>/labforge-agent`, executable by everyone.
fn install(dir: &std::ffi::OsStr) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let me = std::env::current_exe().map_err(|e| format!("finding myself: {e}"))?;
    let target = std::path::Path::new(dir).join("labforge-agent");
    std::fs::copy(&me, &target).map_err(|e| format!("copying to {}: {e}", target.display()))?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("making {} executable: {e}", target.display()))
}

/// Serves one SSH connection over stdin and stdout.
fn ssh() -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting: {e}"))?;
    runtime
        .block_on(labforge_ssh::server::serve(tokio::io::join(
            tokio::io::stdin(),
            tokio::io::stdout(),
        )))
        .map_err(|e| e.to_string())
}

fn run() -> Result<(), String> {
    let mut argv = std::env::args_os().skip(1);
    match argv.next().as_deref().and_then(|a| a.to_str()) {
        Some("install") => {
            return match (argv.next(), argv.next()) {
                (Some(dir), None) => install(&dir),
                _ => Err("usage: labforge-agent install <dir>".into()),
            };
        }
        Some("ssh") if argv.next().is_none() => return ssh(),
        Some("ports") if argv.next().is_none() => return ports::print_listening(),
        Some("connect") => {
            return match (argv.next(), argv.next()) {
                (Some(port), None) => ports::connect(&port.to_string_lossy()),
                _ => Err("usage: labforge-agent connect <port>".into()),
            };
        }
        _ => {}
    }
    let args = parse_args()?;
    let baseline: BaselineIndex =
        serde_json::from_reader(io::BufReader::new(io::stdin().lock()))
            .map_err(|err| format!("reading the baseline index from stdin: {err}"))?;
    let mut options = ScanOptions::container();
    options.ignore.extend(args.ignore);
    options.verify_content = args.verify_content;
    let changes = scan(&args.root, &baseline, &options, |_| {}).map_err(|e| e.to_string())?;
    drop(baseline);
    for path in &changes.unreadable {
        eprintln!(
            "labforge-agent: /{}: this user cannot list it; what the image has there is kept as it is",
            path.display()
        );
    }

    let (output, destination): (Box<dyn Write>, String) = match &args.output {
        None => (Box::new(io::stdout().lock()), "stdout".into()),
        Some(path) => (
            Box::new(
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(path)
                    .map_err(|err| format!("opening --output {}: {err}", path.display()))?,
            ),
            path.display().to_string(),
        ),
    };
    let mut out = BufWriter::with_capacity(1 << 20, output);
    ChangeSetHeader::new(&changes, &args.parent)
        .write_line(&mut out)
        .and_then(|()| out.flush())
        .map_err(|err| format!("writing to {destination}: {err}"))?;
    let (mut out, summary) =
        write_change_set(&args.root, &changes, out, |_, _| {}).map_err(|e| e.to_string())?;
    out.flush()
        .map_err(|err| format!("writing to {destination}: {err}"))?;
    for path in summary.changed_while_writing {
        eprintln!(
            "labforge-agent: {} changed while it was saved",
            path.display()
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("labforge-agent: {message}");
            ExitCode::FAILURE
        }
    }
}
