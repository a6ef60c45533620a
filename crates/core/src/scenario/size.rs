//! Sizes written the way Docker's `--shm-size` takes them: `"64m"`, `"1g"`, `"512k"`, a plain
//! byte count, with binary units (1k = 1024 bytes); and byte counts written back for people
//! (`64.0 MiB`), as every report and message shows them. Pure.

/// The forms [`parse_size`] accepts, for error hints.
pub const SIZE_FORMS: &str = "a number of bytes (`67108864`) or a number with a unit `k`, `m`, `g` \
     (binary: 1k = 1024), e.g. `\"64m\"`, `\"1g\"`, `\"1.5g\"`";

/// Formats a byte count for people: `64.0 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// Why a size does not read: each variant's message is a fragment to be read after the field's
/// name (`data.shm_size`: …), naming the text as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("`{text}` does not start with a number")]
    NoNumber { text: String },
    #[error("`{number}` in `{text}` is not a number")]
    NotANumber { number: String, text: String },
    #[error("unknown unit `{unit}` in `{text}`")]
    UnknownUnit { unit: String, text: String },
    #[error("`{text}` is not a size of at least 1 byte")]
    OutOfRange { text: String },
}

/// Bytes in a size such as `64m`, `1g`, `1.5g`, `64MiB`, `64 MB` or `67108864`.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    if number.is_empty() {
        return Err(SizeError::NoNumber { text: text.to_string() });
    }
    let value: f64 = number
        .parse()
        .map_err(|_| SizeError::NotANumber { number: number.to_string(), text: text.to_string() })?;
    let unit = unit.trim().to_ascii_lowercase();
    let unknown = |unit: &str| SizeError::UnknownUnit { unit: unit.to_string(), text: text.to_string() };
    let scale: u64 = match unit.trim_end_matches('b').trim_end_matches('i') {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => return Err(unknown(&unit)),
    };
    // `ib`/`b` alone are fine after a unit letter, but `i` without a letter (`64i`) is not.
    if unit.starts_with('i') {
        return Err(unknown(&unit));
    }
    let bytes = value * scale as f64;
    // NaN fails every comparison, so it is refused with the rest.
    let in_range = bytes.is_finite() && (1.0..=u64::MAX as f64 / 2.0).contains(&bytes);
    if !in_range {
        return Err(SizeError::OutOfRange { text: text.to_string() });
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_picks_a_readable_unit() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(64 * 1024 * 1024), "64.0 MiB");
        assert_eq!(human_bytes(3 * 1024 * 1024 * 1024 / 2), "1.5 GiB");
    }

    #[test]
    fn docker_style_sizes_are_binary() {
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("64 MB"), Ok(64 << 20));
        assert_eq!(parse_size("67108864"), Ok(64 << 20));
        assert_eq!(parse_size("100b"), Ok(100));
    }

    #[test]
    fn nonsense_says_what_is_wrong() {
        assert_eq!(parse_size("m64").unwrap_err().to_string(), "`m64` does not start with a number");
        assert_eq!(parse_size("64x").unwrap_err().to_string(), "unknown unit `x` in `64x`");
        assert_eq!(parse_size("64i").unwrap_err().to_string(), "unknown unit `i` in `64i`");
        assert_eq!(parse_size("1.2.3m").unwrap_err().to_string(), "`1.2.3` in `1.2.3m` is not a number");
        assert_eq!(parse_size("0").unwrap_err().to_string(), "`0` is not a size of at least 1 byte");
        assert_eq!(parse_size("").unwrap_err().to_string(), "`` does not start with a number");
    }
}
