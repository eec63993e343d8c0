//! Test helper process for `tests/harness_smoke.rs`: starts a Redis server through the harness,
//! prints `HELPER pid=.. port=.. dir=..`, and sleeps until killed. The test then kills this
//! process and checks that the harness's watchdog took the server down with it.

use std::time::Duration;

use harness::{Server, ServerKind};

fn main() {
    let server = Server::start(ServerKind::Redis);
    println!(
        "HELPER pid={} port={} dir={}",
        server.pid().expect("running"),
        server.port(),
        server.dir().display()
    );
    std::thread::sleep(Duration::from_secs(60));
}
