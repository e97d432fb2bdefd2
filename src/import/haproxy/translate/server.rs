//! A `server` line's parameters, by family (health check, traffic, TLS), and
//! `server-template`.

use super::{count, time_ms};
use crate::import::haproxy::parse::Directive;

/// A server's check parameters: inter, fastinter, downinter, rise, fall, port.
pub(super) type CheckTiming = (u64, Option<u64>, Option<u64>, u64, u64, u16);

#[derive(Debug, Default)]
pub(super) struct ServerParams {
    pub(super) check: bool,
    pub(super) inter: u64,
    pub(super) fastinter: Option<u64>,
    pub(super) downinter: Option<u64>,
    pub(super) rise: u64,
    pub(super) fall: u64,
    pub(super) port: u16,
    pub(super) weight: Option<u64>,
    pub(super) maxconn: Option<u64>,
    pub(super) backup: bool,
    pub(super) disabled: bool,
    pub(super) slowstart: Option<u64>,
    pub(super) maxqueue: Option<u64>,
    pub(super) ssl: bool,
    pub(super) verify: bool,
    pub(super) notes: Vec<String>,
}

/// Reads one family of server parameters: `None` when `kw` is not of the family, else how
/// many words after `kw` it took (its `value`, or none).
type ParamFamily = fn(&mut ServerParams, &str, Option<&str>) -> Result<Option<usize>, String>;

/// A `server` line's parameters (after the `default-server` ones), by family.
pub(super) fn server_params(p: &[String]) -> Result<ServerParams, String> {
    const FAMILIES: [ParamFamily; 3] = [check_param, traffic_param, tls_param];
    let mut s = ServerParams {
        inter: 2000,
        rise: 2,
        fall: 3,
        verify: true,
        ..ServerParams::default()
    };
    let mut i = 0;
    while i < p.len() {
        let (kw, value) = (p[i].as_str(), p.get(i + 1).map(String::as_str));
        let mut taken = None;
        for family in FAMILIES {
            taken = family(&mut s, kw, value)?;
            if taken.is_some() {
                break;
            }
        }
        i += 1 + taken.unwrap_or_else(|| untranslated_param(&mut s, kw));
    }
    Ok(s)
}

/// A parameter's number.
fn number(kw: &str, value: Option<&str>) -> Result<u64, String> {
    value
        .and_then(|v| count(v).ok())
        .ok_or_else(|| format!("'{kw}' needs a number"))
}

/// A parameter's time (HAProxy's format), in ms.
fn time(kw: &str, value: Option<&str>) -> Result<u64, String> {
    value
        .and_then(time_ms)
        .ok_or_else(|| format!("'{kw}' needs a time"))
}

/// The health-check parameters: check, no-check, inter, fastinter, downinter, rise, fall,
/// port.
fn check_param(
    s: &mut ServerParams,
    kw: &str,
    value: Option<&str>,
) -> Result<Option<usize>, String> {
    match kw {
        "check" => s.check = true,
        "no-check" => s.check = false,
        "inter" => s.inter = time(kw, value)?,
        "fastinter" => s.fastinter = Some(time(kw, value)?),
        "downinter" => s.downinter = Some(time(kw, value)?),
        "rise" => s.rise = number(kw, value)?.clamp(1, 1000),
        "fall" => s.fall = number(kw, value)?.clamp(1, 1000),
        "port" => {
            s.port =
                u16::try_from(number(kw, value)?).map_err(|_| "port out of range".to_string())?
        }
        _ => return Ok(None),
    }
    // the flags take no word after them, the others their value
    Ok(Some(usize::from(!matches!(kw, "check" | "no-check"))))
}

/// The parameters of the traffic a server takes: weight, maxconn, maxqueue, slowstart,
/// backup, disabled, enabled.
fn traffic_param(
    s: &mut ServerParams,
    kw: &str,
    value: Option<&str>,
) -> Result<Option<usize>, String> {
    match kw {
        "weight" => {
            let w = number(kw, value)?;
            if w > 256 {
                return Err(format!("weight {w} is above HAProxy's 256"));
            }
            s.weight = Some(w);
        }
        "maxconn" => s.maxconn = Some(number(kw, value)?),
        "maxqueue" => s.maxqueue = Some(number(kw, value)?),
        "slowstart" => s.slowstart = Some(time(kw, value)?),
        "backup" => s.backup = true,
        "disabled" => s.disabled = true,
        "enabled" => s.disabled = false,
        _ => return Ok(None),
    }
    // the flags take no word after them, the others their value
    Ok(Some(usize::from(!matches!(
        kw,
        "backup" | "disabled" | "enabled"
    ))))
}

/// The TLS parameters: ssl, and verify (`none` turns verification off).
fn tls_param(s: &mut ServerParams, kw: &str, value: Option<&str>) -> Result<Option<usize>, String> {
    match kw {
        "ssl" => {
            s.ssl = true;
            Ok(Some(0))
        }
        "verify" => {
            if value == Some("none") {
                s.verify = false;
            }
            Ok(Some(1))
        }
        _ => Ok(None),
    }
}

/// Any other parameter: a note; returns how many words after `kw` it takes (the known
/// ones with a value skip it).
fn untranslated_param(s: &mut ServerParams, kw: &str) -> usize {
    s.notes.push(format!("'{kw}' is not translated"));
    let takes_value = matches!(
        kw,
        "resolvers"
            | "init-addr"
            | "cookie"
            | "id"
            | "agent-port"
            | "agent-inter"
            | "on-marked-down"
            | "on-error"
            | "error-limit"
            | "observe"
            | "sni"
            | "ca-file"
            | "crt"
            | "alpn"
            | "proto"
            | "resolve-prefer"
            | "pool-max-conn"
            | "pool-purge-delay"
    );
    usize::from(takes_value)
}

/// `server-template PREFIX NUM|RANGE FQDN[:PORT]`: PREFIX1..PREFIXn, all on the same
/// address (HAProxy fills them from DNS; with a literal address each is that address).
pub(super) fn template(d: &Directive) -> Result<Vec<(String, String)>, String> {
    let prefix = d.arg(1);
    let range = d.arg(2);
    let addr = d.arg(3);
    let (lo, hi) = match range.split_once('-') {
        Some((a, b)) => (
            count(a).map_err(|_| format!("'{range}' is not a number or range"))?,
            count(b).map_err(|_| format!("'{range}' is not a number or range"))?,
        ),
        None => (
            1,
            count(range).map_err(|_| format!("'{range}' is not a number or range"))?,
        ),
    };
    if lo == 0 || hi < lo || hi - lo >= 1000 {
        return Err(format!("range '{range}' (1 to 1000 servers)"));
    }
    if addr.is_empty() {
        return Err("server-template needs an address".into());
    }
    Ok(vec![(prefix.to_string(), addr.to_string())])
}
