//! Helpers of the `locks` operator tool: how it prints a lock's key (and reads it back), and
//! its table.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::bail;
use unicode_width::UnicodeWidthStr as _;

/// The widest the key column gets, in terminal columns (a CJK character takes two). A longer
/// key is printed whole on a line of its own, its row's values on the next line under the
/// columns, marked `(key above)`.
pub const KEY_COLUMN: usize = 60;

/// The escapes [`key_text`] writes and [`parse_key`] reads, for the usage text.
pub const KEY_ESCAPES: &str = r"\\ (a backslash), \n, \r, \t and \xNN (any byte, in hex)";

/// `key` as the tool prints it, one line that [`parse_key`] reads back to the same bytes:
/// printable UTF-8 as it is; a backslash as `\\`; newline, carriage return and tab as `\n`,
/// `\r`, `\t`; any other control character, and every byte that is not UTF-8, as `\xNN` (per
/// byte, lowercase hex, as Rust escapes a byte string).
#[must_use]
pub fn key_text(key: &[u8]) -> String {
    let mut out = String::with_capacity(key.len());
    for chunk in key.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str(r"\\"),
                '\n' => out.push_str(r"\n"),
                '\r' => out.push_str(r"\r"),
                '\t' => out.push_str(r"\t"),
                c if c.is_control() => {
                    let mut bytes = [0; 4];
                    for byte in c.encode_utf8(&mut bytes).bytes() {
                        let _ = write!(out, "\\x{byte:02x}");
                    }
                }
                c => out.push(c),
            }
        }
        for byte in chunk.invalid() {
            let _ = write!(out, "\\x{byte:02x}");
        }
    }
    out
}

/// The key bytes a `show` or `unlock` argument names: the inverse of [`key_text`].
///
/// # Errors
/// A backslash that starts none of the escapes, or `\x` without two hex digits: the error says
/// how to write a backslash.
pub fn parse_key(text: &str) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\\') {
        out.extend_from_slice(&rest.as_bytes()[..at]);
        let escape = &rest[at + 1..];
        let (byte, len) = match escape.as_bytes() {
            [b'\\', ..] => (b'\\', 1),
            [b'n', ..] => (b'\n', 1),
            [b'r', ..] => (b'\r', 1),
            [b't', ..] => (b'\t', 1),
            [b'x', high, low, ..] if high.is_ascii_hexdigit() && low.is_ascii_hexdigit() => {
                match u8::from_str_radix(&escape[1..3], 16) {
                    Ok(byte) => (byte, 3),
                    Err(_) => bail!("key {text:?}: bad escape"),
                }
            }
            _ => {
                let shown: String = escape.chars().take(3).collect();
                bail!(
                    "key {text:?}: `\\{shown}` is not an escape; write a backslash as \\\\ \
                     (keys are written as `list` prints them, with escapes {KEY_ESCAPES})"
                )
            }
        };
        out.push(byte);
        rest = &escape[len..];
    }
    out.extend_from_slice(rest.as_bytes());
    Ok(out)
}

/// A duration as the table shows it: `-` when unknown, milliseconds below a second.
#[must_use]
pub fn duration(value: Option<Duration>) -> String {
    match value {
        None => "-".to_owned(),
        Some(d) if d < Duration::from_secs(1) => format!("{}ms", d.as_millis()),
        Some(d) => format!("{:.1}s", d.as_secs_f64()),
    }
}

/// One row of the table: the key's bytes, fencing token, lease left, time held.
pub type Row = (Vec<u8>, u64, Option<Duration>, Option<Duration>);

