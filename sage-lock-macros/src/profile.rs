//! The `profile = "name"` argument: checked (a non-empty literal whose name maps to environment
//! variables) and expanded into a call of the `*_profile_lock` entry points, which read the
//! profile's settings at run time and apply the attribute's own arguments over them. Each
//! function naming a profile also registers it (through `inventory`) for `check_profiles`.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};
use syn::{Expr, Ident, Lit, LitStr};

/// Checks `profile = <value>`; `literal` is the value as a literal, if it is one.
pub(crate) fn parse(
    span: Span,
    value: Option<&Expr>,
    literal: Option<&Lit>,
) -> Result<LitStr, syn::Error> {
    let Some(value) = value else {
        return Err(syn::Error::new(
            span,
            "`profile` needs a value: write `profile = \"account-updates\"`, the name of a profile \
             installed with `sage_lock::global::set_profiles`",
        ));
    };
    let Some(Lit::Str(text)) = literal else {
        return Err(syn::Error::new_spanned(
            value,
            "`profile` must be a string literal, e.g. `profile = \"account-updates\"`, so that \
             `sage_lock::global::check_profiles()` can list it at start-up; for a profile \
             chosen at run time, call `Locks::with_lock` with \
             `sage_lock::global::profile(name)?.options()`",
        ));
    };
    let name = text.value();
    if name.is_empty() {
        return Err(syn::Error::new(
            text.span(),
            "`profile` cannot be empty: name a profile such as \"account-updates\", or remove \
             the argument",
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(syn::Error::new(
            text.span(),
            format!(
                "profile name {name:?} contains {bad:?}: use ASCII letters, digits, `-`, `_` and \
                 `.`, so that it maps to environment variables (SAGE_LOCK_PROFILE_<NAME>_LEASE, \
                 ...)"
            ),
        ));
    }
    Ok(text.clone())
}

/// What a call with a profile is made of.
pub(crate) struct Call<'a> {
    /// The path to sage-lock.
    pub(crate) krate: &'a TokenStream,
    pub(crate) profile: &'a LitStr,
    /// The annotated function, for `check_profiles`' report.
    pub(crate) function_name: &'a Ident,
    /// The arguments before the profile: `shape, client, key,`.
    pub(crate) leading: &'a TokenStream,
    /// The attribute's option setters (`.lease(..)` ...), applied over the profile's options.
    pub(crate) setters: &'a TokenStream,
    pub(crate) try_lock: bool,
    /// `key = [..]`: all of several keys (`with_locks`), else one key.
    pub(crate) many: bool,
    /// The attribute's wait, which wins over the profile's.
    pub(crate) wait_millis: Option<u64>,
}

/// The generated pieces: a registration statement, the entry point and its leading arguments
/// (up to the body future).
pub(crate) struct Generated {
    pub(crate) registration: TokenStream,
    pub(crate) function: TokenStream,
    pub(crate) arguments: TokenStream,
}

pub(crate) fn call(call: &Call<'_>) -> Generated {
    let Call {
        krate,
        profile,
        function_name,
        leading,
        setters,
        try_lock,
        many,
        wait_millis,
    } = call;
    let noun = if *many { "locks" } else { "lock" };
    let try_function = format_ident!("try_with_profile_{noun}");
    let wait_function = format_ident!("with_profile_{noun}");
    let function_name = LitStr::new(
        &syn::ext::IdentExt::unraw(*function_name).to_string(),
        function_name.span(),
    );
    // A waiting call without a wait of its own takes the profile's.
    let needs_wait = if !*try_lock && wait_millis.is_none() {
        quote!(.needing_wait())
    } else {
        quote!()
    };
    let registration = quote! {
        #krate::__private::inventory::submit! {
            #krate::__private::ProfileUse::new(
                #profile, #function_name, ::core::file!(), ::core::line!()
            )#needs_wait
        }
    };
    let options = format_ident!("sage_lock_options", span = Span::mixed_site());
    let overrides = quote!(|#options: #krate::__private::LockOptions| #options #setters);
    let (function, arguments) = if *try_lock {
        (
            quote!(#krate::__private::#try_function),
            quote!(#leading #profile, #overrides,),
        )
    } else {
        let wait = match wait_millis {
            Some(millis) => quote!(::core::option::Option::Some(
                ::core::time::Duration::from_millis(#millis)
            )),
            None => quote!(::core::option::Option::None),
        };
        (
            quote!(#krate::__private::#wait_function),
            quote!(#leading #profile, #overrides, #wait,),
        )
    };
    Generated {
        registration,
        function,
        arguments,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(value: TokenStream) -> Result<String, String> {
        let expr: Expr = syn::parse2(value).map_err(|e| e.to_string())?;
        let literal = match &expr {
            Expr::Lit(lit) => Some(lit.lit.clone()),
            _ => None,
        };
        parse(Span::call_site(), Some(&expr), literal.as_ref())
            .map(|name| name.value())
            .map_err(|error| error.to_string())
    }

    #[test]
    fn profile_names_are_checked() {
        assert_eq!(
            check(quote!("account-updates.v2_x")),
            Ok("account-updates.v2_x".into())
        );
        assert!(check(quote!("")).is_err_and(|e| e.contains("cannot be empty")));
        assert!(check(quote!("a b")).is_err_and(|e| e.contains("environment variables")));
        assert!(check(quote!(NAME)).is_err_and(|e| e.contains("string literal")));
        assert!(
            parse(Span::call_site(), None, None)
                .is_err_and(|e| e.to_string().contains("needs a value"))
        );
    }

    #[test]
    fn the_attribute_overrides_the_profile() {
        let krate = quote!(::sage_lock);
        let name: Ident = syn::parse_quote!(update);
        let profile: LitStr = syn::parse_quote!("accounts");
        let generated = call(&Call {
            krate: &krate,
            profile: &profile,
            function_name: &name,
            leading: &quote!(shape, client, key,),
            setters: &quote!(.lease(x)),
            try_lock: false,
            many: false,
            wait_millis: Some(100),
        });
        let arguments = generated.arguments.to_string();
        assert!(arguments.contains("\"accounts\""), "{arguments}");
        assert!(
            arguments.contains("sage_lock_options . lease (x)"),
            "{arguments}"
        );
        assert!(arguments.contains("from_millis (100u64)"), "{arguments}");
        assert!(
            generated
                .function
                .to_string()
                .ends_with(":: with_profile_lock"),
            "{}",
            generated.function
        );
        let registration = generated.registration.to_string();
        assert!(
            registration.contains("ProfileUse :: new (\"accounts\" , \"update\""),
            "{registration}"
        );
        let many = call(&Call {
            krate: &krate,
            profile: &profile,
            function_name: &name,
            leading: &quote!(shape, client, keys,),
            setters: &quote!(),
            try_lock: true,
            many: true,
            wait_millis: None,
        });
        assert!(
            many.function
                .to_string()
                .ends_with(":: try_with_profile_locks"),
            "{}",
            many.function
        );
    }
}
