//! `labforge service install`: the systemd unit that runs `labforge up` as a machine's service,
//! so that a team's server comes back after a crash or a reboot.
//!
//! Notebooks are containers of their own (each with podman's `conmon` as its parent), so
//! stopping the service must stop labforge alone: `KillMode=process` leaves them running, and
//! the next start adopts them, as after Ctrl-C.

use std::fmt::Write as _;
use std::path::Path;

/// The unit file for `binary up <up_args>`, with `environment` (name, value) set for it.
pub fn unit_file(binary: &Path, up_args: &[String], environment: &[(String, String)]) -> String {
    let mut exec = exec_word(&binary.display().to_string());
    exec.push_str(" up");
    for arg in up_args {
        exec.push(' ');
        exec.push_str(&exec_word(arg));
    }
    let mut environment_lines = String::new();
    for (name, value) in environment {
        let _ = writeln!(
            environment_lines,
            "Environment={}",
            environment_word(&format!("{name}={value}"))
        );
    }
    let mut unit = String::new();
    let _ = write!(
        unit,
        "\
# Written by `labforge service install`; install again to change it.
[Unit]
Description=labforge: notebooks and dev environments on this machine
After=network-online.target
Wants=network-online.target

[Service]
Type=exec
ExecStart={exec}
Environment=LABFORGE_LOG=info
{environment_lines}Restart=on-failure
RestartSec=5
# Stops labforge alone: its notebooks keep running and the next start adopts them.
KillMode=process
KillSignal=SIGTERM
TimeoutStopSec=30

[Install]
WantedBy=multi-user.target
"
    );
    unit
}

/// When and where `labforge service install --backup-to` backs up.
pub struct BackupSchedule<'a> {
    pub dest: &'a str,
    pub keep: u64,
    /// systemd's `OnCalendar=` (`daily`, `*-*-* 03:00`).
    pub on_calendar: &'a str,
    /// The file S3 credentials are read from (`AWS_ACCESS_KEY_ID=…`), readable by root only.
    pub environment_file: &'a Path,
}

/// The oneshot unit that runs one `labforge backup`, and the timer that starts it:
/// (`.service`, `.timer`). Missed runs (the machine was off) run at the next boot.
pub fn backup_units(binary: &Path, data_dir: &Path, schedule: &BackupSchedule) -> (String, String) {
    let exec = [
        exec_word(&binary.display().to_string()),
        "backup".into(),
        exec_word(schedule.dest),
        "--keep".into(),
        schedule.keep.to_string(),
        "--data-dir".into(),
        exec_word(&data_dir.display().to_string()),
        "--quiet".into(),
    ]
    .join(" ");
    let service = format!(
        "\
# Written by `labforge service install --backup-to`; install again to change it.
[Unit]
Description=labforge: back up to {dest}

[Service]
Type=oneshot
ExecStart={exec}
Environment=LABFORGE_LOG=info
# S3 credentials, kept out of this world-readable file.
EnvironmentFile=-{environment_file}
# Backups yield to notebooks.
Nice=10
IOSchedulingClass=idle
",
        dest = schedule.dest.replace(['\n', '\r'], " "),
        environment_file = environment_word(&schedule.environment_file.display().to_string()),
    );
    let timer = format!(
        "\
# Written by `labforge service install --backup-to`; install again to change it.
[Unit]
Description=labforge: back up on schedule

[Timer]
OnCalendar={}
Persistent=true
RandomizedDelaySec=10min

[Install]
WantedBy=timers.target
",
        schedule.on_calendar
    );
    (service, timer)
}

/// One `ExecStart=` word, which systemd expands `$` variables in: `$` doubled, then as
/// [`quoted`] does.
fn exec_word(word: &str) -> String {
    quoted(&word.replace('$', "$$"))
}

/// One `Environment=` assignment, which systemd does not expand `$` in: a `$` doubled there
/// would reach the program as two.
fn environment_word(word: &str) -> String {
    quoted(word)
}

/// `word` as it is when systemd reads it so, else in double quotes with `"` and `\` escaped and
/// control characters as `\xNN` (a newline would start a line of its own); `%` (specifiers) is
/// doubled, so that every path and name arrives as written.
fn quoted(word: &str) -> String {
    let escaped = word.replace('%', "%%");
    let plain = !escaped.is_empty()
        && escaped.chars().all(|c| {
            !c.is_whitespace() && !c.is_control() && !matches!(c, '"' | '\'' | '\\' | ';')
        });
    if plain {
        return escaped;
    }
    let mut quoted = String::from("\"");
    for c in escaped.chars() {
        if matches!(c, '"' | '\\') {
            quoted.push('\\');
            quoted.push(c);
        } else if c.is_control() {
            let _ = write!(quoted, "\\x{:02x}", u32::from(c));
        } else {
            quoted.push(c);
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_systemd_would_split_or_expand_are_quoted_and_escaped() {
        assert_eq!(exec_word("/var/lib/labforge"), "/var/lib/labforge");
        assert_eq!(exec_word("/srv/lab data"), "\"/srv/lab data\"");
        assert_eq!(exec_word("50%$HOME"), "50%%$$HOME");
        assert_eq!(exec_word(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(exec_word(";"), "\";\"");
        assert_eq!(exec_word(""), "\"\"");
        assert_eq!(
            exec_word("a\nExecStartPre=/bin/evil"),
            "\"a\\x0aExecStartPre=/bin/evil\""
        );
    }

    #[test]
    fn the_unit_runs_up_restarts_on_failure_and_stops_labforge_alone() {
        let unit = unit_file(
            Path::new("/usr/local/bin/labforge"),
            &["--data-dir".into(), "/srv/lab data".into()],
            &[
                ("CULL_IDLE_TIME".into(), "60".into()),
                (
                    "EXTENSIONS_GALLERY".into(),
                    r#"{"url": "$HOST/100%"}"#.into(),
                ),
            ],
        );
        assert!(
            unit.contains("ExecStart=/usr/local/bin/labforge up --data-dir \"/srv/lab data\"\n"),
            "{unit}"
        );
        // Environment= does not expand `$`: it stays single, and `%` is doubled.
        for line in [
            "Environment=CULL_IDLE_TIME=60",
            r#"Environment="EXTENSIONS_GALLERY={\"url\": \"$HOST/100%%\"}""#,
            "Restart=on-failure",
            "KillMode=process",
            "WantedBy=multi-user.target",
        ] {
            assert!(unit.lines().any(|l| l == line), "{line} in {unit}");
        }
    }

    #[test]
    fn the_backup_timer_runs_one_backup_with_retention_and_catches_up_missed_runs() {
        let (service, timer) = backup_units(
            Path::new("/usr/local/bin/labforge"),
            Path::new("/srv/lab data"),
            &BackupSchedule {
                dest: "s3://team/lab",
                keep: 14,
                on_calendar: "*-*-* 03:00",
                environment_file: Path::new("/etc/labforge/backup.env"),
            },
        );
        assert!(
            service.contains(
                "ExecStart=/usr/local/bin/labforge backup s3://team/lab --keep 14 --data-dir \"/srv/lab data\" --quiet\n"
            ),
            "{service}"
        );
        assert!(service.lines().any(|l| l == "Type=oneshot"), "{service}");
        assert!(
            service
                .lines()
                .any(|l| l == "EnvironmentFile=-/etc/labforge/backup.env"),
            "{service}"
        );
        for line in [
            "OnCalendar=*-*-* 03:00",
            "Persistent=true",
            "WantedBy=timers.target",
        ] {
            assert!(timer.lines().any(|l| l == line), "{line} in {timer}");
        }
    }
}
