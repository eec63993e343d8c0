//! Token-level helpers for code generation: where an item starts, the names a function's
//! parameters bind, and spans that make type errors point at the user's code.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, quote};
use syn::{Expr, FnArg, ItemFn, Pat};

use crate::key::Scope;

/// The span of the item's keyword (`struct`, `fn`, ...), past attributes and visibility.
pub(crate) fn first_item_token_span(item: &TokenStream) -> Span {
    let mut tokens = item.clone().into_iter().peekable();
    while let Some(token) = tokens.next() {
        match &token {
            TokenTree::Punct(punct) if punct.as_char() == '#' => {
                tokens.next();
            }
            TokenTree::Ident(ident) if ident == "pub" => {
                if let Some(TokenTree::Group(_)) = tokens.peek() {
                    tokens.next();
                }
            }
            other => return other.span(),
        }
    }
    Span::call_site()
}

/// The names a key template may refer to.
pub(crate) fn scope_of(func: &ItemFn) -> Scope {
    let mut scope = Scope::default();
    for input in &func.sig.inputs {
        match input {
            FnArg::Receiver(_) => scope.has_self = true,
            FnArg::Typed(typed) => {
                let before = scope.params.len();
                collect_bindings(&typed.pat, &mut scope.params);
                if scope.params.len() == before {
                    scope.unnamed += 1;
                }
            }
        }
    }
    scope
}

fn collect_bindings(pat: &Pat, out: &mut Vec<String>) {
    match pat {
        Pat::Ident(ident) => {
            out.push(syn::ext::IdentExt::unraw(&ident.ident).to_string());
            if let Some((_, sub)) = &ident.subpat {
                collect_bindings(sub, out);
            }
        }
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::Struct(strukt) => strukt
            .fields
            .iter()
            .for_each(|field| collect_bindings(&field.pat, out)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::Reference(reference) => collect_bindings(&reference.pat, out),
        Pat::Paren(paren) => collect_bindings(&paren.pat, out),
        Pat::Type(typed) => collect_bindings(&typed.pat, out),
        Pat::Or(or) => {
            if let Some(first) = or.cases.first() {
                collect_bindings(first, out);
            }
        }
        _ => {}
    }
}

/// `tokens` with every span set to `span`.
pub(crate) fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                token = TokenTree::Group(inner);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

/// `&(expr)`, spanned so that a type error about it underlines exactly `expr`.
pub(crate) fn borrowed(expr: &Expr) -> TokenStream {
    let tokens = expr.to_token_stream();
    let mut spans = tokens.clone().into_iter().map(|token| token.span());
    let first = spans.next().unwrap_or_else(Span::call_site);
    let last = spans.last().unwrap_or(first);
    let and = syn::token::And(first);
    let mut group = proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, tokens);
    group.set_span(last);
    quote!(#and #group)
}
