//! The function shapes `#[locked]` accepts: a native `async fn`, or a method `#[async_trait]`
//! already rewrote to return a boxed future; and the type surgery on them (the declared return
//! type with `impl Trait` erased, `#[async_trait]`'s return-type edges in `try_lock` mode).

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::spanned::Spanned as _;
use syn::visit_mut::VisitMut;
use syn::{
    Block, Expr, GenericArgument, ItemFn, Pat, PathArguments, ReturnType, Stmt, Type,
    TypeParamBound,
};

/// How the function is written.
pub(crate) enum Shape {
    /// A native `async fn`; its declared return type (with `impl Trait` erased) and span.
    Async { ret: Type, ret_span: Span },
    /// A function already rewritten by `#[async_trait]`: it returns
    /// `Pin<Box<dyn Future<Output = ret> + ...>>` and its last statement is
    /// `Box::pin(async move { ... })`.
    AsyncTrait { ret: Type, ret_span: Span },
}

impl Shape {
    pub(crate) fn of(func: &ItemFn) -> syn::Result<Self> {
        let sig = &func.sig;
        if sig.asyncness.is_some() {
            let (ret, ret_span) = declared_return(func);
            return Ok(Self::Async { ret, ret_span });
        }
        if let (Some(output), Some(_)) = (boxed_future_output(&sig.output), async_trait_body(func))
        {
            return Ok(Self::AsyncTrait {
                ret: erase_impl_trait(output.clone()),
                ret_span: output.span(),
            });
        }
        let message = if runs_an_async_block(func) {
            "`#[locked]` is on a plain fn that runs an async block: an attribute above it (such \
             as `#[tokio::main]` or `#[tokio::test]`) already rewrote the `async fn`; put \
             `#[locked]` above that attribute, so it sees the `async fn` first"
        } else {
            "`#[locked]` can only be applied to an `async fn`: add `async` before `fn` (the lock \
             is held across the body's `.await`s)"
        };
        Err(syn::Error::new(sig.fn_token.span, message))
    }
}

/// Whether a plain fn's body binds an async block (`let body = async { ... };`), as
/// `#[tokio::main]` and `#[tokio::test]` rewrite an `async fn`.
fn runs_an_async_block(func: &ItemFn) -> bool {
    func.block.stmts.iter().any(|stmt| {
        matches!(stmt, Stmt::Local(local)
            if local.init.as_ref().is_some_and(|init| matches!(&*init.expr, Expr::Async(_))))
    })
}

/// `Output` of a `Pin<Box<dyn Future<Output = T> + ...>>` return type, as `#[async_trait]`
/// writes it.
pub(crate) fn boxed_future_output(output: &ReturnType) -> Option<&Type> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    let pin = single_type_argument(ty, "Pin")?;
    let boxed = single_type_argument(pin, "Box")?;
    let Type::TraitObject(object) = boxed else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let segment = bound.path.segments.last()?;
        if segment.ident != "Future" {
            return None;
        }
        let PathArguments::AngleBracketed(arguments) = &segment.arguments else {
            return None;
        };
        arguments.args.iter().find_map(|argument| match argument {
            GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
            _ => None,
        })
    })
}

pub(crate) fn single_type_argument<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(path) = ty else {
        return None;
    };
    let segment = path.path.segments.last()?;
    if segment.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(arguments) = &segment.arguments else {
        return None;
    };
    arguments.args.iter().find_map(|argument| match argument {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    })
}

/// The `async move { ... }` inside the trailing `Box::pin(...)` of an `#[async_trait]` body.
pub(crate) fn async_trait_body(func: &ItemFn) -> Option<&syn::ExprAsync> {
    let Some(Stmt::Expr(Expr::Call(call), None)) = func.block.stmts.last() else {
        return None;
    };
    let Expr::Path(path) = &*call.func else {
        return None;
    };
    let mut segments = path.path.segments.iter().rev();
    if segments.next()?.ident != "pin" || segments.next()?.ident != "Box" {
        return None;
    }
    match call.args.first() {
        Some(Expr::Async(body)) if call.args.len() == 1 && body.capture.is_some() => Some(body),
        _ => None,
    }
}

pub(crate) fn async_trait_body_mut(func: &mut ItemFn) -> Option<&mut syn::ExprAsync> {
    let Some(Stmt::Expr(Expr::Call(call), None)) = func.block.stmts.last_mut() else {
        return None;
    };
    match call.args.first_mut() {
        Some(Expr::Async(body)) => Some(body),
        _ => None,
    }
}

/// Replaces `impl Trait` with `_` so that the type can be written inside the body.
pub(crate) fn erase_impl_trait(mut ty: Type) -> Type {
    struct Erase;
    impl VisitMut for Erase {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            if let Type::ImplTrait(impl_trait) = ty {
                let span = impl_trait.impl_token.span;
                *ty = Type::Infer(syn::TypeInfer {
                    attrs: Vec::new(),
                    underscore_token: syn::Token![_](span),
                });
            } else {
                syn::visit_mut::visit_type_mut(self, ty);
            }
        }
    }
    Erase.visit_type_mut(&mut ty);
    ty
}

pub(crate) fn declared_return(func: &ItemFn) -> (Type, Span) {
    match &func.sig.output {
        ReturnType::Type(_, ty) => (erase_impl_trait((**ty).clone()), ty.span()),
        ReturnType::Default => {
            let span = func.sig.ident.span();
            (syn::parse_quote_spanned!(span=> ()), span)
        }
    }
}

pub(crate) fn empty_block() -> Block {
    Block {
        brace_token: syn::token::Brace::default(),
        stmts: Vec::new(),
    }
}

