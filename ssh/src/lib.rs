//! SSH into a notebook without sshd or a published port: the server the agent runs inside the
//! container over exec's stdin and stdout ([`server`], with SFTP in [`sftp`]), and the client
//! `labforge ssh` runs ([`client`]). labforge carries the bytes between them over its
//! authenticated websocket, so SSH itself asks for no key.

pub mod client;
pub mod server;
mod sftp;
