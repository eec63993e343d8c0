//! The macro's diagnostics: every problem found is collected, each with its own span, and
//! reported together as `compile_error!`s.

use std::fmt::Display;

use proc_macro2::{Span, TokenStream};

/// Accumulates `syn::Error`s into one.
#[derive(Debug, Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(existing) => existing.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn at(&mut self, span: Span, message: impl Display) {
        self.push(syn::Error::new(span, message));
    }

    /// An error underlining all of `tokens` (from their first to their last token).
    pub(crate) fn spanned(&mut self, tokens: impl quote::ToTokens, message: impl Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Every message collected so far (for tests).
    #[cfg(test)]
    pub(crate) fn messages(self) -> Vec<String> {
        self.0
            .map(|error| error.into_iter().map(|e| e.to_string()).collect())
            .unwrap_or_default()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub(crate) fn into_compile_errors(self) -> TokenStream {
        self.0
            .map(syn::Error::into_compile_error)
            .unwrap_or_default()
    }
}
