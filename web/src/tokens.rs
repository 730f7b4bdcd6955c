//! API tokens: what the CLI, scripts and `labforge ssh` present (`Authorization: Bearer …`)
//! where a browser has its session cookie, with the same access as their user.
//!
//! A token is shown once, when made; `tokens.json` in the data dir keeps only its SHA-256 (a
//! token is 32 random bytes, so a fast hash is as safe as a slow one and the check costs
//! nothing per request). Each expires, and its user or an admin revokes it; removing a user
//! ends theirs. The file is a [`JsonFile`], so a token the CLI revokes is refused at once.

use crate::json_file::{FileError, JsonFile};
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

/// What every token starts with, so that one pasted into the wrong place is recognizable
/// (and secret scanners can find it).
pub const TOKEN_PREFIX: &str = "lft_";
/// How long a token lasts when its maker does not say.
pub const DEFAULT_LIFETIME: &str = "30d";
/// The longest a token may last.
const MAX_LIFETIME: SignedDuration = SignedDuration::from_hours(366 * 24);
/// The longest name a token may have.
const MAX_NAME: usize = 100;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// A field of the request is wrong; the field and why.
    #[error("{1}")]
    Invalid(&'static str, String),
    /// The user has a token of that name.
    #[error("{0}")]
    NameTaken(String),
    #[error("no token {0}")]
    NotFound(String),
    #[error(transparent)]
    File(#[from] FileError),
    #[error("no randomness: {0}")]
    Random(String),
}

/// A token as kept: never the token itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRecord {
    pub id: String,
    pub user: String,
    pub name: String,
    /// Hex SHA-256 of the token.
    pub hash: String,
    pub created: Timestamp,
    pub expires: Timestamp,
}

/// A token just made: the one time its secret is known.
pub struct NewToken {
    pub record: TokenRecord,
    pub token: String,
}

/// `"90m"`, `"12h"`, `"30d"`: how long a token is to last, up to a year.
pub fn parse_lifetime(text: &str) -> Result<SignedDuration, TokenError> {
    let invalid = || {
        TokenError::Invalid(
            "expiresIn",
            format!(
                "expiresIn {text:?} is not a lifetime: give minutes, hours or days, like \
                 \"90m\", \"12h\" or \"30d\", up to 366d"
            ),
        )
    };
    let text = text.trim();
    let split = text.len().saturating_sub(1);
    let (number, unit) = (text.get(..split).ok_or_else(invalid)?, &text[split..]);
    let n: i64 = number.parse().map_err(|_| invalid())?;
    let minutes = match unit {
        "m" => n,
        "h" => n.saturating_mul(60),
        "d" => n.saturating_mul(24 * 60),
        _ => return Err(invalid()),
    };
    let lifetime = SignedDuration::from_mins(minutes);
    if n <= 0 || lifetime > MAX_LIFETIME {
        return Err(invalid());
    }
    Ok(lifetime)
}

