//! `[tenants]`, `[tiers.NAME]` and the tenants file (CONTRACT §14): API keys as
//! identities. The file holds only SHA-256 hashes of keys (`sha256:HEX`); a key in clear
//! is refused, and no error ever shows a key.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde::Deserialize;

use super::check::{err, range, VResult, MAX_COUNT};
use super::schema::{PrioritySection, TenantsSection, TierSection, UnknownKeySection};
pub use super::settings::{Tenant, TenantSettings, Tier, UnknownKey};
use super::{locate, ConfigError};
use portcullis_policy::shed::Priority;
pub use portcullis_policy::tenant::{Period, MAX_QUOTA};

/// The rate-limit key of tenant `name`: apart from every API key (a NUL cannot be sent
/// in a header or a query), shared by all of the tenant's keys.
pub fn ident(name: &str) -> String {
    format!("\0tenant\0{name}")
}

/// A tenant or tier name: the label of the metrics, so short and plain.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

pub(super) fn validate_tenants(
    t: &TenantsSection,
    tiers: &BTreeMap<String, TierSection>,
) -> VResult<TenantSettings> {
    let mut out = Vec::with_capacity(tiers.len());
    for (name, tier) in tiers {
        let at = |k: &str| format!("tiers.{name}.{k}");
        if !valid_name(name) {
            return err(
                format!("tiers.{name}"),
                "a tier name is 1-64 characters of A-Z a-z 0-9 - _ .",
            );
        }
        range(&at("limit"), tier.limit, 1, MAX_COUNT, "requests")?;
        range(
            &at("concurrency"),
            tier.concurrency,
            0,
            1_000_000,
            "requests",
        )?;
        range(&at("quota"), tier.quota, 0, MAX_QUOTA, "cost units")?;
        let Some(period) = Period::parse(&tier.quota_period) else {
            return err(at("quota_period"), "expected hour, day or month");
        };
        out.push(Tier {
            name: name.as_str().into(),
            limit: tier.limit,
            concurrency: tier.concurrency,
            priority: tier.priority.map(|p| match p {
                PrioritySection::Critical => Priority::Critical,
                PrioritySection::Normal => Priority::Normal,
                PrioritySection::Low => Priority::Low,
            }),
            quota: tier.quota,
            period,
        });
    }
    range(
        "tenants.max_file_bytes",
        t.max_file_bytes,
        1 << 10,
        1 << 30,
        "bytes",
    )?;
    let settings = TenantSettings {
        file: (!t.file.is_empty()).then(|| PathBuf::from(&t.file)),
        redis_sync: t.redis_sync,
        unknown_key: match t.unknown_key {
            UnknownKeySection::Allow => UnknownKey::Allow,
            UnknownKeySection::ClientIp => UnknownKey::ClientIp,
            UnknownKeySection::Reject => UnknownKey::Reject,
        },
        allow_empty: t.allow_empty,
        max_file_bytes: t.max_file_bytes,
        tiers: out,
        tenants: Vec::new(),
    };
    if settings.enabled() && settings.tiers.is_empty() {
        return err(
            "tiers",
            "tenants need at least one [tiers.NAME] (their limits come from their tier)",
        );
    }
    Ok(settings)
}

/// The tenants file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantsFile {
    #[serde(default)]
    tenant: Vec<TenantEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    name: String,
    tier: String,
    #[serde(default)]
    keys: Vec<String>,
}

/// Most tenants a file may hold.
pub const MAX_TENANTS: usize = 1_000_000;

/// Why a tenants file with no tenant is refused (`tenants.allow_empty = false`).
pub const EMPTY_FILE: &str = "the tenants file holds no [[tenant]]: refused, as a file \
     caught empty or half written would take every tenant away (set tenants.allow_empty \
     = true to run with no tenant)";

