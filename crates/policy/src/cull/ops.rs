//! Manual operations on backends (CONTRACT §12): drain, maintenance and a weight, put by a
//! person or a deploy tool through the admin API. They live in the same store as the culls'
//! claims, as leases, and share one budget with them: the backends out of an upstream
//! (culled, drained, in maintenance, or at weight 0) never pass `max_culled_fraction` unless
//! the operation is forced, and never reach every backend.
//!
//! A record is stored as one line of text per `(backend, aspect)`: the state (drain or
//! maint) under the backend's address, the weight under `address#w`, so a weight and a
//! drain coexist and `ready` removes both. [`OpRecord::encode`] and [`OpRecord::decode`] are
//! the format; the Redis script reads the same fields (`until`, then `kind`).

use super::max_out;

/// What a manual operation does to a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// No new requests; in-flight ones finish.
    Drain,
    /// As a drain, and neither probed nor readmitted automatically.
    Maint,
    /// The backend's weight on every instance (0 = no new requests).
    Weight(u32),
    /// A claim on the budget (`POST /claims`): drained fleet-wide until released or
    /// expired. `id` names it; an emergency claim passes every limit but the last backend.
    Claim { id: u64, emergency: bool },
}

impl OpKind {
    /// The stored and shown name: `drain`, `maint`, `w:N`.
    pub fn code(&self) -> String {
        match self {
            OpKind::Drain => "drain".into(),
            OpKind::Maint => "maint".into(),
            OpKind::Weight(w) => format!("w:{w}"),
            OpKind::Claim { id, emergency } => format!("claim:{id:016x}:{}", u8::from(*emergency)),
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "drain" => Some(OpKind::Drain),
            "maint" => Some(OpKind::Maint),
            _ if s.starts_with("claim:") => {
                let (id, e) = s.strip_prefix("claim:")?.split_once(':')?;
                Some(OpKind::Claim {
                    id: u64::from_str_radix(id, 16).ok()?,
                    emergency: e == "1",
                })
            }
            _ => s.strip_prefix("w:")?.parse().ok().map(OpKind::Weight),
        }
    }

    /// The backend gets no new requests while this holds.
    pub fn takes_out(&self) -> bool {
        !matches!(self, OpKind::Weight(w) if *w > 0)
    }

    /// The field suffix of this aspect in the store (`""`, `"#w"` or `"#c"`).
    pub fn aspect(&self) -> &'static str {
        match self {
            OpKind::Weight(_) => WEIGHT_ASPECT,
            OpKind::Claim { .. } => CLAIM_ASPECT,
            _ => "",
        }
    }
}

/// The field suffix of a weight record.
pub const WEIGHT_ASPECT: &str = "#w";
/// The field suffix of a claim record (one claim per backend at a time).
pub const CLAIM_ASPECT: &str = "#c";

/// The longest `reason` kept (bytes); the admin API refuses longer ones.
pub const MAX_REASON: usize = 512;

/// An operation as asked: the store stamps `at` and `until` with its own clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpRequest {
    pub kind: OpKind,
    /// The admin token's name (`server.admin_tokens`), or `admin`.
    pub by: String,
    pub reason: String,
    /// `None`: until `ready`.
    pub ttl_ms: Option<u64>,
    /// Past `max_culled_fraction` (never past the last backend).
    pub force: bool,
}

/// One operation in force, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpRecord {
    pub backend: String,
    pub kind: OpKind,
    pub by: String,
    pub reason: String,
    /// When it started (Unix ms, the store's clock).
    pub at_ms: u64,
    /// When it expires by itself (Unix ms); `None` = until `ready`.
    pub until_ms: Option<u64>,
    pub force: bool,
}

impl OpRecord {
    /// The record of `req` on `backend`, started at `now_ms`. Control, separator and bidi
    /// characters of `by` and `reason` become spaces ([`crate::text::one_line`]), so a record stays one line of a log and one record of
    /// the store.
    pub fn new(backend: &str, req: &OpRequest, now_ms: u64) -> Self {
        let clean = crate::text::one_line;
        Self {
            backend: backend.to_string(),
            kind: req.kind,
            by: clean(&req.by),
            reason: clean(&req.reason),
            at_ms: now_ms,
            until_ms: req.ttl_ms.map(|t| now_ms.saturating_add(t.max(1))),
            force: req.force,
        }
    }

    /// The stored value: `until\nkind\nat\nforce\nby\nreason` (`until` 0 = none; `by` and
    /// `reason` hold no control character, see [`OpRecord::new`]).
    pub fn encode(&self) -> String {
        let clean = crate::text::one_line;
        format!(
            "{}\n{}\n{}\n{}\n{}\n{}",
            self.until_ms.unwrap_or(0),
            self.kind.code(),
            self.at_ms,
            u8::from(self.force),
            clean(&self.by),
            clean(&self.reason)
        )
    }

