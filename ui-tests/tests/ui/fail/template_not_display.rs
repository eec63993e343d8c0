use sage_lock::locked;

pub struct Point {
    pub x: i32,
}

#[locked(key = "point:{point}", wait = "2s")]
async fn update(point: Point) -> anyhow::Result<i32> {
    Ok(point.x)
}

fn main() {}