/// Reads `settings.file` (when set) into `settings.tenants`. Errors name the tenants
/// file, the entry's key path and its line.
pub(super) fn read_file(settings: &mut TenantSettings) -> Result<(), ConfigError> {
    let Some(path) = settings.file.clone() else {
        return Ok(());
    };
    let file = path.display().to_string();
    let fail = |line_col, key_path: &str, reason: &str| {
        ConfigError::new(&file, line_col, key_path.to_string(), reason)
    };
    let kind = super::FileKind::Tenants(settings.max_file_bytes);
    let bytes = super::read_regular_file(&path, kind)
        .map_err(|e| fail(None, "", &format!("cannot read the tenants file: {e}")))?;
    let text =
        String::from_utf8(bytes).map_err(|_| fail(None, "", "the tenants file must be UTF-8"))?;
    settings.tenants = parse_tenants(&text, &settings.tiers)
        .map_err(|(key_path, reason)| fail(locate::locate(&text, &key_path), &key_path, &reason))?;
    if settings.tenants.is_empty() && !settings.allow_empty {
        return Err(fail(None, "", EMPTY_FILE));
    }
    Ok(())
}

/// The store's tenants (`redis_sync`: `(name, JSON value)` of the hash) that can join
/// `settings`' file tenants: an entry that is invalid, names a file tenant, or holds a
/// key another tenant holds is left out, with the reason (no key is ever shown).
pub fn store_tenants(
    settings: &TenantSettings,
    entries: &[(String, String)],
) -> (Vec<Tenant>, Vec<String>) {
    let mut owners: HashMap<[u8; 32], &str> = HashMap::new();
    let mut names: HashMap<&str, ()> = HashMap::new();
    for t in settings.tenants.iter().filter(|t| !t.from_store) {
        names.insert(&t.name, ());
        for k in &t.keys {
            owners.insert(*k, &t.name);
        }
    }
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    let mut sorted: Vec<&(String, String)> = entries.iter().collect();
    sorted.sort();
    for (name, value) in sorted {
        if names.contains_key(name.as_str()) {
            skipped.push(format!(
                "tenant {name:?} in the store: the tenants file has a tenant of that name (the file wins)"
            ));
            continue;
        }
        match store_entry(settings, &owners, name, value) {
            Ok(tenant) => {
                for h in &tenant.keys {
                    owners.insert(*h, name);
                }
                names.insert(name, ());
                out.push(tenant);
            }
            Err(why) => skipped.push(format!("tenant {name:?} in the store: {why}")),
        }
    }
    (out, skipped)
}

/// One tenant of the store (`name` → `{"tier": "NAME", "keys": ["sha256:HEX"]}`), or why
/// it is skipped: a bad name or value, an unknown tier, or a key `owners` has already.
fn store_entry(
    settings: &TenantSettings,
    owners: &HashMap<[u8; 32], &str>,
    name: &str,
    value: &str,
) -> Result<Tenant, String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Value {
        tier: String,
        #[serde(default)]
        keys: Vec<String>,
    }
    if !valid_name(name) {
        return Err("a tenant name is 1-64 characters of A-Z a-z 0-9 - _ .".into());
    }
    let v: Value = serde_json::from_str(value).map_err(|e| {
        // serde's message can quote the entry's text (a value, or a field name such as a
        // key written where a field belongs): only its kind and column.
        let kind = match e.classify() {
            serde_json::error::Category::Data => "a field or value that does not fit",
            serde_json::error::Category::Eof => "it ends early",
            _ => "not JSON",
        };
        format!(
            "expected {{\"tier\": \"NAME\", \"keys\": [\"sha256:HEX\"]}}: {kind} at column {}",
            e.column()
        )
    })?;
    let Some(tier) = settings.tier(&v.tier) else {
        // Not the value itself: an entry's text is whatever the tooling wrote, and this
        // reason is logged (a key pasted into "tier" must not reach the logs).
        let known: Vec<&str> = settings.tiers.iter().map(|t| &*t.name).collect();
        return Err(format!(
            "\"tier\" ({} characters) names no tier (tiers: {})",
            v.tier.chars().count(),
            known.join(", ")
        ));
    };
    let mut keys = Vec::with_capacity(v.keys.len());
    for (i, k) in v.keys.iter().enumerate() {
        match decode_key_hash(k) {
            Ok(h) if owners.contains_key(&h) => {
                return Err(format!("keys[{i}] is another tenant's"))
            }
            Ok(h) => keys.push(h),
            Err(why) => return Err(format!("keys[{i}]: {why}")),
        }
    }
    Ok(Tenant {
        name: name.into(),
        tier,
        keys,
        from_store: true,
    })
}

