//! Structured logs: one JSON object per line on stderr.

/// `{"ts": <epoch seconds>, "level", "msg", ...fields}`. Fields carry what clients sent
/// (descriptor values, errors that quote them): the line is JSON with every character a
/// terminal or a log viewer would act on escaped.
pub fn line(level: &str, message: &str, fields: &[(&str, &str)]) {
    let mut o = serde_json::Map::new();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    o.insert("ts".into(), serde_json::json!((now * 1000.0).round() / 1000.0));
    o.insert("level".into(), level.into());
    o.insert("msg".into(), message.into());
    for (k, v) in fields {
        o.insert((*k).into(), (*v).into());
    }
    eprintln!("{}", visible(&serde_json::Value::Object(o).to_string()));
}

/// JSON text with the characters serde_json leaves as they are but a terminal acts on (DEL,
/// the C1 controls, bidirectional and zero-width format characters, line and paragraph
/// separators) written as `\uXXXX`, which keeps it the same JSON.
pub fn visible(json: &str) -> String {
    let hidden = |c: char| {
        matches!(c, '\u{7f}'..='\u{9f}' | '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
                    | '\u{2060}'..='\u{206f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}' | '\u{e0000}'..='\u{e007f}')
    };
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if hidden(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_line_names_no_character_a_terminal_acts_on() {
        let raw = serde_json::json!({"v": "a\u{1b}]52;c;eA==\u{7}\u{9b}2J\u{202e}x\u{e0041}"}).to_string();
        let seen = super::visible(&raw);
        assert!(seen.chars().all(|c| !c.is_control() && c != '\u{202e}' && c != '\u{e0041}'), "{seen}");
        let back: serde_json::Value = serde_json::from_str(&seen).unwrap();
        assert_eq!(back, serde_json::from_str::<serde_json::Value>(&raw).unwrap(), "the same JSON");
    }
}
