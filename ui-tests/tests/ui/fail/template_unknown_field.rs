use sage_lock::locked;

pub struct Order {
    pub id: u64,
}

#[locked(key = "order:{order.number}", wait = "2s")]
async fn update(order: Order) -> anyhow::Result<u64> {
    Ok(order.id)
}

fn main() {}
