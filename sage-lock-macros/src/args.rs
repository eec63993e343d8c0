//! The attribute's arguments, parsed into a validated [`Args`]. Every problem is collected (with
//! its own span and a message that says how to fix it) rather than stopping at the first one.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt as _;
use syn::parse::{Parse, ParseStream, Parser as _};
use syn::punctuated::Punctuated;
use syn::{Expr, Ident, Lit, LitStr, Token};

use crate::duration::{format_millis, parse_millis};
use crate::errors::Errors;
use crate::suggest::{NAMES, unknown_argument};

// The runtime's bounds on durations, checked here so that a literal the runtime would reject
// with `InvalidArgument` on every call is a compile error instead. This crate cannot depend on
// `sage-lock` (which depends on it), so the numbers are repeated: keep them equal to
// `MIN_LEASE` and `MAX_DURATION` in `sage-lock/src/options.rs` (`validate_lease`,
// `validate_hold_at_least`).

/// The shortest lease the runtime accepts, in milliseconds (`sage_lock::MIN_LEASE`, 30 ms).
const MIN_LEASE_MILLIS: u64 = 30;

/// The longest lease or minimum hold the runtime accepts, in milliseconds: one year of 365 days
/// (`MAX_DURATION` in `sage-lock/src/options.rs`), i.e. `"8760h"`.
const MAX_DURATION_MILLIS: u64 = 365 * 24 * 60 * 60 * 1000;

/// How the key is given.
pub(crate) enum KeyArg {
    /// `key = "account:{id}"`.
    Template(LitStr),
    /// `key = <expr>` of any `KeyCodec` type.
    Expr(Expr),
    /// `key = [k1, k2, ..]`: all of several keys (each a template or an expression).
    Many(Vec<KeyArg>),
}

/// A checked duration literal.
#[derive(Debug, Clone)]
pub(crate) struct DurationArg {
    pub(crate) millis: u64,
    pub(crate) span: Span,
}

/// The validated arguments.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) key: Option<KeyArg>,
    pub(crate) wait: Option<DurationArg>,
    pub(crate) lease: Option<DurationArg>,
    pub(crate) namespace: Option<LitStr>,
    /// `profile = "name"`: settings from the named profile, at run time.
    pub(crate) profile: Option<LitStr>,
    pub(crate) replica_ack: Option<(bool, Span)>,
    pub(crate) try_lock: bool,
    pub(crate) client: Option<Expr>,
    pub(crate) krate: Option<syn::Path>,
    /// `hold_at_least = "30s"` (zero allowed: off).
    pub(crate) hold_at_least: Option<DurationArg>,
    /// `reentrant` (alone, or `= true` / `= false`: off wins over a reentrant profile), with
    /// the argument's span.
    pub(crate) reentrant: Option<(bool, Span)>,
    /// `mode = "read" | "write"`: a read-write lock.
    pub(crate) mode: Option<(crate::modes::RwMode, Span)>,
    /// `permits = N`: a semaphore with N permits (N >= 1).
    pub(crate) permits: Option<(u32, Span)>,
}

/// One `name` or `name = value` item, before validation.
struct RawArg {
    name: Ident,
    value: Option<Expr>,
}

impl Parse for RawArg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let name = Ident::parse_any(input).map_err(|error| {
            syn::Error::new(
                error.span(),
                "expected an argument name: `key`, `profile`, `wait`, `lease`, `namespace`, \
                 `replica_ack`, `try_lock`, `mode`, `permits`, `client`, `hold_at_least` or \
                 `reentrant`",
            )
        })?;
        if input.is_empty() || input.peek(Token![,]) {
            return Ok(Self { name, value: None });
        }
        if input.peek(Token![:]) {
            return Err(input.error(format!("expected `=` after `{name}`, not `:`")));
        }
        if !input.peek(Token![=]) {
            return Err(input.error(format!(
                "expected `=` or `,` after `{name}`: arguments are written `name = value`, \
                 separated by commas"
            )));
        }
        input.parse::<Token![=]>()?;
        let value: Expr = input.parse()?;
        Ok(Self {
            name,
            value: Some(value),
        })
    }
}

