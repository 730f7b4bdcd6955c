//! `labforge config-ssh`: a block of `~/.ssh/config` with a `Host` for each notebook the user
//! may open, `<name>.<namespace>.labforge`, reached through `labforge ssh --stdio`. Then `ssh`,
//! `scp`, `rsync`, `ssh -L` and editors' remote SSH (VS Code, JetBrains Gateway) use the
//! notebook like any host, with no key of their own.
//!
//! The block sits between two marker lines and is replaced whole each time; the rest of the
//! file is left as it is. Host keys are not checked: the SSH server's key is made for each
//! connection, and what proves the other end is labforge's TLS and the API token.

use crate::api::NotebookRef;
use crate::tunnel::HOST_SUFFIX;

const BEGIN: &str =
    "# --- labforge: begin (written by `labforge config-ssh`; edits here are replaced) ---";
const END: &str = "# --- labforge: end ---";

/// The host name of a notebook in the block.
pub fn host_of(notebook: &NotebookRef) -> String {
    format!("{}.{}{HOST_SUFFIX}", notebook.name, notebook.namespace)
}

/// `labforge` as the block calls it: `program` quoted for ssh_config where it needs to be.
fn quoted(program: &str) -> String {
    if program.contains([' ', '"', '\'']) {
        format!("\"{}\"", program.replace('"', "\\\""))
    } else {
        program.to_owned()
    }
}

/// The block for `notebooks`, with `program` (this executable) as the proxy command.
pub fn block(program: &str, notebooks: &[NotebookRef]) -> String {
    let mut out = format!("{BEGIN}\n");
    let options = |out: &mut String, target: &str| {
        out.push_str(&format!(
            "  ProxyCommand {} ssh --stdio {target}\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
            quoted(program)
        ));
    };
    for notebook in notebooks {
        out.push_str(&format!("Host {}\n", host_of(notebook)));
        options(
            &mut out,
            &format!("{}/{}", notebook.namespace, notebook.name),
        );
    }
    // Notebooks made after this was written reach the same way, by their host name.
    out.push_str(&format!("Host *{HOST_SUFFIX}\n"));
    options(&mut out, "%h");
    out.push_str(END);
    out.push('\n');
    out
}

/// `config` (a `~/.ssh/config`'s text) with its labforge block replaced by `block`, or `block`
/// added at its end.
pub fn replace_block(config: &str, block: &str) -> String {
    let (before, after) = match (config.find(BEGIN), config.find(END)) {
        (Some(start), Some(end)) if end > start => {
            let after = &config[end + END.len()..];
            (&config[..start], after.strip_prefix('\n').unwrap_or(after))
        }
        _ => (config, ""),
    };
    let mut out = before.to_owned();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    if !out.is_empty() && !out.ends_with("\n\n") {
        out.push('\n');
    }
    out.push_str(block);
    out.push_str(after);
    out
}

/// Writes the block for `notebooks` into the ssh config file at `path` (made, mode 0600, in a
/// directory of mode 0700, when missing); returns the host names written.
pub fn write(
    path: &std::path::Path,
    program: &str,
    notebooks: &[NotebookRef],
) -> Result<Vec<String>, crate::RemoteError> {
    let current = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(crate::RemoteError::File {
                path: path.to_owned(),
                source,
            });
        }
    };
    let text = replace_block(&current, &block(program, notebooks));
    crate::write_private(path, text.as_bytes())?;
    Ok(notebooks.iter().map(host_of).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lab() -> NotebookRef {
        NotebookRef {
            namespace: "alice".into(),
            name: "lab".into(),
        }
    }

    #[test]
    fn the_block_names_each_notebook_and_reaches_it_through_labforge() {
        let block = block("/usr/local/bin/labforge", &[lab()]);
        assert!(block.contains("Host lab.alice.labforge\n  ProxyCommand /usr/local/bin/labforge ssh --stdio alice/lab\n"));
        assert!(
            block.contains(
                "Host *.labforge\n  ProxyCommand /usr/local/bin/labforge ssh --stdio %h\n"
            )
        );
        assert!(block.contains("UserKnownHostsFile /dev/null"));
        assert!(block.starts_with(BEGIN) && block.ends_with(&format!("{END}\n")));
        assert!(
            super::block("/opt/my tools/labforge", &[])
                .contains("ProxyCommand \"/opt/my tools/labforge\" ssh")
        );
    }

    #[test]
    fn writing_again_replaces_the_block_and_keeps_the_rest_of_the_file() {
        let mine = "Host work\n  HostName work.example.com\n";
        let first = replace_block(mine, &block("labforge", &[lab()]));
        assert!(first.starts_with(mine));
        assert!(first.contains("lab.alice.labforge"));
        let later = format!("{first}Host after\n  User me\n");
        let second = replace_block(&later, &block("labforge", &[]));
        assert!(!second.contains("lab.alice.labforge"), "{second}");
        assert!(second.starts_with(mine) && second.ends_with("Host after\n  User me\n"));
        assert_eq!(second.matches(BEGIN).count(), 1);
    }
}