/// In `try_lock` mode the body evaluates to `Result<T, E>` while the function returns
/// `Result<Option<T>, E>`: `#[async_trait]`'s own return-type edges (`None::<R>` and
/// `let __ret: R = ...`) are retargeted to the body type.
pub(crate) fn retarget_async_trait_edges(block: &mut Block, ret: &Type, krate: &TokenStream) {
    struct Retarget {
        ret: String,
        body: Type,
    }
    impl VisitMut for Retarget {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            if erase_impl_trait(ty.clone()).to_token_stream().to_string() == self.ret {
                *ty = self.body.clone();
            } else {
                syn::visit_mut::visit_type_mut(self, ty);
            }
        }
        // Never touch the user's own code.
        fn visit_block_mut(&mut self, _: &mut Block) {}
        fn visit_expr_async_mut(&mut self, _: &mut syn::ExprAsync) {}
        fn visit_expr_closure_mut(&mut self, _: &mut syn::ExprClosure) {}
    }
    let span = ret.span();
    let body: Type = syn::parse_quote_spanned!(span=>
        <#ret as #krate::__private::TryLockReturn>::Body
    );
    fn retarget(visitor: &mut Retarget, stmts: &mut [Stmt]) {
        for stmt in stmts {
            match stmt {
                // `if let Some(__ret) = None::<R> { return __ret; }`
                Stmt::Expr(Expr::If(edge), _) => visitor.visit_expr_mut(&mut edge.cond),
                // `let __ret: R = { ...user body... };`
                Stmt::Local(local) => match &mut local.pat {
                    Pat::Type(typed) => visitor.visit_type_mut(&mut typed.ty),
                    // `#[tracing::instrument]` above `#[locked]` moved the edges into its
                    // future: `let __tracing_instrument_future = async move { ... };`.
                    Pat::Ident(name) if name.ident == INSTRUMENT_FUTURE => {
                        if let Some(init) = &mut local.init
                            && let Expr::Async(future) = &mut *init.expr
                        {
                            retarget(visitor, &mut future.block.stmts);
                        }
                    }
                    _ => {}
                },
                _ => {}
            }
        }
    }
    let mut visitor = Retarget {
        ret: ret.to_token_stream().to_string(),
        body,
    };
    retarget(&mut visitor, &mut block.stmts);
}

/// The local holding the future `#[tracing::instrument]` wraps an async body in.
const INSTRUMENT_FUTURE: &str = "__tracing_instrument_future";

/// The local `#[tracing::instrument]` declares with the function's return type to fix its
/// future's output (`let __tracing_attr_fake_return: R = loop {};`).
const INSTRUMENT_FAKE_RETURN: &str = "__tracing_attr_fake_return";

/// In `try_lock` mode, retargets the fake return that an attribute above `#[locked]`
/// (`#[tracing::instrument]`) put in the body with the declared type `R` to the body's type, as
/// [`retarget_async_trait_edges`] does for `#[async_trait]`'s.
pub(crate) fn retarget_instrument_fake_return(block: &mut Block, ret: &Type, krate: &TokenStream) {
    struct Retarget {
        ret: String,
        body: Type,
    }
    impl VisitMut for Retarget {
        fn visit_local_mut(&mut self, local: &mut syn::Local) {
            if let Pat::Type(typed) = &mut local.pat
                && let Pat::Ident(name) = &*typed.pat
                && name.ident == INSTRUMENT_FAKE_RETURN
                && erase_impl_trait((*typed.ty).clone())
                    .to_token_stream()
                    .to_string()
                    == self.ret
            {
                *typed.ty = self.body.clone();
            }
            syn::visit_mut::visit_local_mut(self, local);
        }
    }
    let span = ret.span();
    let body: Type = syn::parse_quote_spanned!(span=>
        <#ret as #krate::__private::TryLockReturn>::Body
    );
    Retarget {
        ret: ret.to_token_stream().to_string(),
        body,
    }
    .visit_block_mut(block);
}

/// Takes `#[async_trait]`'s rebinding of each named parameter (`let id = id;`) out of its
/// boxed future's `block` (or out of the future `#[tracing::instrument]` above `#[locked]` made
/// of it), so that it can come before the lock's prelude: a parameter the key names is then
/// used by the rebinding's own scope, and not reported unused when the body does not use it.
/// `let __self = self;` stays: the prelude may read `self` (`client = self.locks`).
pub(crate) fn take_async_trait_rebindings(block: &mut Block) -> Vec<Stmt> {
    fn is_rebinding(stmt: &Stmt) -> bool {
        let Stmt::Local(local) = stmt else {
            return false;
        };
        let (Pat::Ident(name), Some(init)) = (&local.pat, &local.init) else {
            return false;
        };
        if name.ident == "__self" || init.diverge.is_some() {
            return false;
        }
        matches!(&*init.expr, Expr::Path(path) if path.qself.is_none() && path.path.is_ident(&name.ident))
    }
    // The user's body is in a block of its own (`let __ret: R = { ... };`): every rebinding at
    // this level is `#[async_trait]`'s.
    fn take(stmts: &mut Vec<Stmt>) -> Vec<Stmt> {
        let mut taken = Vec::new();
        let mut kept = Vec::with_capacity(stmts.len());
        for mut stmt in stmts.drain(..) {
            if is_rebinding(&stmt) {
                taken.push(stmt);
                continue;
            }
            if let Stmt::Local(local) = &mut stmt
                && let Pat::Ident(name) = &local.pat
                && name.ident == INSTRUMENT_FUTURE
                && let Some(init) = &mut local.init
                && let Expr::Async(future) = &mut *init.expr
            {
                taken.extend(take(&mut future.block.stmts));
            }
            kept.push(stmt);
        }
        *stmts = kept;
        taken
    }
    take(&mut block.stmts)
}
