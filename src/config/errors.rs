//! Validation of `[errors]`: the format, and each page read (a regular file of at most
//! 64 KiB) and split into its parts, at load and on every reload (a page that turns
//! unreadable fails the reload, and the pages the proxy has stay).

use std::path::Path;

use super::check::{err, VResult};
use super::schema::{ErrorFormatSection, ErrorsSection};
use super::FileKind;
use crate::respond::body::{ErrorBodies, Format, Page};

pub(super) fn validate_errors(e: &ErrorsSection) -> VResult<ErrorBodies> {
    let format = match e.format {
        ErrorFormatSection::Text => Format::Text,
        ErrorFormatSection::ProblemJson => Format::ProblemJson,
    };
    let mut pages = Vec::with_capacity(e.pages.len());
    for (key, page) in &e.pages {
        let at = format!("errors.pages.{key}");
        let status = match key.parse::<u16>() {
            Ok(s) if (400..=599).contains(&s) && key.len() == 3 => s,
            _ => {
                return err(
                    at,
                    format!("{key:?} is not a status the proxy answers with (400 to 599)"),
                )
            }
        };
        if page.file.is_empty() {
            return err(format!("{at}.file"), "the page's file is required");
        }
        let content_type = match http::HeaderValue::from_str(&page.content_type) {
            Ok(v) if !page.content_type.trim().is_empty() => v,
            _ => {
                return err(
                    format!("{at}.content_type"),
                    format!("{:?} is not a valid Content-Type", page.content_type),
                )
            }
        };
        let template = match super::read_regular_file(Path::new(&page.file), FileKind::Page) {
            Ok(b) => b,
            Err(why) => {
                return err(
                    format!("{at}.file"),
                    format!("cannot read {:?}: {why}", page.file),
                )
            }
        };
        pages.push((status, Page::new(status, &template, content_type)));
    }
    Ok(ErrorBodies::new(format, pages))
}
