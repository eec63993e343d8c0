//! `locks`: see and clear the locks of a namespace, for the person on call.
//!
//! ```text
//! cargo run -p sage-lock-examples --bin locks -- list   --url redis://127.0.0.1:6379 --namespace account-updates
//! cargo run -p sage-lock-examples --bin locks -- show   account:42 --url ... --namespace ...
//! cargo run -p sage-lock-examples --bin locks -- unlock account:42 --url ... --namespace ... [--by "alice, incident 1234"]
//! ```
//!
//! `--url` defaults to `SAGE_LOCK_URL` (any URL `LockClient::connect` takes: standalone,
//! Sentinel, cluster), `--namespace` to `lock`. `list` scans every primary (`SCAN`, never
//! `KEYS`) and prints a table of the held locks: key, fencing token, lease left, time held.
//! `show` prints one lock's holder. `unlock` force-releases a lock (the holder's next renewal
//! fails and its body is cancelled); it is logged at warn by the library with `--by` (default:
//! `$USER`). `--tls-ca FILE` trusts the CA that signed a `rediss://` server's certificate;
//! `--tls-cert FILE --tls-key FILE` present a client certificate (`tls-auth-clients yes`).

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use sage_lock::{HeldLock, HolderInfo, LockClient, LockOptions, Locks};

const USAGE: &str = "usage: locks <list | show KEY | unlock KEY> [--url URL] [--namespace NS] [--by WHO] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE]
  --url        server URL (default: $SAGE_LOCK_URL), e.g. redis://127.0.0.1:6379 or redis-cluster://h:p
  --namespace  the locks' namespace (default: lock)
  --by         who unlocks and why, logged (unlock only; default: $USER)
  --tls-ca     PEM file of the CA that signed the server's certificate (rediss:// URLs)
  --tls-cert   PEM file of a client certificate, for a server that asks for one (with --tls-key)
  --tls-key    PEM file of that certificate's private key
  --           ends the options: a KEY after it may start with a dash (or write --flag=VALUE)";

/// What to do.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    /// `--help` / `-h`: print the usage, exit 0.
    Help,
    List,
    Show(String),
    Unlock(String),
}

/// The parsed command line.
#[derive(Debug, PartialEq, Eq)]
struct Cli {
    command: Command,
    url: Option<String>,
    namespace: String,
    by: Option<String>,
    tls_ca: Option<String>,
    /// A client certificate and its key (both given, or neither).
    tls_client: Option<(String, String)>,
}

fn parse(args: &[String]) -> anyhow::Result<Cli> {
    let mut positional = Vec::new();
    let (mut url, mut namespace, mut by, mut tls_ca) = (None, None, None, None);
    let (mut tls_cert, mut tls_key) = (None, None);
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            // The end of the options: the rest are positional (a key may start with dashes).
            positional.extend(iter.by_ref().cloned());
            break;
        }
        // `--flag=value` takes any value, dashes included.
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value)),
            _ => (arg.as_str(), None),
        };
        let slot = match flag {
            "--url" => &mut url,
            "--namespace" | "-n" => &mut namespace,
            "--by" => &mut by,
            "--tls-ca" => &mut tls_ca,
            "--tls-cert" => &mut tls_cert,
            "--tls-key" => &mut tls_key,
            "-h" | "--help" => {
                return Ok(Cli {
                    command: Command::Help,
                    url: None,
                    namespace: String::new(),
                    by: None,
                    tls_ca: None,
                    tls_client: None,
                });
            }
            flag if flag.starts_with("--") => bail!("unknown option {flag}\n{USAGE}"),
            _ => {
                positional.push(arg.clone());
                continue;
            }
        };
        let value = match inline {
            Some(value) => value,
            None => iter
                .next()
                // Another option is no value: `-n --url U` misses the namespace.
                .filter(|value| !value.starts_with('-') || value.len() == 1)
                .with_context(|| {
                    format!(
                        "{flag} needs a value (write {flag}=VALUE for one starting with -)\n{USAGE}"
                    )
                })?,
        };
        *slot = Some(value.to_owned());
    }
    if by.as_deref().is_some_and(|by| by.trim().is_empty()) {
        bail!(
            "--by is empty: give who unlocks and why, e.g. --by \"alice, incident 1234\"\n{USAGE}"
        );
    }
    let command = match positional.as_slice() {
        [list] if list == "list" => Command::List,
        [show, key] if show == "show" => Command::Show(key.clone()),
        [unlock, key] if unlock == "unlock" => Command::Unlock(key.clone()),
        [verb] if verb == "show" || verb == "unlock" => {
            bail!("`{verb}` needs the lock's key: locks {verb} KEY\n{USAGE}")
        }
        [] => bail!("no command given\n{USAGE}"),
        other => bail!("cannot understand {other:?}\n{USAGE}"),
    };
    let tls_client = match (tls_cert, tls_key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => bail!("--tls-cert and --tls-key go together: give both\n{USAGE}"),
    };
    Ok(Cli {
        command,
        url,
        namespace: namespace.unwrap_or_else(|| "lock".to_owned()),
        by,
        tls_ca,
        tls_client,
    })
}