/// The table `list` and `show` print: a header and a row per lock, keys as [`key_text`] prints
/// them. The key column is as wide as the widest key up to [`KEY_COLUMN`] terminal columns; a
/// longer key is printed whole on a line of its own, and its values on the next line, under
/// the columns, with `(key above)` in the key column.
#[must_use]
pub fn table(rows: &[Row]) -> String {
    const ABOVE: &str = "(key above)";
    let keys: Vec<String> = rows.iter().map(|(key, ..)| key_text(key)).collect();
    let fits = |key: &String| key.width() <= KEY_COLUMN;
    let width = keys
        .iter()
        .map(|key| if fits(key) { key.width() } else { ABOVE.len() })
        .chain(["KEY".len()])
        .max()
        .unwrap_or(3);
    let mut out = format!(
        "{:<width$}  {:>13}  {:>9}  {:>9}\n",
        "KEY", "FENCING TOKEN", "REMAINING", "HELD FOR"
    );
    for (key, (_, token, remaining, held_for)) in keys.iter().zip(rows) {
        let key = if fits(key) {
            key.as_str()
        } else {
            let _ = writeln!(out, "{key}");
            ABOVE
        };
        // `{:<width$}` pads by characters; pad by terminal columns instead.
        let padding = " ".repeat(width - key.width());
        let _ = writeln!(
            out,
            "{key}{padding}  {token:>13}  {:>9}  {:>9}",
            duration(*remaining),
            duration(*held_for)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_print_and_parse_back() {
        let keys: [&[u8]; 7] = [
            b"account:42",
            b"a\xff",
            br"a\xff",
            b"tab\there\nnew\x1b[2J\x7f",
            "konto:Ärger\"x\" \u{85}".as_bytes(),
            b"\\",
            b"",
        ];
        for key in keys {
            let text = key_text(key);
            assert!(!text.chars().any(char::is_control), "{text}");
            assert_eq!(parse_key(&text).expect("parses"), key, "{text}");
        }
        assert_eq!(key_text(b"account:42"), "account:42");
        assert_eq!(key_text(b"a\xff"), r"a\xff");
        assert_eq!(key_text(br"a\xff"), r"a\\xff");
        assert_eq!(key_text("Ärger".as_bytes()), "Ärger");
        assert_eq!(parse_key(r"\x41\x4a").expect("hex"), b"AJ");
        for bad in [r"a\q", r"a\", r"a\x4", r"a\xzz"] {
            let error = parse_key(bad).expect_err(bad).to_string();
            assert!(error.contains(r"\\"), "{error}");
        }
    }

    #[test]
    fn formats_a_table() {
        let text = table(&[(
            b"account:42".to_vec(),
            17,
            Some(Duration::from_millis(29_100)),
            Some(Duration::from_millis(900)),
        )]);
        assert!(text.starts_with("KEY"), "{text}");
        assert!(text.contains("account:42"), "{text}");
        assert!(text.contains("29.1s") && text.contains("900ms"), "{text}");
    }

    #[test]
    fn control_characters_in_keys_are_escaped() {
        let text = table(&[(
            b"evil\nKEY  FENCING TOKEN\tx\x1b[2J".to_vec(),
            1,
            None,
            None,
        )]);
        // Header plus exactly one row: a key cannot forge lines or move the cursor.
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.contains('\u{1b}') && !text.contains('\t'), "{text}");
        assert!(
            text.contains(r"evil\nKEY") && text.contains(r"\x1b[2J"),
            "{text}"
        );
        // Ordinary keys, quotes and non-ASCII letters included, print as they are.
        let text = table(&[("konto:Ärger\"x\"".as_bytes().to_vec(), 1, None, None)]);
        assert!(text.contains("konto:Ärger\"x\""), "{text}");
    }

    #[test]
    fn a_long_key_gets_its_own_line() {
        let long = "y".repeat(KEY_COLUMN + 1);
        let text = table(&[
            (b"short".to_vec(), 1, None, None),
            (long.clone().into_bytes(), 2, None, None),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[2], long, "{text}");
        assert_eq!(lines[3].len(), lines[1].len(), "{text}");
        // The values' line says whose values they are: a reader of a long list must not take
        // them for a row whose key is blank.
        assert!(lines[3].starts_with("(key above)"), "{text}");
        // A key of exactly the cap stays in its row.
        let text = table(&[("z".repeat(KEY_COLUMN).into_bytes(), 1, None, None)]);
        assert_eq!(text.lines().count(), 2, "{text}");
    }

    /// Double-width characters (CJK) take two columns each: the columns after the key line up
    /// with the header's, as a terminal shows them.
    #[test]
    fn wide_characters_keep_the_columns_aligned() {
        let text = table(&[
            ("账户:42".as_bytes().to_vec(), 7, None, None),
            (b"account:42".to_vec(), 8, None, None),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        // The terminal column just past `token` (CJK counted as two columns).
        let column_after = |line: &str, token: char| {
            let before = &line[..line.find(token).map_or(0, |at| at + 1)];
            before
                .chars()
                .map(|c| if c.is_ascii() { 1 } else { 2 })
                .sum::<usize>()
        };
        let header_end = lines[0].find("TOKEN").map(|at| at + "TOKEN".len());
        assert_eq!(Some(column_after(lines[1], '7')), header_end, "{text}");
        assert_eq!(Some(column_after(lines[2], '8')), header_end, "{text}");
    }
}
