//! Code generation: rewrites the function body to acquire the lock, run the original body
//! under it, and release it, keeping everything else about the function as it was.
//!
//! ```text
//! #[locked(key = "account:{id}", wait = "2s", namespace = "account-updates")]
//! pub async fn update(id: u64, delta: i64) -> Result<(), AppError> { BODY }
//! ```
//! becomes (the `sage_lock_*` locals are hygienic: the body cannot name them)
//! ```text
//! pub async fn update(id: u64, delta: i64) -> Result<(), AppError> {
//!     let sage_lock_key: Vec<u8> = ::sage_lock::__private::KeyTemplate::with_capacity(16)
//!         .literal("account:").display(&id).finish();
//!     let sage_lock_client: Option<LockClient> = None;     // `client = e`: Some(ClientArg::lock_client(&(e)))
//!     let sage_lock_shape = ::sage_lock::__private::lock_shape::<Result<(), AppError>>();
//!     ::sage_lock::__private::with_lock(
//!         sage_lock_shape, sage_lock_client, sage_lock_key,
//!         ::sage_lock::__private::LockOptions::new().namespace("account-updates"),
//!         ::core::time::Duration::from_millis(2000u64),
//!         async move {
//!             if false { return sage_lock_shape.fake_return(); }
//!             BODY
//!         },
//!     ).await
//! }
//! ```
//! * `lock_shape::<R>()` (spanned at the return type) is the one check of the return type, and
//!   carries the conversion of a `LockError` into `R`; `try_lock` uses `try_lock_shape`, whose
//!   `fake_body()` has the body's type `Result<T, E>`.
//! * The `if false` edge fixes the async block's output type before the body is checked, so `?`
//!   and `return` work in the body exactly as they did in the function.
//! * On an `#[async_trait]` method (already rewritten to return a boxed future), the same
//!   prelude and call are put inside its `Box::pin(async move { ... })`.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned as _;
use syn::{AttrStyle, Block, ItemFn, Type};

use crate::args::{self, Args, KeyArg};
use crate::errors::Errors;
use crate::key::{self, Scope};
use crate::modes::RwMode;
use crate::profile;
use crate::shape::{
    Shape, async_trait_body_mut, declared_return, empty_block, retarget_async_trait_edges,
    retarget_instrument_fake_return, take_async_trait_rebindings,
};
use crate::tokens::{borrowed, first_item_token_span, respan, scope_of};

/// Entry point: `#[locked(args)] item`.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let args = args::parse(args, &mut errors);

    let func = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            errors.at(first_item_token_span(&item), not_a_function_message(&item));
            let errors = errors.into_compile_errors();
            return quote!(#item #errors);
        }
    };

    // The next `#[locked]` down is still on the item: a second lock, nested in this one.
    if let Some(again) = func.attrs.iter().find(|attr| is_locked(attr)) {
        errors.spanned(again, LOCKED_TWICE);
    }

    let shape = match Shape::of(&func) {
        Ok(shape) => Some(shape),
        Err(error) => {
            errors.push(error);
            None
        }
    };

    let mut scope = scope_of(&func);
    if matches!(shape, Some(Shape::AsyncTrait { .. })) {
        // `#[async_trait]` renamed destructured parameters to hygienic `__argN`: not nameable.
        scope.async_trait = true;
        let before = scope.params.len();
        scope.params.retain(|name| {
            !(name.starts_with("__arg") && name[5..].chars().all(|c| c.is_ascii_digit()))
        });
        scope.unnamed += before - scope.params.len();
    }
    let key = args
        .key
        .as_ref()
        .and_then(|arg| key_tokens(arg, &args, &scope, &mut errors));

    match (shape, key) {
        (Some(shape), Some(key)) if errors.is_empty() => generate(&args, func, &shape, &key),
        _ => {
            // Keep the function as written so that the only errors are ours.
            let errors = errors.into_compile_errors();
            let func = fallback(&args, &func);
            quote!(#func #errors)
        }
    }
}

