//! Images of chat `image_url` content parts: `data:` URLs (base64 PNG, JPEG or WebP) and, under
//! `--allowed-local-media-path`, local `file://` paths. Remote http(s) URLs are refused (the
//! server fetches nothing). Every failure is a 400 naming the field.

use super::errors::ApiError;
use super::state::Settings;
use base64::Engine as _;
use dayone_engine::vision::{decode_image, RgbImage};
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
    } else if let Some(path) = url.strip_prefix("file://") {
        let Some(root) = &settings.allowed_local_media_path else {
            return Err(ApiError::bad_field(
                field,
                "local image files are refused: start the server with --allowed-local-media-path DIR to allow files under DIR",
            ));
        };
        let p = std::path::Path::new(path)
            .canonicalize()
            .map_err(|e| ApiError::bad_field(field, format!("cannot read {path}: {e}")))?;
        if !p.starts_with(root) {
            return Err(ApiError::bad_field(
                field,
                format!(
                    "{path} is outside --allowed-local-media-path {}",
                    root.display()
                ),
            ));
        }
        std::fs::read(&p)
            .map_err(|e| ApiError::bad_field(field, format!("cannot read {path}: {e}")))?
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
