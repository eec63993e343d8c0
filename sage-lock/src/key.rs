//! [`KeyCodec`] (how a key becomes bytes) and the server-side key layout.
//!
//! A lock on key `k` in namespace `ns` lives at `{ns:k}` and its fencing counter at
//! `{ns:k}:fence`. The braces are a Redis Cluster hash tag, so both keys always share one hash
//! slot. Inside the tag, `%`, `{`, `}` (and `:` in the namespace) are percent-escaped, which keeps
//! the tag non-empty and the layout injective: two different (namespace, key) pairs never map to
//! the same server key, whatever bytes they contain.

use std::fmt::Write as _;

use fred::bytes::Bytes;

/// Turns a lock key into bytes. All processes that protect the same resource must encode its key
/// the same way.
///
/// Strings and byte slices encode as their raw bytes and integers as decimal text, so
/// `Locks<u64>` with key `42` and `Locks<String>` with key `"42"` name the same lock. Tuples
/// join their parts with `:`, percent-escaping `%` and `:` inside each part, and bracket tuples
/// nested in tuples (`%28`..`%2C`..`%29`), so that different tuples never collide.
///
/// Implement it for your own key types:
///
/// ```
/// use sage_lock::KeyCodec;
///
/// struct AccountId(u64);
///
/// impl KeyCodec for AccountId {
///     fn encode_key(&self, out: &mut Vec<u8>) {
///         out.extend_from_slice(b"account:");
///         self.0.encode_key(out);
///     }
/// }
///
/// let mut bytes = Vec::new();
/// AccountId(42).encode_key(&mut bytes);
/// assert_eq!(bytes, b"account:42");
/// ```
pub trait KeyCodec {
    /// Appends this key's bytes to `out`.
    fn encode_key(&self, out: &mut Vec<u8>);

    /// Appends this key as one part of a tuple key. The default escapes `%` and `:` in
    /// [`KeyCodec::encode_key`]'s bytes; tuples nested in tuples are bracketed instead, so a
    /// nested tuple never encodes like a flat part that contains `:`. Leave it alone.
    #[doc(hidden)]
    fn encode_part(&self, out: &mut Vec<u8>) {
        let mut raw = Vec::new();
        self.encode_key(&mut raw);
        escape_part(&raw, out);
    }
}

impl<T: KeyCodec + ?Sized> KeyCodec for &T {
    fn encode_key(&self, out: &mut Vec<u8>) {
        (**self).encode_key(out);
    }

    fn encode_part(&self, out: &mut Vec<u8>) {
        (**self).encode_part(out);
    }
}