/// A value as a literal, looking through attributes-free literal expressions.
pub(crate) fn as_lit(expr: &Expr) -> Option<&Lit> {
    match expr {
        Expr::Lit(lit) if lit.attrs.is_empty() => Some(&lit.lit),
        Expr::Group(group) => as_lit(&group.expr),
        _ => None,
    }
}

/// Parses and validates the arguments. Syntax errors stop parsing; every other problem is
/// collected in `errors`.
pub(crate) fn parse(tokens: TokenStream, errors: &mut Errors) -> Args {
    let raw = match Punctuated::<RawArg, Token![,]>::parse_terminated.parse2(tokens) {
        Ok(raw) => raw,
        Err(error) => {
            errors.push(error);
            return Args::default();
        }
    };
    let mut args = Args::default();
    let mut seen: Vec<String> = Vec::new();
    // What the unknown arguments most likely mean: not reported missing as well.
    let mut meant: Vec<&'static str> = Vec::new();
    let mut try_lock_flag: Option<(bool, Span)> = None;
    for arg in raw {
        let name = arg.name.unraw().to_string();
        let span = arg.name.span();
        if seen.contains(&name) && NAMES.contains(&name.as_str()) {
            errors.at(
                span,
                format!("duplicate `{name}` argument: it is already given earlier; remove one"),
            );
            continue;
        }
        seen.push(name.clone());
        match name.as_str() {
            "key" => args.key = key_arg(&name, span, arg.value, errors),
            "wait" => {
                args.wait = duration_arg(&name, span, arg.value, errors);
                if let Some(wait) = &args.wait
                    && wait.millis == 0
                {
                    errors.at(
                        wait.span,
                        "`wait` must be positive: to not wait at all, replace this `wait` \
                         with `try_lock`",
                    );
                }
            }
            "lease" => {
                args.lease = duration_arg(&name, span, arg.value, errors);
                if let Some(lease) = &args.lease
                    && lease.millis < MIN_LEASE_MILLIS
                {
                    errors.at(
                        lease.span,
                        format!(
                            "`lease` must be at least 30ms, got {}: a lease this short cannot \
                             be renewed in time; write e.g. `lease = \"10s\"`",
                            format_millis(lease.millis)
                        ),
                    );
                }
                if let Some(lease) = &args.lease
                    && lease.millis > MAX_DURATION_MILLIS
                {
                    errors.at(
                        lease.span,
                        format!(
                            "`lease` must be at most one year (\"8760h\"), got {}: renewal keeps \
                             the lock while the body runs, however long, so the lease only bounds \
                             how long others wait after a crash; write e.g. `lease = \"10s\"`",
                            format_millis(lease.millis)
                        ),
                    );
                }
            }
            "namespace" => args.namespace = namespace_arg(span, arg.value, errors),
            "profile" => {
                let literal = arg.value.as_ref().and_then(as_lit);
                match crate::profile::parse(span, arg.value.as_ref(), literal) {
                    Ok(profile) => args.profile = Some(profile),
                    Err(error) => errors.push(error),
                }
            }
            "hold_at_least" => {
                args.hold_at_least = duration_arg(&name, span, arg.value, errors);
                if let Some(hold) = &args.hold_at_least
                    && hold.millis > MAX_DURATION_MILLIS
                {
                    errors.at(
                        hold.span,
                        format!(
                            "`hold_at_least` must be at most one year (\"8760h\"), got {}: use \
                             the interval of the scheduled job, e.g. `hold_at_least = \"30s\"`",
                            format_millis(hold.millis)
                        ),
                    );
                }
            }
            "reentrant" => args.reentrant = flag_arg(&name, span, arg.value, errors),
            "replica_ack" => args.replica_ack = flag_arg(&name, span, arg.value, errors),
            "try_lock" => {
                // An invalid value still shows the intent not to wait: no "missing `wait`".
                try_lock_flag = flag_arg(&name, span, arg.value, errors).or(Some((true, span)));
            }
            "client" => match arg.value {
                Some(value) => args.client = Some(value),
                None => errors.at(
                    span,
                    "`client` needs a value: write `client = self.locks` (any expression giving \
                     a `LockClient`, `&LockClient` or `Arc<LockClient>`)",
                ),
            },
            "crate" => match arg.value {
                Some(Expr::Path(path)) if path.attrs.is_empty() && path.qself.is_none() => {
                    args.krate = Some(path.path);
                }
                Some(other) => errors.spanned(
                    other,
                    "`crate` must be a path to the sage-lock crate, e.g. `crate = ::sage_lock`",
                ),
                None => errors.at(span, "`crate` needs a value: `crate = ::sage_lock`"),
            },
            "mode" => args.mode = crate::modes::mode(span, arg.value, errors),
            "permits" => args.permits = crate::modes::permits(span, arg.value, errors),
            _ => {
                meant.extend(crate::suggest::meant(&name));
                errors.at(span, unknown_argument(&name));
            }
        }
    }
    crate::modes::check(&args, errors);
    args.try_lock = try_lock_flag.is_some_and(|(on, _)| on);
    if args.key.is_none() && !seen.iter().any(|name| name == "key") && !meant.contains(&"key") {
        errors.at(
            Span::call_site(),
            "`#[locked]` needs a `key`: add `key = \"account:{id}\"` (a template naming the \
             function's parameters) or `key = <expression>`",
        );
    }
    match (&args.wait, try_lock_flag) {
        (Some(wait), Some((true, _))) => errors.at(
            wait.span,
            "`wait` cannot be combined with `try_lock`, which does not wait: remove `wait`, \
             or remove `try_lock` to wait up to that long",
        ),
        // With a profile, the wait may come from the profile (checked at run time).
        (None, flag)
            if !flag.is_some_and(|(on, _)| on)
                && !seen.iter().any(|n| n == "wait" || n == "profile")
                && !meant
                    .iter()
                    .any(|n| matches!(*n, "wait" | "profile" | "try_lock")) =>
        {
            errors.at(
                Span::call_site(),
                "`#[locked]` needs `wait = \"...\"`, how long to wait for a busy lock \
                 (e.g. `wait = \"2s\"`), or `try_lock` to give up at once when it is busy",
            );
        }
        _ => {}
    }
    args
}

