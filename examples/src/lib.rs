//! Shared helpers of the sage-lock examples.
