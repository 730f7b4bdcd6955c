//! The SSH server the agent runs inside a notebook's container, one per connection, speaking
//! over its own stdin and stdout.
//!
//! Nothing listens on a port: the web app starts the agent through exec for each connection and
//! carries its bytes over the user's authenticated websocket. Whoever reaches this server has
//! already been let in by labforge, exactly as for opening the notebook, so the SSH layer asks
//! for no key ("none" authentication, which OpenSSH tries first) and its host key is made afresh
//! for each connection. Everything runs as the container's user, in the container's
//! environment: a shell or command (with a terminal when asked), SFTP (what `scp` speaks), and
//! `ssh -L` forwards to ports the container can reach.

use crate::sftp::Files;
use russh::keys::{PrivateKey, ssh_key::private::Ed25519Keypair};
use russh::server::{Auth, ChannelOpenHandle, Msg, Session};
use russh::{Channel, ChannelId, ChannelMsg, ChannelOpenFailure, MethodKind, MethodSet};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::process::Child;

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("no randomness for the host key: {0}")]
    Random(String),
    #[error("SSH: {0}")]
    Protocol(#[from] russh::Error),
}

/// Serves one SSH connection over `stream` until the client leaves.
pub async fn serve<S>(stream: S) -> Result<(), ServerError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| ServerError::Random(e.to_string()))?;
    let key = PrivateKey::from(Ed25519Keypair::from_seed(&seed));
    let config = russh::server::Config {
        server_id: russh::SshId::Standard("SSH-2.0-labforge".into()),
        methods: MethodSet::from(&[MethodKind::None][..]),
        auth_rejection_time: Duration::from_millis(100),
        keys: vec![key],
        // The websocket above keeps the connection; an idle shell stays open like sshd's.
        inactivity_timeout: None,
        keepalive_interval: Some(Duration::from_secs(30)),
        nodelay: true,
        ..Default::default()
    };
    let ended = match russh::server::run_stream(Arc::new(config), stream, Connection).await {
        Ok(running) => running.await,
        Err(err) => Err(err),
    };
    match ended {
        // The client going away is how every connection ends.
        Ok(()) | Err(russh::Error::Disconnect | russh::Error::HUP | russh::Error::IO(_)) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// One client connection.
struct Connection;

impl russh::server::Handler for Connection {
    type Error = russh::Error;

    async fn auth_none(&mut self, _user: &str) -> Result<Auth, Self::Error> {
        Ok(Auth::Accept)
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        reply.accept().await;
        tokio::spawn(session_channel(channel));
        Ok(())
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host: &str,
        port: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Ok(port) = u16::try_from(port) else {
            reply.reject(ChannelOpenFailure::ConnectFailed).await;
            return Ok(());
        };
        match tokio::net::TcpStream::connect((host, port)).await {
            Ok(mut tcp) => {
                reply.accept().await;
                tokio::spawn(async move {
                    let mut stream = channel.into_stream();
                    let _ = tokio::io::copy_bidirectional(&mut stream, &mut tcp).await;
                });
            }
            Err(err) => {
                tracing::info!(%host, port, error = %err, "forward refused");
                reply.reject(ChannelOpenFailure::ConnectFailed).await;
            }
        }
        Ok(())
    }

    // The requests a session channel's task acts on, answered here: the task sees each as a
    // message in order.
    async fn pty_request(
        &mut self,
        channel: ChannelId,
        _term: &str,
        _cols: u32,
        _rows: u32,
        _pix_width: u32,
        _pix_height: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn env_request(
        &mut self,
        channel: ChannelId,
        _name: &str,
        _value: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        _command: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if name == "sftp" {
            session.channel_success(channel)
        } else {
            session.channel_failure(channel)
        }
    }

    async fn window_change_request(
        &mut self,
        _channel: ChannelId,
        _cols: u32,
        _rows: u32,
        _pix_width: u32,
        _pix_height: u32,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// What a session channel asked for before its program started.
#[derive(Default)]
struct Request {
    terminal: Option<(String, (u16, u16))>,
    env: Vec<(String, String)>,
}

/// The terminal size (rows, columns) an SSH request gives, in the bounds a terminal has; a
/// client that knows none (0) gets 24 by 80.
fn rows_and_cols(cols: u32, rows: u32) -> (u16, u16) {
    let clamp = |n: u32, unknown: u16| match n {
        0 => unknown,
        n => u16::try_from(n.min(1000)).unwrap_or(unknown),
    };
    (clamp(rows, 24), clamp(cols, 80))
}

fn pty_size((rows, cols): (u16, u16)) -> pty_process::Size {
    pty_process::Size::new(rows, cols)
}

/// Runs one session channel: gathers its terminal and environment, then runs the shell, the
/// command or SFTP it asks for, and ends with the program's exit status.
async fn session_channel(mut channel: Channel<Msg>) {
    let mut request = Request::default();
    let program = loop {
        let Some(message) = channel.wait().await else {
            return;
        };
        match message {
            ChannelMsg::RequestPty {
                term,
                col_width,
                row_height,
                ..
            } => request.terminal = Some((term, rows_and_cols(col_width, row_height))),
            ChannelMsg::SetEnv {
                variable_name,
                variable_value,
                ..
            } => request.env.push((variable_name, variable_value)),
            ChannelMsg::RequestShell { .. } => break None,
            ChannelMsg::Exec { command, .. } => {
                break Some(String::from_utf8_lossy(&command).into_owned());
            }
            ChannelMsg::RequestSubsystem { name, .. } if name == "sftp" => {
                serve_sftp(&mut channel).await;
                finish(&channel, 0).await;
                return;
            }
            ChannelMsg::Eof | ChannelMsg::Close => return,
            _ => {}
        }
    };
    let status = match &request.terminal {
        Some(_) => run_on_terminal(&mut channel, &request, program.as_deref()).await,
        None => run_with_pipes(&mut channel, &request, program.as_deref()).await,
    };
    let status = match status {
        Ok(status) => status,
        Err(err) => {
            let message = format!("labforge: cannot start {}: {err}\r\n", shell());
            let _ = channel.extended_data_bytes(1, message.into_bytes()).await;
            127
        }
    };
    finish(&channel, status).await;
}

/// Ends a session channel with `status`, which OpenSSH passes on as its own (scp too).
async fn finish(channel: &Channel<Msg>, status: u32) {
    let _ = channel.exit_status(status).await;
    let _ = channel.eof().await;
    let _ = channel.close().await;
}

/// Serves SFTP on the channel until the client ends it. The SFTP server runs on a task of its
/// own over one end of a pipe; this carries the channel's bytes to the other, so that the end
/// of the session is seen here and the exit status can follow.
async fn serve_sftp(channel: &mut Channel<Msg>) {
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    russh_sftp::server::run(theirs, Files::default()).await;
    let (mut from_sftp, mut to_sftp) = tokio::io::split(ours);
    let mut writer = channel.make_writer();
    let output = async {
        let _ = tokio::io::copy(&mut from_sftp, &mut writer).await;
        let _ = writer.flush().await;
    };
    let input = async {
        while let Some(message) = channel.wait().await {
            match message {
                ChannelMsg::Data { data } if to_sftp.write_all(&data).await.is_err() => break,
                // The SFTP server ends when its input does; its last answers still go out.
                ChannelMsg::Eof => {
                    let _ = to_sftp.shutdown().await;
                    std::future::pending::<()>().await;
                }
                ChannelMsg::Close => break,
                _ => {}
            }
        }
    };
    tokio::select! {
        () = output => {}
        () = input => {}
    }
}

/// The user's shell: `$SHELL`, else bash where the image has it, else `sh`.
fn shell() -> String {
    std::env::var("SHELL")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            ["/bin/bash", "/usr/bin/bash"]
                .into_iter()
                .find(|p| std::path::Path::new(p).exists())
                .map(String::from)
        })
        .unwrap_or_else(|| "/bin/sh".into())
}

/// Where a session starts: the user's home, as sshd does.
pub(crate) fn home() -> std::path::PathBuf {
    std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .filter(|h| h.is_dir())
        .unwrap_or_else(|| "/".into())
}

/// The arguments of the shell for `program`: a login shell, or `-c` with the command, as sshd
/// runs them.
fn shell_args(program: Option<&str>) -> Vec<String> {
    match program {
        Some(command) => vec!["-c".into(), command.into()],
        None => vec!["-l".into()],
    }
}

/// An exit status as SSH reports it: a program killed by a signal reports 128 + the signal, as
/// shells do.
fn exit_code(status: std::process::ExitStatus) -> u32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .map(|c| c as u32)
        .or_else(|| status.signal().map(|s| 128 + s as u32))
        .unwrap_or(255)
}

async fn run_with_pipes(
    channel: &mut Channel<Msg>,
    request: &Request,
    program: Option<&str>,
) -> std::io::Result<u32> {
    let mut child = tokio::process::Command::new(shell())
        .args(shell_args(program))
        .envs(request.env.iter().map(|(k, v)| (k, v)))
        .current_dir(home())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let mut stdin = child.stdin.take();
    let out = copy_out(stdout, channel.make_writer());
    let err = copy_out(stderr, channel.make_writer_ext(Some(1)));
    let input = async {
        while let Some(message) = channel.wait().await {
            match message {
                ChannelMsg::Data { data } => {
                    if let Some(pipe) = stdin.as_mut()
                        && pipe.write_all(&data).await.is_err()
                    {
                        stdin = None;
                    }
                }
                ChannelMsg::Eof => stdin = None,
                ChannelMsg::Close => break,
                _ => {}
            }
        }
    };
    let output = async {
        tokio::join!(out, err);
    };
    until_exit_or_close(&mut child, output, input).await
}

/// The program's exit status once it has exited and `output` is all sent; killed, if `input`
/// ends first (the client closed the channel: nobody is left to read what it writes).
async fn until_exit_or_close(
    child: &mut Child,
    output: impl Future<Output = ()>,
    input: impl Future<Output = ()>,
) -> std::io::Result<u32> {
    let finished = async {
        let (status, ()) = tokio::join!(child.wait(), output);
        status
    };
    tokio::select! {
        status = finished => return Ok(exit_code(status?)),
        () = input => {}
    }
    let _ = child.start_kill();
    Ok(exit_code(child.wait().await?))
}

/// Copies a program's output to the channel until the program closes it.
async fn copy_out(pipe: Option<impl AsyncRead + Unpin>, mut to: impl AsyncWrite + Unpin) {
    if let Some(mut pipe) = pipe {
        let _ = tokio::io::copy(&mut pipe, &mut to).await;
        let _ = to.flush().await;
    }
}

async fn run_on_terminal(
    channel: &mut Channel<Msg>,
    request: &Request,
    program: Option<&str>,
) -> std::io::Result<u32> {
    let (term, size) = request
        .terminal
        .clone()
        .unwrap_or_else(|| ("xterm".into(), (24, 80)));
    let (pty, pts) = pty_process::open().map_err(std::io::Error::other)?;
    pty.resize(pty_size(size)).map_err(std::io::Error::other)?;
    let mut child: Child = pty_process::Command::new(shell())
        .args(shell_args(program))
        .env("TERM", term)
        .envs(request.env.iter().map(|(k, v)| (k, v)))
        .current_dir(home())
        .kill_on_drop(true)
        .spawn(pts)
        .map_err(std::io::Error::other)?;
    let (mut from_terminal, mut to_terminal) = pty.into_split();
    let mut writer = channel.make_writer();
    let output = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from_terminal.read(&mut buf).await {
                // EIO: every process holding the terminal has closed it.
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if writer.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = writer.flush().await;
    };
    let input = async {
        while let Some(message) = channel.wait().await {
            match message {
                ChannelMsg::Data { data } if to_terminal.write_all(&data).await.is_err() => break,
                ChannelMsg::WindowChange {
                    col_width,
                    row_height,
                    ..
                } => {
                    let _ = to_terminal.resize(pty_size(rows_and_cols(col_width, row_height)));
                }
                ChannelMsg::Close => break,
                _ => {}
            }
        }
    };
    until_exit_or_close(&mut child, output, input).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_runs_in_the_users_shell_and_no_command_is_a_login_shell() {
        assert_eq!(shell_args(Some("echo hi")), ["-c", "echo hi"]);
        assert_eq!(shell_args(None), ["-l"]);
    }

    #[test]
    fn terminal_sizes_are_kept_in_bounds() {
        assert_eq!(rows_and_cols(0, 0), (24, 80));
        assert_eq!(rows_and_cols(120, 40), (40, 120));
        assert_eq!(rows_and_cols(u32::MAX, 5), (5, 1000));
    }
}