/// The expression giving the key's bytes (`Vec<u8>`), or for `key = [..]` every key's
/// (`Vec<Vec<u8>>`); `None` after reporting a problem.
fn key_tokens(
    arg: &KeyArg,
    args: &Args,
    scope: &Scope,
    errors: &mut Errors,
) -> Option<TokenStream> {
    match arg {
        KeyArg::Template(lit) => match key::parse_template(&lit.value(), scope) {
            Ok(segments) => Some(key::template_tokens(&segments, lit, &krate(args))),
            Err(problems) => {
                for problem in problems {
                    errors.at(key::span_of(lit, &problem.range), problem.message);
                }
                None
            }
        },
        KeyArg::Expr(expr) => {
            let krate = krate(args);
            let argument = borrowed(expr);
            let function = quote_spanned!(expr.span()=> #krate::__private::encode_key);
            Some(quote!(#function(#argument)))
        }
        KeyArg::Many(keys) => {
            let all: Vec<Option<TokenStream>> = keys
                .iter()
                .map(|key| key_tokens(key, args, scope, errors))
                .collect();
            let all: Option<Vec<TokenStream>> = all.into_iter().collect();
            let all = all?;
            Some(quote!(::std::vec![#(#all),*]))
        }
    }
}

/// What a second `#[locked]` on one function is told.
const LOCKED_TWICE: &str = "`#[locked]` is applied twice: the locks would nest (this one \
     inside the one above), and two functions taking the same keys in opposite orders can \
     deadlock; take several keys together with one attribute: `key = [\"a:{x}\", \"b:{y}\"]`";

/// Whether `attr` is `#[locked(..)]` (by any path ending in `locked`).
fn is_locked(attr: &syn::Attribute) -> bool {
    attr.path()
        .segments
        .last()
        .is_some_and(|segment| segment.ident == "locked")
}

fn krate(args: &Args) -> TokenStream {
    args.krate
        .as_ref()
        .map_or_else(|| quote!(::sage_lock), ToTokens::to_token_stream)
}

fn not_a_function_message(item: &TokenStream) -> &'static str {
    match syn::parse2::<syn::TraitItemFn>(item.clone()) {
        Ok(declaration) if declaration.default.is_none() => {
            "`#[locked]` needs a function body: put it on the `async fn` in the `impl` block, \
             not on the trait's declaration"
        }
        _ => "`#[locked]` can only be applied to an `async fn`",
    }
}

/// The generated pieces around the body.
struct Generated {
    /// `let key = ...; let client = ...; let shape = ...;`
    locals: TokenStream,
    /// `with_lock(shape, client, key, options, wait, ` ... up to the body future (as tokens
    /// of the callee and the leading arguments).
    function: TokenStream,
    arguments: TokenStream,
    /// `if false { return shape.fake_return(); }`: fixes the body's type before it is checked.
    edge: TokenStream,
}

fn shape_local() -> syn::Ident {
    format_ident!("sage_lock_shape", span = Span::mixed_site())
}

/// `let shape = lock_shape::<R>();` (or `try_lock_shape`), the one check of the return type,
/// spanned at the return type.
fn shape_statement(args: &Args, ret: &Type, ret_span: Span) -> TokenStream {
    let krate = krate(args);
    let shape = shape_local();
    let function = if args.try_lock {
        quote_spanned!(ret_span=> try_lock_shape)
    } else {
        quote_spanned!(ret_span=> lock_shape)
    };
    // All of the call is spanned at the return type (from its first to its last token), so
    // that an unsatisfied bound underlines the return type rather than the attribute.
    let mut spans = ret.to_token_stream().into_iter().map(|token| token.span());
    let first = spans.next().unwrap_or(ret_span);
    let last = spans.last().unwrap_or(first);
    let krate = respan(krate, first);
    let head = quote_spanned!(first=> #krate::__private::#function::<);
    let tail = quote_spanned!(last=> >());
    quote!(let #shape = #head #ret #tail;)
}

fn edge(args: &Args, ret_span: Span) -> TokenStream {
    let shape = shape_local();
    let fake = if args.try_lock {
        quote_spanned!(ret_span=> fake_body)
    } else {
        quote_spanned!(ret_span=> fake_return)
    };
    quote_spanned! {ret_span=>
        if false {
            return #shape.#fake();
        }
    }
}

fn generated(
    args: &Args,
    key: &TokenStream,
    ret: &Type,
    ret_span: Span,
    function_name: &syn::Ident,
) -> Generated {
    let krate = krate(args);
    let key_local = format_ident!("sage_lock_key", span = Span::mixed_site());
    let client_local = format_ident!("sage_lock_client", span = Span::mixed_site());
    let shape = shape_local();

    let client = match &args.client {
        Some(expr) => {
            let argument = borrowed(expr);
            let function = quote_spanned!(expr.span()=> #krate::__private::ClientArg::lock_client);
            quote!(::core::option::Option::Some(#function(#argument)))
        }
        None => quote!(::core::option::Option::None),
    };

    // The options the attribute sets, as setter calls: on `LockOptions::new()`, or with a
    // profile on the profile's options (so the attribute's arguments override the profile).
    let mut setters = TokenStream::new();
    if let Some(lease) = &args.lease {
        let millis = lease.millis;
        setters.extend(quote!(.lease(::core::time::Duration::from_millis(#millis))));
    }
    if let Some(namespace) = &args.namespace {
        setters.extend(quote!(.namespace(#namespace)));
    }
    if let Some((on, span)) = args.replica_ack {
        let on = syn::LitBool::new(on, span);
        setters.extend(quote!(.replica_acknowledgement(#on)));
    }
    if let Some(hold_at_least) = &args.hold_at_least {
        let millis = hold_at_least.millis;
        setters.extend(quote!(.hold_at_least(::core::time::Duration::from_millis(#millis))));
    }
    if let Some((on, span)) = args.reentrant {
        let on = syn::LitBool::new(on, span);
        setters.extend(quote!(.reentrant(#on)));
    }
    let shape_statement = shape_statement(args, ret, ret_span);
    let many = matches!(args.key, Some(KeyArg::Many(_)));
    let key_type = if many {
        quote!(::std::vec::Vec<::std::vec::Vec<u8>>)
    } else {
        quote!(::std::vec::Vec<u8>)
    };
    let mut locals = quote! {
        let #key_local: #key_type = #key;
        let #client_local: ::core::option::Option<#krate::__private::LockClient> = #client;
        #shape_statement
    };
    // Which runtime entry point: the mutex, several keys, or another primitive.
    let primitive = match (args.mode, args.permits) {
        (Some((RwMode::Read, span)), _) => {
            Some(quote_spanned!(span=> #krate::__private::Primitive::Read))
        }
        (Some((RwMode::Write, span)), _) => {
            Some(quote_spanned!(span=> #krate::__private::Primitive::Write))
        }
        (None, Some((permits, span))) => {
            Some(quote_spanned!(span=> #krate::__private::Primitive::Semaphore(#permits)))
        }
        (None, None) => None,
    };
    let (function, arguments) = if let Some(profile) = &args.profile {
        // `args` rejects a profile together with `mode` or `permits`.
        let call = profile::call(&profile::Call {
            krate: &krate,
            profile,
            function_name,
            leading: &quote!(#shape, #client_local, #key_local,),
            setters: &setters,
            try_lock: args.try_lock,
            many,
            wait_millis: args.wait.as_ref().map(|wait| wait.millis),
        });
        let registration = &call.registration;
        locals = quote!(#registration #locals);
        (call.function, call.arguments)
    } else {
        let options = quote!(#krate::__private::LockOptions::new() #setters);
        let (name, leading) = match (&primitive, many) {
            (Some(primitive), _) => (
                "primitive",
                quote!(#shape, #client_local, #primitive, #key_local, #options,),
            ),
            (None, true) => (
                "locks",
                quote!(#shape, #client_local, #key_local, #options,),
            ),
            (None, false) => ("lock", quote!(#shape, #client_local, #key_local, #options,)),
        };
        if args.try_lock {
            let function = format_ident!("try_with_{name}");
            (quote!(#krate::__private::#function), leading)
        } else {
            let millis = args.wait.as_ref().map_or(0, |wait| wait.millis);
            let function = format_ident!("with_{name}");
            (
                quote!(#krate::__private::#function),
                quote!(#leading ::core::time::Duration::from_millis(#millis),),
            )
        }
    };
    Generated {
        locals,
        function,
        arguments,
        edge: edge(args, ret_span),
    }
}

/// Writes `func` with a new body: outer attributes, visibility and signature as they were, the
/// inner attributes first in the body.
fn with_body(func: &ItemFn, body: &TokenStream) -> TokenStream {
    let outer = func
        .attrs
        .iter()
        .filter(|attr| matches!(attr.style, AttrStyle::Outer));
    let inner = func
        .attrs
        .iter()
        .filter(|attr| matches!(attr.style, AttrStyle::Inner(_)));
    let vis = &func.vis;
    let sig = &func.sig;
    let mut out = quote!(#(#outer)* #vis #sig);
    func.block.brace_token.surround(&mut out, |tokens| {
        tokens.extend(quote!(#(#inner)* #body));
    });
    out
}

/// What is emitted when the attribute has errors: the function as written, so that the only
/// errors are the attribute's. In `try_lock` mode the body is still checked as the body type
/// `Result<T, E>` (as it would be with a correct attribute), to avoid a cascade of type errors.
pub(crate) fn fallback(args: &Args, func: &ItemFn) -> TokenStream {
    if !args.try_lock || func.sig.asyncness.is_none() {
        return func.to_token_stream();
    }
    let (ret, ret_span) = declared_return(func);
    let shape_statement = shape_statement(args, &ret, ret_span);
    let edge = edge(args, ret_span);
    // The statements go straight into the async block, as in `generate`: wrapped in their own
    // braces, a one-expression body would trip `unused_braces`.
    let stmts = &func.block.stmts;
    let body = quote! {
        #shape_statement
        let _ = async move {
            #edge
            #(#stmts)*
        };
        ::core::unreachable!()
    };
    with_body(func, &body)
}

fn generate(args: &Args, mut func: ItemFn, shape: &Shape, key: &TokenStream) -> TokenStream {
    let name = func.sig.ident.clone();
    match shape {
        Shape::Async { ret, ret_span } => {
            let Generated {
                locals,
                function,
                arguments,
                edge,
            } = generated(args, key, ret, *ret_span, &name);
            if args.try_lock {
                retarget_instrument_fake_return(&mut func.block, ret, &krate(args));
            }
            // The body's statements go straight into the async block: wrapped in their own
            // braces, a one-expression body would trip `unused_braces`.
            let stmts = &func.block.stmts;
            let body = quote! {
                #locals
                #function(#arguments async move {
                    #edge
                    #(#stmts)*
                }).await
            };
            with_body(&func, &body)
        }
        Shape::AsyncTrait { ret, ret_span } => {
            let Generated {
                locals,
                function,
                arguments,
                edge: _,
            } = generated(args, key, ret, *ret_span, &name);
            let krate = krate(args);
            if let Some(async_block) = async_trait_body_mut(&mut func) {
                if args.try_lock {
                    retarget_async_trait_edges(&mut async_block.block, ret, &krate);
                    retarget_instrument_fake_return(&mut async_block.block, ret, &krate);
                }
                let mut inner = std::mem::replace(&mut async_block.block, empty_block());
                let rebindings = take_async_trait_rebindings(&mut inner);
                let stmts = &inner.stmts;
                let replacement: Block = syn::parse_quote! {{
                    #(#rebindings)*
                    #locals
                    #function(#arguments async move { #(#stmts)* }).await
                }};
                async_block.block = replacement;
            }
            func.into_token_stream()
        }
    }
}

#[cfg(test)]
mod tests;
