//! envoyproxy/ratelimit's configuration format, loaded and matched as the reference loads
//! and matches it (src/config/config_impl.go), with pg_ratelimit's few additions.
//!
//! One YAML document per file, one `domain` per document:
//!
//! ```yaml
//! domain: edge_proxy_per_ip
//! on_database_error: error        # ours: error (Envoy decides), allow or deny
//! algorithm: fixed                # ours: the default of the rules below that name none
//! descriptors:
//!   - key: remote_address
//!     rate_limit: {unit: second, requests_per_unit: 10}
//!   - key: remote_address
//!     value: 50.0.0.5
//!     rate_limit: {unit: second, requests_per_unit: 0}
//! ```
//!
//! A descriptor node has `key`, an optional `value` (`*` anywhere in it is a wildcard; `""`
//! is no value), an optional `rate_limit` (`unit`, `requests_per_unit`, `name`, `replaces`,
//! `unlimited`, and ours: `algorithm`, `policy`, `tier_key`), `shadow_mode`, `quota_mode`,
//! `detailed_metric`, `value_to_metric`, `share_threshold`, `metadata` and nested
//! `descriptors`. As in the reference, every field name is checked wherever it appears
//! (`config error, unknown key 'x'`), YAML merge keys (`<<`) are applied first, and each
//! error starts with the file's name.
//!
//! Matching follows the reference's GetLimit: the request descriptor's entries are walked
//! from the domain's top level down; at each level an entry matches the node with its key
//! and exactly its value, else the first wildcard (in load order) that matches
//! `key_value`, else the node with its key and no value. The limit is the matched node's at
//! the request's last entry; a walk that stops earlier matches nothing.

use serde::Deserialize;
use serde_json::Value as Json;
use serde_yaml::Value as Yaml;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A `unit` of the reference format, with its length in seconds where it has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    /// As the reference reads it: the proto enum's name, in any case (UNKNOWN is none).
    fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The unit's length in seconds (a month: 30 days, a year: 365, as the reference's
    /// UnitToDivider has them).
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// A bucket of `requests_per_unit` refilled over one unit (smooth; the default for
    /// second, minute and hour).
    Bucket,
    /// A UTC calendar budget (day and month only; the default for them).
    Budget,
    /// At most `requests_per_unit` in any sliding unit (exact; the default for week and
    /// year, which have no calendar budget).
    Window,
    /// At most `requests_per_unit` in each unit-long window aligned to the Unix epoch (a
    /// month 30 days, a year 365), every hit counted, refused or not: the reference's own
    /// counting, exactly (`rl_fixed_window`).
    Fixed,
}

