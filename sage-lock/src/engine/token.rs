//! Owner tokens: what a hold writes as the lock's value, unique per acquisition.

use fred::bytes::Bytes;

/// A random 128-bit owner token, as 32 hex digits after `prefix`.
pub(super) fn new_token(prefix: &[u8]) -> Bytes {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits = rand::random::<u128>();
    let mut token = Vec::with_capacity(prefix.len() + 32);
    token.extend_from_slice(prefix);
    token.extend(
        (0..32).map(|i| HEX[usize::from(u8::try_from((bits >> (124 - 4 * i)) & 0xf).unwrap_or(0))]),
    );
    Bytes::from(token)
}

#[cfg(test)]
mod tests {
    use super::new_token;

    #[test]
    fn tokens_are_32_lowercase_hex_digits_and_differ() {
        let (a, b) = (new_token(b""), new_token(b""));
        assert_eq!(a.len(), 32);
        assert!(
            a.iter()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        );
        assert_ne!(a, b);
        let marked = new_token(b"m");
        assert_eq!(marked.len(), 33);
        assert_eq!(marked[0], b'm');
    }
}
