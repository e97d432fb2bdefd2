//! The structure of an HAProxy configuration: sections and their directives (words of a
//! line), named `defaults` sections and `from`, and the conditions of `if` / `unless`.

use super::lexer::{split_line, LexError};

/// Most sections a file may have (bounds the work of a hostile input).
pub const MAX_SECTIONS: usize = 10_000;

/// What a section header says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Global,
    Defaults,
    Frontend,
    Backend,
    Listen,
    /// `userlist`, `peers`, `resolvers`, `cache`, `http-errors`... read, and reported.
    Other,
}

/// One statement: its line number and words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    pub line: usize,
    pub args: Vec<String>,
}

impl Directive {
    pub fn kw(&self) -> &str {
        self.args.first().map(String::as_str).unwrap_or("")
    }
    pub fn arg(&self, i: usize) -> &str {
        self.args.get(i).map(String::as_str).unwrap_or("")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub kind: Kind,
    /// The keyword as written (`userlist`, `peers`... for [`Kind::Other`]).
    pub keyword: String,
    pub name: String,
    pub line: usize,
    /// `listen NAME ADDR`: the address given on the header line (old syntax).
    pub header_bind: Option<String>,
    /// For a proxy: the index in [`Config::sections`] of the defaults it inherits.
    pub defaults: Option<usize>,
    pub directives: Vec<Directive>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    pub sections: Vec<Section>,
}

/// A file that cannot be read as HAProxy's language: its line, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub why: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.why)
    }
}

fn section_kind(kw: &str) -> Option<Kind> {
    Some(match kw {
        "global" => Kind::Global,
        "defaults" => Kind::Defaults,
        "frontend" => Kind::Frontend,
        "backend" => Kind::Backend,
        "listen" => Kind::Listen,
        "userlist" | "peers" | "resolvers" | "mailers" | "program" | "http-errors" | "cache"
        | "ring" | "log-forward" | "crt-store" | "traces" | "dynamic-update" | "fcgi-app"
        | "acme" => Kind::Other,
        _ => return None,
    })
}

/// The sections of `text`, with environment variables from `env`.
pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ParseError> {
    let mut cfg = Config::default();
    // The defaults section a proxy without `from` inherits: the last one before it.
    let mut last_defaults: Option<usize> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let args = split_line(raw, env).map_err(|LexError(why)| ParseError { line, why })?;
        let Some(kw) = args.first() else { continue };
        if let Some(kind) = section_kind(kw) {
            if cfg.sections.len() >= MAX_SECTIONS {
                return Err(ParseError {
                    line,
                    why: format!("more than {MAX_SECTIONS} sections"),
                });
            }
            let s = header(kind, &args, line, &cfg, last_defaults)?;
            if kind == Kind::Defaults {
                last_defaults = Some(cfg.sections.len());
            }
            cfg.sections.push(s);
            continue;
        }
        match cfg.sections.last_mut() {
            Some(s) => s.directives.push(Directive { line, args }),
            None => {
                return Err(ParseError {
                    line,
                    why: format!("unknown keyword '{kw}' out of section"),
                })
            }
        }
    }
    Ok(cfg)
}

/// A section's header line: its name, the defaults it inherits, and (`listen NAME ADDR`)
/// its address.
fn header(
    kind: Kind,
    args: &[String],
    line: usize,
    cfg: &Config,
    last_defaults: Option<usize>,
) -> Result<Section, ParseError> {
    let fail = |why: String| ParseError { line, why };
    let kw = args[0].clone();
    let mut rest: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    let from = from_clause(kind, &kw, &mut rest).map_err(fail)?;
    let name = rest.first().map(|s| (*s).to_string()).unwrap_or_default();
    check_name(kind, &kw, &name).map_err(fail)?;
    let header_bind = header_bind(kind, &rest).map_err(fail)?;
    let defaults = match from {
        Some(f) => Some(named_defaults(cfg, &f).map_err(fail)?),
        None if proxy_like(kind) => last_defaults,
        None => None,
    };
    if let Some(c) = name_clash(cfg, kind, &name) {
        return Err(fail(format!(
            "'{kw} {name}' has the same name as the section at line {}",
            c.line
        )));
    }
    Ok(Section {
        kind,
        keyword: kw,
        name,
        line,
        header_bind,
        defaults,
        directives: Vec::new(),
    })
}

