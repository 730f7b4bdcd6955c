//! The certificate `labforge up --tls-self-signed` makes for itself and keeps in the data dir,
//! so that a team gets HTTPS and secure cookies before it has a certificate from a CA. Browsers
//! warn until each user trusts it; the SHA-256 fingerprint printed at start is what they compare
//! with what their browser shows.
//!
//! It is kept across restarts (a new one would make every browser ask again) and made anew only
//! when the names it must cover change or it is about to expire.

use crate::data_dir::write_replacing;
use labforge_proxy::server::TlsFiles;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// How long a new certificate is valid: the longest Apple's platforms accept for a server
/// certificate, trusted by hand or not.
const VALID_DAYS: i64 = 825;
/// A certificate this close to its end is replaced at the next start.
const RENEW_DAYS: i64 = 30;

#[derive(Debug, thiserror::Error)]
pub enum SelfSignedError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a PEM certificate", path.display())]
    Pem { path: PathBuf },
    #[error("making a self-signed certificate for {names:?}: {source}")]
    Generate {
        names: Vec<String>,
        #[source]
        source: rcgen::Error,
    },
}

/// The certificate in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfSigned {
    pub files: TlsFiles,
    /// SHA-256 of the certificate, as browsers show it (`AB:CD:…`).
    pub fingerprint: String,
    /// Whether this start made it (else it was kept from an earlier one).
    pub made: bool,
}

/// What the kept certificate was made for, stored beside it.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Made {
    names: Vec<String>,
    not_after: jiff::Timestamp,
}

/// The certificate in `dir` for `names` (host names, `*.` wildcards, IP addresses): the kept one
/// when it still covers exactly them for more than a month after `now`, else a new one.
pub fn ensure(
    dir: &Path,
    names: &[String],
    now: jiff::Timestamp,
) -> Result<SelfSigned, SelfSignedError> {
    let files = TlsFiles {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    };
    let made_path = dir.join("made.json");
    let kept = std::fs::read(&made_path)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Made>(&bytes).ok())
        .filter(|made| {
            made.names == names
                && made.not_after.duration_since(now).as_secs() > RENEW_DAYS * 86_400
                && files.key.is_file()
        });
    if kept.is_some()
        && let Ok(fingerprint) = fingerprint_of(&files.cert)
    {
        return Ok(SelfSigned {
            files,
            fingerprint,
            made: false,
        });
    }

    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| SelfSignedError::Io { path, source }
    };
    create_private_dir(dir).map_err(io(dir))?;
    let generate = |source| SelfSignedError::Generate {
        names: names.to_vec(),
        source,
    };
    let (first_day, last_day) = validity(now);
    let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(generate)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "labforge (self-signed)");
    let ymd = |day: jiff::civil::Date| {
        rcgen::date_time_ymd(
            i32::from(day.year()),
            u8::try_from(day.month()).unwrap_or(1),
            u8::try_from(day.day()).unwrap_or(1),
        )
    };
    params.not_before = ymd(first_day);
    params.not_after = ymd(last_day);
    let not_after = last_day
        .to_zoned(jiff::tz::TimeZone::UTC)
        .map(|zoned| zoned.timestamp())
        .unwrap_or(now);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate().map_err(generate)?;
    let certificate = params.self_signed(&key).map_err(generate)?;
    // The key first: a certificate without its key is never left as the one to keep.
    write_replacing(&files.key, key.serialize_pem().as_bytes(), 0o600).map_err(io(&files.key))?;
    write_replacing(&files.cert, certificate.pem().as_bytes(), 0o644).map_err(io(&files.cert))?;
    let made = serde_json::to_vec_pretty(&Made {
        names: names.to_vec(),
        not_after,
    })
    .map_err(|e| io(&made_path)(std::io::Error::other(e)))?;
    write_replacing(&made_path, &made, 0o644).map_err(io(&made_path))?;
    Ok(SelfSigned {
        files,
        fingerprint: fingerprint_of_der(certificate.der()),
        made: true,
    })
}

/// The SHA-256 fingerprint of the first certificate in PEM file `path`.
pub fn fingerprint_of(path: &Path) -> Result<String, SelfSignedError> {
    let certificate = CertificateDer::pem_file_iter(path)
        .ok()
        .and_then(|mut certificates| certificates.next())
        .and_then(Result::ok)
        .ok_or_else(|| SelfSignedError::Pem {
            path: path.to_owned(),
        })?;
    Ok(fingerprint_of_der(&certificate))
}

fn fingerprint_of_der(der: &[u8]) -> String {
    let digest = Sha256::digest(der);
    let hex: Vec<String> = digest.iter().map(|byte| format!("{byte:02X}")).collect();
    hex.join(":")
}

/// The first and last day (UTC midnights) of a certificate made at `now`: from the day before
/// (clocks of other machines run behind) for [`VALID_DAYS`].
fn validity(now: jiff::Timestamp) -> (jiff::civil::Date, jiff::civil::Date) {
    let today = now.to_zoned(jiff::tz::TimeZone::UTC).date();
    let first = today.yesterday().unwrap_or(today);
    let last = first
        .checked_add(jiff::Span::new().days(VALID_DAYS))
        .unwrap_or(first);
    (first, last)
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn a_certificate_is_made_once_and_kept_while_it_covers_the_same_names() {
        let dir = tempfile::tempdir().unwrap();
        let tls = dir.path().join("tls");
        let now = jiff::Timestamp::now();
        let wanted = names(&["lab.example.com", "*.lab.example.com", "127.0.0.1"]);
        let first = ensure(&tls, &wanted, now).unwrap();
        assert!(first.made);
        assert_eq!(first.fingerprint.len(), 32 * 3 - 1, "{}", first.fingerprint);
        assert_eq!(
            fingerprint_of(&first.files.cert).unwrap(),
            first.fingerprint
        );
        use std::os::unix::fs::PermissionsExt;
        let key_mode = std::fs::metadata(&first.files.key)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(key_mode & 0o077, 0, "the key is the owner's alone");

        // It serves: rustls takes the pair.
        let _ = rustls::crypto::ring::default_provider().install_default();
        labforge_proxy::server::tls_acceptor(&first.files).unwrap();

        let again = ensure(&tls, &wanted, now).unwrap();
        assert_eq!(
            (again.made, &again.fingerprint),
            (false, &first.fingerprint)
        );

        let other_names = ensure(&tls, &names(&["localhost", "*.localhost"]), now).unwrap();
        assert!(other_names.made);
        assert_ne!(other_names.fingerprint, first.fingerprint);

        let late = now + jiff::SignedDuration::from_hours((VALID_DAYS - RENEW_DAYS + 1) * 24);
        let renewed = ensure(&tls, &names(&["localhost", "*.localhost"]), late).unwrap();
        assert!(renewed.made, "renewed before it expires");
    }

    #[test]
    fn a_certificate_is_valid_for_exactly_the_days_apple_platforms_accept() {
        for now in [
            "2026-11-26T23:59:59Z",
            "2028-02-29T00:00:00Z",
            "2026-01-01T00:00:00Z",
        ] {
            let now: jiff::Timestamp = now.parse().unwrap();
            let (first, last) = validity(now);
            assert_eq!((last - first).get_days(), 825, "{now}");
            assert!(
                first < now.to_zoned(jiff::tz::TimeZone::UTC).date(),
                "{now}"
            );
        }
    }

    #[test]
    fn a_name_no_certificate_can_carry_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let error = ensure(
            dir.path(),
            &names(&["läb.example.com"]),
            jiff::Timestamp::now(),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("läb.example.com"), "{error}");
    }
}
