//! The lock primitives, each a small module stating its scripts and its rules on the shared
//! [lease engine](crate::engine).

pub(crate) mod mutex;
