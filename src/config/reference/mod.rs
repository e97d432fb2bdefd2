//! The configuration reference, generated from the JSON Schema of the file (`schema.rs`,
//! the types the parser reads): every key with its type, default, allowed values and
//! description. One source, three outputs: `--print-config-schema` (editors),
//! `--print-config-reference` (the book's reference page, `docs/src/reference/config.md`)
//! and the `portcullis.toml(5)` man page (`--print-man portcullis.toml`).

use serde_json::{Map, Value};

mod render;

pub use render::{anchor, man_page, markdown, roff_text};

/// The sections in the order the reference lists them; any other top-level key follows
/// in alphabetical order, so a new section is never left out.
const ORDER: &[&str] = &[
    "server",
    "tls",
    "redis",
    "upstreams",
    "routes",
    "shedding",
    "rate_limit",
    "tenants",
    "tiers",
    "jwt",
    "culling",
    "budget",
    "watchdog",
    "access_log",
    "tracing",
    "log",
    "errors",
];

/// One table of the file: `[server]`, `[[upstreams]]`, `[upstreams.health_check]`...
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    /// How the file writes it: `[server]`, `[[routes]]`, `[tiers.NAME]`.
    pub header: String,
    pub description: String,
    pub keys: Vec<Key>,
}

/// One key of a section.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    pub name: String,
    /// `integer`, `string`, `array of strings`, `table`...
    pub kind: String,
    /// As TOML writes it, `required`, or `none`.
    pub default: String,
    /// A range (`1–1024`), the values of an enumeration, or "".
    pub allowed: String,
    pub description: String,
    /// The header of the section this key opens (`[upstreams.health_check]`), if any.
    pub table: Option<String>,
    /// An enumeration's values with what each means.
    pub choices: Vec<(String, String)>,
}

/// Every section of the file, in reference order.
pub fn sections() -> Vec<Section> {
    let schema = super::schema::json_schema();
    let defs = schema
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let props = schema
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut names: Vec<&String> = props.keys().collect();
    names.sort_by_key(|n| {
        (
            ORDER.iter().position(|o| o == n).unwrap_or(ORDER.len()),
            n.to_string(),
        )
    });
    let mut out = Vec::new();
    for name in names {
        let prop = &props[name];
        if let Some((header, def)) = table_of(name, name, prop, &defs) {
            walk(&header, name, &description(prop), &def, &defs, &mut out);
        }
    }
    out
}

/// `$ref` resolved against `$defs`.
fn resolve<'a>(v: &'a Value, defs: &'a Map<String, Value>) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => r
            .strip_prefix("#/$defs/")
            .and_then(|n| defs.get(n))
            .unwrap_or(v),
        None => v,
    }
}

/// The object schema `v` stands for, if it is one (directly, through `$ref`, or as the
/// object choice of an `anyOf`).
fn object_of(v: &Value, defs: &Map<String, Value>) -> Option<Value> {
    let r = resolve(v, defs);
    if r.get("properties").is_some() {
        return Some(r.clone());
    }
    r.get("anyOf")
        .and_then(Value::as_array)?
        .iter()
        .map(|c| resolve(c, defs))
        .find(|c| c.get("properties").is_some())
        .cloned()
}

/// If the key `name` (at dotted `path`) holds a table, an array of tables or a map of
/// tables: the header the file writes for it, and the table's schema.
fn table_of(
    path: &str,
    name: &str,
    prop: &Value,
    defs: &Map<String, Value>,
) -> Option<(String, Value)> {
    let _ = name;
    if let Some(obj) = object_of(prop, defs) {
        if resolve(prop, defs).get("properties").is_some() {
            return Some((format!("[{path}]"), obj));
        }
    }
    if let Some(items) = resolve(prop, defs).get("items") {
        if let Some(obj) = object_of(items, defs) {
            let alone = resolve(items, defs).get("properties").is_some();
            let header = if alone {
                format!("[[{path}]]")
            } else {
                // an entry written as a string or as a table (`backends`)
                let (table, key) = path.rsplit_once('.').unwrap_or(("", path));
                format!("[[{table}]] {key} = [{{ … }}]")
            };
            return Some((header, obj));
        }
    }
    if let Some(values) = resolve(prop, defs).get("additionalProperties") {
        if let Some(obj) = object_of(values, defs) {
            let entry = if path == "errors.pages" {
                "STATUS"
            } else {
                "NAME"
            };
            return Some((format!("[{path}.{entry}]"), obj));
        }
    }
    None
}