impl KeyCodec for str {
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl KeyCodec for String {
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl KeyCodec for [u8] {
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl<const N: usize> KeyCodec for [u8; N] {
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl KeyCodec for Vec<u8> {
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl KeyCodec for std::borrow::Cow<'_, str> {
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl KeyCodec for std::sync::Arc<str> {
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

macro_rules! integer_codec {
    ($($t:ty),*) => {$(
        impl KeyCodec for $t {
            fn encode_key(&self, out: &mut Vec<u8>) {
                let mut text = String::new();
                // Writing to a String cannot fail.
                let _ = write!(text, "{self}");
                out.extend_from_slice(text.as_bytes());
            }
        }
    )*};
}
integer_codec!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);

#[cfg(feature = "uuid")]
impl KeyCodec for uuid::Uuid {
    fn encode_key(&self, out: &mut Vec<u8>) {
        let mut buf = uuid::Uuid::encode_buffer();
        out.extend_from_slice(self.hyphenated().encode_lower(&mut buf).as_bytes());
    }
}

/// Escapes `%` and `:` in one tuple part, so the joined form is unambiguous.
fn escape_part(raw: &[u8], out: &mut Vec<u8>) {
    for &byte in raw {
        match byte {
            b'%' => out.extend_from_slice(b"%25"),
            b':' => out.extend_from_slice(b"%3A"),
            other => out.push(other),
        }
    }
}

// A tuple key joins its parts' `encode_part` with `:`. A tuple that is itself a part is written
// `%28` part `%2C` part ... `%29`: escaped parts never contain `%28`, `%2C` or `%29` (a literal
// `%` becomes `%25`), so nesting can always be told apart from flat parts.
macro_rules! tuple_codec {
    ($first:ident $(, $rest:ident)*) => {
        impl<$first: KeyCodec $(, $rest: KeyCodec)*> KeyCodec for ($first, $($rest,)*) {
            #[allow(non_snake_case)]
            fn encode_key(&self, out: &mut Vec<u8>) {
                let ($first, $($rest,)*) = self;
                $first.encode_part(out);
                $(
                    out.push(b':');
                    $rest.encode_part(out);
                )*
            }

            #[allow(non_snake_case)]
            fn encode_part(&self, out: &mut Vec<u8>) {
                let ($first, $($rest,)*) = self;
                out.extend_from_slice(b"%28");
                $first.encode_part(out);
                $(
                    out.extend_from_slice(b"%2C");
                    $rest.encode_part(out);
                )*
                out.extend_from_slice(b"%29");
            }
        }
    };
}
tuple_codec!(A);
tuple_codec!(A, B);
tuple_codec!(A, B, C);
tuple_codec!(A, B, C, D);
tuple_codec!(A, B, C, D, E);
tuple_codec!(A, B, C, D, E, F);

/// The server-side names of one lock: its key, its fencing counter, its fair queue's keys, and
/// their shared slot. All the names share one allocation.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    /// `{ns:key}`: holds the owner's token, with the lease as its TTL.
    pub(crate) lock: Bytes,
    /// `{ns:key}:fence`: the fencing counter, incremented on every acquisition.
    pub(crate) fence: Bytes,
    /// `{ns:key}:queue`: the tokens of the waiters queued for the lock, oldest first.
    pub(crate) queue: Bytes,
    /// `{ns:key}:waiters`: each queued waiter's deadline, so a dead one is skipped.
    pub(crate) waiters: Bytes,
    /// `{ns:key}:since`: the last grant's marker (its time, and whether waiters may queue).
    pub(crate) since: Bytes,
    /// The Redis Cluster hash slot of every key above.
    pub(crate) slot: u16,
    /// The user's key, encoded (for [`LockKeys::display`]).
    encoded: Bytes,
    display: std::sync::OnceLock<std::sync::Arc<str>>,
}

/// The suffixes of a lock's named companion keys, in [`LockKeys`] field order after `lock`.
const NAMED_SUFFIXES: [&[u8]; 4] = [b":fence", b":queue", b":waiters", b":since"];

impl LockKeys {
    /// Lays out the server keys for `key` (already encoded) in `namespace`.
    pub(crate) fn new(namespace: &str, key: &[u8]) -> Self {
        // One buffer, `lock:fence lock:queue lock:waiters lock:since key`, sliced per name
        // (`lock` is the start of `lock:fence`).
        let name_len = namespace.len() + key.len() + 3;
        let suffixes: usize = NAMED_SUFFIXES.iter().map(|s| s.len()).sum();
        let mut all = Vec::with_capacity(NAMED_SUFFIXES.len() * name_len + suffixes + key.len());
        all.push(b'{');
        escape_into(namespace.as_bytes(), true, &mut all);
        all.push(b':');
        escape_into(key, false, &mut all);
        all.push(b'}');
        let lock_len = all.len();
        let slot = fred::util::redis_keyslot(&all);
        all.extend_from_slice(NAMED_SUFFIXES[0]);
        let mut ranges = [(0, all.len()); 4];
        for (range, suffix) in ranges.iter_mut().zip(NAMED_SUFFIXES).skip(1) {
            let start = all.len();
            all.extend_from_within(..lock_len);
            all.extend_from_slice(suffix);
            *range = (start, all.len());
        }
        let key_start = all.len();
        all.extend_from_slice(key);
        let all = Bytes::from(all);
        let [fence, queue, waiters, since] = ranges.map(|(start, end)| all.slice(start..end));
        LockKeys {
            lock: all.slice(0..lock_len),
            fence,
            queue,
            waiters,
            since,
            slot,
            encoded: all.slice(key_start..),
            display: std::sync::OnceLock::new(),
        }
    }

    /// The user's key, printable, for errors and traces (made on first use).
    pub(crate) fn display(&self) -> &std::sync::Arc<str> {
        self.display
            .get_or_init(|| std::sync::Arc::from(printable(&self.encoded)))
    }

    /// A companion key of this lock, `{ns:key}<suffix>` (same slot): e.g. `:r`, `:w`, `:wq`,
    /// `:sem`. Suffixes start with `:` and none equals `:fence`, so the layout stays injective
    /// and distinct from the mutex's `{ns:key}`.
    pub(crate) fn companion(&self, suffix: &str) -> Bytes {
        let mut key = Vec::with_capacity(self.lock.len() + suffix.len());
        key.extend_from_slice(&self.lock);
        key.extend_from_slice(suffix.as_bytes());
        Bytes::from(key)
    }
}

/// The `SCAN ... MATCH` pattern of every lock key in `namespace`: `{ns:*}` with the namespace
/// escaped as in [`LockKeys::new`], then glob metacharacters (`*?[]\\`) escaped with `\\`.
/// Lock keys end with the tag's `}`; companion keys (`:fence`, ...) do not, so they never match.
pub(crate) fn scan_pattern(namespace: &str) -> Vec<u8> {
    let mut escaped = Vec::with_capacity(namespace.len() + 8);
    escape_into(namespace.as_bytes(), true, &mut escaped);
    let mut pattern = Vec::with_capacity(escaped.len() + 4);
    pattern.push(b'{');
    for byte in escaped {
        if matches!(byte, b'*' | b'?' | b'[' | b']' | b'\\') {
            pattern.push(b'\\');
        }
        pattern.push(byte);
    }
    pattern.extend_from_slice(b":*}");
    pattern
}

/// The encoded key of `server_key` if it is a lock key of `namespace` (the inverse of
/// [`LockKeys::new`]), else `None`.
pub(crate) fn decode_lock_key(namespace: &str, server_key: &[u8]) -> Option<Vec<u8>> {
    let mut prefix = vec![b'{'];
    escape_into(namespace.as_bytes(), true, &mut prefix);
    prefix.push(b':');
    let inner = server_key.strip_prefix(&prefix[..])?.strip_suffix(b"}")?;
    let mut key = Vec::with_capacity(inner.len());
    let mut rest = inner;
    while let Some((&byte, tail)) = rest.split_first() {
        let (decoded, more) = match (byte, tail) {
            (b'%', [b'2', b'5', more @ ..]) => (b'%', more),
            (b'%', [b'7', b'B', more @ ..]) => (b'{', more),
            (b'%', [b'7', b'D', more @ ..]) => (b'}', more),
            (b'%' | b'{' | b'}', _) => return None,
            (other, more) => (other, more),
        };
        key.push(decoded);
        rest = more;
    }
    Some(key)
}

fn escape_into(bytes: &[u8], escape_colon: bool, out: &mut Vec<u8>) {
    let special = |byte: u8| matches!(byte, b'%' | b'{' | b'}') || (escape_colon && byte == b':');
    if !bytes.iter().any(|&byte| special(byte)) {
        out.extend_from_slice(bytes);
        return;
    }
    for &byte in bytes {
        match byte {
            b'%' => out.extend_from_slice(b"%25"),
            b'{' => out.extend_from_slice(b"%7B"),
            b'}' => out.extend_from_slice(b"%7D"),
            b':' if escape_colon => out.extend_from_slice(b"%3A"),
            other => out.push(other),
        }
    }
}

/// The key as text: UTF-8 as is, other bytes escaped like `b"\xff"`.
pub(crate) fn printable(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) => text.to_owned(),
        Err(_) => key.escape_ascii().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded<T: KeyCodec + ?Sized>(key: &T) -> Vec<u8> {
        let mut out = Vec::new();
        key.encode_key(&mut out);
        out
    }

    #[test]
    fn strings_and_integers_agree() {
        assert_eq!(encoded("42"), encoded(&42_u64));
        assert_eq!(encoded(&String::from("a")), encoded(&b"a"[..]));
        assert_eq!(encoded(&-7_i32), b"-7");
    }

    #[test]
    fn nested_tuples_do_not_collide_with_flat_ones() {
        assert_ne!(encoded(&(("a", "b"),)), encoded(&("a:b",)));
        assert_ne!(encoded(&(("a", "b"), "c")), encoded(&("a", ("b", "c"))));
        assert_ne!(encoded(&(("a", "b"), "c")), encoded(&("a%28b", "c")));
        assert_eq!(encoded(&(("a", "b"), 1_u8)), b"%28a%2Cb%29:1");
    }

    #[test]
    fn tuples_are_unambiguous() {
        assert_ne!(encoded(&("a:b", "c")), encoded(&("a", "b:c")));
        assert_eq!(encoded(&("account", 42_u64)), b"account:42");
    }

    #[test]
    fn layout_shares_a_slot_and_is_injective() {
        for (ns, key) in [
            ("lock", &b"a"[..]),
            ("}x{", b"{}"),
            ("n", b""),
            ("a:b", b"c"),
        ] {
            let keys = LockKeys::new(ns, key);
            assert_eq!(keys.slot, fred::util::redis_keyslot(&keys.fence));
            for suffix in [
                ":r",
                ":w",
                ":wq",
                ":wd",
                ":rq",
                ":rd",
                ":sem",
                ":sem-queue",
                ":sem-due",
            ] {
                let companion = keys.companion(suffix);
                assert_eq!(keys.slot, fred::util::redis_keyslot(&companion));
                assert_ne!(companion, keys.lock);
                assert_ne!(companion, keys.fence);
            }
            assert_eq!(keys.lock.iter().filter(|b| **b == b'{').count(), 1);
        }
        assert_ne!(
            LockKeys::new("a:b", b"c").lock,
            LockKeys::new("a", b"b:c").lock
        );
        assert_eq!(
            &LockKeys::new("lock", b"account:42").lock[..],
            b"{lock:account:42}"
        );
    }

    #[test]
    fn named_companions_follow_the_lock_key() {
        let keys = LockKeys::new("lock", b"caf\xc3\xa9:1");
        let named = [
            (&keys.fence, ":fence"),
            (&keys.queue, ":queue"),
            (&keys.waiters, ":waiters"),
            (&keys.since, ":since"),
        ];
        for (name, suffix) in named {
            assert_eq!(name, &keys.companion(suffix), "{suffix}");
        }
        assert_eq!(&keys.lock[..], b"{lock:caf\xc3\xa9:1}");
        assert_eq!(&**keys.display(), "café:1");
        assert_eq!(&**LockKeys::new("n", b"\xff").display(), "\\xff");
        // Escaped names (the escaping path) lay out the same way.
        let escaped = LockKeys::new("a:b%", b"{x}:y");
        assert_eq!(&escaped.lock[..], b"{a%3Ab%25:%7Bx%7D:y}");
        assert_eq!(&escaped.since[..], b"{a%3Ab%25:%7Bx%7D:y}:since");
        assert_eq!(&**escaped.display(), "{x}:y");
    }

    #[test]
    fn scan_patterns_escape_globs_and_keys_decode() {
        assert_eq!(scan_pattern("lock"), b"{lock:*}");
        assert_eq!(scan_pattern("a*b?[c]\\d"), b"{a\\*b\\?\\[c\\]\\\\d:*}");
        assert_eq!(scan_pattern("x:y{z}%"), b"{x%3Ay%7Bz%7D%25:*}");
        for (ns, key) in [
            ("lock", &b"account:42"[..]),
            ("a:b*", b"{}%:x"),
            ("n", b""),
            ("n", b"\xff%7B"),
        ] {
            let keys = LockKeys::new(ns, key);
            assert_eq!(decode_lock_key(ns, &keys.lock).as_deref(), Some(key));
            assert_eq!(decode_lock_key(ns, &keys.fence), None);
        }
        assert_eq!(decode_lock_key("a", &LockKeys::new("ab", b"k").lock), None);
        assert_eq!(decode_lock_key("a", b"{a:%zz}"), None);
    }

    #[cfg(feature = "uuid")]
    #[test]
    fn uuids_encode_hyphenated_lowercase() {
        let id = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        assert_eq!(encoded(&id), b"01234567-89ab-cdef-0123-456789abcdef");
    }

    #[test]
    fn printable_escapes_binary() {
        assert_eq!(printable(b"caf\xc3\xa9"), "café");
        assert_eq!(printable(b"\xff\x00"), "\\xff\\x00");
    }
}
