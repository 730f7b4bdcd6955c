//! `labforge service install`: the systemd unit that runs `labforge up` as a machine's service,
//! so that a team's server comes back after a crash or a reboot.
//!
//! Notebooks are containers of their own (each with podman's `conmon` as its parent), so
//! stopping the service must stop labforge alone: `KillMode=process` leaves them running, and
//! the next start adopts them, as after Ctrl-C.

use std::fmt::Write as _;
use std::path::Path;

/// The unit file for `binary up <up_args>`.
pub fn unit_file(binary: &Path, up_args: &[String]) -> String {
    let mut exec = quote(&binary.display().to_string());
    exec.push_str(" up");
    for arg in up_args {
        exec.push(' ');
        exec.push_str(&quote(arg));
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
Restart=on-failure
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

/// One `ExecStart=` word: as it is when systemd reads it so, else in double quotes with `"` and
/// `\` escaped. `%` (specifiers) and `$` (variables) are doubled either way, so that every
/// path and name arrives as written.
fn quote(word: &str) -> String {
    let escaped = word.replace('%', "%%").replace('$', "$$");
    let plain = !escaped.is_empty()
        && escaped
            .chars()
            .all(|c| !c.is_whitespace() && !matches!(c, '"' | '\'' | '\\' | ';'));
    if plain {
        return escaped;
    }
    let mut quoted = String::from("\"");
    for c in escaped.chars() {
        if matches!(c, '"' | '\\') {
            quoted.push('\\');
        }
        quoted.push(c);
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
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(quote(";"), "\";\"");
        assert_eq!(quote(""), "\"\"");
    }

    #[test]
    fn the_unit_runs_up_restarts_on_failure_and_stops_labforge_alone() {
        let unit = unit_file(
            Path::new("/usr/local/bin/labforge"),
            &["--data-dir".into(), "/srv/lab data".into()],
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
