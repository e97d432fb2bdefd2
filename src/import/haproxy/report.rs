//! One report line per directive: `LINE: DIRECTIVE: translated` /
//! `approximated: HOW` / `unsupported: WHY`.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    Translated,
    Approximated(String),
    Unsupported(String),
}

impl Status {
    fn severity(&self) -> u8 {
        match self {
            Status::Translated => 0,
            Status::Approximated(_) => 1,
            Status::Unsupported(_) => 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub line: usize,
    /// The directive's first words (its keyword, and the sub-keyword when it has one).
    pub directive: String,
    pub status: Status,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: ", self.line, self.directive)?;
        match &self.status {
            Status::Translated => write!(f, "translated"),
            Status::Approximated(how) => write!(f, "approximated: {how}"),
            Status::Unsupported(why) => write!(f, "unsupported: {why}"),
        }
    }
}

/// The report being built: one entry per line; a line reported twice (a `defaults`
/// directive seen by several proxies) keeps its most severe verdict.
#[derive(Debug, Default)]
pub struct Report {
    lines: BTreeMap<usize, Line>,
}

impl Report {
    pub fn put(&mut self, line: usize, directive: &str, status: Status) {
        match self.lines.get_mut(&line) {
            Some(old) if old.status.severity() >= status.severity() => {}
            Some(old) => old.status = status,
            None => {
                self.lines.insert(
                    line,
                    Line {
                        line,
                        directive: directive.to_string(),
                        status,
                    },
                );
            }
        }
    }
    pub fn has(&self, line: usize) -> bool {
        self.lines.contains_key(&line)
    }
    pub fn into_lines(self) -> Vec<Line> {
        self.lines.into_values().collect()
    }
}

/// Counts of a report: translated, approximated, unsupported.
pub fn counts(lines: &[Line]) -> (usize, usize, usize) {
    let mut c = (0, 0, 0);
    for l in lines {
        match l.status {
            Status::Translated => c.0 += 1,
            Status::Approximated(_) => c.1 += 1,
            Status::Unsupported(_) => c.2 += 1,
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_directive_most_severe_kept() {
        let mut r = Report::default();
        r.put(3, "timeout connect", Status::Translated);
        r.put(3, "timeout connect", Status::Approximated("x".into()));
        r.put(3, "timeout connect", Status::Translated);
        r.put(1, "maxconn", Status::Unsupported("y".into()));
        let lines = r.into_lines();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].to_string(), "1: maxconn: unsupported: y");
        assert_eq!(lines[1].to_string(), "3: timeout connect: approximated: x");
        assert_eq!(counts(&lines), (0, 1, 1));
    }
}