    /// The record stored under `field` (`address` or `address#w`), or `None` when the value
    /// is not one (a record written by a newer version is skipped, not misread).
    pub fn decode(field: &str, value: &str) -> Option<Self> {
        let mut it = value.splitn(6, '\n');
        let until: u64 = it.next()?.parse().ok()?;
        let kind = OpKind::parse(it.next()?)?;
        let at_ms = it.next()?.parse().ok()?;
        let force = it.next()? == "1";
        let by = it.next()?.to_string();
        let reason = it.next()?.to_string();
        let backend = field.strip_suffix(kind.aspect()).unwrap_or(field);
        if field != format!("{backend}{}", kind.aspect()) {
            return None;
        }
        Some(Self {
            backend: backend.to_string(),
            kind,
            by,
            reason,
            at_ms,
            until_ms: (until > 0).then_some(until),
            force,
        })
    }

    /// In force at `now_ms`.
    pub fn active(&self, now_ms: u64) -> bool {
        self.until_ms.is_none_or(|u| u > now_ms)
    }

    /// The store field of this record.
    pub fn field(&self) -> String {
        format!("{}{}", self.backend, self.kind.aspect())
    }
}

/// Why a manual operation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpRefusal {
    /// `out` backends would be out of `total`, over `max_out` (culls included).
    Fraction { out: u32, max_out: u32, total: u32 },
    /// It would take out every backend of the upstream (never, even forced).
    LastBackend { total: u32 },
}

impl OpRefusal {
    /// The policy's name in a refusal (`fraction`, `last_backend`).
    pub fn policy(&self) -> &'static str {
        match self {
            OpRefusal::Fraction { .. } => "fraction",
            OpRefusal::LastBackend { .. } => "last_backend",
        }
    }

    /// A sentence a person can act on.
    pub fn reason(&self) -> String {
        match self {
            OpRefusal::Fraction {
                out,
                max_out,
                total,
            } => format!(
                "fraction: {out} of {total} backends would be out (culled, drained, in maintenance or at weight 0), \
                 over max_culled_fraction's {max_out}; wait for one to come back, or force it"
            ),
            OpRefusal::LastBackend { total } => format!(
                "last_backend: this would take out all {total} backends of the upstream; bring another back first"
            ),
        }
    }
}

/// Whether `backend` may be taken out of an upstream of `total` backends, of which
/// `out` (distinct backends culled or under an operation that takes them out, in force
/// now) are out already; `already_out` says whether `backend` is one of them.
pub fn check_out(
    already_out: bool,
    out: u32,
    total: u32,
    fraction: f64,
    force: bool,
) -> Result<(), OpRefusal> {
    if already_out {
        return Ok(());
    }
    let after = out.saturating_add(1);
    if after >= total {
        return Err(OpRefusal::LastBackend { total });
    }
    let limit = max_out(total, fraction);
    if after > limit && !force {
        return Err(OpRefusal::Fraction {
            out: after,
            max_out: limit,
            total,
        });
    }
    Ok(())
}