/// Each tenant's tier limit, as a limit of its key ([`ident`]) in `overrides` (the
/// `[rate_limit]` policy's per-key limits).
pub fn tier_limits(settings: &TenantSettings, overrides: &mut HashMap<String, u64>) {
    for t in &settings.tenants {
        if let Some(tier) = settings.tiers.get(t.tier) {
            overrides.insert(ident(&t.name), tier.limit);
        }
    }
}

/// The tenants of `text` (a tenants file), each key's hash decoded; an error is
/// `(key path, reason)`.
pub fn parse_tenants(text: &str, tiers: &[Tier]) -> VResult<Vec<Tenant>> {
    let raw: TenantsFile = match toml::from_str(text) {
        Ok(r) => r,
        Err(e) => {
            let at = e
                .span()
                .and_then(|s| locate::path_at(text, s.start))
                .unwrap_or_default();
            // The message may quote a value: a key in clear must not be shown.
            return err(at, super::redact::without_quoted_values(e.message().trim()));
        }
    };
    if raw.tenant.len() > MAX_TENANTS {
        return err("tenant", format!("at most {MAX_TENANTS} tenants"));
    }
    let mut names: HashMap<&str, usize> = HashMap::with_capacity(raw.tenant.len());
    let mut owners: HashMap<[u8; 32], usize> = HashMap::new();
    let mut out = Vec::with_capacity(raw.tenant.len());
    for (i, t) in raw.tenant.iter().enumerate() {
        let at = |k: &str| format!("tenant[{i}].{k}");
        if !valid_name(&t.name) {
            return err(
                at("name"),
                "a tenant name is 1-64 characters of A-Z a-z 0-9 - _ . (it labels metrics)",
            );
        }
        if let Some(first) = names.insert(&t.name, i) {
            return err(
                at("name"),
                format!("tenant {:?} is also tenant[{first}]", t.name),
            );
        }
        let Some(tier) = tiers.iter().position(|x| *x.name == *t.tier) else {
            let known: Vec<&str> = tiers.iter().map(|x| &*x.name).collect();
            return err(
                at("tier"),
                format!("no tier {:?} (tiers: {})", t.tier, known.join(", ")),
            );
        };
        let mut keys = Vec::with_capacity(t.keys.len());
        for (k, key) in t.keys.iter().enumerate() {
            let path = format!("tenant[{i}].keys[{k}]");
            let hash = decode_key_hash(key).map_err(|why| (path.clone(), why))?;
            if let Some(other) = owners.insert(hash, i) {
                let why = if other == i {
                    "the same key twice".to_string()
                } else {
                    format!("this key is also tenant[{other}]'s: a key names one tenant")
                };
                return err(path, why);
            }
            keys.push(hash);
        }
        out.push(Tenant {
            name: t.name.as_str().into(),
            tier,
            keys,
            from_store: false,
        });
    }
    Ok(out)
}

