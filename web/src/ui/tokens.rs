//! The Tokens page: a user makes, sees and revokes their API tokens, and reads how the CLI and
//! OpenSSH use one; an admin also sees and revokes everyone's. `web/ui/tokens.js` fills it in.

use super::{Viewer, page, to_login};
use crate::api::ApiState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

pub(super) async fn tokens_page(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let Some(user) = state.access.identify(&headers).await else {
        return to_login(&state.base_path);
    };
    page(
        &state.base_path,
        "API tokens",
        Some(Viewer::from(&user)),
        tokens_main(user.admin),
        Some("tokens.js"),
    )
    .into_response()
}

const LIFETIMES: [(&str, &str); 5] = [
    ("1d", "1 day"),
    ("7d", "7 days"),
    ("30d", "30 days"),
    ("90d", "90 days"),
    ("366d", "1 year"),
];

fn token_table(id: &str, with_user: bool) -> Markup {
    html! {
        div.table-wrap {
            table #(id) {
                thead {
                    tr {
                        @if with_user { th scope="col" { "User" } }
                        th scope="col" { "Name" }
                        th scope="col" { "Made" }
                        th scope="col" { "Expires" }
                        th scope="col" { "Last used" }
                        th scope="col" { "Revoke" }
                    }
                }
                tbody {}
            }
        }
    }
}

fn tokens_main(admin: bool) -> Markup {
    html! {
        h1 { "API tokens" }
        p {
            "A token signs the command line, scripts and SSH in as you, with what you may do here. "
            "Keep it like a password; revoke one you no longer use."
        }
        section.card {
            h2 { "Make a token" }
            form.inline #new-token novalidate {
                div {
                    label for="token-name" { "Name" }
                    input #token-name name="name" placeholder="e.g. laptop" required maxlength="100";
                    span.error data-error-for="name" {}
                }
                div {
                    label for="token-expires" { "Expires in" }
                    select #token-expires name="expiresIn" {
                        @for (value, label) in LIFETIMES {
                            option value=(value) selected[value == "30d"] { (label) }
                        }
                    }
                    span.error data-error-for="expiresIn" {}
                }
                button type="submit" { "Make token" }
            }
            p.error #token-error role="alert" {}
            div #made-token hidden {
                p { strong { "Your new token" } " (shown this once; copy it now):" }
                p.token-secret {
                    code #made-token-value {}
                    " "
                    button.secondary #copy-token type="button" { "Copy" }
                }
            }
        }
        section.card {
            h2 { "Your tokens" }
            (token_table("tokens", false))
            p #no-tokens hidden { "No tokens yet." }
        }
        section.card {
            h2 { "Use it" }
            ol {
                li { "Sign the CLI in: " code #login-command { "labforge login URL" } " (asks your password and makes a token), or " code { "labforge login URL --token TOKEN" } "." }
                li { "Run a command in a notebook: " code { "labforge ssh NAMESPACE/NAME -- python3 --version" } "; a shell without the command." }
                li { "Use ssh, scp, rsync and VS Code Remote-SSH: " code { "labforge config-ssh" } ", then " code { "ssh NAME.NAMESPACE.labforge" } "." }
                li { "Call the API: " code { "curl -H 'Authorization: Bearer TOKEN' URL/api/whoami" } "." }
            }
        }
        @if admin {
            section.card {
                h2 { "Everyone's tokens" }
                (token_table("all-tokens", true))
            }
        }
    }
}