fn walk(
    header: &str,
    path: &str,
    intro: &str,
    def: &Value,
    defs: &Map<String, Value>,
    out: &mut Vec<Section>,
) {
    let required: Vec<&str> = def
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut keys = Vec::new();
    let mut nested = Vec::new();
    let empty = Map::new();
    let props = def
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    // `[[upstreams]]`'s `health_check` is `[upstreams.health_check]`
    let base = path.trim_end_matches("[]");
    for (name, prop) in props {
        let sub_path = format!("{base}.{name}");
        let table = table_of(&sub_path, name, prop, defs);
        keys.push(Key {
            name: name.clone(),
            kind: kind(prop, defs),
            default: default_of(prop, required.contains(&name.as_str())),
            allowed: allowed(prop, defs),
            description: description(prop),
            table: table.as_ref().map(|(h, _)| h.clone()),
            choices: choices(prop, defs),
        });
        if let Some((h, d)) = table {
            nested.push((h, sub_path, description(prop), d));
        }
    }
    // `[server]`: listeners... -> listeners...: the heading names the table already
    let mut text = match intro.split_once("`: ") {
        Some((label, rest)) if label.starts_with("`[") && !label[1..].contains('`') => {
            upper_first(rest)
        }
        _ => intro.to_string(),
    };
    let own = description(def);
    if !own.is_empty() && own != text && !is_label(&own) {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(&own);
    }
    out.push(Section {
        header: header.to_string(),
        description: text,
        keys,
    });
    for (h, p, d, def) in nested {
        walk(&h, &p, &d, &def, defs, out);
    }
}

fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// A description that only names the section (`` `[server]`. ``) adds nothing.
fn is_label(d: &str) -> bool {
    d.starts_with('`') && d.ends_with("`.") && !d[1..d.len() - 2].contains('`')
        || d.starts_with("One `")
}

/// The description with its source line breaks joined.
fn description(v: &Value) -> String {
    let d = v.get("description").and_then(Value::as_str).unwrap_or("");
    d.split('\n')
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
        .trim()
        .to_string()
}

fn kind(v: &Value, defs: &Map<String, Value>) -> String {
    let r = resolve(v, defs);
    if r.get("oneOf").is_some() || r.get("enum").is_some() {
        return "string".into();
    }
    if r.get("anyOf").is_some() {
        return "string or table".into();
    }
    match r.get("type").and_then(Value::as_str) {
        Some("integer") => "integer".into(),
        Some("number") => "number".into(),
        Some("boolean") => "boolean".into(),
        Some("string") => "string".into(),
        Some("array") => match r.get("items") {
            Some(items) => {
                let k = kind(items, defs);
                if k == "table" {
                    "array of tables".into()
                } else if k == "string or table" {
                    "array of strings or tables".into()
                } else {
                    format!("array of {k}s")
                }
            }
            None => "array".into(),
        },
        Some("object") => match r.get("additionalProperties") {
            Some(Value::Object(vals)) if !vals.is_empty() => {
                let k = kind(&Value::Object(vals.clone()), defs);
                if k == "table" {
                    "table of tables".into()
                } else {
                    format!("table of {k}s")
                }
            }
            _ => "table".into(),
        },
        _ if r.get("properties").is_some() => "table".into(),
        _ => "value".into(),
    }
}

