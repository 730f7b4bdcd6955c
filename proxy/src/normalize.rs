//! Request paths made canonical before routing, so the path that was matched and authorized is
//! exactly the path the notebook receives.
//!
//! RFC 3986 normalization as Envoy does it (`normalize_path` + `merge_slashes`): percent-encoded
//! unreserved characters are decoded (`%61` → `a`), `.` and `..` segments are resolved, `//` is
//! merged. Where decoding would change the path's structure the request is refused instead of
//! guessed at: an encoded `/` or `\` (`%2F`, `%5C`), an encoded dot segment (`%2e%2e`), a raw
//! backslash, a `..` above the root, control bytes and broken escapes. Case is left alone: Istio
//! matches case-sensitively, so `/notebook/Alice/` simply matches no route of `alice`.

use std::borrow::Cow;

/// Why a path was refused (answered 400, before any routing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path does not start with /")]
    NotAbsolute,
    #[error("the path has an encoded slash or backslash")]
    EncodedSeparator,
    #[error("the path has an encoded dot segment")]
    EncodedDotSegment,
    #[error("the path has a backslash")]
    Backslash,
    #[error("the path climbs above the root")]
    AboveRoot,
    #[error("the path has a malformed percent escape")]
    BadEscape,
    #[error("the path has a control character")]
    ControlCharacter,
}

/// The canonical form of `path` (no query), borrowed when it already is canonical.
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    if is_canonical(bytes)? {
        return Ok(Cow::Borrowed(path));
    }
    let mut segments: Vec<String> = Vec::new();
    let raw_segments: Vec<&str> = path[1..].split('/').collect();
    let last = raw_segments.len() - 1;
    let mut trailing_slash = false;
    for (i, raw) in raw_segments.iter().enumerate() {
        let (segment, encoded_dot) = decode_segment(raw)?;
        let is_last = i == last;
        match segment.as_str() {
            "." | ".." if encoded_dot => return Err(PathError::EncodedDotSegment),
            "" => trailing_slash = is_last,
            "." => trailing_slash = is_last,
            ".." => {
                if segments.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
                trailing_slash = is_last;
            }
            _ => {
                segments.push(segment);
                trailing_slash = false;
            }
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if trailing_slash || segments.is_empty() {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

/// True when nothing needs doing; the common case costs one pass over the bytes.
fn is_canonical(bytes: &[u8]) -> Result<bool, PathError> {
    let mut canonical = true;
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            0..=0x1f | 0x7f => return Err(PathError::ControlCharacter),
            b'\\' => return Err(PathError::Backslash),
            b'%' => canonical = false,
            b'/' => {
                let rest = &bytes[i + 1..];
                if rest.first() == Some(&b'/')
                    || rest == b"."
                    || rest == b".."
                    || rest.starts_with(b"./")
                    || rest.starts_with(b"../")
                {
                    canonical = false;
                }
            }
            _ => {}
        }
    }
    Ok(canonical)
}

/// Decodes the escapes of unreserved characters; other escapes stay as they are. Returns whether
/// a `.` came from an escape.
fn decode_segment(raw: &str) -> Result<(String, bool), PathError> {
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut encoded_dot = false;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            let end = bytes[i..]
                .iter()
                .position(|&b| b == b'%')
                .map_or(bytes.len(), |p| i + p);
            out.push_str(&raw[i..end]);
            i = end;
            continue;
        }
        let hex = bytes.get(i + 1..i + 3).ok_or(PathError::BadEscape)?;
        let value = std::str::from_utf8(hex)
            .ok()
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .ok_or(PathError::BadEscape)?;
        match value {
            b'/' | b'\\' => return Err(PathError::EncodedSeparator),
            0..=0x1f | 0x7f => return Err(PathError::ControlCharacter),
            b'.' => {
                encoded_dot = true;
                out.push('.');
            }
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'~' => out.push(value as char),
            _ => {
                // Reserved or non-ASCII: keep the escape, with upper-case hex as RFC 3986 advises.
                out.push('%');
                out.push_str(&raw[i + 1..i + 3].to_ascii_uppercase());
            }
        }
        i += 3;
    }
    Ok((out, encoded_dot))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(path: &str) -> String {
        normalize_path(path).unwrap().into_owned()
    }

    #[test]
    fn canonical_paths_are_borrowed_unchanged() {
        for path in [
            "/",
            "/notebook/alice/lab/",
            "/notebook/alice/lab/api/kernels",
            "/a.b/.c/d.",
        ] {
            assert!(
                matches!(normalize_path(path), Ok(Cow::Borrowed(p)) if p == path),
                "{path}"
            );
        }
    }

    #[test]
    fn dots_and_double_slashes_resolve() {
        assert_eq!(
            ok("/notebook/alice/lab/../../bob/lab/"),
            "/notebook/bob/lab/"
        );
        assert_eq!(ok("/notebook//bob///lab/"), "/notebook/bob/lab/");
        assert_eq!(ok("/notebook/./bob/lab/."), "/notebook/bob/lab/");
        assert_eq!(ok("/notebook/bob/lab/x/.."), "/notebook/bob/lab/");
        assert_eq!(ok("//"), "/");
    }

    #[test]
    fn unreserved_escapes_decode_and_reserved_ones_stay() {
        assert_eq!(ok("/notebook/%61lice/lab/"), "/notebook/alice/lab/");
        assert_eq!(ok("/files/a%20b%3f"), "/files/a%20b%3F");
        assert_eq!(ok("/files/%7euser"), "/files/~user");
    }

    #[test]
    fn structure_changing_escapes_and_tricks_are_refused() {
        let refused = [
            (
                "/notebook/alice/lab%2F..%2F..%2Fbob/lab/",
                PathError::EncodedSeparator,
            ),
            ("/notebook/alice/lab%2fx", PathError::EncodedSeparator),
            ("/notebook/alice/lab/%5c..", PathError::EncodedSeparator),
            (
                "/notebook/alice/lab/%2e%2e/%2e%2e/bob/lab/",
                PathError::EncodedDotSegment,
            ),
            ("/notebook/alice/lab/.%2e/x", PathError::EncodedDotSegment),
            ("/notebook/alice/lab/..\\..\\bob", PathError::Backslash),
            ("/../etc/passwd", PathError::AboveRoot),
            ("/a/../../b", PathError::AboveRoot),
            ("/bad%zz", PathError::BadEscape),
            ("/bad%2", PathError::BadEscape),
            ("/nul%00", PathError::ControlCharacter),
            ("relative", PathError::NotAbsolute),
            ("*", PathError::NotAbsolute),
        ];
        for (path, error) in refused {
            assert_eq!(normalize_path(path), Err(error), "{path}");
        }
        // A dot inside a name is not a dot segment, encoded or not.
        assert_eq!(ok("/files/%2ebashrc"), "/files/.bashrc");
    }
}
