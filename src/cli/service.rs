//! Installing `labforge up` as this machine's systemd service.

use super::up::UpArgs;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// Write a systemd unit that runs `labforge up` with these arguments (restarted on failure;
    /// stopping it leaves notebooks running), then say how to start it.
    Install(ServiceInstallArgs),
}

#[derive(Debug, Args)]
pub struct ServiceInstallArgs {
    /// Where the unit file is written.
    #[arg(long, default_value = "/etc/systemd/system")]
    pub unit_dir: PathBuf,
    /// The unit's name (`<name>.service`).
    #[arg(long, default_value = "labforge", value_parser = unit_name)]
    pub name: String,
    /// Also back up on a schedule to this destination (a directory or s3://bucket/prefix):
    /// writes `<name>-backup.service` and `<name>-backup.timer`.
    #[arg(long, value_name = "DEST")]
    pub backup_to: Option<String>,
    /// Snapshots the scheduled backups keep.
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u64).range(1..))]
    pub backup_keep: u64,
    /// When scheduled backups run: systemd's OnCalendar= (`daily`, `*-*-* 03:00`).
    #[arg(long, default_value = "daily", value_parser = calendar)]
    pub backup_on: String,
    /// Where the scheduled backups read S3 credentials from (AWS_ACCESS_KEY_ID=…).
    #[arg(long, default_value = "/etc/labforge/backup.env")]
    pub backup_environment_file: PathBuf,
    #[command(flatten)]
    pub up: UpArgs,
}

/// `--backup-on`: one line of systemd calendar text.
pub(crate) fn calendar(value: &str) -> Result<String, String> {
    if value.trim().is_empty() || value.chars().any(char::is_control) {
        Err("a systemd calendar expression on one line, e.g. daily or \"*-*-* 03:00\"".into())
    } else {
        Ok(value.trim().to_owned())
    }
}

/// `--name`: what systemd accepts as a unit name, without its suffix.
pub(crate) fn unit_name(value: &str) -> Result<String, String> {
    let ok = !value.is_empty()
        && value.len() <= 200
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b));
    if ok {
        Ok(value.to_owned())
    } else {
        Err("letters, digits and -_.@ only".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

    #[test]
    fn a_service_runs_up_with_the_arguments_it_was_installed_with() {
        let install = |args: &[&str]| {
            let argv = [&["labforge", "service", "install"][..], args].concat();
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Service(ServiceCommand::Install(install)) => install,
                other => panic!("{other:?}"),
            }
        };
        let up = |args: &[String]| {
            let argv = ["labforge".to_owned(), "up".to_owned()]
                .into_iter()
                .chain(args.iter().cloned());
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Up(up) => up,
                other => panic!("{other:?}"),
            }
        };
        let every = [
            "--data-dir",
            "/srv/lab",
            "--listen",
            "0.0.0.0:8443",
            "--engine",
            "docker",
            "--registry",
            "registry.lab:5000",
            "--registry-listen",
            "127.0.0.1:5001",
            "--registry-program",
            "/opt/registry",
            "--insecure-registry",
            "a:5000",
            "--insecure-registry",
            "b:5000",
            "--agent",
            "/opt/agent",
            "--spawner-config",
            "/etc/spawner.json",
            "--notebook-domain",
            "lab.example.com",
            "--notebook-paths",
            "--metrics-listen",
            "127.0.0.1:9464",
        ];
        for tls in [
            &[
                "--tls-cert",
                "/etc/lab/cert.pem",
                "--tls-key",
                "/etc/lab/key.pem",
            ][..],
            &["--tls-self-signed"][..],
        ] {
            let installed = install(&[&every[..], tls].concat());
            let run = up(&installed.up.service_args().unwrap());
            assert_eq!(format!("{run:?}"), format!("{:?}", installed.up));
        }

        // A service starts in `/`: relative paths are made absolute.
        let relative = install(&["--data-dir", "lab-data", "--agent", "bin/agent"]);
        let args = relative.up.service_args().unwrap();
        let cwd = std::env::current_dir().unwrap();
        for (flag, path) in [("--data-dir", "lab-data"), ("--agent", "bin/agent")] {
            let at = args.iter().position(|a| a == flag).unwrap();
            assert_eq!(args[at + 1], cwd.join(path).display().to_string());
        }
        assert!(
            Cli::try_parse_from(["labforge", "service", "install", "--name", "lab/../x"]).is_err()
        );
    }
}