fn hash(token: &str) -> String {
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// The bearer token a request carries, if it carries one (whatever its scheme's case).
pub fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The tokens file, and when each token was last used (kept in memory only: a write per request
/// would cost more than the answer is worth).
pub struct Tokens {
    file: JsonFile<Vec<TokenRecord>>,
    /// Serializes this process's read-modify-write of the file.
    writing: Mutex<()>,
    last_used: Mutex<HashMap<String, Timestamp>>,
}

impl Tokens {
    pub fn open(data_dir: &Path) -> Result<Self, TokenError> {
        Ok(Self {
            file: JsonFile::open(data_dir.join("tokens.json"))?,
            writing: Mutex::new(()),
            last_used: Mutex::new(HashMap::new()),
        })
    }

    fn edit<R>(
        &self,
        change: impl FnOnce(&mut Vec<TokenRecord>) -> Result<R, TokenError>,
    ) -> Result<R, TokenError> {
        let _writing = self
            .writing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.file.refresh()?;
        let mut records = self.file.get();
        let answer = change(&mut records)?;
        self.file.write(&records)?;
        Ok(answer)
    }

    /// Makes a token for `user` named `name` that lasts `lifetime` (e.g. `"30d"`).
    pub fn create(&self, user: &str, name: &str, lifetime: &str) -> Result<NewToken, TokenError> {
        let name = name.trim();
        if name.is_empty() || name.chars().count() > MAX_NAME || name.chars().any(char::is_control)
        {
            return Err(TokenError::Invalid(
                "name",
                format!(
                    "name must be 1 to {MAX_NAME} printable characters, saying what the token is for"
                ),
            ));
        }
        let lifetime = parse_lifetime(lifetime)?;
        let random =
            |len| crate::users::random_token(len).map_err(|e| TokenError::Random(e.to_string()));
        let token = format!("{TOKEN_PREFIX}{}", random(32)?);
        let now = Timestamp::now();
        let record = TokenRecord {
            id: random(8)?,
            user: user.to_owned(),
            name: name.to_owned(),
            hash: hash(&token),
            created: now,
            expires: now.saturating_add(lifetime).unwrap_or(now),
        };
        self.edit(|records| {
            let now = Timestamp::now();
            records.retain(|r| r.expires > now);
            if records.iter().any(|r| r.user == user && r.name == name) {
                return Err(TokenError::NameTaken(format!(
                    "{user} has a token named {name:?} already: pick another name, or revoke that one"
                )));
            }
            records.push(record.clone());
            Ok(())
        })?;
        Ok(NewToken { record, token })
    }

    /// Every token that has not expired; `user`'s alone when given.
    pub fn list(&self, user: Option<&str>) -> Vec<TokenRecord> {
        if let Err(err) = self.file.refresh() {
            tracing::warn!(error = %err, "re-reading the tokens file");
        }
        let now = Timestamp::now();
        let mut records: Vec<TokenRecord> = self
            .file
            .get()
            .into_iter()
            .filter(|r| r.expires > now && user.is_none_or(|u| r.user == u))
            .collect();
        records.sort_by(|a, b| a.user.cmp(&b.user).then(a.created.cmp(&b.created)));
        records
    }

    pub fn last_used(&self, id: &str) -> Option<Timestamp> {
        self.last_used.lock().ok()?.get(id).copied()
    }

    /// Revokes token `id`, if `may(record)` says the asker may: returns the revoked record.
    /// One they may not revoke is as unknown to them as one that does not exist.
    pub fn revoke(
        &self,
        id: &str,
        may: impl FnOnce(&TokenRecord) -> bool,
    ) -> Result<TokenRecord, TokenError> {
        self.edit(|records| {
            let at = records
                .iter()
                .position(|r| r.id == id)
                .filter(|&at| may(&records[at]))
                .ok_or_else(|| TokenError::NotFound(id.to_owned()))?;
            Ok(records.remove(at))
        })
    }

    /// Revokes every token of `user` (a removed user), returning how many.
    pub fn revoke_user(&self, user: &str) -> Result<usize, TokenError> {
        self.edit(|records| {
            let before = records.len();
            records.retain(|r| r.user != user);
            Ok(before - records.len())
        })
    }

    /// The user whose live token `token` is.
    pub fn user_of(&self, token: &str) -> Option<String> {
        if !token.starts_with(TOKEN_PREFIX) {
            return None;
        }
        if let Err(err) = self.file.refresh() {
            tracing::warn!(error = %err, "re-reading the tokens file");
        }
        let hash = hash(token);
        let now = Timestamp::now();
        let (id, user) = self
            .file
            .read(|records| {
                records
                    .iter()
                    .find(|r| r.hash == hash && r.expires > now)
                    .map(|r| (r.id.clone(), r.user.clone()))
            })
            .flatten()?;
        if let Ok(mut used) = self.last_used.lock() {
            used.insert(id, now);
        }
        Some(user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_kept_hashed_finds_its_user_and_stops_at_revocation() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::open(dir.path()).unwrap();
        let made = tokens.create("alice", "laptop", "30d").unwrap();
        assert!(made.token.starts_with(TOKEN_PREFIX));
        let file = std::fs::read_to_string(dir.path().join("tokens.json")).unwrap();
        assert!(
            !file.contains(&made.token),
            "the token itself is not stored"
        );
        assert_eq!(tokens.user_of(&made.token).as_deref(), Some("alice"));
        assert_eq!(tokens.user_of(&format!("{}x", made.token)), None);
        assert!(tokens.last_used(&made.record.id).is_some());

        // Another process (the CLI) revokes it: refused at once.
        let other = Tokens::open(dir.path()).unwrap();
        let not_bobs = other.revoke(&made.record.id, |r| r.user == "bob");
        assert!(matches!(not_bobs, Err(TokenError::NotFound(_))));
        other
            .revoke(&made.record.id, |r| r.user == "alice")
            .unwrap();
        assert_eq!(tokens.user_of(&made.token), None);
    }

    #[test]
    fn names_and_lifetimes_are_checked_and_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::open(dir.path()).unwrap();
        tokens.create("alice", "ci", "1h").unwrap();
        let again = tokens.create("alice", "ci", "1h").err().unwrap();
        assert!(matches!(again, TokenError::NameTaken(_)), "{again}");
        tokens.create("bob", "ci", "1h").unwrap();
        for bad in ["", "30", "0d", "-1d", "367d", "2w", "d"] {
            let err = tokens.create("alice", "x", bad).err().unwrap();
            assert!(matches!(err, TokenError::Invalid("expiresIn", _)), "{bad}");
        }
        assert!(matches!(
            tokens.create("alice", " ", "1h"),
            Err(TokenError::Invalid("name", _))
        ));
        assert_eq!(
            parse_lifetime("90m").unwrap(),
            SignedDuration::from_mins(90)
        );
        assert_eq!(tokens.list(Some("alice")).len(), 1);
        assert_eq!(tokens.list(None).len(), 2);
        assert_eq!(tokens.revoke_user("alice").unwrap(), 1);
    }

    #[test]
    fn an_expired_token_finds_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::open(dir.path()).unwrap();
        let made = tokens.create("alice", "old", "1m").unwrap();
        let mut records = tokens.file.get();
        records[0].expires = Timestamp::now() - SignedDuration::from_secs(1);
        tokens.file.write(&records).unwrap();
        assert_eq!(tokens.user_of(&made.token), None);
        assert!(tokens.list(None).is_empty());
    }

    #[test]
    fn the_bearer_token_is_read_from_the_authorization_header() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert(
            http::header::AUTHORIZATION,
            "Bearer lft_abc".parse().unwrap(),
        );
        assert_eq!(bearer(&headers), Some("lft_abc"));
        headers.insert(
            http::header::AUTHORIZATION,
            "bearer  lft_x".parse().unwrap(),
        );
        assert_eq!(bearer(&headers), Some("lft_x"));
        headers.insert(http::header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&headers), None);
    }
}
