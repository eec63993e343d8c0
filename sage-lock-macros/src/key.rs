//! Key templates: `"account:{id}"`, `"order:{order.id}"`, `"tenant:{self.tenant}"`, the card
//! notation `"account:<id>"`, and the `{{` / `}}` escapes.
//!
//! A template is split into literal text and placeholders; each placeholder must name one of
//! the function's parameters (or `self`), optionally followed by field accesses. The generated
//! code formats each placeholder with `Display`, exactly as `format!("{}", value)` would, so a
//! key built by the macro equals the one a caller builds by hand with `format!`.

use std::ops::Range;

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote_spanned};
use syn::LitStr;

use crate::suggest::closest;

/// One piece of a key template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    Literal(String),
    Placeholder(Placeholder),
}

/// A placeholder: a parameter (or `self`) followed by zero or more field accesses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placeholder {
    pub(crate) root: String,
    pub(crate) fields: Vec<String>,
}

/// A template error, located by a byte range of the template text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TemplateError {
    pub(crate) message: String,
    pub(crate) range: Range<usize>,
}

/// What the template may refer to.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scope {
    /// Names bound by the parameters, in order (without `self`).
    pub(crate) params: Vec<String>,
    /// Whether the function has a `self` receiver.
    pub(crate) has_self: bool,
    /// Whether the function was rewritten by `#[async_trait]`, which renames destructured
    /// parameters.
    pub(crate) async_trait: bool,
    /// How many parameters bind no name a template can use (`_: u64`, `(_, _): (u8, u8)`, or
    /// under `#[async_trait]` a destructured one), so that messages do not claim there are none.
    pub(crate) unnamed: usize,
}

impl Scope {
    fn describe(&self) -> String {
        let mut names: Vec<String> = Vec::new();
        if self.has_self {
            names.push("`self`".to_owned());
        }
        names.extend(self.params.iter().map(|name| format!("`{name}`")));
        if names.is_empty() && self.unnamed > 0 {
            "no parameter of this function has a name (`_` binds none); name the one to put in \
             the key, e.g. `id: u64` instead of `_: u64`, or use a constant key or an expression \
             key"
            .to_owned()
        } else if names.is_empty() {
            "this function has no parameters; use a constant key or an expression key".to_owned()
        } else {
            format!("the parameters are: {}", names.join(", "))
        }
    }
}

const PLACEHOLDER_FORMS: &str = "a placeholder names a parameter, optionally followed by fields: \
                                 `{id}`, `{order.id}`, `{self.tenant}`";

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

fn is_identifier(text: &str) -> bool {
    let text = text.strip_prefix("r#").unwrap_or(text);
    let mut chars = text.chars();
    chars.next().is_some_and(is_ident_start) && chars.all(is_ident_continue)
}

fn is_field(text: &str) -> bool {
    (is_identifier(text) && !matches!(text, "self" | "Self" | "super" | "crate"))
        || (!text.is_empty()
            && text.chars().all(|c| c.is_ascii_digit())
            && (text == "0" || !text.starts_with('0')))
}

