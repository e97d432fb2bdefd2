//! Configuration from the environment (CONTRACT §13): a string value may hold `${NAME}` or
//! `${NAME:-default}`, replaced from the environment when the file is read (start,
//! `--check`, reload); `$$` is a literal `$`.
//!
//! Only string values are expanded, never keys, numbers or booleans: the file is parsed
//! (keeping spans), each string value holding a `$` is expanded, and its text in the file
//! is replaced by the result written as a one-line TOML string; the serde schema then
//! reads that text, so every other error keeps its key path and line. A value from the
//! environment is never expanded again (no recursion), and an error names the variable,
//! never a value (a Redis password may come from the environment).

use std::borrow::Cow;

use toml_edit::{ImDocument, Item, Value};

/// What is wrong with a `${…}` in a string value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpandError {
    /// `${NAME}` with `NAME` unset (or not UTF-8) and no default.
    Unset(String),
    /// `${` without its `}`, or what is between them is not `NAME` or `NAME:-default`.
    Malformed(String),
}

impl std::fmt::Display for ExpandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExpandError::Unset(name) => write!(
                f,
                "environment variable {name} is not set (write ${{{name}:-default}} for a default)"
            ),
            ExpandError::Malformed(what) => write!(
                f,
                "invalid {what}: expected ${{NAME}} or ${{NAME:-default}} (NAME: letters, digits, _), or $$ for a literal $"
            ),
        }
    }
}

