//! The macro's own names do not clash with the user's: parameters and locals named like them,
//! a local `sage_lock` module, shadowed prelude names, items and inner attributes in the body.
#![allow(dead_code)]
use sage_lock::locked;

mod core {}
mod std {}
struct Option;
struct Vec;

#[locked(key = "k:{sage_lock_key}:{sage_lock_client}", wait = "2s")]
async fn clashing_names(sage_lock_key: u64, sage_lock_client: u64) -> anyhow::Result<u64> {
    #![allow(unused_variables)]
    use ::std::collections::HashMap;
    fn helper(x: u64) -> u64 {
        x + 1
    }
    let unused = 1;
    let map: HashMap<u64, u64> = HashMap::new();
    let sage_lock_key = helper(sage_lock_key) + map.len() as u64;
    Ok(sage_lock_key + sage_lock_client)
}

fn main() {
    drop(clashing_names(1, 2));
}
