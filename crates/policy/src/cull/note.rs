//! Who culled a backend, and by which rule: the instance holding a cull's lease publishes
//! it beside the claim, so the instances that only follow the cull can say more than "held
//! by another instance" (the page, `/status`).

/// One backend's cull as the instance holding its lease describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CullNote {
    pub backend: String,
    /// The culling instance (`host:pid`).
    pub by: String,
    /// The rule that made it a candidate (`error_threshold`, `success_rate`, `latency`).
    pub rule: String,
    /// The note is dropped after this (Unix ms): a lease's end, renewed while it is held.
    pub until_ms: u64,
}

impl CullNote {
    /// The store's value: `until\nby\nrule` (`by` and `rule` hold no newline).
    pub fn encode_value(&self) -> String {
        let line = |s: &str| s.replace(['\n', '\r'], " ");
        format!(
            "{}\n{}\n{}",
            self.until_ms,
            line(&self.by),
            line(&self.rule)
        )
    }

    /// A field (the backend) and value as [`CullNote::encode_value`] wrote them; `None`
    /// for anything else.
    pub fn decode_entry(backend: &str, value: &str) -> Option<Self> {
        let mut parts = value.splitn(3, '\n');
        let until_ms = parts.next()?.parse().ok()?;
        let by = parts.next()?.to_string();
        let rule = parts.next()?.to_string();
        Some(Self {
            backend: backend.to_string(),
            by,
            rule,
            until_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_round_trips_and_stays_one_record() {
        let n = CullNote {
            backend: "10.0.0.5:8080".into(),
            by: "web-1:4242".into(),
            rule: "error_threshold".into(),
            until_ms: 1_700_000_000_000,
        };
        assert_eq!(
            CullNote::decode_entry(&n.backend, &n.encode_value()),
            Some(n.clone())
        );
        let forged = CullNote {
            by: "a\nb".into(),
            ..n
        };
        let back = CullNote::decode_entry("x:1", &forged.encode_value());
        assert_eq!(back.map(|b| b.by), Some("a b".into()));
        assert_eq!(CullNote::decode_entry("x:1", "soon\na\nb"), None);
        assert_eq!(CullNote::decode_entry("x:1", "12\nonly"), None);
    }
}