fn is_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// `s` with each `${NAME}` replaced by `lookup(NAME)`, each `${NAME:-default}` by
/// `lookup(NAME)` or, when that is unset or empty, `default` (taken as written), and each
/// `$$` by `$`. A `$` followed by anything else stays as it is. What `lookup` returns is
/// inserted as is (never expanded again).
pub fn expand<'s>(
    s: &'s str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Cow<'s, str>, ExpandError> {
    if !s.contains('$') {
        return Ok(Cow::Borrowed(s));
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('{') {
            let Some(end) = inner.find('}') else {
                let shown: String = rest.chars().take(40).collect();
                return Err(ExpandError::Malformed(format!("{shown:?} (no closing }})")));
            };
            let body = &inner[..end];
            let (name, default) = match body.split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (body, None),
            };
            if !is_name(name) {
                return Err(ExpandError::Malformed(format!("${{{body}}}")));
            }
            match (lookup(name), default) {
                (Some(v), Some(_)) if !v.is_empty() => out.push_str(&v),
                (Some(v), None) => out.push_str(&v),
                (_, Some(default)) => out.push_str(default),
                (None, None) => return Err(ExpandError::Unset(name.to_string())),
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(Cow::Owned(out))
}

/// A variable of the process environment (`None` when unset or not UTF-8).
pub fn from_process(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Where expanding the config text failed: key path, byte offset of the value, reason.
pub type TextError = (String, usize, String);

/// `text` with every string value expanded (see the module). Text that does not parse is
/// returned as it is: the schema's parser then reports the syntax error.
pub fn expand_text<'t>(
    text: &'t str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Cow<'t, str>, TextError> {
    if !text.contains('$') {
        return Ok(Cow::Borrowed(text));
    }
    let Ok(doc) = ImDocument::parse(text) else {
        return Ok(Cow::Borrowed(text));
    };
    // (span of the value's text, its expansion), in document order.
    let mut edits: Vec<(std::ops::Range<usize>, String)> = Vec::new();
    let mut path = String::new();
    walk_table(doc.as_table(), &mut path, lookup, &mut edits)?;
    if edits.is_empty() {
        return Ok(Cow::Borrowed(text));
    }
    edits.sort_by_key(|(span, _)| span.start);
    let mut out = String::with_capacity(text.len() + 64);
    let mut at = 0;
    for (span, value) in edits {
        out.push_str(&text[at..span.start]);
        basic_string(&mut out, &value);
        at = span.end;
    }
    out.push_str(&text[at..]);
    Ok(Cow::Owned(out))
}

fn walk_table(
    t: &toml_edit::Table,
    path: &mut String,
    lookup: &dyn Fn(&str) -> Option<String>,
    edits: &mut Vec<(std::ops::Range<usize>, String)>,
) -> Result<(), TextError> {
    for (k, item) in t.iter() {
        let len = path.len();
        push_key(path, k);
        walk_item(item, path, lookup, edits)?;
        path.truncate(len);
    }
    Ok(())
}

fn push_key(path: &mut String, k: &str) {
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(k);
}

fn walk_item(
    item: &Item,
    path: &mut String,
    lookup: &dyn Fn(&str) -> Option<String>,
    edits: &mut Vec<(std::ops::Range<usize>, String)>,
) -> Result<(), TextError> {
    match item {
        Item::Value(v) => walk_value(v, path, lookup, edits),
        Item::Table(t) => walk_table(t, path, lookup, edits),
        Item::ArrayOfTables(a) => {
            for (i, t) in a.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                walk_table(t, path, lookup, edits)?;
                path.truncate(len);
            }
            Ok(())
        }
        Item::None => Ok(()),
    }
}

fn walk_value(
    v: &Value,
    path: &mut String,
    lookup: &dyn Fn(&str) -> Option<String>,
    edits: &mut Vec<(std::ops::Range<usize>, String)>,
) -> Result<(), TextError> {
    match v {
        Value::String(s) => {
            let span = s.span().unwrap_or(0..0);
            match expand(s.value(), lookup) {
                Ok(Cow::Borrowed(_)) => {}
                Ok(Cow::Owned(new)) if !span.is_empty() => edits.push((span, new)),
                Ok(Cow::Owned(_)) => {}
                Err(e) => return Err((path.clone(), span.start, e.to_string())),
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                walk_value(v, path, lookup, edits)?;
                path.truncate(len);
            }
        }
        Value::InlineTable(t) => {
            for (k, v) in t.iter() {
                let len = path.len();
                push_key(path, k);
                walk_value(v, path, lookup, edits)?;
                path.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

/// `s` as a one-line TOML basic string.
fn basic_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("10.0.0.5".into()),
            "EMPTY" => Some(String::new()),
            "DOLLARS" => Some("a${HOST}b$$c".into()),
            "QUOTED" => Some("x\"y\\z\nw".into()),
            _ => None,
        }
    }

    fn ok(s: &str) -> String {
        expand(s, env).expect("expands").into_owned()
    }

    #[test]
    fn set_default_and_literal_dollar() {
        assert_eq!(ok("${HOST}:6379"), "10.0.0.5:6379");
        assert_eq!(
            ok("redis://${HOST}:${PORT:-6379}/0"),
            "redis://10.0.0.5:6379/0"
        );
        assert_eq!(ok("${HOST:-other}"), "10.0.0.5");
        assert_eq!(ok("${UNSET:-}"), "");
        // `:-` as in the shell: an empty value takes the default too.
        assert_eq!(ok("${EMPTY:-d}"), "d");
        assert_eq!(ok("${EMPTY}"), "");
        assert_eq!(ok("pa$$word"), "pa$word");
        assert_eq!(ok("$${HOST}"), "${HOST}");
        assert_eq!(ok("$$$$"), "$$");
        // A default is taken as written: `$$` and `${` in it are not expanded.
        assert_eq!(ok("${UNSET:-a$$b}"), "a$$b");
        // A `$` before anything else stays.
        assert_eq!(ok("cost: 5$ or $HOST"), "cost: 5$ or $HOST");
        assert_eq!(ok("end$"), "end$");
        assert!(matches!(expand("plain", env), Ok(Cow::Borrowed("plain"))));
    }

    #[test]
    fn values_are_never_expanded_again() {
        assert_eq!(ok("${DOLLARS}"), "a${HOST}b$$c");
        assert_eq!(ok("${QUOTED}"), "x\"y\\z\nw");
    }

    #[test]
    fn unset_and_malformed_are_errors_naming_the_variable() {
        assert_eq!(
            expand("x${NOPE}y", env),
            Err(ExpandError::Unset("NOPE".into()))
        );
        assert!(expand("${NOPE}", env)
            .unwrap_err()
            .to_string()
            .contains("environment variable NOPE is not set"));
        for bad in ["${", "${HOST", "${}", "${1X}", "${A-B}", "${A B}", "${:-x}"] {
            assert!(
                matches!(expand(bad, env), Err(ExpandError::Malformed(_))),
                "{bad}"
            );
        }
    }

    fn text(t: &str) -> Result<String, TextError> {
        expand_text(t, &env).map(Cow::into_owned)
    }

    #[test]
    fn only_string_values_with_exact_key_paths() {
        let t = "[server]\nadmin_token = \"${HOST}\"\n# ${NOPE} in a comment\n\
                 [[upstreams]]\nname = \"a\"\n[[upstreams]]\nname = \"b\"\nbackends = [\"x\", \"${HOST}:80\"]\n\
                 [rate_limit.keys]\n\"${NOPE}\" = 5\n";
        let out = text(t).expect("expands");
        assert!(out.contains("admin_token = \"10.0.0.5\"\n"), "{out}");
        assert!(
            out.contains("backends = [\"x\", \"10.0.0.5:80\"]\n"),
            "{out}"
        );
        assert!(out.contains("# ${NOPE} in a comment"), "comments untouched");
        assert!(out.contains("\"${NOPE}\" = 5"), "keys untouched");
        assert_eq!(out.lines().count(), t.lines().count());

        let t = "[[upstreams]]\nname = \"a\"\n[[upstreams]]\nname = \"b\"\nbackends = [\"x\", \"${NOPE}:80\"]\n";
        let (path, at, reason) = text(t).unwrap_err();
        assert_eq!(path, "upstreams[1].backends[1]");
        assert_eq!(&t[at..at + 6], "\"${NOP");
        assert!(reason.contains("NOPE"), "{reason}");

        let t = "[redis]\nurl = { a = \"${NOPE}\" }\n";
        assert_eq!(text(t).unwrap_err().0, "redis.url.a");
    }

    #[test]
    fn expanded_values_are_written_back_as_valid_toml() {
        let t = "a = '${QUOTED}'\nb = \"\"\"\n$$x\"\"\"\nn = 5\n";
        let out = text(t).expect("expands");
        let v: toml::Table = toml::from_str(&out).expect("valid TOML");
        assert_eq!(v["a"].as_str(), Some("x\"y\\z\nw"));
        assert_eq!(v["b"].as_str(), Some("$x"));
        assert_eq!(v["n"].as_integer(), Some(5));
        assert!(matches!(expand_text("x = 1\n", &env), Ok(Cow::Borrowed(_))));
    }
}
