//! Images of chat `image_url` content parts: `data:` URLs (base64 PNG, JPEG or WebP) and, under
//! `--allowed-local-media-path`, local `file://` paths. Remote http(s) URLs are refused (the
//! server fetches nothing). Every failure is a 400 naming the field.

use super::errors::ApiError;
use super::state::Settings;
use base64::Engine as _;
use dayone_engine::vision::{decode_image, RgbImage};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Decodes the image `url` names; `field` names the request field in errors.
pub fn load_image_url(
    url: &str,
    settings: &Settings,
    field: &str,
) -> Result<Arc<RgbImage>, ApiError> {
    let bytes = if let Some(rest) = url.strip_prefix("data:") {
        // RFC 2397: data:[<media type>][;base64],<data>
        let (head, data) = rest.split_once(',').ok_or_else(|| {
            ApiError::bad_field(field, "a data: URL needs a comma before its data")
        })?;
        if !head.ends_with(";base64") {
            return Err(ApiError::bad_field(
                field,
                "only base64 data: URLs are accepted (data:image/png;base64,...)",
            ));
        }
        let media = head.trim_end_matches(";base64");
        if !media.is_empty() && !media.starts_with("image/") {
            return Err(ApiError::bad_field(
                field,
                format!("data: URL media type '{media}' is not an image (expected image/png, image/jpeg or image/webp)"),
            ));
        }
        let clean: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        base64::engine::general_purpose::STANDARD
            .decode(clean.as_bytes())
            .map_err(|e| {
                ApiError::bad_field(field, format!("invalid base64 in the data: URL: {e}"))
            })?
    } else if let Some(rest) = url.strip_prefix("file://") {
        let Some(root) = &settings.allowed_local_media_path else {
            return Err(ApiError::bad_field(
                field,
                "local image files are refused: start the server with --allowed-local-media-path DIR to allow files under DIR",
            ));
        };
        let path = file_url_path(rest).map_err(|e| ApiError::bad_field(field, e))?;
        read_under(&path, root).map_err(|e| ApiError::bad_field(field, e))?
    } else if url.starts_with("http://") || url.starts_with("https://") {
        return Err(ApiError::bad_field(
            field,
            "remote image URLs are not fetched: send the image inline as a data: URL (data:image/png;base64,...)",
        ));
    } else {
        return Err(ApiError::bad_field(
            field,
            "expected a data: URL (data:image/png;base64,...) or a file:// URL",
        ));
    };
    decode_image(&bytes)
        .map(Arc::new)
        .map_err(|e| ApiError::bad_field(field, format!("bad image: {e}")))
}

/// The local path of a `file://` URL's remainder `rest` (RFC 8089): an empty host or
/// `localhost`, then an absolute path, percent-decoded (`my%20cat.png` is `my cat.png`).
///
/// Errors (as text for the 400): another host, a path that is not absolute, or one that does not
/// decode to UTF-8.
fn file_url_path(rest: &str) -> Result<PathBuf, String> {
    let (host, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if !host.is_empty() && !host.eq_ignore_ascii_case("localhost") {
        return Err(format!(
            "file://{host}/… names the host '{host}': only local files are read (file:///path or file://localhost/path)"
        ));
    }
    if path.is_empty() {
        return Err("a file:// URL needs an absolute path (file:///dir/image.png)".into());
    }
    let decoded = percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .map_err(|_| format!("file://{rest}: the percent-decoded path is not UTF-8"))?;
    Ok(PathBuf::from(decoded.as_ref()))
}

/// Where a path that does not exist would be: its deepest existing ancestor with symbolic links
/// resolved, then the rest by name. `None` when the rest climbs (`..`: where that lands depends
/// on links that do not exist yet) or no ancestor resolves.
fn resolve_missing(path: &Path) -> Option<PathBuf> {
    path.ancestors().skip(1).find_map(|anc| {
        let real = anc.canonicalize().ok()?;
        let rest = path.strip_prefix(anc).ok()?;
        (!rest.components().any(|c| c == Component::ParentDir)).then(|| real.join(rest))
    })
}

/// Reads `path` if it lies under the canonical directory `root` once symbolic links are
/// resolved. A path outside `root` is refused as outside whether or not it exists, so the
/// answer does not tell a client which files exist elsewhere.
fn read_under(path: &Path, root: &Path) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let outside = || {
        format!(
            "{shown} is outside --allowed-local-media-path {}",
            root.display()
        )
    };
    let canonical = match path.canonicalize() {
        Ok(p) => p,
        Err(e) if resolve_missing(path).is_some_and(|p| p.starts_with(root)) => {
            return Err(format!("cannot read {shown}: {e}"))
        }
        Err(_) => return Err(outside()),
    };
    if !canonical.starts_with(root) {
        return Err(outside());
    }
    std::fs::read(&canonical).map_err(|e| format!("cannot read {shown}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_urls_decode_their_path_and_host() {
        assert_eq!(
            file_url_path("/tmp/my%20cat.png").unwrap(),
            PathBuf::from("/tmp/my cat.png")
        );
        assert_eq!(
            file_url_path("localhost/tmp/a.png").unwrap(),
            PathBuf::from("/tmp/a.png")
        );
        assert_eq!(
            file_url_path("LOCALHOST/tmp/a.png").unwrap(),
            PathBuf::from("/tmp/a.png")
        );
        assert!(file_url_path("example.com/tmp/a.png")
            .unwrap_err()
            .contains("example.com"));
        assert!(file_url_path("").unwrap_err().contains("absolute path"));
        assert!(file_url_path("/tmp/%ff.png").unwrap_err().contains("UTF-8"));
    }

    #[test]
    fn paths_outside_the_root_are_outside_whether_or_not_they_exist() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("media");
        std::fs::create_dir(&root).unwrap();
        let root = root.canonicalize().unwrap();
        std::fs::write(root.join("in.png"), b"x").unwrap();
        std::fs::write(dir.path().join("out.png"), b"x").unwrap();
        assert_eq!(read_under(&root.join("in.png"), &root).unwrap(), b"x");
        for p in [
            dir.path().join("out.png"),
            dir.path().join("missing.png"),
            root.join("../out.png"),
            root.join("../missing.png"),
        ] {
            let e = read_under(&p, &root).unwrap_err();
            assert!(e.contains("outside"), "{}: {e}", p.display());
        }
        let e = read_under(&root.join("missing.png"), &root).unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
        // A link inside the root to a directory outside it: a missing file behind it is outside
        // too (else the answer would tell which files exist there).
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("there.png"), b"x").unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("link")).unwrap();
        for name in ["link/there.png", "link/missing.png", "link/../missing.png"] {
            let e = read_under(&root.join(name), &root).unwrap_err();
            assert!(e.contains("outside"), "{name}: {e}");
        }
    }
}
