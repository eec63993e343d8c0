use sage_lock::locked;

#[locked(key = "account", wait = "2s")]
pub struct Account {
    pub id: u64,
}

fn main() {}