fn key_arg(name: &str, span: Span, value: Option<Expr>, errors: &mut Errors) -> Option<KeyArg> {
    let Some(value) = value else {
        errors.at(
            span,
            format!(
                "`{name}` needs a value: write `key = \"account:{{id}}\"` or `key = <expression>`"
            ),
        );
        return None;
    };
    if let Expr::Array(array) = &value
        && array.attrs.is_empty()
    {
        if array.elems.is_empty() {
            errors.spanned(
                array,
                "`key = []` names no key: list at least one, e.g. \
                 `key = [\"account:{from}\", \"account:{to}\"]`, or give one `key = \"...\"`",
            );
            return None;
        }
        let keys = array.elems.iter().map(|element| match as_lit(element) {
            Some(Lit::Str(template)) => KeyArg::Template(template.clone()),
            _ => KeyArg::Expr(element.clone()),
        });
        return Some(KeyArg::Many(keys.collect()));
    }
    match as_lit(&value) {
        Some(Lit::Str(template)) => Some(KeyArg::Template(template.clone())),
        _ => Some(KeyArg::Expr(value)),
    }
}

fn duration_arg(
    name: &str,
    span: Span,
    value: Option<Expr>,
    errors: &mut Errors,
) -> Option<DurationArg> {
    let example = match name {
        "wait" => "2s",
        "hold_at_least" => "30s",
        _ => "10s",
    };
    let Some(value) = value else {
        errors.at(
            span,
            format!("`{name}` needs a value: write `{name} = \"{example}\"`"),
        );
        return None;
    };
    match as_lit(&value) {
        Some(Lit::Str(text)) => match parse_millis(&text.value()) {
            Ok(millis) => Some(DurationArg {
                millis,
                span: text.span(),
            }),
            Err(error) => {
                errors.at(text.span(), format!("invalid `{name}`: {error}"));
                None
            }
        },
        Some(Lit::Int(int)) => {
            let unit = if int.suffix().is_empty() {
                "s"
            } else {
                int.suffix()
            };
            let digits = int.base10_digits();
            errors.at(
                int.span(),
                format!(
                    "`{name}` is a string with a unit: write `{name} = \"{digits}{unit}\"` \
                     (units: `ms`, `s`, `m`, `h`)"
                ),
            );
            None
        }
        Some(Lit::Float(float)) => {
            errors.at(
                float.span(),
                format!(
                    "`{name}` is a string with a unit, in whole units: write e.g. \
                     `{name} = \"1s500ms\"`"
                ),
            );
            None
        }
        _ => {
            errors.spanned(
                &value,
                format!(
                    "`{name}` must be a string literal such as `{name} = \"{example}\"`, so that \
                     it is checked at compile time; for a duration computed at run time, call \
                     `Locks::with_lock` directly"
                ),
            );
            None
        }
    }
}

