//! ACL criteria HAProxy configurations route on, as [`Region`]s of requests.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;

use super::parse::{Condition, Directive, Term};
use super::routes::Region;

/// A criterion read from an ACL.
#[derive(Debug, Clone, PartialEq)]
pub enum Criterion {
    /// Any of these regions (the values of one ACL are OR'ed).
    Regions(Vec<Region>),
    /// `sc_http_req_rate(0) gt N` / `sc0_http_req_rate gt N`: the request rate over the
    /// tracked table's period is above N.
    RateAbove(u64),
}

/// What an ACL's words mean; `approx` notes what is only close.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub criterion: Criterion,
    pub approx: Option<String>,
}

/// The predefined ACLs HAProxy knows.
fn predefined(name: &str) -> Option<Parsed> {
    let methods = |m: &[&str]| {
        Criterion::Regions(vec![Region {
            methods: Some(m.iter().map(|s| s.to_string()).collect()),
            ..Region::any()
        }])
    };
    let c = match name {
        "TRUE" | "HTTP" => Criterion::Regions(vec![Region::any()]),
        "FALSE" => Criterion::Regions(Vec::new()),
        "METH_GET" => methods(&["GET", "HEAD"]),
        "METH_POST" => methods(&["POST"]),
        "METH_PUT" => methods(&["PUT"]),
        "METH_DELETE" => methods(&["DELETE"]),
        "METH_OPTIONS" => methods(&["OPTIONS"]),
        "METH_CONNECT" => methods(&["CONNECT"]),
        "METH_TRACE" => methods(&["TRACE"]),
        "LOCALHOST" => Criterion::Regions(vec![Region {
            cidrs: "127.0.0.0/8".parse().ok().map(|n| vec![n]),
            ..Region::any()
        }]),
        _ => return None,
    };
    Some(Parsed {
        criterion: c,
        approx: None,
    })
}

/// Reads `criterion [flags] values...`.
pub fn criterion(words: &[String]) -> Result<Parsed, String> {
    let Some(crit) = words.first() else {
        return Err("an ACL needs a criterion".into());
    };
    let (icase, values) = flags_and_values(&words[1..])?;
    let c = crit.to_ascii_lowercase();
    if matches!(c.as_str(), "hdr(host)" | "req.hdr(host)" | "hdr(host,-1)") {
        return host(crit, &values, icase);
    }
    match c.as_str() {
        "path_beg" | "path" => path(crit, &values, c == "path", icase),
        "method" => method(crit, &values, icase),
        "src" => src(crit, &values),
        "sc_http_req_rate(0)" | "sc0_http_req_rate" | "sc0_http_req_rate()" => rate(crit, &values),
        "always_true" => Ok(Parsed::exact(Criterion::Regions(vec![Region::any()]))),
        "always_false" => Ok(Parsed::exact(Criterion::Regions(Vec::new()))),
        "ssl_fc" => {
            Err("portcullis's routes apply to cleartext and TLS listeners alike (no ssl_fc)".into())
        }
        _ => Err(format!(
            "the criterion '{crit}' has no portcullis equivalent"
        )),
    }
}

impl Parsed {
    fn exact(criterion: Criterion) -> Self {
        Parsed {
            criterion,
            approx: None,
        }
    }
}

/// The words after the criterion: whether `-i` (ignore case) is given, and the values.
fn flags_and_values(words: &[String]) -> Result<(bool, Vec<&str>), String> {
    let mut icase = false;
    let mut values: Vec<&str> = Vec::new();
    let mut flags_done = false;
    let mut i = 0;
    while i < words.len() {
        let w = words[i].as_str();
        if !flags_done && w.starts_with('-') && w.len() > 1 {
            match w {
                "-i" => icase = true,
                "--" => flags_done = true,
                "-f" => return Err("values read from a file (-f) are not translated".into()),
                "-m" => {
                    let m = words.get(i + 1).map(String::as_str).unwrap_or("");
                    return Err(format!("the match method '-m {m}' is not translated"));
                }
                "-n" | "-u" => {}
                _ => return Err(format!("the ACL flag '{w}' is not translated")),
            }
            i += 1;
            continue;
        }
        flags_done = true;
        values.push(w);
        i += 1;
    }
    Ok((icase, values))
}

fn need_values(crit: &str, values: &[&str]) -> Result<(), String> {
    if values.is_empty() {
        Err(format!("'{crit}' without a value to match"))
    } else {
        Ok(())
    }
}

/// One region per value.
fn each_value(values: &[&str], region: impl Fn(&str) -> Region) -> Criterion {
    Criterion::Regions(values.iter().map(|v| region(v)).collect())
}