impl Algorithm {
    fn parse(text: &str) -> Option<Algorithm> {
        Some(match text {
            "bucket" => Algorithm::Bucket,
            "budget" => Algorithm::Budget,
            "window" => Algorithm::Window,
            "fixed" => Algorithm::Fixed,
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
    /// `quota_mode`: over the limit refuses the call only when every quota of it is over.
    pub quota: bool,
    pub detailed_metric: bool,
    pub algorithm: Algorithm,
    /// A pg_ratelimit policy (rl_policy_set) that counts the hits instead of `unit` and
    /// `requests_per_unit`: rl_check(policy, the last entry's value, hits, tier).
    pub policy: Option<PolicyRef>,
    /// `metadata`, returned in the response's dynamic metadata when the descriptor passes.
    pub metadata: Option<serde_json::Map<String, Json>>,
}

impl Rule {
    /// A descriptor's own limit (the proto's `limit` override): no shadow, no quota.
    pub fn overriding(requests_per_unit: u32, unit: Unit) -> Rule {
        Rule {
            name: None,
            replaces: vec![],
            unit,
            requests_per_unit,
            unlimited: false,
            shadow: false,
            quota: false,
            detailed_metric: false,
            algorithm: Algorithm::default_for(unit),
            policy: None,
            metadata: None,
        }
    }
}

/// `policy` and `tier_key` of a rate_limit block.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyRef {
    pub name: String,
    /// The descriptor entry whose value names the tier (none: the policy's base limits).
    pub tier_key: Option<String>,
}

/// One level of descriptors: nodes by `key` or `key_value`, and the wildcard ones again
/// with their value split on `*`, in load order.
#[derive(Default, Debug)]
struct Level {
    nodes: HashMap<String, Node>,
    wildcards: Vec<(String, Vec<String>)>,
}

#[derive(Default, Debug)]
struct Node {
    rule: Option<Rule>,
    children: Level,
    value_to_metric: bool,
    /// With share_threshold, the wildcard value (`files/*`) that every matching value
    /// counts under.
    shared: Option<String>,
}

#[derive(Debug)]
pub struct Domain {
    pub name: String,
    pub on_database_error: OnDatabaseError,
    top: Level,
}

/// A rule matched by a request descriptor, with the stat key the reference would use
/// (`domain.key_value.key`, sanitized as the reference's stats are), and for each entry the
/// wildcard value it counts under when its node shares one counter (share_threshold).
#[derive(Debug, PartialEq)]
pub struct Matched<'a> {
    pub rule: &'a Rule,
    pub stat_key: String,
    pub shared: Vec<Option<String>>,
}

/// Whether `value` matches a wildcard split on `*` (each `*` any run of characters).
fn wildcard_match(parts: &[String], value: &str) -> bool {
    if parts.len() == 1 {
        return parts[0] == value;
    }
    let (first, last) = (&parts[0], &parts[parts.len() - 1]);
    if !value.starts_with(first.as_str()) || !value.ends_with(last.as_str()) {
        return false;
    }
    if value.len() < parts.iter().map(String::len).sum::<usize>() {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// The reference's stat name sanitizing: `:` and `|` become `_`, and so do the dots of
/// anything shaped like an IPv4 address. Length-preserving.
pub fn sanitize_stat(text: &str) -> String {
    let mut out: Vec<u8> = text.replace([':', '|'], "_").into_bytes();
    let mut i = 0;
    while i < out.len() {
        match ipv4_at(&out, i) {
            Some(end) => {
                for b in &mut out[i..end] {
                    if *b == b'.' {
                        *b = b'_';
                    }
                }
                i = end;
            }
            None => i += 1,
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// The end of `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` starting at `at` (greedy, backtracking).
fn ipv4_at(s: &[u8], at: usize) -> Option<usize> {
    fn group(s: &[u8], at: usize, left: u8) -> Option<usize> {
        for len in (1..=3).rev() {
            if at + len <= s.len() && s[at..at + len].iter().all(u8::is_ascii_digit) {
                if left == 0 {
                    return Some(at + len);
                }
                if s.get(at + len) == Some(&b'.') {
                    if let Some(end) = group(s, at + len + 1, left - 1) {
                        return Some(end);
                    }
                }
            }
        }
        None
    }
    group(s, at, 3)
}

impl Domain {
    /// The rule for one request descriptor's (key, value) entries, if any.
    pub fn find(&self, entries: &[(&str, &str)]) -> Option<Matched<'_>> {
        let mut level = &self.top;
        let mut detailed = self.name.clone();
        let mut plain = self.name.clone();
        let mut shared: Vec<Option<String>> = vec![None; entries.len()];
        let mut found: Option<&Rule> = None;
        for (i, (key, value)) in entries.iter().enumerate() {
            let full = format!("{key}_{value}");
            detailed.push('.');
            detailed.push_str(&full);
            let mut wildcard: Option<&str> = None;
            let mut node = level.nodes.get(&full);
            if node.is_none() {
                if let Some((k, _)) = level.wildcards.iter().find(|(_, parts)| wildcard_match(parts, &full)) {
                    node = level.nodes.get(k);
                    wildcard = Some(k.as_str());
                }
            }
            let by_value = node.is_some();
            if node.is_none() {
                node = level.nodes.get(*key);
            }
            let Some(node) = node else { break };
            let pattern = wildcard.map(|w| w.strip_prefix(&format!("{key}_")).unwrap_or(w).to_owned());
            if wildcard.is_some() && node.shared.is_some() {
                shared[i] = pattern.clone();
            }
            let shown: Option<String> = if wildcard.is_some() {
                if shared[i].is_some() {
                    shared[i].clone()
                } else if node.value_to_metric {
                    Some((*value).to_owned())
                } else {
                    pattern
                }
            } else if by_value || node.value_to_metric {
                Some((*value).to_owned())
            } else {
                None
            };
            plain.push('.');
            plain.push_str(key);
            if let Some(v) = shown.filter(|v| !v.is_empty()) {
                plain.push('_');
                plain.push_str(&v);
            }
            if i == entries.len() - 1 {
                found = node.rule.as_ref();
            }
            if node.children.nodes.is_empty() {
                break;
            }
            level = &node.children;
        }
        let rule = found?;
        let stat_key = if rule.detailed_metric {
            if shared.iter().any(Option::is_some) {
                let mut key = self.name.clone();
                for ((k, v), s) in entries.iter().zip(&shared) {
                    key.push('.');
                    key.push_str(k);
                    match s {
                        Some(p) => {
                            key.push('_');
                            key.push_str(p);
                        }
                        None if !v.is_empty() => {
                            key.push('_');
                            key.push_str(v);
                        }
                        None => {}
                    }
                }
                key
            } else {
                detailed
            }
        } else {
            plain
        };
        Some(Matched { rule, stat_key: sanitize_stat(&stat_key), shared })
    }
}

/// A descriptor node as a file or an xDS push gives it, before the reference's checks.
#[derive(Deserialize, Default)]
pub struct NodeDoc {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub value: String,
    #[serde(default)]
    pub rate_limit: Option<RateLimitDoc>,
    #[serde(default)]
    pub descriptors: Vec<NodeDoc>,
    #[serde(default)]
    pub shadow_mode: bool,
    #[serde(default)]
    pub quota_mode: bool,
    #[serde(default)]
    pub detailed_metric: bool,
    #[serde(default)]
    pub value_to_metric: bool,
    #[serde(default)]
    pub share_threshold: bool,
    #[serde(default)]
    pub metadata: Option<Yaml>,
}

#[derive(Deserialize, Default)]
pub struct RateLimitDoc {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub replaces: Vec<ReplacesDoc>,
    #[serde(default)]
    pub unit: String,
    #[serde(default)]
    pub requests_per_unit: u32,
    #[serde(default)]
    pub unlimited: bool,
    #[serde(default)]
    pub algorithm: Option<String>,
    #[serde(default)]
    pub policy: Option<String>,
    #[serde(default)]
    pub tier_key: Option<String>,
}

#[derive(Deserialize, Default)]
pub struct ReplacesDoc {
    #[serde(default)]
    pub name: String,
}

#[derive(Deserialize, Default)]
pub struct FileDoc {
    #[serde(default)]
    pub domain: String,
    #[serde(default)]
    pub on_database_error: Option<String>,
    /// Ours: the algorithm of every rate_limit of this file's descriptors that names none.
    #[serde(default)]
    pub algorithm: Option<String>,
    #[serde(default)]
    pub descriptors: Vec<NodeDoc>,
}

/// The field names the reference accepts anywhere in a file, and ours.
const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    // pg_ratelimit's
    "on_database_error",
    "algorithm",
    "policy",
    "tier_key",
];

/// A YAML scalar as Go's `%v` prints it in the reference's messages.
fn shown(v: &Yaml) -> String {
    match v {
        Yaml::String(s) => s.clone(),
        Yaml::Number(n) => n.to_string(),
        Yaml::Bool(b) => b.to_string(),
        Yaml::Null => "<nil>".to_owned(),
        other => serde_yaml::to_string(other).unwrap_or_default().trim_end().to_owned(),
    }
}

/// The reference's validateYamlKeys: every key text and known, every list a list of maps.
fn validate_keys(map: &serde_yaml::Mapping) -> Result<(), String> {
    for (k, v) in map {
        let Yaml::String(name) = k else {
            return Err(format!("config error, key is not of type string: {}", shown(k)));
        };
        if !VALID_KEYS.contains(&name.as_str()) {
            return Err(format!("config error, unknown key '{name}'"));
        }
        if name == "metadata" {
            continue;
        }
        match v {
            Yaml::Sequence(items) => {
                for item in items {
                    let Yaml::Mapping(m) = item else {
                        return Err(format!(
                            "config error, yaml file contains list of type other than map: {}",
                            shown(item)
                        ));
                    };
                    validate_keys(m)?;
                }
            }
            Yaml::Mapping(m) => validate_keys(m)?,
            Yaml::Tagged(_) => return Err("error checking config".to_owned()),
            _ => {}
        }
    }
    Ok(())
}

/// A field written with no value (`descriptors:`, `value:`) is its zero value, as Go's
/// YAML decoder leaves it: such fields are dropped before the typed read, so that their
/// defaults apply (not inside `metadata`, whose nulls are values).
fn without_nulls(value: &mut Yaml) {
    match value {
        Yaml::Mapping(m) => {
            m.retain(|_, v| !v.is_null());
            for (k, v) in m.iter_mut() {
                if k.as_str() != Some("metadata") {
                    without_nulls(v);
                }
            }
        }
        Yaml::Sequence(items) => items.iter_mut().for_each(without_nulls),
        _ => {}
    }
}

/// One file's text as the reference reads it: merge keys applied, keys checked, then the
/// fields. Errors without the file's name.
pub fn read_file(text: &str) -> Result<FileDoc, String> {
    let mut value: Yaml = serde_yaml::from_str(text).map_err(|e| format!("error loading config file: {e}"))?;
    value.apply_merge().map_err(|e| format!("error loading config file: {e}"))?;
    match &value {
        Yaml::Mapping(m) => validate_keys(m)?,
        // an empty file: no domain, as the reference reads it
        Yaml::Null => return Ok(FileDoc::default()),
        _ => return Err("error loading config file: the document is not a map".to_owned()),
    }
    without_nulls(&mut value);
    // read again from text, so that a wrong value's message says where it is
    let merged = serde_yaml::to_string(&value).map_err(|e| format!("error loading config file: {e}"))?;
    serde_yaml::from_str(&merged).map_err(|e| format!("error loading config file: {e}"))
}

fn yaml_to_json(v: &Yaml) -> Json {
    match v {
        Yaml::Null => Json::Null,
        Yaml::Bool(b) => Json::Bool(*b),
        Yaml::Number(n) => {
            if let Some(i) = n.as_i64() {
                Json::from(i)
            } else if let Some(u) = n.as_u64() {
                Json::from(u)
            } else {
                n.as_f64().and_then(serde_json::Number::from_f64).map_or(Json::Null, Json::Number)
            }
        }
        Yaml::String(s) => Json::String(s.clone()),
        Yaml::Sequence(items) => Json::Array(items.iter().map(yaml_to_json).collect()),
        Yaml::Mapping(m) => Json::Object(m.iter().map(|(k, v)| (shown(k), yaml_to_json(v))).collect()),
        Yaml::Tagged(t) => yaml_to_json(&t.value),
    }
}

/// Every domain of a configuration.
#[derive(Debug, Default)]
pub struct Config {
    pub domains: HashMap<String, Domain>,
    /// MERGE_DOMAIN_CONFIG: a domain in several files is one domain.
    merge: bool,
}

impl Config {
    pub fn new(merge: bool) -> Config {
        Config { domains: HashMap::new(), merge }
    }

    /// Loads one document as the reference's loadConfig does; `name` starts every error.
    pub fn add(&mut self, name: &str, doc: FileDoc) -> Result<(), String> {
        let err = |e: String| format!("{name}: {e}");
        if doc.domain.is_empty() {
            return Err(err("config file cannot have empty domain".into()));
        }
        let on_database_error = match doc.on_database_error.as_deref() {
            None | Some("error") => OnDatabaseError::Error,
            Some("allow") => OnDatabaseError::Allow,
            Some("deny") => OnDatabaseError::Deny,
            Some(other) => return Err(err(format!("on_database_error must be error, allow or deny, got {other:?}"))),
        };
        let merge = self.merge;
        let domain = match self.domains.get_mut(&doc.domain) {
            Some(_) if !merge => return Err(err(format!("duplicate domain '{}' in config file", doc.domain))),
            Some(existing) => existing,
            None => self.domains.entry(doc.domain.clone()).or_insert(Domain {
                name: doc.domain.clone(),
                on_database_error,
                top: Level::default(),
            }),
        };
        if doc.on_database_error.is_some() {
            domain.on_database_error = on_database_error;
        }
        let algorithm = match doc.algorithm.as_deref() {
            None => None,
            Some(a) => Some(Algorithm::parse(a).ok_or_else(|| err(algorithm_error(&doc.domain, a)))?),
        };
        load_level(&mut domain.top, &format!("{}.", doc.domain), doc.descriptors, algorithm).map_err(err)
    }
}

fn algorithm_error(at: &str, given: &str) -> String {
    format!("{at}: algorithm must be bucket, budget, window or fixed, got {given:?}")
}

/// Loads a level's nodes; `algorithm` is the file's default for rules that name none.
fn load_level(level: &mut Level, parent: &str, docs: Vec<NodeDoc>, algorithm: Option<Algorithm>) -> Result<(), String> {
    for mut doc in docs {
        if doc.key.is_empty() {
            return Err("descriptor has empty key".into());
        }
        let final_key = if doc.value.is_empty() { doc.key.clone() } else { format!("{}_{}", doc.key, doc.value) };
        let path = format!("{parent}{final_key}");
        if level.nodes.contains_key(&final_key) {
            return Err(format!("duplicate descriptor composite key '{path}'"));
        }
        let rule = match doc.rate_limit.take() {
            None => None,
            Some(rl) => Some(rule_of(rl, &doc, &path, algorithm)?),
        };
        let wild = final_key.contains('*');
        if doc.share_threshold && !wild {
            return Err(format!(
                "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
            ));
        }
        if wild {
            level.wildcards.push((final_key.clone(), final_key.split('*').map(str::to_owned).collect()));
        }
        let mut node = Node {
            rule,
            children: Level::default(),
            value_to_metric: doc.value_to_metric,
            shared: if doc.share_threshold { Some(doc.value.clone()) } else { None },
        };
        load_level(&mut node.children, &format!("{path}."), doc.descriptors, algorithm)?;
        level.nodes.insert(final_key, node);
    }
    Ok(())
}

fn rule_of(rl: RateLimitDoc, doc: &NodeDoc, at: &str, default: Option<Algorithm>) -> Result<Rule, String> {
    let unit = Unit::parse(&rl.unit);
    let policy = match (&rl.policy, &rl.tier_key) {
        (Some(name), tier_key) => {
            if name.is_empty() {
                return Err(format!("{at}: policy must not be empty"));
            }
            if !rl.unit.is_empty() || rl.requests_per_unit != 0 || rl.algorithm.is_some() || rl.unlimited {
                return Err(format!(
                    "{at}: a rate_limit with a policy takes its limits from the policy: no unit, requests_per_unit, algorithm or unlimited"
                ));
            }
            Some(PolicyRef { name: name.clone(), tier_key: tier_key.clone() })
        }
        (None, Some(_)) => return Err(format!("{at}: tier_key needs a policy")),
        (None, None) => None,
    };
    if rl.unlimited && unit.is_some() {
        return Err("should not specify rate limit unit when unlimited".into());
    }
    if !rl.unlimited && unit.is_none() && policy.is_none() {
        return Err(format!("invalid rate limit unit '{}'", rl.unit));
    }
    let unit = unit.unwrap_or(Unit::Second);
    for r in &rl.replaces {
        if r.name.is_empty() {
            return Err("should not have an empty replaces entry".into());
        }
        if r.name == rl.name {
            return Err("replaces should not contain name of same descriptor".into());
        }
    }
    let algorithm = match &rl.algorithm {
        None => default.unwrap_or(Algorithm::default_for(unit)),
        Some(a) => Algorithm::parse(a).ok_or_else(|| algorithm_error(at, a))?,
    };
    if algorithm == Algorithm::Budget && matches!(unit, Unit::Second | Unit::Minute) {
        return Err(format!("{at}: algorithm budget needs unit hour, day, week, month or year (UTC calendar periods)"));
    }
    if algorithm == Algorithm::Bucket && matches!(unit, Unit::Month | Unit::Year) {
        return Err(format!("{at}: algorithm bucket takes units second to week; use budget or window"));
    }
    let metadata = match &doc.metadata {
        None | Some(Yaml::Null) => None,
        Some(m @ Yaml::Mapping(_)) => match yaml_to_json(m) {
            Json::Object(o) if !o.is_empty() => Some(o),
            _ => None,
        },
        Some(_) => return Err("error parsing metadata: metadata must be a map".into()),
    };
    Ok(Rule {
        name: Some(rl.name).filter(|n| !n.is_empty()),
        replaces: rl.replaces.into_iter().map(|r| r.name).collect(),
        unit,
        requests_per_unit: rl.requests_per_unit,
        unlimited: rl.unlimited,
        shadow: doc.shadow_mode,
        quota: doc.quota_mode,
        detailed_metric: doc.detailed_metric,
        algorithm,
        policy,
        metadata,
    })
}

/// One configuration document (tests and `--check` of one file).
#[cfg(test)]
pub fn parse_domain(text: &str, origin: &str) -> Result<Domain, String> {
    let doc = read_file(text).map_err(|e| format!("{origin}: {e}"))?;
    let mut config = Config::new(false);
    let name = doc.domain.clone();
    config.add(origin, doc)?;
    config.domains.remove(&name).ok_or_else(|| format!("{origin}: no domain"))
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

/// Every domain of a file, or of every `.yaml`/`.yml` file of a folder (in name order);
/// an error starts with the file's name as the folder holds it.
pub fn load(path: &Path, merge: bool) -> Result<Config, String> {
    let files = files_of(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut config = Config::new(merge);
    for (file, ..) in files {
        let name = file.file_name().map_or_else(|| file.display().to_string(), |n| n.to_string_lossy().into_owned());
        let text = std::fs::read_to_string(&file).map_err(|e| format!("{name}: {e}"))?;
        let doc = read_file(&text).map_err(|e| format!("{name}: {e}"))?;
        config.add(&name, doc)?;
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE4: &str = include_str!("../config/examples/edge_proxy_per_ip.yaml");
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
    value: /a/*/b
    rate_limit: {unit: minute, requests_per_unit: 4}
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
            (EXAMPLE4, &[("remote_address", "10.0.0.1")], Some((10, Unit::Second, "edge_proxy_per_ip.remote_address"))),
            (
                EXAMPLE4,
                &[("remote_address", "50.0.0.5")],
                Some((0, Unit::Second, "edge_proxy_per_ip.remote_address_50_0_0_5")),
            ),
            (EXAMPLE4, &[("other", "x")], None),
            (
                EXAMPLE2,
                &[("message_type", "marketing"), ("to_number", "2061234567")],
                Some((5, Unit::Day, "messaging.message_type_marketing.to_number")),
            ),
            (EXAMPLE2, &[("to_number", "2061234567")], Some((100, Unit::Day, "messaging.to_number"))),
            (EXAMPLE2, &[("message_type", "marketing")], None),
            (EXAMPLE2, &[("message_type", "transactional"), ("to_number", "1")], None),
            (WILDCARD, &[("path", "/foo/baz")], Some((3, Unit::Minute, "wild.path_/foo/*"))),
            (WILDCARD, &[("path", "/foo/bar")], Some((1, Unit::Minute, "wild.path_/foo/bar"))),
            (WILDCARD, &[("path", "/a/x/y/b")], Some((4, Unit::Minute, "wild.path_/a/*/b"))),
            (WILDCARD, &[("path", "/a/b")], Some((7, Unit::Hour, "wild.path"))),
            (WILDCARD, &[("path", "/other")], Some((7, Unit::Hour, "wild.path"))),
        ];
        for (doc, entries, want) in cases {
            let got = find(doc, entries);
            let want = want.map(|(n, u, s)| (n, u, s.to_owned()));
            assert_eq!(got, want, "{entries:?}");
        }
    }

    /// `algorithm` at the top of a file is the default of its rules that name none: the
    /// reference's fixed windows for a whole domain, a rule still choosing its own.
    #[test]
    fn a_file_chooses_the_algorithm_of_its_rules() {
        let doc = "
domain: exact
algorithm: fixed
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 3}
    descriptors:
      - key: path
        rate_limit: {unit: month, requests_per_unit: 9}
  - key: user
    rate_limit: {unit: day, requests_per_unit: 5, algorithm: budget}
";
        let d = parse_domain(doc, "t").unwrap();
        let algorithm = |entries: &[(&str, &str)]| d.find(entries).map(|m| m.rule.algorithm);
        assert_eq!(algorithm(&[("ip", "1")]), Some(Algorithm::Fixed));
        assert_eq!(algorithm(&[("ip", "1"), ("path", "/")]), Some(Algorithm::Fixed));
        assert_eq!(algorithm(&[("user", "u")]), Some(Algorithm::Budget));
        let plain = parse_domain(&doc.replace("algorithm: fixed\n", ""), "t").unwrap();
        assert_eq!(plain.find(&[("ip", "1")]).map(|m| m.rule.algorithm), Some(Algorithm::Bucket));
    }

    #[test]
    fn wildcards_and_sanitizing() {
        let parts = |p: &str| p.split('*').map(str::to_owned).collect::<Vec<_>>();
        assert!(wildcard_match(&parts("k_foo*bar*baz"), "k_foo1bar2baz"));
        assert!(wildcard_match(&parts("k_foo*bar*baz"), "k_foobarbaz"));
        assert!(!wildcard_match(&parts("k_foo*bar*baz"), "k_foo1baz"));
        assert!(!wildcard_match(&parts("k_bar*b"), "k_bara"));
        assert!(wildcard_match(&parts("k_bar*b"), "k_barb"));
        assert_eq!(sanitize_stat("d.ip_1234.5.6.7.x:y|z"), "d.ip_1234_5_6_7.x_y_z");
        assert_eq!(sanitize_stat("d.a_10.0.0.1.b"), "d.a_10_0_0_1.b");
        assert_eq!(sanitize_stat("d.v_1.2.3"), "d.v_1.2.3");
    }

    #[test]
    fn reference_errors() {
        let cases = [
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "invalid rate limit unit 'fortnight'"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n", "invalid rate limit unit ''"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: budget}\n", "budget needs unit hour, day, week, month or year"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: sliding}\n", "d.k: algorithm must be bucket, budget, window or fixed, got \"sliding\""),
            ("domain: d\nalgorithm: fixd\ndescriptors: []\n", "d: algorithm must be bucket, budget, window or fixed, got \"fixd\""),
            ("domain: d\ndescriptors:\n  - key: k\n  - key: k\n", "duplicate descriptor composite key 'd.k'"),
            ("domain: d\ndescriptors:\n  - key: k\n    colour: red\n", "config error, unknown key 'colour'"),
            ("domain: d\non_database_error: maybe\n", "on_database_error must be"),
            ("domain: ''\n", "config file cannot have empty domain"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {policy: p, unit: second}\n", "takes its limits from the policy"),
            ("domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n", "share_threshold can only be used with wildcard values"),
        ];
        for (doc, want) in cases {
            let err = parse_domain(doc, "t").unwrap_err();
            assert!(err.starts_with("t: ") && err.contains(want), "{err} lacks {want}");
        }
    }

    #[test]
    fn fields_without_a_value_are_their_zero_value() {
        let d = parse_domain("domain: n\ndescriptors:\n  - key: a\n    value:\n    descriptors:\n    rate_limit:\n      unit: hour\n      requests_per_unit: 2\n      replaces:\n", "t").unwrap();
        assert_eq!(d.find(&[("a", "x")]).unwrap().rule.requests_per_unit, 2);
        assert_eq!(parse_domain("domain:\n", "t").unwrap_err(), "t: config file cannot have empty domain");
        assert_eq!(parse_domain("", "t").unwrap_err(), "t: config file cannot have empty domain");
        assert!(parse_domain("domain: n\ndescriptors:\n", "t").is_ok());
    }

    #[test]
    fn merge_keys_and_empty_values() {
        let d = parse_domain(
            "domain: m\ndescriptors:\n  - &a\n    key: a\n    rate_limit: {unit: minute, requests_per_unit: 3}\n  - <<: *a\n    key: b\n  - key: c\n    value: \"\"\n    rate_limit: {unlimited: true}\n",
            "t",
        )
        .unwrap();
        assert_eq!(d.find(&[("b", "x")]).unwrap().rule.requests_per_unit, 3);
        assert!(d.find(&[("c", "y")]).unwrap().rule.unlimited);
    }
}
