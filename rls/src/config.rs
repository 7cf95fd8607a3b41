//! envoyproxy/ratelimit's configuration format, and its most-specific matching.
//!
//! One YAML document per file, one `domain` per document:
//!
//! ```yaml
//! domain: edge_proxy_per_ip
//! on_database_error: error        # ours: error (Envoy decides), allow or deny
//! descriptors:
//!   - key: remote_address
//!     rate_limit: {unit: second, requests_per_unit: 10}
//!   - key: remote_address
//!     value: 50.0.0.5
//!     rate_limit: {unit: second, requests_per_unit: 0}
//! ```
//!
//! A descriptor node has `key`, an optional `value` (a trailing `*` makes it a prefix),
//! an optional `rate_limit` (`unit`, `requests_per_unit`, `name`, `replaces`, `unlimited`,
//! and ours, `algorithm`), `shadow_mode`, `detailed_metric` and nested `descriptors`.
//! Unknown fields are errors, as in the reference server.
//!
//! Matching follows the reference's GetLimit: the request descriptor's entries are walked
//! from the domain's top level down; at each level an entry matches the node with its key
//! and exactly its value, else the first node (in file order) whose value prefix it starts
//! with, else the node with its key and no value. The limit is the matched node's at the
//! request's last entry; a walk that stops earlier matches nothing.

use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A `unit` of the reference format, with its length in seconds where it has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    /// The unit's length in seconds (a month: 30 days, a year: 365, for a window only).
    pub fn seconds(self) -> f64 {
        match self {
            Unit::Second => 1.0,
            Unit::Minute => 60.0,
            Unit::Hour => 3_600.0,
            Unit::Day => 86_400.0,
            Unit::Week => 604_800.0,
            Unit::Month => 2_592_000.0,
            Unit::Year => 31_536_000.0,
        }
    }

    /// The value of envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit.
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// From the proto's enum (a descriptor's limit override); 0 (UNKNOWN) has none.
    pub fn from_proto(value: i32) -> Option<Unit> {
        Some(match value {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }
}

/// Which pg_ratelimit limit counts a rule's hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// rl_take: a bucket of `requests_per_unit` refilled over one unit (smooth; the default
    /// for second, minute and hour).
    Bucket,
    /// rl_spend: a UTC calendar budget (day and month only; the default for them).
    Budget,
    /// rl_window: at most `requests_per_unit` in any sliding unit (exact; the default for
    /// week and year, which have no calendar budget).
    Window,
}

impl Algorithm {
    fn parse(text: &str) -> Option<Algorithm> {
        Some(match text {
            "bucket" => Algorithm::Bucket,
            "budget" => Algorithm::Budget,
            "window" => Algorithm::Window,
            _ => return None,
        })
    }

    pub fn default_for(unit: Unit) -> Algorithm {
        match unit {
            Unit::Second | Unit::Minute | Unit::Hour => Algorithm::Bucket,
            Unit::Day | Unit::Month => Algorithm::Budget,
            Unit::Week | Unit::Year => Algorithm::Window,
        }
    }
}

/// What a domain answers when the database cannot be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDatabaseError {
    /// gRPC UNAVAILABLE: Envoy's own `failure_mode_deny` decides (it allows by default).
    Error,
    /// OK for every descriptor.
    Allow,
    /// OVER_LIMIT for every descriptor.
    Deny,
}

/// One `rate_limit` block with what its node says around it.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub name: Option<String>,
    pub replaces: Vec<String>,
    pub unit: Unit,
    pub requests_per_unit: u32,
    pub unlimited: bool,
    pub shadow: bool,
    pub detailed_metric: bool,
    pub algorithm: Algorithm,
    /// A pg_ratelimit policy (rl_policy_set) that counts the hits instead of `unit` and
    /// `requests_per_unit`: rl_check(policy, the last entry's value, hits, tier).
    pub policy: Option<PolicyRef>,
}

/// `policy` and `tier_key` of a rate_limit block.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyRef {
    pub name: String,
    /// The descriptor entry whose value names the tier (none: the policy's base limits).
    pub tier_key: Option<String>,
}

#[derive(Default, Debug)]
struct Level {
    /// (key, value) -> node
    exact: HashMap<(String, String), Node>,
    /// key -> node without a value
    any: HashMap<String, Node>,
    /// (key, value prefix, node), in file order
    prefixes: Vec<(String, String, Node)>,
}

