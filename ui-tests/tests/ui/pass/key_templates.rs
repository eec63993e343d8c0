//! Every template form: parameters, fields, tuple fields, `self` fields, the card notation,
//! escapes, raw identifiers, patterns, and a constant key.
use sage_lock::locked;

pub struct Order {
    pub id: u64,
    pub customer: Customer,
    pub pair: (u32, &'static str),
}

pub struct Customer {
    pub name: String,
}

#[locked(
    key = "order:{order.id}:{order.customer.name}:{order.pair.1}",
    wait = "2s"
)]
async fn fields(order: &Order) -> anyhow::Result<u64> {
    Ok(order.id)
}

#[locked(key = "account:<id>:<order.customer.name>", wait = "2s")]
async fn card_notation(id: u64, order: Order) -> anyhow::Result<u64> {
    Ok(id + order.id)
}

#[locked(key = "{{literal}}:{id}:}}{{:<<not-a-placeholder>:a<b>c", wait = "2s")]
async fn escapes(id: u64, b: u8) -> anyhow::Result<u64> {
    Ok(id + u64::from(b))
}

#[locked(key = "kind:{r#type}:{type}", wait = "2s")]
async fn raw_identifiers(r#type: &str) -> anyhow::Result<usize> {
    Ok(r#type.len())
}

#[locked(key = "pair:{a}:{b}:{x}:{first}", wait = "2s")]
async fn patterns(
    (a, b): (u32, u32),
    Point { x, .. }: Point,
    [first, ..]: [u8; 2],
) -> anyhow::Result<u32> {
    Ok(a + b + x + u32::from(first))
}

pub struct Point {
    pub x: u32,
    pub y: u32,
}

#[locked(key = "singleton", wait = "2s")]
async fn constant() -> anyhow::Result<()> {
    Ok(())
}

pub struct Tenant {
    pub name: String,
}

impl Tenant {
    #[locked(key = "tenant:{self.name}:{self}", wait = "2s", client = sage_lock_client())]
    async fn with_self(&self) -> anyhow::Result<usize> {
        Ok(self.name.len())
    }
}

impl std::fmt::Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

fn sage_lock_client() -> sage_lock::LockClient {
    sage_lock::LockClient::from_fred(sage_lock::fred::clients::Client::default())
}

fn main() {
    let _ = (
        fields,
        card_notation,
        escapes,
        raw_identifiers,
        patterns,
        constant,
    );
    let _ = Tenant::with_self;
}
