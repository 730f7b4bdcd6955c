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
    let mut exec = quote(&binary.display().to_string());
    exec.push_str(" up");
    for arg in up_args {
        exec.push(' ');
        exec.push_str(&quote(arg));
    }
    let mut environment_lines = String::new();
    for (name, value) in environment {
        let _ = writeln!(
            environment_lines,
            "Environment={}",
            quote(&format!("{name}={value}"))
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

/// One `ExecStart=` or `Environment=` word: as it is when systemd reads it so, else in double
/// quotes with `"` and `\` escaped and control characters as `\xNN` (a newline would start a
/// line of its own). `%` (specifiers) and, in `ExecStart=`, `$` (variables) are doubled, so that
/// every path and name arrives as written.
fn quote(word: &str) -> String {
    quote_for(word, true)
}

/// [`quote`], for a setting that expands `$` (`ExecStart=`) or not (`Environment=`).
fn quote_for(word: &str, expands_variables: bool) -> String {
    let escaped = word.replace('%', "%%");
    let escaped = if expands_variables {
        escaped.replace('$', "$$")
    } else {
        escaped
    };
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
        assert_eq!(quote("/var/lib/labforge"), "/var/lib/labforge");
        assert_eq!(quote("/srv/lab data"), "\"/srv/lab data\"");
        assert_eq!(quote("50%$HOME"), "50%%$$HOME");
        assert_eq!(quote_for("A=50%$HOME", false), "A=50%%$HOME");
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(quote(";"), "\";\"");
        assert_eq!(quote(""), "\"\"");
        assert_eq!(
            quote("a\nExecStartPre=/bin/evil"),
            "\"a\\x0aExecStartPre=/bin/evil\""
        );
    }

    #[test]
    fn the_unit_runs_up_restarts_on_failure_and_stops_labforge_alone() {
        let unit = unit_file(
            Path::new("/usr/local/bin/labforge"),
            &["--data-dir".into(), "/srv/lab data".into()],
            &[("CULL_IDLE_TIME".into(), "60".into())],
        );
        assert!(
            unit.contains("ExecStart=/usr/local/bin/labforge up --data-dir \"/srv/lab data\"\n"),
            "{unit}"
        );
        for line in [
            "Restart=on-failure",
            "KillMode=process",
            "WantedBy=multi-user.target",
        ] {
            assert!(unit.lines().any(|l| l == line), "{line} in {unit}");
        }
    }
}
