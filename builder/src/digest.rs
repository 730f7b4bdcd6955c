//! Content digests computed while bytes stream past, so no blob is ever read twice.

use sha2::{Digest as _, Sha256};
use std::fmt;
use std::io::{self, Write};

/// A `sha256:<hex>` content digest as used by OCI descriptors and `diff_ids`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// Digest of a byte slice held in memory (configs, manifests).
    pub fn of(bytes: &[u8]) -> Self {
        Self::from_hasher(Sha256::new_with_prefix(bytes))
    }

    fn from_hasher(hasher: Sha256) -> Self {
        Digest(format!("sha256:{}", hex::encode(hasher.finalize())))
    }

    /// Parses `sha256:<64 lowercase hex>`; anything else is refused.
    pub fn parse(s: &str) -> Option<Self> {
        let hex = s.strip_prefix("sha256:")?;
        let well_formed = hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        well_formed.then(|| Digest(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The hex part, used for cache keys and file names.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A writer that hashes and counts everything written through it before passing it on.
pub struct DigestWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> DigestWriter<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Returns the inner writer, the digest and the byte count of everything written.
    pub fn finish(self) -> (W, Digest, u64) {
        (self.inner, Digest::from_hasher(self.hasher), self.written)
    }
}

impl<W: Write> Write for DigestWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_of_empty_input_is_the_well_known_value() {
        assert_eq!(
            Digest::of(b"").as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn writer_digest_matches_digest_of_the_same_bytes() {
        let mut w = DigestWriter::new(Vec::new());
        w.write_all(b"hello ").unwrap();
        w.write_all(b"layer").unwrap();
        let (inner, digest, n) = w.finish();
        assert_eq!(inner, b"hello layer");
        assert_eq!(n, 11);
        assert_eq!(digest, Digest::of(b"hello layer"));
    }

    #[test]
    fn parse_refuses_malformed_digests() {
        assert!(Digest::parse("sha256:abc").is_none());
        assert!(
            Digest::parse("md5:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
                .is_none()
        );
        assert!(
            Digest::parse(
                "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855"
            )
            .is_none()
        );
        let ok = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(Digest::parse(ok).unwrap().hex().len(), 64);
    }
}
