//! Owner tokens: what a hold writes as the lock's value, unique per acquisition.

use fred::bytes::Bytes;

/// A random 128-bit owner token, as 32 hex digits.
pub(super) fn new_token() -> Bytes {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits = rand::random::<u128>();
    let mut digits = [0_u8; 32];
    for (i, digit) in digits.iter_mut().enumerate() {
        *digit = HEX[usize::from(u8::try_from((bits >> (124 - 4 * i)) & 0xf).unwrap_or(0))];
    }
    Bytes::copy_from_slice(&digits)
}

#[cfg(test)]
mod tests {
    use super::new_token;

    #[test]
    fn tokens_are_32_lowercase_hex_digits_and_differ() {
        let (a, b) = (new_token(), new_token());
        assert_eq!(a.len(), 32);
        assert!(
            a.iter()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        );
        assert_ne!(a, b);
    }
}