/// `from NAME` (2.x): the named defaults section this one inherits; taken off `rest`.
fn from_clause(kind: Kind, kw: &str, rest: &mut Vec<&str>) -> Result<Option<String>, String> {
    let Some(p) = rest.iter().position(|a| *a == "from") else {
        return Ok(None);
    };
    if !matches!(
        kind,
        Kind::Defaults | Kind::Frontend | Kind::Backend | Kind::Listen
    ) {
        return Err(format!("'from' is not allowed in a '{kw}' section"));
    }
    let Some(name) = rest.get(p + 1) else {
        return Err("'from' needs the name of a defaults section".into());
    };
    let from = (*name).to_string();
    if rest.len() > p + 2 {
        return Err(format!("unexpected '{}' after 'from {name}'", rest[p + 2]));
    }
    rest.truncate(p);
    Ok(Some(from))
}

/// A proxy (and most other sections) needs a name, of HAProxy's characters.
fn check_name(kind: Kind, kw: &str, name: &str) -> Result<(), String> {
    let needs_name = matches!(
        kind,
        Kind::Frontend | Kind::Backend | Kind::Listen | Kind::Other
    );
    if needs_name && name.is_empty() && kw != "program" {
        return Err(format!("'{kw}' needs a name"));
    }
    if !name.is_empty()
        && !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
    {
        return Err(format!(
            "invalid character in the name '{name}' (letters, digits, '-', '_', '.', ':')"
        ));
    }
    Ok(())
}

/// The words after the name: none, but a `listen`'s address (the old syntax).
fn header_bind(kind: Kind, rest: &[&str]) -> Result<Option<String>, String> {
    match (kind, rest.len()) {
        (Kind::Global, n) if n > 0 => Err(format!("'global' takes no argument, got '{}'", rest[0])),
        (Kind::Listen, 2) => Ok(Some(rest[1].to_string())),
        (Kind::Frontend | Kind::Backend | Kind::Defaults, n) if n > 1 => {
            Err(format!("unexpected '{}' after the name", rest[1]))
        }
        _ => Ok(None),
    }
}

/// The index of the last defaults section named `name` before this line.
fn named_defaults(cfg: &Config, name: &str) -> Result<usize, String> {
    cfg.sections
        .iter()
        .rposition(|s| s.kind == Kind::Defaults && s.name == name)
        .ok_or_else(|| {
            format!("'from {name}': no defaults section named '{name}' before this line")
        })
}

/// The earlier section whose name this one takes: proxies have names of their own (a
/// frontend and a backend may share one), and so have defaults sections; the other
/// sections (`userlist`, `peers`...) are not checked.
fn name_clash<'c>(cfg: &'c Config, kind: Kind, name: &str) -> Option<&'c Section> {
    if name.is_empty() {
        return None;
    }
    cfg.sections.iter().find(|s| {
        s.name == name
            && s.kind != Kind::Other
            && kind != Kind::Other
            && proxy_like(s.kind) == proxy_like(kind)
            && !(s.kind == Kind::Frontend && kind == Kind::Backend)
            && !(s.kind == Kind::Backend && kind == Kind::Frontend)
    })
}

fn proxy_like(k: Kind) -> bool {
    matches!(k, Kind::Frontend | Kind::Backend | Kind::Listen)
}

// ---------------------------------------------------------------------------------------
// Conditions

/// One ACL term of a condition: a named ACL or an anonymous `{ ... }` one, maybe negated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    Named(String),
    /// The words between the braces: criterion, flags, values.
    Anonymous(Vec<String>),
}

/// `if` / `unless` and the condition in disjunctive form: OR of ANDs of (negated?, term).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub unless: bool,
    pub or: Vec<Vec<(bool, Term)>>,
}

/// Splits `args` at its `if` / `unless` word: the words before it and the condition.
pub fn split_condition(args: &[String]) -> Result<(Vec<String>, Option<Condition>), String> {
    let Some(p) = args.iter().position(|a| a == "if" || a == "unless") else {
        return Ok((args.to_vec(), None));
    };
    let unless = args[p] == "unless";
    let cond = parse_condition(&args[p + 1..])?;
    Ok((args[..p].to_vec(), Some(Condition { unless, or: cond })))
}