/// Splits and checks a template. All errors are reported, not just the first.
pub(crate) fn parse_template(
    text: &str,
    scope: &Scope,
) -> Result<Vec<Segment>, Vec<TemplateError>> {
    if text.is_empty() {
        return Err(vec![TemplateError {
            message: "empty key template: every call would lock the same empty key; name what \
                      the lock protects, e.g. `key = \"account:{id}\"`"
                .to_owned(),
            range: 0..0,
        }]);
    }
    let mut segments: Vec<Segment> = Vec::new();
    let mut errors: Vec<TemplateError> = Vec::new();
    let mut literal = String::new();
    let mut chars = text.char_indices().peekable();

    let push_placeholder =
        |segments: &mut Vec<Segment>, literal: &mut String, placeholder: Placeholder| {
            if !literal.is_empty() {
                segments.push(Segment::Literal(std::mem::take(literal)));
            }
            segments.push(Segment::Placeholder(placeholder));
        };

    while let Some((start, ch)) = chars.next() {
        match ch {
            '{' if chars.peek().is_some_and(|&(_, next)| next == '{') => {
                chars.next();
                literal.push('{');
            }
            '}' if chars.peek().is_some_and(|&(_, next)| next == '}') => {
                chars.next();
                literal.push('}');
            }
            '}' => errors.push(TemplateError {
                message: "unmatched `}` in key template: write `}}` for a literal `}`".to_owned(),
                range: start..start + 1,
            }),
            '{' => {
                let body_start = start + 1;
                let close = text[body_start..].find(['}', '{']).map(|i| body_start + i);
                match close {
                    Some(end) if text[end..].starts_with('}') => {
                        // Skip the placeholder body and the closing brace.
                        while chars.next_if(|&(i, _)| i <= end).is_some() {}
                        let body = &text[body_start..end];
                        match check_placeholder(body, scope, '{') {
                            Ok(placeholder) => {
                                push_placeholder(&mut segments, &mut literal, placeholder);
                            }
                            Err(message) => errors.push(TemplateError {
                                message,
                                range: start..end + 1,
                            }),
                        }
                    }
                    _ => {
                        errors.push(TemplateError {
                            message: "unclosed `{` in key template: close the placeholder with \
                                      `}`, or write `{{` for a literal `{`"
                                .to_owned(),
                            range: start..start + 1,
                        });
                    }
                }
            }
            '<' if chars.peek().is_some_and(|&(_, next)| next == '<') => {
                chars.next();
                literal.push('<');
            }
            '<' => {
                // Card notation `<id>`: only an identifier-like path closed by `>` is a
                // placeholder; any other `<` is literal text.
                let body_start = start + 1;
                let body_len = text[body_start..]
                    .find(|c: char| !(is_ident_continue(c) || c == '.' || c == '#'))
                    .unwrap_or(text.len() - body_start);
                let end = body_start + body_len;
                let body = &text[body_start..end];
                let looks_like_placeholder =
                    text[end..].starts_with('>') && body.chars().next().is_some_and(is_ident_start);
                if looks_like_placeholder {
                    while chars.next_if(|&(i, _)| i <= end).is_some() {}
                    match check_placeholder(body, scope, '<') {
                        Ok(placeholder) => {
                            push_placeholder(&mut segments, &mut literal, placeholder);
                        }
                        Err(message) => errors.push(TemplateError {
                            // It may be text that only looks like a placeholder (`<body>`).
                            message: format!(
                                "{message}; if `<{body}>` is meant as text, write `<<{body}>` \
                                 (`<<` is a literal `<`)"
                            ),
                            range: start..end + 1,
                        }),
                    }
                } else {
                    literal.push('<');
                }
            }
            other => literal.push(other),
        }
    }
    if !literal.is_empty() {
        segments.push(Segment::Literal(literal));
    }
    if errors.is_empty() {
        Ok(segments)
    } else {
        Err(errors)
    }
}

/// Checks one placeholder body (the text between the delimiters).
fn check_placeholder(body: &str, scope: &Scope, open: char) -> Result<Placeholder, String> {
    let close = if open == '{' { '}' } else { '>' };
    let shown = format!("{open}{body}{close}");
    let trimmed = body.trim();
    if trimmed.is_empty() {
        return Err(format!(
            "empty placeholder `{shown}` in key template: name the parameter to put in the key, \
             e.g. `{{id}}`; {}",
            scope.describe()
        ));
    }
    if trimmed != body {
        return Err(format!(
            "placeholder `{shown}` has spaces inside: write `{open}{trimmed}{close}`"
        ));
    }
    if let Some((name, spec)) = body.split_once(':') {
        return Err(format!(
            "format spec `:{spec}` is not supported in key templates: placeholders are always \
             formatted with `Display`, so write `{{{name}}}`; for another format use an \
             expression key, e.g. `key = format!(\"...{{:{spec}}}\", {name})`"
        ));
    }
    if body.contains('(') {
        let call = body;
        return Err(format!(
            "method calls are not allowed in key template placeholders (`{shown}`): \
             compute the key with an expression instead, e.g. `key = format!(\"...{{}}\", {call})`"
        ));
    }
    if body.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!(
            "positional placeholder `{shown}` is not supported: name a parameter instead, \
             e.g. `{{id}}`; {}",
            scope.describe()
        ));
    }
    let mut parts = body.split('.');
    let root = parts.next().unwrap_or_default();
    let fields: Vec<String> = parts.map(str::to_owned).collect();
    if !is_identifier(root) || !fields.iter().all(|field| is_field(field)) {
        return Err(format!(
            "invalid placeholder `{shown}` in key template: {PLACEHOLDER_FORMS}"
        ));
    }
    let bare_root = root.strip_prefix("r#").unwrap_or(root);
    if bare_root == "_" {
        let mut message = format!(
            "`_` cannot be named in a key template (`{shown}`): a `_` parameter binds no name, so \
             its value cannot be put in the key; give the parameter a name, e.g. `id: u64` \
             instead of `_: u64`, and write `{open}id{close}`"
        );
        if !scope.params.is_empty() || scope.has_self {
            message.push_str(&format!("; {}", scope.describe()));
        }
        return Err(message);
    }
    if bare_root == "self" {
        if !scope.has_self {
            return Err(format!(
                "placeholder `{shown}` uses `self`, but this function has no `self` receiver; {}",
                scope.describe()
            ));
        }
    } else if !scope.params.iter().any(|param| param == bare_root) {
        let mut message = format!(
            "placeholder `{shown}` names no parameter of this function: {}",
            scope.describe()
        );
        let mut candidates: Vec<&str> = scope.params.iter().map(String::as_str).collect();
        if scope.has_self {
            candidates.push("self");
        }
        if let Some(best) = closest(bare_root, &candidates) {
            message.push_str(&format!("; did you mean `{best}`?"));
        }
        if scope.async_trait {
            message.push_str(
                " (in an `#[async_trait]` method, destructured parameters cannot be named: \
                 bind the parameter to a name and destructure it in the body)",
            );
        }
        return Err(message);
    }
    Ok(Placeholder {
        root: bare_root.to_owned(),
        fields,
    })
}