/// A JSON value as TOML writes it.
fn toml_value(v: &Value) -> String {
    match v {
        Value::Null => "none".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(toml_value).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) if map.is_empty() => "{}".into(),
        Value::Object(map) => format!(
            "{{ {} }}",
            map.iter()
                .map(|(k, v)| format!("{k} = {}", toml_value(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn default_of(v: &Value, required: bool) -> String {
    match v.get("default") {
        Some(d) => toml_value(d),
        None if required => "required".into(),
        None => "none".into(),
    }
}

/// The largest value of each integer format: a range that is the type's own says nothing.
fn natural_max(format: Option<&str>) -> Option<u64> {
    match format? {
        "uint8" => Some(u8::MAX.into()),
        "uint16" => Some(u16::MAX.into()),
        "uint32" => Some(u32::MAX.into()),
        "uint64" | "uint" => Some(u64::MAX),
        _ => None,
    }
}

fn allowed(v: &Value, defs: &Map<String, Value>) -> String {
    let r = resolve(v, defs);
    if let Some(choices) = r.get("oneOf").and_then(Value::as_array) {
        let names: Vec<String> = choices
            .iter()
            .filter_map(|c| c.get("const").or_else(|| c.get("enum")?.get(0)))
            .map(|c| {
                format!(
                    "`{}`",
                    c.as_str().map_or_else(|| c.to_string(), String::from)
                )
            })
            .collect();
        return names.join(" | ");
    }
    if let Some(values) = r.get("enum").and_then(Value::as_array) {
        return values
            .iter()
            .map(|c| {
                format!(
                    "`{}`",
                    c.as_str().map_or_else(|| c.to_string(), String::from)
                )
            })
            .collect::<Vec<_>>()
            .join(" | ");
    }
    if let Some(p) = r.get("pattern").and_then(Value::as_str) {
        if let Some(alts) = p.strip_prefix("^(").and_then(|p| p.strip_suffix(")$")) {
            return alts
                .split('|')
                .map(|a| format!("`{a}`"))
                .collect::<Vec<_>>()
                .join(" | ");
        }
        return format!("matches `{p}`");
    }
    let min = r.get("minimum").and_then(Value::as_f64);
    let max = r.get("maximum");
    let format = r.get("format").and_then(Value::as_str);
    let num = |x: &Value| x.to_string();
    match (r.get("minimum"), max) {
        (Some(lo), Some(hi)) => {
            let natural =
                min == Some(0.0) && hi.as_u64().is_some() && hi.as_u64() == natural_max(format);
            if natural {
                String::new()
            } else {
                format!("{}–{}", num(lo), num(hi))
            }
        }
        (Some(lo), None) if min.is_some_and(|m| m > 0.0) => format!("≥ {}", num(lo)),
        _ => String::new(),
    }
}

/// The values of an enumeration with what each means, for the description.
fn choices(v: &Value, defs: &Map<String, Value>) -> Vec<(String, String)> {
    resolve(v, defs)
        .get("oneOf")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter_map(|c| {
                    let name = c.get("const")?.as_str()?.to_string();
                    Some((name, description(c)))
                })
                .filter(|(_, d)| !d.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_top_level_key_has_a_section_and_every_key_a_description() {
        let all = sections();
        for name in [
            "server",
            "upstreams",
            "routes",
            "rate_limit",
            "log",
            "errors",
        ] {
            assert!(
                all.iter()
                    .any(|s| s.header == format!("[{name}]") || s.header == format!("[[{name}]]")),
                "no section for {name}: {:?}",
                all.iter().map(|s| &s.header).collect::<Vec<_>>()
            );
        }
        for s in &all {
            for k in &s.keys {
                assert!(
                    !k.description.is_empty(),
                    "{} {} has no description",
                    s.header,
                    k.name
                );
            }
        }
    }

    #[test]
    fn nested_tables_get_their_own_sections() {
        let headers: Vec<String> = sections().into_iter().map(|s| s.header).collect();
        for h in [
            "[upstreams.health_check]",
            "[[rate_limit.policies]]",
            "[tiers.NAME]",
            "[errors.pages.STATUS]",
            "[[tls.certificates]]",
        ] {
            assert!(headers.iter().any(|x| x == h), "{h} missing: {headers:?}");
        }
    }

    #[test]
    fn defaults_ranges_and_enumerations_come_from_the_types() {
        let all = sections();
        let server = all
            .iter()
            .find(|s| s.header == "[server]")
            .expect("[server]");
        let threads = server
            .keys
            .iter()
            .find(|k| k.name == "threads")
            .expect("threads");
        assert_eq!(threads.default, "2");
        assert_eq!(threads.allowed, "1–1024");
        assert_eq!(threads.kind, "integer");
        let listen = server
            .keys
            .iter()
            .find(|k| k.name == "listen")
            .expect("listen");
        assert_eq!(listen.default, "[\"127.0.0.1:8080\"]");
        let log = all.iter().find(|s| s.header == "[log]").expect("[log]");
        let format = &log.keys[0];
        assert_eq!(format.allowed, "`auto` | `json` | `text`");
        let up = all
            .iter()
            .find(|s| s.header == "[[upstreams]]")
            .expect("upstreams");
        let name = up.keys.iter().find(|k| k.name == "name").expect("name");
        assert_eq!(name.default, "required");
    }

    /// A file with `key = value` in the table `header` stands for, beside one upstream.
    /// A key that only means something beside another gets that one too.
    fn file_with(header: &str, key: &str, value: &str) -> String {
        let up = "[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]\n";
        let companion = match (header, key) {
            ("[shedding]", "queue_target_ms") => "queue_timeout_ms = 1000\n",
            ("[[upstreams]]", "fleet_max_inflight") => "max_inflight = 10\n",
            _ => "",
        };
        match header {
            "[[upstreams]]" => format!("{up}{companion}{key} = {value}\n"),
            h if h.starts_with("[[upstreams]] backends") => format!(
                "[[upstreams]]\nname = \"app\"\nbackends = [{{ address = \"127.0.0.1:9001\", {key} = {value} }}]\n"
            ),
            "[upstreams.health_check]" => {
                format!("{up}[upstreams.health_check]\nshared = true\n{key} = {value}\n")
            }
            "[[rate_limit.policies]]" => {
                format!("{up}[[rate_limit.policies]]\nname = \"p\"\n{key} = {value}\n")
            }
            "[[routes]]" => format!("{up}[[routes]]\nupstream = \"app\"\n{key} = {value}\n"),
            h => format!("{up}{}\n{companion}{key} = {value}\n", h),
        }
    }

    /// Every range the reference shows is the one `--check` enforces: one past either end
    /// is an error naming the key.
    #[test]
    fn the_ranges_shown_are_the_ranges_enforced() {
        let mut tested = 0;
        for s in sections() {
            for k in &s.keys {
                let Some((lo, hi)) = k.allowed.split_once('–') else {
                    continue;
                };
                // both ends are accepted, unless another key's rule refuses the file
                // (`min_concurrency` beside `max_concurrency`): then that key is named
                for end in [lo, hi] {
                    let text = file_with(&s.header, &k.name, end);
                    if let Err(e) = super::super::parse("range.toml", &text) {
                        assert!(
                            !e.key_path.ends_with(&k.name),
                            "{} {} = {end} is inside {} yet refused: {e}",
                            s.header,
                            k.name,
                            k.allowed
                        );
                    }
                }
                let outside: Vec<String> = if k.kind == "number" {
                    let (Ok(lo), Ok(hi)) = (lo.parse::<f64>(), hi.parse::<f64>()) else {
                        continue;
                    };
                    vec![format!("{:?}", hi + 0.5), format!("{:?}", lo - 0.5)]
                } else {
                    let (Ok(lo), Ok(hi)) = (lo.parse::<u64>(), hi.parse::<u64>()) else {
                        continue;
                    };
                    let mut v = vec![(hi + 1).to_string()];
                    if lo > 0 {
                        v.push((lo - 1).to_string());
                    }
                    v
                };
                for value in outside {
                    let text = file_with(&s.header, &k.name, &value);
                    tested += 1;
                    match super::super::parse("range.toml", &text) {
                        Ok(_) => panic!(
                            "{} {} = {value} is outside {} yet accepted:\n{text}",
                            s.header, k.name, k.allowed
                        ),
                        Err(e) => assert!(
                            e.key_path.ends_with(&k.name),
                            "{} {} = {value}: the error names {:?}: {e}",
                            s.header,
                            k.name,
                            e.key_path
                        ),
                    }
                }
            }
        }
        assert!(tested > 50, "only {tested} ranges tested");
    }

    #[test]
    fn roff_escapes_what_roff_would_read_as_requests() {
        assert_eq!(roff_text("`a-b` c\\d"), "\\fBa\\-b\\fR c\\ed");
        assert_eq!(roff_text(".x\n'y"), "\\&.x\n\\&'y");
    }

    #[test]
    fn anchors_are_mdbooks() {
        assert_eq!(
            anchor("`[upstreams.health_check]`"),
            "upstreamshealth_check"
        );
        assert_eq!(anchor("Coming from HAProxy"), "coming-from-haproxy");
    }
}