fn parse_condition(words: &[String]) -> Result<Vec<Vec<(bool, Term)>>, String> {
    if words.is_empty() {
        return Err("missing condition after 'if'/'unless'".into());
    }
    let mut or: Vec<Vec<(bool, Term)>> = vec![Vec::new()];
    let mut i = 0;
    while i < words.len() {
        let w = words[i].as_str();
        if w == "||" || w == "or" {
            if or.last().is_some_and(Vec::is_empty) {
                return Err(format!("'{w}' with nothing before it"));
            }
            or.push(Vec::new());
            i += 1;
            continue;
        }
        let (neg, w) = match w.strip_prefix('!') {
            Some("") => {
                i += 1;
                match words.get(i) {
                    Some(n) => (true, n.as_str()),
                    None => return Err("'!' at the end of the condition".into()),
                }
            }
            Some(rest) => (true, rest),
            None => (false, w),
        };
        let term = if w == "{" {
            let Some(close) = words[i + 1..].iter().position(|x| x == "}") else {
                return Err("'{' without its '}'".into());
            };
            let inner = words[i + 1..i + 1 + close].to_vec();
            if inner.is_empty() {
                return Err("empty anonymous ACL '{ }'".into());
            }
            i += close + 2;
            Term::Anonymous(inner)
        } else if w == "}" {
            return Err("'}' without its '{'".into());
        } else {
            i += 1;
            Term::Named(w.to_string())
        };
        if let Some(last) = or.last_mut() {
            last.push((neg, term));
        }
    }
    if or.last().is_some_and(Vec::is_empty) {
        return Err("condition ends with '||'".into());
    }
    Ok(or)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn sections_and_directives_with_lines() {
        let c = match parse(
            "# head\nglobal\n  maxconn 10\n\ndefaults\n  mode http\nfrontend fe\n  bind :80\nbackend be\n  server a 1.2.3.4:80\n",
            &no_env,
        ) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        let kinds: Vec<Kind> = c.sections.iter().map(|s| s.kind).collect();
        assert_eq!(
            kinds,
            [Kind::Global, Kind::Defaults, Kind::Frontend, Kind::Backend]
        );
        assert_eq!(c.sections[0].directives[0].line, 3);
        assert_eq!(c.sections[2].defaults, Some(1));
        assert_eq!(
            c.sections[3].directives[0].args,
            words("server a 1.2.3.4:80")
        );
    }

    #[test]
    fn named_defaults_and_from() {
        let c = match parse(
            "defaults base\n mode http\ndefaults other\n mode tcp\nbackend b from base\n server a 1.1.1.1:1\nbackend c\n server a 1.1.1.1:1\n",
            &no_env,
        ) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(c.sections[2].defaults, Some(0));
        assert_eq!(c.sections[3].defaults, Some(1));
        let e = parse("backend b from nowhere\n", &no_env);
        assert_eq!(e.map_err(|e| e.line), Err(1));
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(parse("maxconn 1\n", &no_env).map_err(|e| e.line), Err(1));
        assert_eq!(
            parse("global\n  log \"oops\n", &no_env).map_err(|e| e.line),
            Err(2)
        );
        assert_eq!(
            parse("global\nfrontend\n", &no_env).map_err(|e| e.line),
            Err(2)
        );
        assert_eq!(
            parse("backend a\nbackend a\n", &no_env).map_err(|e| e.line),
            Err(2)
        );
        // a frontend and a backend may share a name
        assert!(parse("frontend a\nbackend a\n", &no_env).is_ok());
    }

    #[test]
    fn conditions_or_and_negation_anonymous() {
        let (head, c) = match split_condition(&words(
            "use_backend api if is_api !{ src 10.0.0.0/8 } || { path_beg /v2 } or !is_admin",
        )) {
            Ok((h, Some(c))) => (h, c),
            other => panic!("{other:?}"),
        };
        assert_eq!(head, words("use_backend api"));
        assert!(!c.unless);
        assert_eq!(c.or.len(), 3);
        assert_eq!(c.or[0][0], (false, Term::Named("is_api".into())));
        assert_eq!(c.or[0][1], (true, Term::Anonymous(words("src 10.0.0.0/8"))));
        assert_eq!(c.or[2][0], (true, Term::Named("is_admin".into())));
        assert!(split_condition(&words("deny if { path_beg /a")).is_err());
        assert!(split_condition(&words("deny if a ||")).is_err());
        assert!(split_condition(&words("deny if")).is_err());
        assert!(split_condition(&words("deny unless ! ")).is_err());
    }
}
