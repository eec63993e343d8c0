//! `std::io::Result<T>` is a return type `#[locked]` accepts: sage-lock converts a `LockError`
//! into an `io::Error` (the orphan rule keeps users from writing that impl themselves). In
//! `try_lock` mode the fn returns `Option` and the body the value.
use sage_lock::locked;

#[locked(key = "file:{name}", wait = "2s")]
async fn rewrite(name: &str) -> std::io::Result<usize> {
    Ok(name.len())
}

#[locked(key = "file:{name}", try_lock)]
async fn try_rewrite(name: &str) -> std::io::Result<Option<usize>> {
    Ok(name.len())
}

fn main() {
    drop(rewrite("a"));
    drop(try_rewrite("a"));
}
