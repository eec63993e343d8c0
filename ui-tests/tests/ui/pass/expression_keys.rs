//! `key = <expression>` of any `KeyCodec` type.
use sage_lock::{KeyCodec, locked};

pub struct AccountId(pub u64);

impl KeyCodec for AccountId {
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"account:");
        self.0.encode_key(out);
    }
}

#[locked(key = id, wait = "2s")]
async fn integer(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

#[locked(key = name, wait = "2s")]
async fn string(name: String) -> anyhow::Result<String> {
    Ok(name)
}

#[locked(key = name, wait = "2s")]
async fn str_ref(name: &str) -> anyhow::Result<usize> {
    Ok(name.len())
}

#[locked(key = (tenant, id), wait = "2s")]
async fn tuple(tenant: &str, id: u64) -> anyhow::Result<u64> {
    Ok(id + tenant.len() as u64)
}

#[locked(key = account, try_lock)]
async fn custom(account: AccountId) -> anyhow::Result<Option<u64>> {
    Ok(account.0)
}

#[locked(key = format!("user:{}", name.to_lowercase()), wait = "2s")]
async fn computed(name: String) -> anyhow::Result<String> {
    Ok(name)
}

#[locked(key = b"raw-bytes", wait = "2s")]
async fn bytes() -> anyhow::Result<()> {
    Ok(())
}

pub struct Holder {
    pub key: String,
}

impl Holder {
    // A field of `self` behind `&self` is borrowed, not moved.
    #[locked(key = self.key, wait = "2s")]
    async fn field(&self) -> anyhow::Result<usize> {
        Ok(self.key.len())
    }
}

fn main() {
    let _ = (integer, string, str_ref, tuple, custom, computed, bytes);
    let _ = Holder::field;
}
