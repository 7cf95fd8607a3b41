//! Composite keys: parts encoded as JSON strings in a JSON array, so two different lists of
//! parts never give the same key, whatever characters a part holds.

use crate::args::Arg;
use crate::error::{Error, Result};

/// `rl_key(part, ...)`: each part as text (numbers in decimal), JSON-encoded.
pub fn encode_key(parts: &[Arg]) -> Result<String> {
    if parts.is_empty() {
        return Err(Error::invalid(crate::messages::NO_PARTS.template));
    }
    let texts = parts
        .iter()
        .enumerate()
        .map(|(i, part)| match *part {
            Arg::Text(t) => Ok(t.to_owned()),
            Arg::Integer(n) => Ok(n.to_string()),
            Arg::Real(r) => Ok(r.to_string()),
            Arg::Null => Err(Error::invalid(crate::messages::NULL_PART.render(&[&(i + 1)]))),
            Arg::Blob(_) | Arg::Json(_) => {
                Err(Error::invalid(format!("part {} must be text or a number, got {}", i + 1, part.describe())))
            }
        })
        .collect::<Result<Vec<String>>>()?;
    Ok(serde_json::to_string(&texts).expect("a list of strings always encodes"))
}
