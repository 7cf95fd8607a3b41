//! Structured logs: one JSON object per line on stderr.

/// `{"ts": <epoch seconds>, "level", "msg", ...fields}`.
pub fn line(level: &str, message: &str, fields: &[(&str, &str)]) {
    let mut o = serde_json::Map::new();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    o.insert("ts".into(), serde_json::json!((now * 1000.0).round() / 1000.0));
    o.insert("level".into(), level.into());
    o.insert("msg".into(), message.into());
    for (k, v) in fields {
        o.insert((*k).into(), (*v).into());
    }
    eprintln!("{}", serde_json::Value::Object(o));
}
