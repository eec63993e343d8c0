use sage_lock::locked;

pub struct Order {
    pub id: u64,
    pub name: String,
}

// A near miss: rustc's "a field with a similar name exists" suggestion replaced the whole
// template with `name` (helper 28); the error alone is kept.
#[locked(key = "order:{order.nme}", wait = "2s")]
async fn update(order: Order) -> anyhow::Result<u64> {
    Ok(order.id)
}

fn main() {}
