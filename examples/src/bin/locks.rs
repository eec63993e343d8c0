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
//! `KEYS`) and prints a table of the held locks: key, fencing token, lease left, time held. In
//! a cluster it waits out a slot migration (the command timeout at most), then fails naming the
//! slot rather than print a list that may leave out the locks that move.
//! `show` prints one lock's holder. `unlock` force-releases a lock (the holder's next renewal
//! fails and its body is cancelled); it is logged at warn by the library with `--by` (default:
//! `$USER`). `--tls-ca FILE` trusts the CA that signed a `rediss://` server's certificate;
//! `--tls-cert FILE --tls-key FILE` present a client certificate (`tls-auth-clients yes`).
//!
//! Keys print escaped (a backslash as `\\`, control characters and bytes that are not UTF-8 as
//! `\xNN`, see [`sage_lock_examples::locks_tool::key_text`]), and `show` and `unlock` read their
//! KEY with the same escapes, so any key `list` prints can be pasted back. A reader that closes
//! the output early (`locks list | head -1`) ends the tool quietly, with exit 0.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use sage_lock::{HeldLock, HolderInfo, LockClient, LockError, LockOptions, Locks};
use sage_lock_examples::locks_tool::{Row, key_text, parse_key, table};

const USAGE: &str = r"usage: locks <list | show KEY | unlock KEY> [-n NS] [--url URL] [--by WHO] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE]
  --url URL           server URL (default: $SAGE_LOCK_URL), e.g. redis://127.0.0.1:6379 or redis-cluster://h:p
  -n, --namespace NS  the locks' namespace (default: lock)
  --by WHO            who unlocks and why, logged (unlock only; default: $USER)
  --tls-ca FILE       PEM file of the CA that signed the server's certificate (rediss:// URLs)
  --tls-cert FILE     PEM file of a client certificate, for a server that asks for one (with --tls-key)
  --tls-key FILE      PEM file of that certificate's private key
  -h, --help          print this and exit
  --                  ends the options: a KEY after it may start with a dash (or write --flag=VALUE)
KEY is written as `list` prints it: a backslash as \\, control characters and bytes that are not
UTF-8 as \xNN (also \n, \r, \t). A key wider than the KEY column (60) is listed whole on a line
of its own, with its values on the next line.";

/// What to do.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    /// `--help` / `-h`: print the usage, exit 0.
    Help,
    List,
    /// A key's bytes (the argument with its escapes read, see [`parse_key`]).
    Show(Vec<u8>),
    Unlock(Vec<u8>),
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
        // `--flag=value` (and `-n=value`) takes any value, dashes included.
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") || flag == "-n" => (flag, Some(value)),
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
                        "{flag} needs a value: {flag} VALUE (or {flag}=VALUE for one starting \
                         with -)\n{USAGE}"
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
        [show, key] if show == "show" => Command::Show(parse_key(key)?),
        [unlock, key] if unlock == "unlock" => Command::Unlock(parse_key(key)?),
        [verb] if verb == "show" || verb == "unlock" => {
            bail!("`{verb}` needs the lock's key: locks {verb} KEY\n{USAGE}")
        }
        [] => bail!("no command given\n{USAGE}"),
        other => bail!("cannot understand {other:?}\n{USAGE}"),
    };
    if by.is_some() && !matches!(command, Command::Unlock(_)) {
        bail!("--by only applies to `unlock` (it names who clears a lock, in the log)\n{USAGE}");
    }
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

fn row(key: Vec<u8>, holder: &HolderInfo) -> Row {
    (key, holder.fencing_token, holder.remaining, holder.held_for)
}

/// `error` with the library's hints, which name its builder's methods, naming this tool's flags.
fn with_tool_hints(error: LockError, cli: &Cli) -> anyhow::Error {
    const FLAGS: [(&str, &str); 4] = [
        (
            "LockClientBuilder::tls_client_cert_file or tls_client_cert_pem",
            "--tls-cert FILE --tls-key FILE",
        ),
        ("(see tls_client_cert_file)", "(see --tls-cert)"),
        (
            "LockClientBuilder::tls_ca_file or tls_ca_pem",
            "--tls-ca FILE",
        ),
        ("tls_ca_file or tls_ca_pem", "--tls-ca FILE"),
    ];
    let text = error.to_string();
    let hinted = FLAGS.iter().fold(text.clone(), |text, (method, flag)| {
        text.replace(method, flag)
    });
    let named_a_file = text.contains("tls_client_cert");
    let error = if hinted == text {
        anyhow::Error::new(error)
    } else {
        anyhow::anyhow!(hinted)
    };
    match &cli.tls_client {
        // The library could not use the files given (unreadable, not PEM, a key that is not
        // the certificate's).
        Some((cert, key)) if named_a_file => error.context(format!(
            "the client certificate --tls-cert {cert} with --tls-key {key}"
        )),
        _ => error,
    }
}