/// `hdr(host) HOST...`: the request's host.
fn host(crit: &str, values: &[&str], icase: bool) -> Result<Parsed, String> {
    need_values(crit, values)?;
    let approx = (!icase).then(|| {
        "portcullis compares hosts case-insensitively (HAProxy without -i does not)".into()
    });
    Ok(Parsed {
        criterion: each_value(values, |v| Region {
            host: Some(v.to_ascii_lowercase()),
            ..Region::any()
        }),
        approx,
    })
}

/// `path_beg PREFIX...` / `path PATH...` (`exact`): the path, matched as a prefix.
fn path(crit: &str, values: &[&str], exact: bool, icase: bool) -> Result<Parsed, String> {
    need_values(crit, values)?;
    if let Some(v) = values.iter().find(|v| !v.starts_with('/')) {
        return Err(format!("the path '{v}' does not start with /"));
    }
    let mut notes = Vec::new();
    if exact {
        notes.push("an exact path is matched as a prefix");
    }
    if icase {
        notes.push("portcullis matches path prefixes case-sensitively");
    }
    Ok(Parsed {
        criterion: each_value(values, |v| Region {
            prefix: v.to_string(),
            ..Region::any()
        }),
        approx: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

/// `method METHOD...`.
fn method(crit: &str, values: &[&str], icase: bool) -> Result<Parsed, String> {
    need_values(crit, values)?;
    let set: BTreeSet<String> = values
        .iter()
        .map(|v| {
            if icase {
                v.to_ascii_uppercase()
            } else {
                v.to_string()
            }
        })
        .collect();
    if let Some(bad) = set
        .iter()
        .find(|m| http::Method::from_bytes(m.as_bytes()).is_err())
    {
        return Err(format!("'{bad}' is not a method"));
    }
    Ok(Parsed::exact(Criterion::Regions(vec![Region {
        methods: Some(set),
        ..Region::any()
    }])))
}

/// `src ADDRESS|CIDR...`: the client's address.
fn src(crit: &str, values: &[&str]) -> Result<Parsed, String> {
    need_values(crit, values)?;
    let mut nets: Vec<IpNet> = Vec::new();
    for v in values {
        let n = v
            .parse::<IpNet>()
            .or_else(|_| v.parse::<std::net::IpAddr>().map(IpNet::from))
            .map_err(|_| format!("'{v}' is not an address or CIDR"))?;
        nets.push(n.trunc());
    }
    Ok(Parsed::exact(Criterion::Regions(vec![Region {
        cidrs: Some(nets),
        ..Region::any()
    }])))
}

/// `sc_http_req_rate(0) gt N` / `ge N`: the tracked request rate.
fn rate(crit: &str, values: &[&str]) -> Result<Parsed, String> {
    match (
        values.first().copied(),
        values.get(1).and_then(|n| super::translate::count(n).ok()),
    ) {
        (Some("gt"), Some(n)) => Ok(Parsed::exact(Criterion::RateAbove(n))),
        (Some("ge"), Some(n)) if n > 0 => Ok(Parsed::exact(Criterion::RateAbove(n - 1))),
        _ => Err(format!("'{crit}' is translated with 'gt N' or 'ge N' only")),
    }
}

/// The named ACLs of a proxy: name -> its lines (OR'ed), each parsed or its error.
pub type Acls = BTreeMap<String, Vec<(usize, Result<Parsed, String>)>>;

pub fn named_acls(directives: &[Directive]) -> Acls {
    let mut acls: Acls = BTreeMap::new();
    for d in directives.iter().filter(|d| d.kw() == "acl") {
        let parsed = if d.args.len() < 3 {
            Err("'acl' needs a name and a criterion".into())
        } else {
            criterion(&d.args[2..])
        };
        acls.entry(d.arg(1).to_string())
            .or_default()
            .push((d.line, parsed));
    }
    acls
}

/// A term of a condition: its criterion and notes.
fn term(t: &Term, acls: &Acls) -> Result<Parsed, String> {
    match t {
        Term::Anonymous(w) => criterion(w),
        Term::Named(n) => {
            if let Some(lines) = acls.get(n) {
                let mut regions = Vec::new();
                let mut notes: Vec<String> = Vec::new();
                for (line, p) in lines {
                    match p {
                        Ok(Parsed {
                            criterion: Criterion::Regions(r),
                            approx,
                        }) => {
                            regions.extend(r.iter().cloned());
                            notes.extend(approx.iter().cloned());
                        }
                        Ok(Parsed {
                            criterion: Criterion::RateAbove(n),
                            ..
                        }) if lines.len() == 1 => {
                            return Ok(Parsed {
                                criterion: Criterion::RateAbove(*n),
                                approx: None,
                            })
                        }
                        Ok(_) => return Err(format!("ACL '{n}' mixes a rate with other criteria")),
                        Err(e) => return Err(format!("ACL '{n}' (line {line}): {e}")),
                    }
                }
                notes.dedup();
                Ok(Parsed {
                    criterion: Criterion::Regions(regions),
                    approx: (!notes.is_empty()).then(|| notes.join("; ")),
                })
            } else if let Some(p) = predefined(n) {
                Ok(p)
            } else {
                Err(format!("ACL '{n}' is not defined"))
            }
        }
    }
}

/// A condition in portcullis's terms: OR of cubes, each a positive region and the
/// regions it excludes; `rate` when a term is a request rate.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Cubes {
    pub cubes: Vec<(Region, Vec<Region>)>,
    pub rate: Option<u64>,
    pub approx: Vec<String>,
}

/// Most cubes one condition may expand to.
const MAX_CUBES: usize = 256;

/// The `if` condition as cubes (an `unless` is left to the caller).
pub fn cubes(cond: &Condition, acls: &Acls) -> Result<Cubes, String> {
    let mut out = Cubes::default();
    for and in &cond.or {
        // the positive part: a cross product of the OR'ed regions of each positive term
        let mut pos: Vec<Region> = vec![Region::any()];
        let mut neg: Vec<Region> = Vec::new();
        let mut dead = false;
        for (negated, t) in and {
            let p = term(t, acls)?;
            out.approx.extend(p.approx.iter().cloned());
            let regions = match p.criterion {
                Criterion::RateAbove(n) => {
                    if *negated || out.rate.is_some() {
                        return Err("a negated or second request-rate term".into());
                    }
                    out.rate = Some(n);
                    continue;
                }
                Criterion::Regions(r) => r,
            };
            if *negated {
                if regions.iter().any(|r| *r == Region::any()) {
                    dead = true; // !TRUE
                }
                neg.extend(regions);
            } else {
                let mut next = Vec::new();
                for a in &pos {
                    for b in &regions {
                        if let Some(x) = a.intersect(b) {
                            next.push(x);
                        }
                    }
                }
                if next.len() > MAX_CUBES {
                    return Err("the condition expands to too many routes".into());
                }
                pos = next;
            }
        }
        if dead {
            continue;
        }
        for p in pos {
            out.cubes.push((p, neg.clone()));
            if out.cubes.len() > MAX_CUBES {
                return Err("the condition expands to too many routes".into());
            }
        }
    }
    out.approx.sort();
    out.approx.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn criteria() {
        let p = criterion(&w("hdr(host) -i WWW.a.test b.test")).map_err(|e| panic!("{e}"));
        let Ok(Parsed {
            criterion: Criterion::Regions(r),
            approx: None,
        }) = p
        else {
            panic!("{p:?}")
        };
        assert_eq!(r[0].host.as_deref(), Some("www.a.test"));
        assert_eq!(r.len(), 2);
        assert!(criterion(&w("path_beg -i /A")).is_ok_and(|p| p.approx.is_some()));
        assert!(criterion(&w("src 10.0.0.1 192.168.0.0/16")).is_ok());
        assert!(criterion(&w("src nope")).is_err());
        assert!(criterion(&w("path_reg ^/x")).is_err());
        assert!(criterion(&w("ssl_fc")).is_err());
        assert!(criterion(&w("hdr(host) -m beg x")).is_err());
        assert_eq!(
            criterion(&w("sc_http_req_rate(0) gt 20")).map(|p| p.criterion),
            Ok(Criterion::RateAbove(20))
        );
    }

    #[test]
    fn named_acls_are_ored_and_conditions_expand() {
        let dirs = vec![
            Directive {
                line: 1,
                args: w("acl api path_beg /api"),
            },
            Directive {
                line: 2,
                args: w("acl api path_beg /v1"),
            },
            Directive {
                line: 3,
                args: w("acl h hdr(host) -i a.test"),
            },
        ];
        let acls = named_acls(&dirs);
        let cond = super::super::parse::split_condition(&w(
            "use_backend x if api h !{ src 10.0.0.0/8 } || METH_POST",
        ));
        let Ok((_, Some(cond))) = cond else {
            panic!("{cond:?}")
        };
        let c = cubes(&cond, &acls).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.cubes.len(), 3);
        assert_eq!(c.cubes[0].0.prefix, "/api");
        assert_eq!(c.cubes[0].0.host.as_deref(), Some("a.test"));
        assert_eq!(c.cubes[0].1.len(), 1);
        assert!(c.cubes[2].0.methods.is_some());
    }
}