fn duration(value: Option<Duration>) -> String {
    match value {
        None => "-".to_owned(),
        Some(d) if d < Duration::from_secs(1) => format!("{}ms", d.as_millis()),
        Some(d) => format!("{:.1}s", d.as_secs_f64()),
    }
}

/// One row of the table: key, fencing token, lease left, time held.
type Row = (String, u64, Option<Duration>, Option<Duration>);

fn row(key: String, holder: &HolderInfo) -> Row {
    (key, holder.fencing_token, holder.remaining, holder.held_for)
}

/// `text` with its control characters (newline, tab, escape, ...) written as escapes, so a key
/// prints on one line and cannot drive the terminal; everything else prints as it is.
fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_debug().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The table `list` and `show` print.
fn table(rows: &[Row]) -> String {
    let keys: Vec<String> = rows.iter().map(|(key, ..)| printable(key)).collect();
    let width = keys
        .iter()
        .map(|key| key.chars().count())
        .chain([3])
        .max()
        .unwrap_or(3);
    let mut out = format!(
        "{:<width$}  {:>13}  {:>9}  {:>9}\n",
        "KEY", "FENCING TOKEN", "REMAINING", "HELD FOR"
    );
    for (key, (_, token, remaining, held_for)) in keys.iter().zip(rows) {
        let _ = writeln!(
            out,
            "{key:<width$}  {token:>13}  {:>9}  {:>9}",
            duration(*remaining),
            duration(*held_for)
        );
    }
    out
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.command == Command::Help {
        println!("{USAGE}");
        return Ok(());
    }
    let url = match cli.url {
        Some(url) => url,
        None => std::env::var(sage_lock_examples::URL_VARIABLE)
            .ok()
            .filter(|url| !url.is_empty())
            .with_context(|| format!("give --url URL (or set SAGE_LOCK_URL)\n{USAGE}"))?,
    };
    let mut builder = LockClient::builder().url(&url);
    if let Some(ca) = &cli.tls_ca {
        builder = builder.tls_ca_file(ca);
    }
    if let Some((cert, key)) = &cli.tls_client {
        builder = builder.tls_client_cert_file(cert, key);
    }
    let client = builder.connect().await.map_err(|error| {
        // The library's hint names its builder; this tool's user gives the flags.
        if error.to_string().contains("tls_client_cert") {
            anyhow::Error::new(error)
                .context("give the locks tool a client certificate: --tls-cert FILE --tls-key FILE")
        } else {
            anyhow::Error::new(error)
        }
    })?;
    let locks: Locks<str> =
        client.lock_with(LockOptions::new().namespace(cli.namespace.as_str()))?;
    let namespace = &cli.namespace;
    match cli.command {
        Command::List => {
            let held: Vec<HeldLock> = locks.scan().await?;
            let rows: Vec<Row> = held.into_iter().map(|h| row(h.key, &h.holder)).collect();
            print!("{}", table(&rows));
            println!("{} held in namespace {namespace:?}", plural(rows.len()));
        }
        Command::Help => {}
        Command::Show(key) => match locks.holder(key.as_str()).await? {
            Some(holder) => print!("{}", table(&[row(key, &holder)])),
            None => println!("{key:?} is not locked in namespace {namespace:?}"),
        },
        Command::Unlock(key) => {
            let by = cli
                .by
                .or_else(|| std::env::var("USER").ok())
                .filter(|by| !by.trim().is_empty())
                .unwrap_or_else(|| "unknown operator".to_owned());
            let by = format!("{by} (locks CLI)");
            if locks.force_unlock_by(key.as_str(), &by).await? {
                println!("unlocked {key:?} in namespace {namespace:?}");
            } else {
                println!("{key:?} was not locked in namespace {namespace:?}");
            }
        }
    }
    client.quit().await;
    Ok(())
}