#[derive(Default, Debug)]
struct Node {
    /// How the metrics name this node: `key` or `key_value`.
    stat: String,
    rule: Option<Rule>,
    children: Level,
}

#[derive(Debug)]
pub struct Domain {
    pub name: String,
    pub on_database_error: OnDatabaseError,
    top: Level,
}

/// A rule matched by a request descriptor, with the metric key the reference would use
/// (`key_value.key`, the domain apart; with `detailed_metric`, every value of the request).
#[derive(Debug, PartialEq)]
pub struct Matched<'a> {
    pub rule: &'a Rule,
    pub stat_key: String,
}

impl Domain {
    /// The rule for one request descriptor's (key, value) entries, if any.
    pub fn find(&self, entries: &[(&str, &str)]) -> Option<Matched<'_>> {
        let mut level = &self.top;
        let mut path = Vec::new();
        let mut detailed = Vec::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            let node = level
                .exact
                .get(&((*key).to_owned(), (*value).to_owned()))
                .or_else(|| {
                    level.prefixes.iter().find(|(k, p, _)| k == key && value.starts_with(p.as_str())).map(|t| &t.2)
                })
                .or_else(|| level.any.get(*key))?;
            path.push(node.stat.clone());
            detailed.push(format!("{key}_{value}"));
            if i == entries.len() - 1 {
                let rule = node.rule.as_ref()?;
                let stat_key = if rule.detailed_metric { detailed.join(".") } else { path.join(".") };
                return Some(Matched { rule, stat_key });
            }
            level = &node.children;
        }
        None
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    domain: String,
    #[serde(default)]
    on_database_error: Option<String>,
    #[serde(default)]
    descriptors: Vec<NodeDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeDoc {
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<RateLimitDoc>,
    #[serde(default)]
    descriptors: Vec<NodeDoc>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitDoc {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<ReplacesDoc>,
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    tier_key: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplacesDoc {
    name: String,
}

fn node_of(doc: NodeDoc, at: &str) -> Result<Node, String> {
    let at = match &doc.value {
        Some(v) => format!("{at}.{}_{v}", doc.key),
        None => format!("{at}.{}", doc.key),
    };
    if doc.key.is_empty() {
        return Err(format!("{at}: key must not be empty"));
    }
    let rule = match doc.rate_limit {
        None => None,
        Some(rl) => {
            let policy = match (&rl.policy, &rl.tier_key) {
                (Some(name), tier_key) => {
                    if name.is_empty() {
                        return Err(format!("{at}: policy must not be empty"));
                    }
                    if rl.unit.is_some() || rl.requests_per_unit.is_some() || rl.algorithm.is_some() || rl.unlimited {
                        return Err(format!(
                            "{at}: a rate_limit with a policy takes its limits from the policy: no unit, requests_per_unit, algorithm or unlimited"
                        ));
                    }
                    Some(PolicyRef { name: name.clone(), tier_key: tier_key.clone() })
                }
                (None, Some(_)) => return Err(format!("{at}: tier_key needs a policy")),
                (None, None) => None,
            };
            let unit = match (&rl.unit, rl.unlimited || policy.is_some()) {
                (Some(u), _) => Unit::parse(u).ok_or_else(|| {
                    format!("{at}: unit must be one of second, minute, hour, day, week, month, year, got {u:?}")
                })?,
                (None, true) => Unit::Second,
                (None, false) => return Err(format!("{at}: rate_limit needs a unit")),
            };
            let requests_per_unit = match (rl.requests_per_unit, rl.unlimited || policy.is_some()) {
                (Some(n), _) => n,
                (None, true) => 0,
                (None, false) => return Err(format!("{at}: rate_limit needs requests_per_unit")),
            };
            let algorithm = match &rl.algorithm {
                None => Algorithm::default_for(unit),
                Some(a) => Algorithm::parse(a)
                    .ok_or_else(|| format!("{at}: algorithm must be bucket, budget or window, got {a:?}"))?,
            };
            if algorithm == Algorithm::Budget && !matches!(unit, Unit::Day | Unit::Month) {
                return Err(format!("{at}: algorithm budget needs unit day or month (UTC calendar periods)"));
            }
            if algorithm == Algorithm::Bucket && matches!(unit, Unit::Month | Unit::Year) {
                return Err(format!("{at}: algorithm bucket takes units second to week; use budget or window"));
            }
            if rl.replaces.iter().any(|r| r.name.is_empty()) {
                return Err(format!("{at}: replaces needs a name"));
            }
            Some(Rule {
                name: rl.name,
                replaces: rl.replaces.into_iter().map(|r| r.name).collect(),
                unit,
                requests_per_unit,
                unlimited: rl.unlimited,
                shadow: doc.shadow_mode,
                detailed_metric: doc.detailed_metric,
                algorithm,
                policy,
            })
        }
    };
    let stat = match &doc.value {
        Some(v) => format!("{}_{v}", doc.key),
        None => doc.key.clone(),
    };
    Ok(Node { stat, rule, children: level_of(doc.descriptors, &at)? })
}

fn level_of(docs: Vec<NodeDoc>, at: &str) -> Result<Level, String> {
    let mut level = Level::default();
    for doc in docs {
        let key = doc.key.clone();
        let value = doc.value.clone();
        let node = node_of(doc, at)?;
        let duplicate = match value {
            None => level.any.insert(key.clone(), node).is_some(),
            Some(v) if v.ends_with('*') => {
                let prefix = v.trim_end_matches('*').to_owned();
                let dup = level.prefixes.iter().any(|(k, p, _)| *k == key && *p == prefix);
                level.prefixes.push((key.clone(), prefix, node));
                dup
            }
            Some(v) => level.exact.insert((key.clone(), v), node).is_some(),
        };
        if duplicate {
            return Err(format!("{at}: duplicate descriptor {key:?} with the same value"));
        }
    }
    Ok(level)
}

/// One configuration document.
pub fn parse_domain(text: &str, origin: &str) -> Result<Domain, String> {
    let doc: FileDoc = serde_yaml::from_str(text).map_err(|e| format!("{origin}: {e}"))?;
    if doc.domain.is_empty() {
        return Err(format!("{origin}: domain must not be empty"));
    }
    let on_database_error = match doc.on_database_error.as_deref() {
        None | Some("error") => OnDatabaseError::Error,
        Some("allow") => OnDatabaseError::Allow,
        Some("deny") => OnDatabaseError::Deny,
        Some(other) => return Err(format!("{origin}: on_database_error must be error, allow or deny, got {other:?}")),
    };
    let top = level_of(doc.descriptors, &format!("{origin}: {}", doc.domain))?;
    Ok(Domain { name: doc.domain, on_database_error, top })
}

/// Every domain of a configuration: a file, or every `.yaml`/`.yml` file of a folder.
#[derive(Debug, Default)]
pub struct Config {
    pub domains: HashMap<String, Domain>,
}

/// What identifies one version of a configuration file: its path, the file it resolves to
/// (a Kubernetes ConfigMap swaps a `..data` symlink), its length and modification time.
pub type FileVersion = (PathBuf, PathBuf, u64, std::time::SystemTime);

/// The files a configuration path stands for, sorted, each with what identifies its
/// version, so that a reload happens when one changes. In a folder: the `.yaml` and `.yml`
/// files whose names do not start with a dot (editors' and ConfigMaps' own files).
pub fn files_of(path: &Path) -> std::io::Result<Vec<FileVersion>> {
    let mut found = Vec::new();
    let paths: Vec<PathBuf> = if path.is_dir() {
        let mut list: Vec<PathBuf> = std::fs::read_dir(path)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
            .filter(|p| !p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.')))
            .collect();
        list.sort();
        list
    } else {
        vec![path.to_owned()]
    };
    for p in paths {
        let meta = std::fs::metadata(&p)?;
        let resolved = std::fs::canonicalize(&p)?;
        found.push((p, resolved, meta.len(), meta.modified()?));
    }
    Ok(found)
}

pub fn load(path: &Path) -> Result<Config, String> {
    let files = files_of(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut config = Config::default();
    for (file, ..) in files {
        let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let domain = parse_domain(&text, &file.display().to_string())?;
        if config.domains.contains_key(&domain.name) {
            return Err(format!("{}: domain {:?} is configured twice", file.display(), domain.name));
        }
        config.domains.insert(domain.name.clone(), domain);
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The reference server's README examples (the files the Python tests serve too).
    const EXAMPLE4: &str = include_str!("../config/examples/edge_proxy_per_ip.yaml");
    const EXAMPLE3: &str = "domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 500}
  - key: database
    value: default
    rate_limit: {unit: second, requests_per_unit: 500}
";
    const EXAMPLE2: &str = include_str!("../config/examples/messaging.yaml");
    const WILDCARD: &str = "
domain: wild
descriptors:
  - key: path
    value: /foo/*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /foo/bar
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1, name: exact, replaces: [{name: other}]}
  - key: path
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 7, algorithm: window}
";

    fn find(doc: &str, entries: &[(&str, &str)]) -> Option<(u32, Unit, String)> {
        let d = parse_domain(doc, "t").unwrap();
        d.find(entries).map(|m| (m.rule.requests_per_unit, m.rule.unit, m.stat_key))
    }

    type Entries<'a> = &'a [(&'a str, &'a str)];
    type Expected<'a> = Option<(u32, Unit, &'a str)>;

    #[test]
    fn matching_table() {
        let cases: &[(&str, Entries, Expected)] = &[
            (EXAMPLE4, &[("remote_address", "10.0.0.1")], Some((10, Unit::Second, "remote_address"))),
            (EXAMPLE4, &[("remote_address", "50.0.0.5")], Some((0, Unit::Second, "remote_address_50.0.0.5"))),
            (EXAMPLE4, &[("other", "x")], None),
            (EXAMPLE3, &[("database", "users")], Some((500, Unit::Second, "database_users"))),
            (EXAMPLE3, &[("database", "other")], None),
            (
                EXAMPLE2,
                &[("message_type", "marketing"), ("to_number", "2061234567")],
                Some((5, Unit::Day, "message_type_marketing.to_number")),
            ),
            (EXAMPLE2, &[("to_number", "2061234567")], Some((100, Unit::Day, "to_number"))),
            // a walk that stops before the request's last entry matches nothing
            (EXAMPLE2, &[("message_type", "marketing")], None),
            (EXAMPLE2, &[("message_type", "transactional"), ("to_number", "1")], None),
            (WILDCARD, &[("path", "/foo/baz")], Some((3, Unit::Minute, "path_/foo/*"))),
            (WILDCARD, &[("path", "/foo/bar")], Some((1, Unit::Minute, "path_/foo/bar"))),
            (WILDCARD, &[("path", "/other")], Some((7, Unit::Hour, "path"))),
        ];
        for (doc, entries, want) in cases {
            let got = find(doc, entries);
            let want = want.map(|(n, u, s)| (n, u, s.to_owned()));
            assert_eq!(got, want, "{entries:?}");
        }
    }

    #[test]
    fn rule_fields() {
        let d = parse_domain(WILDCARD, "t").unwrap();
        let m = d.find(&[("path", "/foo/bar")]).unwrap();
        assert_eq!(m.rule.name.as_deref(), Some("exact"));
        assert_eq!(m.rule.replaces, vec!["other".to_owned()]);
        assert_eq!(m.rule.algorithm, Algorithm::Bucket);
        let m = d.find(&[("path", "/x")]).unwrap();
        assert!(m.rule.shadow);
        assert_eq!(m.rule.algorithm, Algorithm::Window);
        let m = parse_domain(EXAMPLE2, "t").unwrap();
        assert_eq!(m.find(&[("to_number", "1")]).unwrap().rule.algorithm, Algorithm::Budget);
    }

    #[test]
    fn errors_name_the_place() {
        let cases = [
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "t: d.k: unit must be one of"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n", "t: d.k: rate_limit needs requests_per_unit"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: budget}\n", "budget needs unit day or month"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: month, requests_per_unit: 1, algorithm: bucket}\n", "bucket takes units"),
            ("domain: d\ndescriptors:\n  - key: k\n  - key: k\n", "duplicate descriptor"),
            ("domain: d\ndescriptors:\n  - key: k\n    colour: red\n", "unknown field `colour`"),
            ("domain: d\non_database_error: maybe\n", "on_database_error must be"),
            ("domain: ''\n", "domain must not be empty"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {policy: p, unit: second}\n", "takes its limits from the policy"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {tier_key: plan, unit: second, requests_per_unit: 1}\n", "tier_key needs a policy"),
        ];
        for (doc, want) in cases {
            let err = parse_domain(doc, "t").unwrap_err();
            assert!(err.contains(want), "{err} lacks {want}");
        }
    }

    #[test]
    fn unlimited_needs_no_numbers() {
        let d = parse_domain("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n", "t").unwrap();
        assert!(d.find(&[("k", "v")]).unwrap().rule.unlimited);
    }
}