/// `sha256:` and 64 hex digits. Anything else is refused without being shown: it may be
/// a key in clear.
pub fn decode_key_hash(s: &str) -> Result<[u8; 32], String> {
    const HOW: &str =
        "write its SHA-256 instead: sha256:$(printf %s \"$KEY\" | sha256sum | cut -d' ' -f1)";
    let Some(hex_part) = s.strip_prefix("sha256:") else {
        return Err(format!(
            "a key in clear (or not a key hash) is refused: the file holds only key hashes; {HOW}"
        ));
    };
    let mut out = [0u8; 32];
    if hex_part.len() != 64 || hex::decode_to_slice(hex_part, &mut out).is_err() {
        return Err(format!(
            "sha256: must be followed by 64 hex digits ({} characters given); {HOW}",
            hex_part.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn tiers() -> Vec<Tier> {
        vec![Tier {
            name: "pro".into(),
            limit: 10,
            concurrency: 0,
            priority: None,
            quota: 0,
            period: Period::Day,
        }]
    }

    const H: &str = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn a_tenants_file_parses_and_its_errors_point_at_the_entry() {
        let text = format!("[[tenant]]\nname = \"acme\"\ntier = \"pro\"\nkeys = [\"{H}\"]\n");
        let t = parse_tenants(&text, &tiers()).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(&*t[0].name, "acme");
        assert_eq!(t[0].keys[0][0], 0x9f);

        let clear = "[[tenant]]\nname = \"acme\"\ntier = \"pro\"\nkeys = [\"my-secret-key\"]\n";
        let (path, why) = parse_tenants(clear, &tiers()).unwrap_err();
        assert_eq!(path, "tenant[0].keys[0]");
        assert!(why.contains("in clear"), "{why}");
        assert!(!why.contains("my-secret-key"), "{why}");

        let short = "[[tenant]]\nname = \"a\"\ntier = \"pro\"\nkeys = [\"sha256:abc\"]\n";
        assert!(parse_tenants(short, &tiers())
            .unwrap_err()
            .1
            .contains("64 hex"));

        let tier = format!("[[tenant]]\nname = \"a\"\ntier = \"gold\"\nkeys = [\"{H}\"]\n");
        assert_eq!(
            parse_tenants(&tier, &tiers()).unwrap_err().0,
            "tenant[0].tier"
        );

        let twice = format!(
            "[[tenant]]\nname = \"a\"\ntier = \"pro\"\nkeys = [\"{H}\"]\n[[tenant]]\nname = \"b\"\ntier = \"pro\"\nkeys = [\"{H}\"]\n"
        );
        let (path, why) = parse_tenants(&twice, &tiers()).unwrap_err();
        assert_eq!(path, "tenant[1].keys[0]");
        assert!(why.contains("tenant[0]"), "{why}");

        let names =
            "[[tenant]]\nname = \"a\"\ntier = \"pro\"\n[[tenant]]\nname = \"a\"\ntier = \"pro\"\n";
        assert_eq!(
            parse_tenants(names, &tiers()).unwrap_err().0,
            "tenant[1].name"
        );

        let label = "[[tenant]]\nname = \"a b\\\"}\"\ntier = \"pro\"\n";
        assert_eq!(
            parse_tenants(label, &tiers()).unwrap_err().0,
            "tenant[0].name"
        );

        // A key written where the list belongs: the parser's message would quote it.
        let single = "[[tenant]]\nname = \"a\"\ntier = \"pro\"\nkeys = \"my-secret-key\"\n";
        let (path, why) = parse_tenants(single, &tiers()).unwrap_err();
        assert_eq!(path, "tenant[0].keys");
        assert!(why.contains("expected a sequence"), "{why}");
        assert!(!why.contains("my-secret"), "{why}");

        let unknown = "[[tenant]]\nname = \"a\"\ntier = \"pro\"\nkey = []\n";
        assert!(parse_tenants(unknown, &tiers()).is_err());
        // Line numbers come from the text.
        let at = locate::locate(clear, "tenant[0].keys[0]").unwrap();
        assert_eq!(at.0, 4);
    }

    #[test]
    fn the_stores_tenants_never_show_a_key() {
        let settings = TenantSettings {
            file: None,
            redis_sync: true,
            unknown_key: UnknownKey::Allow,
            tiers: tiers(),
            ..TenantSettings::default()
        };
        let entries = [
            ("a", r#"{"tier":"pro","keys":"my-secret-key-1"}"#),
            ("b", r#"{"tier":"pro","keys":["my-secret-key-2"]}"#),
            ("c", r#"{"tier":"pro","keys":[1, "my-secret-key-3"]}"#),
            ("d", r#"{"tier":"pro","keys":["my-secret-key-4"#),
            ("f", r#"{"tier":"pro","my-secret-key-5":1}"#),
            // a key pasted where the tier belongs (found by the tenants fuzz target)
            ("g", r#"{"tier":"my-secret-key-6","keys":[]}"#),
            ("e", &format!(r#"{{"tier":"pro","keys":["{H}"]}}"#)),
        ]
        .map(|(n, v)| (n.to_string(), v.to_string()));
        let (joined, skipped) = store_tenants(&settings, &entries);
        assert_eq!(joined.len(), 1);
        assert_eq!(&*joined[0].name, "e");
        assert_eq!(skipped.len(), 6, "{skipped:?}");
        for why in &skipped {
            assert!(!why.contains("my-secret"), "{why}");
        }
        let g = skipped
            .iter()
            .find(|w| w.contains("\"g\""))
            .expect("g skipped");
        assert!(g.contains("names no tier (tiers: "), "{g}");
    }
}