/// Runs the command: what it prints on stdout.
async fn run(cli: Cli) -> anyhow::Result<String> {
    if cli.command == Command::Help {
        return Ok(format!("{USAGE}\n"));
    }
    let url = match cli.url.as_deref() {
        Some(url) => url.to_owned(),
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
    let client = builder
        .connect()
        .await
        .map_err(|error| with_tool_hints(error, &cli))?;
    let output = command(&client, cli).await;
    client.quit().await;
    output
}

/// The command's work on `client`: what it prints.
async fn command(client: &LockClient, cli: Cli) -> anyhow::Result<String> {
    let locks: Locks<[u8]> =
        client.lock_with(LockOptions::new().namespace(cli.namespace.as_str()))?;
    let namespace = &cli.namespace;
    Ok(match cli.command {
        Command::Help => String::new(),
        Command::List => {
            let held: Vec<HeldLock> = locks.scan().await?;
            let rows: Vec<Row> = held
                .into_iter()
                .map(|held| row(held.key_bytes, &held.holder))
                .collect();
            let total = plural(rows.len());
            format!("{}{total} held in namespace {namespace:?}\n", table(&rows))
        }
        Command::Show(key) => match locks.holder(key.as_slice()).await? {
            Some(holder) => table(&[row(key, &holder)]),
            None => format!(
                "\"{}\" is not locked in namespace {namespace:?}\n",
                key_text(&key)
            ),
        },
        Command::Unlock(key) => {
            let by = cli
                .by
                .or_else(|| std::env::var("USER").ok())
                .filter(|by| !by.trim().is_empty())
                .unwrap_or_else(|| "unknown operator".to_owned());
            let by = format!("{by} (locks CLI)");
            let text = key_text(&key);
            if locks.force_unlock_by(key.as_slice(), &by).await? {
                format!("unlocked \"{text}\" in namespace {namespace:?}\n")
            } else {
                format!("\"{text}\" was not locked in namespace {namespace:?}\n")
            }
        }
    })
}

/// Writes `output` to stdout. A reader that closed the pipe early (`locks list | head -1`) is
/// a normal end, as for `ls | head`: `Ok`, the rest unwritten.
fn print(output: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(output.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
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
    // fred's own warnings repeat what the tool reports (a lone Sentinel, commands cancelled by
    // `quit`); sage-lock's warnings stay.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,fred=error")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match parse(&args) {
        Ok(cli) => run(cli).await,
        Err(error) => Err(error),
    }
    .and_then(|output| print(&output).context("cannot write the output"));
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
        assert!(error.contains("-n needs a value: -n VALUE"), "{error}");
        // ... and the hinted `-n=VALUE` is taken.
        let cli = parse(&args("list -n=-odd")).expect("-n=value");
        assert_eq!(cli.namespace, "-odd");
        // `--by` is for `unlock` only.
        for line in ["list --by alice", "show k --by alice"] {
            let error = parse(&args(line)).expect_err(line).to_string();
            assert!(error.contains("--by only applies to `unlock`"), "{error}");
        }
        // Keys are read with the escapes `list` prints them with.
        let cli = parse(&args(r"unlock a\\xff")).expect("escaped backslash");
        assert_eq!(cli.command, Command::Unlock(br"a\xff".to_vec()));
        let cli = parse(&args(r"show a\xff")).expect("escaped byte");
        assert_eq!(cli.command, Command::Show(b"a\xff".to_vec()));
        assert!(parse(&args(r"show a\q")).is_err());
        // The usage says the key column's width.
        let width = sage_lock_examples::locks_tool::KEY_COLUMN;
        assert!(USAGE.contains(&format!("KEY column ({width})")), "{USAGE}");
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
