use sage_lock::locked;

#[locked(key = "account:{id}", wait = "2s")]
async fn update(id: u64) -> u64 {
    id
}

fn main() {}
