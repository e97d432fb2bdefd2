//! Find `line:column` of a key path (`upstreams[1].backends[0]`) in TOML text,
//! so validation errors point at the offending line like parse errors do.

use toml_edit::{ImDocument, Item, Value};

/// 1-based line and column of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(offset, |nl| offset - nl - 1) + 1;
    (line, col)
}

enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

fn segments(path: &str) -> Vec<Seg<'_>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (name, rest) = part.split_once('[').unwrap_or((part, ""));
        if !name.is_empty() {
            out.push(Seg::Key(name));
        }
        for idx in rest.split('[') {
            if let Ok(i) = idx.trim_end_matches(']').parse() {
                out.push(Seg::Index(i));
            }
        }
    }
    out
}

/// A node of the document while walking a path: tables hold `Item`s, inline
/// tables and arrays hold `Value`s.
#[derive(Clone, Copy)]
enum Node<'a> {
    Item(&'a Item),
    Value(&'a Value),
    Table(&'a toml_edit::Table),
}

/// Best-effort location of `path`: the deepest part of the path that exists.
pub fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let doc = ImDocument::parse(text).ok()?;
    let mut node = Node::Table(doc.as_table());
    let mut best = None;
    for seg in segments(path) {
        let (span, next) = step(node, &seg);
        best = span.or(best);
        match next {
            Some(n) => node = n,
            None => break,
        }
    }
    best.map(|s| line_col(text, s.start))
}

type Span = Option<std::ops::Range<usize>>;

fn step<'a>(node: Node<'a>, seg: &Seg<'_>) -> (Span, Option<Node<'a>>) {
    match (node, seg) {
        (Node::Table(t), Seg::Key(k)) | (Node::Item(Item::Table(t)), Seg::Key(k)) => {
            let span = t.key(k).and_then(|key| key.span());
            (span, t.get(k).map(Node::Item))
        }
        (Node::Item(Item::Value(v)), s) => step(Node::Value(v), s),
        (Node::Value(Value::InlineTable(t)), Seg::Key(k)) => {
            let span = t.key(k).and_then(|key| key.span());
            (span, t.get(k).map(Node::Value))
        }
        (Node::Item(Item::ArrayOfTables(a)), Seg::Index(i)) => {
            let t = a.get(*i);
            (t.and_then(|t| t.span()), t.map(Node::Table))
        }
        (Node::Value(Value::Array(a)), Seg::Index(i)) => {
            let v = a.get(*i);
            (v.and_then(|v| v.span()), v.map(Node::Value))
        }
        _ => (None, None),
    }
}

/// The key path of the line holding byte `offset`, read from the table headers
/// and `key =` lines up to it. For errors the TOML parser reports with a
/// position but without a path (an integer too large, invalid UTF-8), where the
/// document cannot be parsed to walk it.
pub fn path_at(text: &str, offset: usize) -> Option<String> {
    let mut table = String::new();
    let mut arrays: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut key: Option<String> = None;
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        pos += line.len();
        let t = line.trim();
        if let Some(h) = t.strip_prefix("[[") {
            let name = header_name(h.split("]]").next().unwrap_or(""));
            let n = arrays
                .entry(name.clone())
                .and_modify(|n| *n += 1)
                .or_insert(0);
            table = format!("{name}[{n}]");
            key = None;
        } else if let Some(h) = t.strip_prefix('[') {
            let name = header_name(h.split(']').next().unwrap_or(""));
            // `[upstreams.x]` inside the current `[[upstreams]]` entry.
            table = match name.split_once('.') {
                Some((head, tail)) => match arrays.get(head) {
                    Some(n) => format!("{head}[{n}].{tail}"),
                    None => name,
                },
                None => name,
            };
            key = None;
        } else if let Some(k) = line_key(t) {
            key = Some(k);
        }
        if offset < pos {
            break;
        }
    }
    let path = match key {
        Some(k) if table.is_empty() => k,
        Some(k) => format!("{table}.{k}"),
        None => table,
    };
    (!path.is_empty()).then_some(path)
}

/// `a . "b"` → `a.b`.
fn header_name(h: &str) -> String {
    h.split('.')
        .map(|p| p.trim().trim_matches(['"', '\'', '[', ']']))
        .collect::<Vec<_>>()
        .join(".")
}

/// The key of a `key = value` line (quotes removed), if the line is one.
fn line_key(t: &str) -> Option<String> {
    if t.starts_with('#') {
        return None;
    }
    let mut quote = None;
    for (i, c) in t.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '=') => {
                let k = header_name(&t[..i]);
                return (!k.is_empty()).then_some(k);
            }
            (None, '#' | '[' | '{' | ',') => return None,
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_at_follows_tables_and_arrays_of_tables() {
        let text = "[server]\nthreads = 2\n\n[[upstreams]]\nname = \"a\"\n[[upstreams]]\nname = \"b\"\nbackends = [\n  \"x\",\n]\n[rate_limit.keys]\n\"k-1\" = 5\n";
        let at = |needle: &str| path_at(text, text.find(needle).expect("needle"));
        assert_eq!(at("2").as_deref(), Some("server.threads"));
        assert_eq!(at("\"b\"").as_deref(), Some("upstreams[1].name"));
        assert_eq!(at("\"x\"").as_deref(), Some("upstreams[1].backends"));
        assert_eq!(at("5").as_deref(), Some("rate_limit.keys.k-1"));
        assert_eq!(path_at("x = 1", 4).as_deref(), Some("x"));
    }
}
