//! The SSH client `labforge ssh NS/NAME` runs: a shell or one command over a stream the CLI has
//! opened to the notebook, with this terminal in raw mode while a shell runs, and the remote
//! exit status as its result.
//!
//! The stream is labforge's authenticated tunnel, so the server's host key (new for every
//! connection) is not what proves whom we talk to; TLS to labforge and its token do.

use russh::client::{Config, Handle};
use russh::keys::PublicKeyOrCertificate;
use russh::{ChannelMsg, Disconnect};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// Why a session could not run.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("SSH: {0}")]
    Protocol(#[from] russh::Error),
    #[error("the notebook's SSH server refused the session")]
    Refused,
    #[error("the notebook's SSH server closed the session without an exit status")]
    NoExitStatus,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

struct Trusting;

impl russh::client::Handler for Trusting {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        _key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        Ok(true)
    }
}

/// Joins a command's words into the one line SSH sends, each quoted for the remote shell, so
/// that `labforge ssh nb -- python3 -c 'print(6*7)'` runs what it says.
pub fn command_line<S: AsRef<str>>(words: &[S]) -> String {
    words
        .iter()
        .map(|w| quote(w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// This terminal in raw mode until dropped, when stdin is one.
struct RawTerminal(Option<rustix::termios::Termios>);

impl RawTerminal {
    fn enter() -> Self {
        let stdin = std::io::stdin();
        let Ok(saved) = rustix::termios::tcgetattr(&stdin) else {
            return Self(None);
        };
        let mut raw = saved.clone();
        raw.make_raw();
        match rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw) {
            Ok(()) => Self(Some(saved)),
            Err(_) => Self(None),
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = rustix::termios::tcsetattr(
                std::io::stdin(),
                rustix::termios::OptionalActions::Now,
                saved,
            );
        }
    }
}

/// Whether stdin and stdout are a terminal (then a shell gets one too).
pub fn interactive() -> bool {
    rustix::termios::isatty(std::io::stdin()) && rustix::termios::isatty(std::io::stdout())
}

/// Runs `command` (a login shell when `None`) over `stream`, this process's stdin, stdout and
/// stderr wired to it, and returns its exit status. A terminal is asked for when `terminal`.
pub async fn run<S>(stream: S, command: Option<&str>, terminal: bool) -> Result<u32, ClientError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = (tokio::io::stdin(), tokio::io::stdout(), tokio::io::stderr());
    if !terminal {
        return run_with(stream, command, None, io).await;
    }
    let size = rustix::termios::tcgetwinsize(std::io::stdout()).ok();
    let size = size.map_or((80, 24), |s| (s.ws_col.into(), s.ws_row.into()));
    // Keys go to the remote shell as typed while it runs; the terminal is restored after.
    let _raw = RawTerminal::enter();
    run_with(stream, command, Some(size), io).await
}

/// [`run`] with the given stdin, stdout and stderr, and a terminal of `terminal`'s size
/// (columns, rows) when asked for one.
pub async fn run_with<S, I, O, E>(
    stream: S,
    command: Option<&str>,
    terminal: Option<(u32, u32)>,
    (mut stdin, mut stdout, mut stderr): (I, O, E),
) -> Result<u32, ClientError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    I: AsyncRead + Unpin,
    O: AsyncWrite + Unpin,
    E: AsyncWrite + Unpin,
{
    let config = Arc::new(Config {
        inactivity_timeout: None,
        ..Default::default()
    });
    let mut session: Handle<Trusting> =
        russh::client::connect_stream(config, stream, Trusting).await?;
    if !session.authenticate_none("labforge").await?.success() {
        return Err(ClientError::Refused);
    }
    let mut channel = session.channel_open_session().await?;
    if let Some((cols, rows)) = terminal {
        let term = std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into());
        channel
            .request_pty(true, &term, cols, rows, 0, 0, &[])
            .await?;
    }
    match command {
        Some(command) => channel.exec(true, command).await?,
        None => channel.request_shell(true).await?,
    }
    let mut buf = vec![0u8; 16 * 1024];
    let mut stdin_open = true;
    let mut status = None;
    loop {
        tokio::select! {
            read = stdin.read(&mut buf), if stdin_open => match read {
                Ok(0) | Err(_) => {
                    stdin_open = false;
                    channel.eof().await?;
                }
                Ok(n) => channel.data(&buf[..n]).await?,
            },
            message = channel.wait() => match message {
                Some(ChannelMsg::Data { data }) => {
                    stdout.write_all(&data).await?;
                    stdout.flush().await?;
                }
                Some(ChannelMsg::ExtendedData { data, .. }) => {
                    stderr.write_all(&data).await?;
                    stderr.flush().await?;
                }
                Some(ChannelMsg::ExitStatus { exit_status }) => status = Some(exit_status),
                Some(ChannelMsg::ExitSignal { .. }) => status = status.or(Some(255)),
                Some(ChannelMsg::Close) | None => break,
                Some(_) => {}
            },
        }
    }
    let _ = session
        .disconnect(Disconnect::ByApplication, "", "en")
        .await;
    status.ok_or(ClientError::NoExitStatus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commands_words_reach_the_remote_shell_as_they_were_given() {
        assert_eq!(
            command_line(&["python3", "-c", "print(6*7)"]),
            "python3 -c 'print(6*7)'"
        );
        assert_eq!(command_line(&["echo", "it's", ""]), r"echo 'it'\''s' ''");
        assert_eq!(command_line(&["ls", "-la", "/tmp"]), "ls -la /tmp");
    }

    #[tokio::test]
    async fn a_command_runs_through_the_server_with_its_output_input_and_exit_status() {
        let (near, far) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(crate::server::serve(far));
        let mut out = Vec::new();
        let mut err = Vec::new();
        let status = run_with(
            near,
            Some("read line; echo \"got $line\"; echo oops >&2; exit 3"),
            None,
            (&b"hello\n"[..], &mut out, &mut err),
        )
        .await
        .unwrap();
        assert_eq!(status, 3);
        assert_eq!(String::from_utf8_lossy(&out), "got hello\n");
        assert_eq!(String::from_utf8_lossy(&err), "oops\n");
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_terminal_is_given_when_asked_with_the_clients_size() {
        let (near, far) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(crate::server::serve(far));
        let mut out = Vec::new();
        let status = run_with(
            near,
            Some("tty; stty size; exit 5"),
            Some((100, 30)),
            (&b""[..], &mut out, tokio::io::sink()),
        )
        .await
        .unwrap();
        assert_eq!(status, 5);
        let said = String::from_utf8_lossy(&out);
        assert!(said.contains("/dev/pts/"), "{said}");
        assert!(said.contains("30 100"), "rows and columns as asked: {said}");
        server.await.unwrap().unwrap();
    }
}