fn namespace_arg(span: Span, value: Option<Expr>, errors: &mut Errors) -> Option<LitStr> {
    let Some(value) = value else {
        errors.at(
            span,
            "`namespace` needs a value: write `namespace = \"account-updates\"`",
        );
        return None;
    };
    match as_lit(&value) {
        Some(Lit::Str(text)) if text.value().trim().is_empty() => {
            errors.at(
                text.span(),
                "`namespace` cannot be empty: give a name such as \"account-updates\", or remove \
                 the argument to use the default namespace",
            );
            None
        }
        Some(Lit::Str(text)) if text.value().trim() != text.value() => {
            errors.at(
                text.span(),
                format!(
                    "`namespace` has leading or trailing whitespace, so its locks would not \
                     exclude those of {trimmed:?}: write `namespace = {trimmed:?}`",
                    trimmed = text.value().trim()
                ),
            );
            None
        }
        Some(Lit::Str(text)) => Some(text.clone()),
        _ => {
            errors.spanned(
                &value,
                "`namespace` must be a string literal, e.g. `namespace = \"account-updates\"`",
            );
            None
        }
    }
}

fn flag_arg(
    name: &str,
    span: Span,
    value: Option<Expr>,
    errors: &mut Errors,
) -> Option<(bool, Span)> {
    let Some(value) = value else {
        return Some((true, span));
    };
    let fix = if name == "try_lock" {
        "write `try_lock` alone (or `try_lock = true`)".to_owned()
    } else {
        format!("write `{name} = true` or `{name} = false`")
    };
    match as_lit(&value) {
        Some(Lit::Bool(flag)) => Some((flag.value(), span)),
        Some(Lit::Str(text)) if matches!(text.value().as_str(), "true" | "false") => {
            errors.at(
                text.span(),
                format!(
                    "`{name}` takes a bool, not a string: write `{name} = {}` without quotes",
                    text.value()
                ),
            );
            None
        }
        Some(Lit::Int(int)) => {
            errors.at(
                int.span(),
                format!("`{name}` takes `true` or `false`, not a number: {fix}"),
            );
            None
        }
        _ => {
            errors.spanned(&value, format!("`{name}` takes `true` or `false`: {fix}"));
            None
        }
    }
}

#[cfg(test)]
mod tests;
