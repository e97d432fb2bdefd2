//! `portcullis import-haproxy FILE [--out FILE]`: an HAProxy configuration as a portcullis
//! one, and a report of one line per directive (translated / approximated / unsupported).
//!
//! [`lexer`] splits lines as HAProxy does, [`parse`] finds sections and conditions,
//! [`acl`] reads the criteria, [`routes`] turns HAProxy's first-match rules into
//! portcullis's route table, [`translate`] writes the TOML and [`report`] the verdicts.

pub mod acl;
pub mod lexer;
pub mod parse;
pub mod report;
pub mod routes;
pub mod translate;

pub use report::{counts, Line, Status};
pub use translate::{Options, Translation};

/// What the importer made of a file.
pub enum Outcome {
    /// Parsed: the translation (report included).
    Done(Translation),
    /// Not parsable: the error names the line.
    Unparsable(parse::ParseError),
}

/// Imports `text` with the variables of `env`.
pub fn import(text: &str, env: &dyn Fn(&str) -> Option<String>, opts: &Options<'_>) -> Outcome {
    match parse::parse(text, env) {
        Ok(cfg) => Outcome::Done(translate::translate(&cfg, opts)),
        Err(e) => Outcome::Unparsable(e),
    }
}

/// The exit code of a translation: 0 when every directive was translated, 3 otherwise.
pub fn exit_code(t: &Translation) -> u8 {
    let (_, approximated, unsupported) = counts(&t.report);
    if approximated + unsupported == 0 {
        0
    } else {
        3
    }
}
