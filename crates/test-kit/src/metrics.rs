//! Prometheus text: parse a scrape and pick one sample by selector.

fn parse_selector(sel: &str) -> (String, Vec<(String, String)>) {
    match sel.find('{') {
        None => (sel.trim().to_string(), Vec::new()),
        Some(i) => {
            let name = sel[..i].trim().to_string();
            let inner = sel[i + 1..].trim_end().trim_end_matches('}');
            (name, parse_labels(inner))
        }
    }
}

fn parse_labels(inner: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let Some(eq) = rest.find('=') else { break };
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_string();
        let after = rest[eq + 1..].trim_start();
        let Some(after) = after.strip_prefix('"') else {
            break;
        };
        let mut val = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        val.push(match n {
                            'n' => '\n',
                            other => other,
                        });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                other => val.push(other),
            }
        }
        out.push((key, val));
        rest = after[end..]
            .trim_start()
            .trim_start_matches(',')
            .trim_start();
    }
    out
}

/// Label pairs of one sample, in exposition order.
pub type Labels = Vec<(String, String)>;

/// All samples of a Prometheus text exposition: (metric name, labels, value).
pub fn metric_samples(text: &str) -> Vec<(String, Labels, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, rest) = match line.find('{') {
            Some(i) => match line[i..].find('}') {
                Some(j) => (&line[..i + j + 1], &line[i + j + 1..]),
                None => continue,
            },
            None => match line.find(char::is_whitespace) {
                Some(i) => (&line[..i], &line[i..]),
                None => continue,
            },
        };
        let Some(value) = rest.split_whitespace().next() else {
            continue;
        };
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => match v.parse::<f64>() {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        let (name, labels) = parse_selector(series);
        out.push((name, labels, value));
    }
    out
}

/// Value of the series matching `selector` (`name` or `name{label="x",...}`).
/// Labels in the selector must all be present with equal values (others are ignored);
/// when several series match, their values are summed. `None` when nothing matches.
pub fn metric_value(text: &str, selector: &str) -> Option<f64> {
    let (name, want) = parse_selector(selector);
    let mut found = None;
    for (n, labels, v) in metric_samples(text) {
        if n != name {
            continue;
        }
        if want.iter().all(|w| labels.iter().any(|l| l == w)) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// Whether any sample (or `# TYPE`/`# HELP` line) of metric family `name` exists.
pub fn has_metric(text: &str, name: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim();
        if let Some(rest) = l
            .strip_prefix("# TYPE ")
            .or_else(|| l.strip_prefix("# HELP "))
        {
            return rest.split_whitespace().next() == Some(name);
        }
        let series = l.split(['{', ' ']).next().unwrap_or("");
        series == name
            || series
                .strip_prefix(name)
                .is_some_and(|s| matches!(s, "_bucket" | "_count" | "_sum"))
    })
}
