//! The lock primitives, each a small module stating its scripts and its rules on the shared
//! [lease engine](crate::engine).

mod family;
mod multi;
pub(crate) mod mutex;
pub(crate) mod operator;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
