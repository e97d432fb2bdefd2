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
