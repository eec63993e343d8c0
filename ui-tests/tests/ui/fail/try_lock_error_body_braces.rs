// An argument error in `try_lock` mode reports the error alone: the function kept as written
// raised `unused_braces` on a one-expression body, with a fix that does not parse.
use sage_lock::locked;

#[locked(key = "a", wait = "2s", try_lock)]
async fn wait_and_try() -> anyhow::Result<Option<()>> { Ok(()) }

#[locked(key = "a", try_lock, try_lock)]
async fn repeated() -> anyhow::Result<Option<()>> { Ok(()) }

fn main() {}
