//! What sage-lock needs from the caller's executor: a Tokio runtime. fred's connections and
//! sage-lock's timers and background tasks run on it, so a call made elsewhere (another
//! executor's `block_on`, a plain thread) fails with [`missing`] instead of Tokio's panic.

use fred::error::{Error, ErrorKind};

/// The detail text of [`missing`].
const NO_RUNTIME: &str = "called outside a Tokio runtime: sage-lock (like fred) runs on Tokio; \
     call it from within #[tokio::main] or #[tokio::test], a tokio Runtime's block_on, or a task \
     spawned on one";

/// Whether the calling thread runs inside a Tokio runtime.
pub(crate) fn is_current() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}

/// The error of a call made outside a Tokio runtime: a configuration error, never retried.
pub(crate) fn missing() -> Error {
    Error::new(ErrorKind::Config, NO_RUNTIME)
}

/// `Err(`[`missing`]`)` outside a Tokio runtime.
pub(crate) fn ensure() -> Result<(), Error> {
    if is_current() { Ok(()) } else { Err(missing()) }
}