/// The distinct backends out at `now_ms`: those with an active cull claim (`culled`) and
/// those under an operation that takes them out.
pub fn out_backends<'a>(
    culled: impl IntoIterator<Item = &'a str>,
    ops: &'a [OpRecord],
    now_ms: u64,
) -> Vec<&'a str> {
    let mut out: Vec<&str> = culled.into_iter().collect();
    for r in ops {
        if r.active(now_ms) && r.kind.takes_out() {
            out.push(r.backend.as_str());
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether `r` was granted past the budget: a forced operation or an emergency claim.
pub fn outside_budget(r: &OpRecord) -> bool {
    r.force
        || matches!(
            r.kind,
            OpKind::Claim {
                emergency: true,
                ..
            }
        )
}

/// The budget an operation on `backend` is checked against, from the backends out
/// (`out`, [`out_backends`]) and those out within the budget (`within`: culls and the
/// operations that are neither forced nor emergency claims): `(already_out, out)` for
/// [`check_out`]. A backend out only past the budget is not out already: the new
/// operation would keep it out after the forced operation or emergency claim ends, so it
/// counts as one more on top of those out within the budget.
pub fn budget_for(backend: &str, out: &[&str], within: &[&str]) -> (bool, u32) {
    let count = |l: &[&str]| u32::try_from(l.len()).unwrap_or(u32::MAX);
    if within.contains(&backend) || !out.contains(&backend) {
        (out.contains(&backend), count(out))
    } else {
        (false, count(within))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_out_only_past_the_budget_counts_as_new() {
        let out = ["a", "b", "x"];
        let within = ["a", "b"];
        // out by a drain within the budget: out already
        assert_eq!(budget_for("a", &out, &within), (true, 3));
        // a new backend: one more on top of every backend out
        assert_eq!(budget_for("y", &out, &within), (false, 3));
        // out only by an emergency claim: one more on top of those within the budget
        assert_eq!(budget_for("x", &out, &within), (false, 2));
        assert!(check_out(false, 2, 4, 0.5, false).is_err());
        assert!(check_out(false, 1, 4, 0.5, false).is_ok());
    }

    fn req(kind: OpKind, ttl: Option<u64>) -> OpRequest {
        OpRequest {
            kind,
            by: "deployer".into(),
            reason: "disk swap\nrack 4".into(),
            ttl_ms: ttl,
            force: false,
        }
    }

    #[test]
    fn records_round_trip_and_stay_one_record() {
        for kind in [
            OpKind::Drain,
            OpKind::Maint,
            OpKind::Weight(0),
            OpKind::Weight(7),
        ] {
            let r = OpRecord::new("10.0.0.5:8080", &req(kind, Some(30_000)), 1_000);
            let back = OpRecord::decode(&r.field(), &r.encode()).unwrap_or_else(|| panic!("{r:?}"));
            assert_eq!(
                back.reason, "disk swap rack 4",
                "control characters become spaces"
            );
            assert_eq!(
                (back.kind, back.until_ms, back.at_ms),
                (kind, Some(31_000), 1_000)
            );
            assert_eq!(back.backend, "10.0.0.5:8080");
        }
        let forever = OpRecord::new("b:1", &req(OpKind::Maint, None), 5);
        let back = OpRecord::decode("b:1", &forever.encode());
        assert_eq!(back.map(|b| b.until_ms), Some(None));
        assert!(OpRecord::decode("b:1", "garbage").is_none());
        assert!(OpRecord::decode("b:1", "0\nexplode\n1\n0\na\nb").is_none());
        // a weight stored under the state's field is not misread
        assert!(OpRecord::decode("b:1", "0\nw:3\n1\n0\na\nb").is_none());
    }

    #[test]
    fn expiry_is_a_lease() {
        let r = OpRecord::new("b:1", &req(OpKind::Drain, Some(10)), 100);
        assert!(r.active(109));
        assert!(!r.active(110));
        assert!(OpRecord::new("b:1", &req(OpKind::Drain, None), 100).active(u64::MAX));
    }

    #[test]
    fn weight_zero_takes_out_and_other_weights_do_not() {
        assert!(OpKind::Weight(0).takes_out());
        assert!(!OpKind::Weight(1).takes_out());
        assert!(OpKind::Drain.takes_out() && OpKind::Maint.takes_out());
    }

    #[test]
    fn one_budget_for_culls_and_operations() {
        // four backends at 0.5: two may be out, whatever took them out
        assert_eq!(check_out(false, 0, 4, 0.5, false), Ok(()));
        assert_eq!(check_out(false, 1, 4, 0.5, false), Ok(()));
        let refused = check_out(false, 2, 4, 0.5, false);
        assert_eq!(
            refused,
            Err(OpRefusal::Fraction {
                out: 3,
                max_out: 2,
                total: 4
            })
        );
        assert!(refused
            .err()
            .is_some_and(|r| r.reason().starts_with("fraction:")));
        // force passes the fraction, never the last backend
        assert_eq!(check_out(false, 2, 4, 0.5, true), Ok(()));
        assert_eq!(
            check_out(false, 3, 4, 1.0, true),
            Err(OpRefusal::LastBackend { total: 4 })
        );
        assert_eq!(
            check_out(false, 0, 1, 1.0, true),
            Err(OpRefusal::LastBackend { total: 1 })
        );
        // a backend already out may change its operation
        assert_eq!(check_out(true, 3, 4, 0.5, false), Ok(()));
    }

    #[test]
    fn out_counts_each_backend_once_and_only_while_in_force() {
        let ops = vec![
            OpRecord::new("a", &req(OpKind::Drain, None), 0),
            OpRecord::new("a", &req(OpKind::Weight(0), None), 0),
            OpRecord::new("b", &req(OpKind::Weight(3), None), 0),
            OpRecord::new("c", &req(OpKind::Maint, Some(10)), 0),
        ];
        assert_eq!(out_backends(["a", "d"], &ops, 5), ["a", "c", "d"]);
        assert_eq!(out_backends([], &ops, 10), ["a"]);
    }
}
