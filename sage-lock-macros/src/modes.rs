//! The arguments that pick another primitive than the mutex: `mode = "read" | "write"` (a
//! read-write lock), `permits = N` (a semaphore), and their combination rules with `key = [..]`
//! (which also excludes `reentrant`) and `profile` (the mutex only).

use proc_macro2::Span;
use syn::{Expr, Lit};

use crate::args::{Args, KeyArg, as_lit};
use crate::errors::Errors;
use crate::suggest::closest;

/// Which side of a read-write lock `mode` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RwMode {
    Read,
    Write,
}

/// `mode`, `permits` and several keys pick different primitives: at most one of them.
pub(crate) fn check(args: &Args, errors: &mut Errors) {
    if let (Some(_), Some((_, span))) = (args.mode, args.permits) {
        errors.at(
            span,
            "`mode` and `permits` cannot be combined: `mode` asks for a read-write lock, \
             `permits` for a semaphore; remove one of them",
        );
    }
    if args.profile.is_some() {
        let other = args
            .mode
            .map(|(_, span)| (span, "mode"))
            .or(args.permits.map(|(_, span)| (span, "permits")));
        if let Some((span, name)) = other {
            errors.at(
                span,
                format!(
                    "`profile` works with the mutex only (one key or `key = [..]`), not with \
                     `{name}`: remove `profile` and give `lease`/`namespace`/`wait` explicitly"
                ),
            );
        }
    }
    if matches!(args.key, Some(KeyArg::Many(_))) {
        let other = args
            .mode
            .map(|(_, span)| (span, "mode"))
            .or(args.permits.map(|(_, span)| (span, "permits")));
        if let Some((span, name)) = other {
            errors.at(
                span,
                format!(
                    "`{name}` works with one key: `key = [..]` locks several keys with the \
                     (exclusive) mutex; remove `{name}` or give a single `key = \"...\"`"
                ),
            );
        }
        // The runtime's `with_locks` ignores `reentrant` (it always takes its keys), so the flag
        // would be silently without effect.
        if let Some((true, span)) = args.reentrant {
            errors.at(
                span,
                "`reentrant` works with one key: `key = [..]` always takes all of its keys, so a \
                 nested call for keys the task already holds fails at once (`TimedOut` with \
                 `HeldByThisTask`); remove `reentrant` or give a single `key = \"...\"`",
            );
        }
    }
}

pub(crate) fn mode(span: Span, value: Option<Expr>, errors: &mut Errors) -> Option<(RwMode, Span)> {
    let fix = "write `mode = \"read\"` (shared with other readers) or `mode = \"write\"` (alone)";
    let Some(value) = value else {
        errors.at(span, format!("`mode` needs a value: {fix}"));
        return None;
    };
    match as_lit(&value) {
        Some(Lit::Str(text)) => match text.value().as_str() {
            "read" => Some((RwMode::Read, text.span())),
            "write" => Some((RwMode::Write, text.span())),
            other => {
                let hint = closest(other, &["read", "write"])
                    .map(|good| format!("did you mean `\"{good}\"`? "))
                    .unwrap_or_default();
                errors.at(text.span(), format!("unknown mode `{other}`: {hint}{fix}"));
                None
            }
        },
        _ => {
            errors.spanned(&value, format!("`mode` must be a string literal: {fix}"));
            None
        }
    }
}

pub(crate) fn permits(span: Span, value: Option<Expr>, errors: &mut Errors) -> Option<(u32, Span)> {
    let fix = "write e.g. `permits = 4`, the most holders of the key at a time";
    let Some(value) = value else {
        errors.at(span, format!("`permits` needs a value: {fix}"));
        return None;
    };
    match as_lit(&value) {
        Some(Lit::Int(int)) => match int.base10_parse::<u32>() {
            Ok(0) => {
                errors.at(
                    int.span(),
                    "`permits` must be at least 1: a semaphore with no permits could never be \
                     acquired; write e.g. `permits = 4`",
                );
                None
            }
            Ok(permits) => Some((permits, int.span())),
            Err(_) => {
                errors.at(
                    int.span(),
                    format!(
                        "`permits` must be a whole number from 1 to {}: {fix}",
                        u32::MAX
                    ),
                );
                None
            }
        },
        _ => {
            errors.spanned(
                &value,
                format!("`permits` must be an integer literal, checked at compile time: {fix}"),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args;
    use quote::quote;

    fn messages(tokens: proc_macro2::TokenStream) -> Vec<String> {
        let mut errors = Errors::default();
        let _ = args::parse(tokens, &mut errors);
        errors.messages()
    }

    #[test]
    fn primitive_modes() {
        let mut errors = Errors::default();
        let parsed = args::parse(quote!(key = "r", wait = "1s", mode = "read"), &mut errors);
        assert!(errors.is_empty());
        assert_eq!(parsed.mode.map(|(m, _)| m), Some(RwMode::Read));
        let parsed = args::parse(quote!(key = "s", try_lock, permits = 3), &mut errors);
        assert!(errors.is_empty());
        assert_eq!(parsed.permits.map(|(p, _)| p), Some(3));
        let parsed = args::parse(quote!(key = ["a:{x}", y], wait = "1s"), &mut errors);
        assert!(errors.is_empty());
        assert!(matches!(parsed.key, Some(KeyArg::Many(ref keys)) if keys.len() == 2));
        let all = messages(quote!(key = id, wait = "1s", permits = 0));
        assert!(all[0].contains("at least 1"), "{all:?}");
        let all = messages(quote!(key = id, wait = "1s", mode = "read", permits = 2));
        assert!(all[0].contains("cannot be combined"), "{all:?}");
        let all = messages(quote!(key = id, wait = "1s", mode = "raed"));
        assert!(all[0].contains("did you mean `\"read\"`"), "{all:?}");
        let all = messages(quote!(key = [], wait = "1s"));
        assert!(all[0].contains("names no key"), "{all:?}");
        let all = messages(quote!(key = [a, b], wait = "1s", mode = "write"));
        assert!(all[0].contains("works with one key"), "{all:?}");
        let all = messages(quote!(key = [a, b], wait = "1s", reentrant));
        assert_eq!(all.len(), 1, "{all:?}");
        assert!(all[0].contains("`reentrant` works with one key"), "{all:?}");
        let all = messages(quote!(key = [a, b], wait = "1s", mode = "read", reentrant));
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(messages(quote!(key = [a], wait = "1s", hold_at_least = "1s")).is_empty());
        assert!(messages(quote!(key = a, wait = "1s", mode = "read", reentrant)).is_empty());
        let all = messages(quote!(key = id, wait = "1s", permits = "2"));
        assert!(all[0].contains("integer literal"), "{all:?}");
    }
}