fn plural(n: usize) -> String {
    if n == 1 {
        "1 lock".to_owned()
    } else {
        format!("{n} locks")
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match parse(&args) {
        Ok(cli) => run(cli).await,
        Err(error) => Err(error),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("locks: {}", sage_lock_examples::report(&error));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_the_commands() {
        let cli = parse(&args("list --url redis://h:1 --namespace ns")).expect("list");
        assert_eq!(cli.command, Command::List);
        assert_eq!(cli.url.as_deref(), Some("redis://h:1"));
        assert_eq!(cli.namespace, "ns");
        let cli = parse(&args("unlock k --by alice")).expect("unlock");
        assert_eq!(cli.command, Command::Unlock("k".into()));
        assert_eq!(cli.by.as_deref(), Some("alice"));
        let cli = parse(&args("list --tls-ca /etc/ca.pem")).expect("tls");
        assert_eq!(cli.tls_ca.as_deref(), Some("/etc/ca.pem"));
        let cli = parse(&args("list --tls-cert c.pem --tls-key k.pem")).expect("client cert");
        assert_eq!(cli.tls_client, Some(("c.pem".into(), "k.pem".into())));
        assert!(parse(&args("list --tls-cert c.pem")).is_err());
        assert_eq!(cli.namespace, "lock");
        for verb in ["show", "unlock"] {
            let error = parse(&args(verb)).expect_err("no key").to_string();
            assert!(error.contains("needs the lock's key"), "{error}");
        }
        assert!(parse(&args("list --url")).is_err());
        assert!(parse(&args("list --colour red")).is_err());
        assert!(parse(&[]).is_err());
        assert_eq!(
            parse(&args("list --help")).expect("help").command,
            Command::Help
        );
        assert_eq!(parse(&args("-h")).expect("help").command, Command::Help);
    }

    #[test]
    fn formats_a_table() {
        let text = table(&[(
            "account:42".into(),
            17,
            Some(Duration::from_millis(29_100)),
            Some(Duration::from_millis(900)),
        )]);
        assert!(text.starts_with("KEY"), "{text}");
        assert!(text.contains("account:42"), "{text}");
        assert!(text.contains("29.1s") && text.contains("900ms"), "{text}");
    }

    #[test]
    fn control_characters_in_keys_are_escaped() {
        let text = table(&[("evil\nKEY  FENCING TOKEN\tx\u{1b}[2J".into(), 1, None, None)]);
        // Header plus exactly one row: a key cannot forge lines or move the cursor.
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.contains('\u{1b}') && !text.contains('\t'), "{text}");
        assert!(text.contains(r"evil\nKEY"), "{text}");
        // Ordinary keys, quotes and non-ASCII letters included, print as they are.
        let text = table(&[("konto:Ärger\"x\"".into(), 1, None, None)]);
        assert!(text.contains("konto:Ärger\"x\""), "{text}");
    }

    #[test]
    fn odd_keys_and_missing_values() {
        // `--` ends the options: a key may start with dashes.
        let cli = parse(&args("show -- --weird")).expect("after --");
        assert_eq!(cli.command, Command::Show("--weird".into()));
        assert!(parse(&args("show -- --weird --url redis://h:1")).is_err());
        let cli = parse(&args("unlock --url redis://h:1 -- -k")).expect("after --");
        assert_eq!(cli.command, Command::Unlock("-k".into()));
        // `--flag=value` takes any value, dashes included.
        let cli = parse(&args("list --namespace=--odd")).expect("flag=value");
        assert_eq!(cli.namespace, "--odd");
        // A flag given where a value belongs is not taken as the value.
        let error = parse(&args("show k -n --url redis://h:1"))
            .expect_err("-n without a value")
            .to_string();
        assert!(error.contains("-n needs a value"), "{error}");
        // An empty --by is refused, not replaced by a default name.
        let error = parse(&[
            "unlock".to_owned(),
            "k".to_owned(),
            "--by".to_owned(),
            String::new(),
        ])
        .expect_err("empty --by")
        .to_string();
        assert!(error.contains("--by"), "{error}");
    }
}