/// Maps a byte range of the template value to a span inside the literal, where the compiler
/// allows it (nightly); otherwise the whole literal.
pub(crate) fn span_of(lit: &LitStr, range: &Range<usize>) -> Span {
    let token = lit.token();
    let repr = token.to_string();
    // Only plain literals without escapes map byte-for-byte (offset 1 for the opening quote).
    if repr.starts_with('"')
        && !repr.contains('\\')
        && let Some(span) = token.subspan(range.start + 1..range.end + 1)
    {
        return span;
    }
    lit.span()
}

/// Generates the expression that builds the key bytes from a checked template.
pub(crate) fn template_tokens(
    segments: &[Segment],
    lit: &LitStr,
    krate: &TokenStream,
) -> TokenStream {
    let span = lit.span();
    let capacity: usize = segments
        .iter()
        .map(|segment| match segment {
            Segment::Literal(text) => text.len(),
            Segment::Placeholder(_) => 8,
        })
        .sum();
    let mut calls = TokenStream::new();
    for segment in segments {
        match segment {
            Segment::Literal(text) => {
                let text = LitStr::new(text, span);
                calls.extend(quote_spanned!(span=> .literal(#text)));
            }
            Segment::Placeholder(placeholder) => {
                let value = placeholder_expr(placeholder, span);
                calls.extend(quote_spanned!(span=> .display(&#value)));
            }
        }
    }
    quote_spanned! {span=>
        #krate::__private::KeyTemplate::with_capacity(#capacity) #calls .finish()
    }
}

/// `root.field.0`, with every token spanned at the template so that the names resolve to the
/// function's parameters.
fn placeholder_expr(placeholder: &Placeholder, span: Span) -> TokenStream {
    let mut tokens = if placeholder.root == "self" {
        syn::token::SelfValue(span).into_token_stream()
    } else {
        ident(&placeholder.root, span).into_token_stream()
    };
    for field in &placeholder.fields {
        let dot = syn::token::Dot(span);
        dot.to_tokens(&mut tokens);
        if field.chars().all(|c| c.is_ascii_digit()) {
            let mut index = field.parse::<usize>().map_or_else(
                |_| proc_macro2::Literal::string(field),
                proc_macro2::Literal::usize_unsuffixed,
            );
            index.set_span(span);
            index.to_tokens(&mut tokens);
        } else {
            ident(field, span).to_tokens(&mut tokens);
        }
    }
    tokens
}

/// An identifier token for `name`, raw (`r#type`) when `name` is a keyword.
fn ident(name: &str, span: Span) -> syn::Ident {
    let name = name.strip_prefix("r#").unwrap_or(name);
    if syn::parse_str::<syn::Ident>(name).is_ok() {
        syn::Ident::new(name, span)
    } else {
        syn::Ident::new_raw(name, span)
    }
}

#[cfg(test)]
mod tests;
