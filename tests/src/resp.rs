//! A tiny blocking RESP client for admin commands (`CONFIG SET`, `DEBUG`, `INFO`, `CLUSTER ...`),
//! so tests and the harness can talk to a server without an async runtime.

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// Default read/write timeout of [`cmd`] and [`RawConn`]: long enough for `DEBUG SLEEP` or `WAIT`
/// in a test, short enough that a paused server fails a test instead of hanging it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// One RESP reply.
///
/// RESP2 null bulk strings and null arrays both read as `Bulk(None)`. RESP3 replies (only seen after a
/// `HELLO 3` on a [`RawConn`]) are folded into these variants: null → `Bulk(None)`, boolean → `Int(0|1)`,
/// double and big number → `Simple`, map/set/push → `Array` (maps flattened to key, value, ...),
/// verbatim string → `Bulk`, blob error → `Error`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

impl Reply {
    /// The text of a simple or (UTF-8) bulk string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Reply::Simple(s) => Some(s),
            Reply::Bulk(Some(b)) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// Owned text of a simple or bulk string (bulk decoded lossily).
    pub fn to_text(&self) -> Option<String> {
        match self {
            Reply::Simple(s) => Some(s.clone()),
            Reply::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    /// Text of a string, digits of an integer, else the `Display` rendering.
    pub fn to_plain(&self) -> String {
        match self {
            Reply::Int(i) => i.to_string(),
            other => other.to_text().unwrap_or_else(|| other.to_string()),
        }
    }

    /// An integer reply, or a string reply that parses as one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            other => other.as_str().and_then(|s| s.trim().parse().ok()),
        }
    }

    pub fn as_array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(Some(b)) => Some(b),
            Reply::Simple(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// The message of an error reply.
    pub fn as_error(&self) -> Option<&str> {
        match self {
            Reply::Error(e) => Some(e),
            _ => None,
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// `+OK`.
    pub fn is_ok(&self) -> bool {
        matches!(self, Reply::Simple(s) if s == "OK")
    }

    /// A null bulk string / null array.
    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Bulk(None))
    }

    /// Reads an array of alternating keys and values (e.g. `SENTINEL MASTER`, `CONFIG GET`)
    /// as pairs of strings (see [`Reply::to_plain`]).
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        let Some(items) = self.as_array() else {
            return Vec::new();
        };
        items
            .chunks(2)
            .filter_map(|kv| match kv {
                [k, v] => Some((k.to_plain(), v.to_plain())),
                _ => None,
            })
            .collect()
    }

    /// `Err` with the message of an error reply, else `Ok(self)`.
    pub fn into_result(self) -> Result<Reply, String> {
        match self {
            Reply::Error(e) => Err(e),
            other => Ok(other),
        }
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Simple(s) => write!(f, "{s}"),
            Reply::Error(e) => write!(f, "(error) {e}"),
            Reply::Int(i) => write!(f, "(integer) {i}"),
            Reply::Bulk(None) => write!(f, "(nil)"),
            Reply::Bulk(Some(b)) => write!(f, "{:?}", String::from_utf8_lossy(b)),
            Reply::Array(items) => {
                write!(f, "[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{item}")?;
                }
                write!(f, "]")
            }
        }
    }
}

/// One blocking RESP connection to `127.0.0.1:port`. Use it when several commands must share a
/// connection (`CLIENT ID`, `MULTI`, `WAIT` after a write, pipelining with [`RawConn::send`]).
#[derive(Debug)]
pub struct RawConn {
    port: u16,
    reader: BufReader<TcpStream>,
}

impl RawConn {
    /// Connects with a 2 s connect timeout and [`DEFAULT_TIMEOUT`] for reads and writes.
    pub fn connect(port: u16) -> Result<RawConn, String> {
        RawConn::connect_timeout(port, DEFAULT_TIMEOUT)
    }

    /// Connects with the given read/write timeout (the connect timeout is at most 2 s).
    pub fn connect_timeout(port: u16, timeout: Duration) -> Result<RawConn, String> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT.min(timeout))
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        stream
            .set_nodelay(true)
            .map_err(|e| format!("set_nodelay on {addr}: {e}"))?;
        let mut conn = RawConn {
            port,
            reader: BufReader::new(stream),
        };
        conn.set_timeout(timeout)?;
        Ok(conn)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sets the read and write timeout.
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<(), String> {
        let stream = self.reader.get_ref();
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .map_err(|e| format!("set timeout on port {}: {e}", self.port))
    }

    /// Sends one command and reads its reply. A server error is `Ok(Reply::Error(..))`;
    /// `Err` means an I/O or protocol failure.
    pub fn cmd(&mut self, args: &[&str]) -> Result<Reply, String> {
        self.send(args)?;
        self.read()
    }

    /// Like [`RawConn::cmd`] with binary arguments.
    pub fn cmd_bytes(&mut self, args: &[&[u8]]) -> Result<Reply, String> {
        self.send_bytes(args)?;
        self.read()
    }

    /// Writes one command without reading its reply (pipelining); read it later with [`RawConn::read`].
    pub fn send(&mut self, args: &[&str]) -> Result<(), String> {
        let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.send_bytes(&bytes)
    }

    pub fn send_bytes(&mut self, args: &[&[u8]]) -> Result<(), String> {
        let mut buf = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
        buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for arg in args {
            buf.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            buf.extend_from_slice(arg);
            buf.extend_from_slice(b"\r\n");
        }
        self.reader
            .get_mut()
            .write_all(&buf)
            .map_err(|e| format!("write to port {}: {e}", self.port))
    }

    /// Reads one reply.
    pub fn read(&mut self) -> Result<Reply, String> {
        read_reply(&mut self.reader).map_err(|e| format!("read from port {}: {e}", self.port))
    }
}

fn read_line(r: &mut impl BufRead) -> Result<Vec<u8>, String> {
    let mut line = Vec::new();
    let n = r.read_until(b'\n', &mut line).map_err(|e| e.to_string())?;
    if n == 0 {
        return Err("connection closed by the server".to_owned());
    }
    if line.ends_with(b"\r\n") {
        line.truncate(line.len() - 2);
        Ok(line)
    } else {
        Err(format!(
            "truncated reply line {:?}",
            String::from_utf8_lossy(&line)
        ))
    }
}

fn parse_int(bytes: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad integer {:?}", String::from_utf8_lossy(bytes)))
}

fn read_blob(r: &mut impl BufRead, len: i64) -> Result<Option<Vec<u8>>, String> {
    let Ok(len) = usize::try_from(len) else {
        return Ok(None);
    };
    let mut buf = vec![0u8; len + 2];
    r.read_exact(&mut buf).map_err(|e| e.to_string())?;
    if !buf.ends_with(b"\r\n") {
        return Err("bulk string not terminated by CRLF".to_owned());
    }
    buf.truncate(len);
    Ok(Some(buf))
}

fn read_items(r: &mut impl BufRead, count: i64) -> Result<Reply, String> {
    let Ok(count) = usize::try_from(count) else {
        return Ok(Reply::Bulk(None));
    };
    let mut items = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        items.push(read_reply(r)?);
    }
    Ok(Reply::Array(items))
}

/// Reads one RESP2 (or RESP3) reply.
pub fn read_reply(r: &mut impl BufRead) -> Result<Reply, String> {
    let line = read_line(r)?;
    let Some((&tag, rest)) = line.split_first() else {
        return Err("empty reply line".to_owned());
    };
    let text = || String::from_utf8_lossy(rest).into_owned();
    match tag {
        b'+' => Ok(Reply::Simple(text())),
        b'-' => Ok(Reply::Error(text())),
        b':' => Ok(Reply::Int(parse_int(rest)?)),
        b'$' => Ok(Reply::Bulk(read_blob(r, parse_int(rest)?)?)),
        b'*' | b'~' | b'>' => read_items(r, parse_int(rest)?),
        // RESP3
        b'_' => Ok(Reply::Bulk(None)),
        b'#' => Ok(Reply::Int(i64::from(rest == b"t"))),
        b',' | b'(' => Ok(Reply::Simple(text())),
        b'%' | b'|' => {
            let pairs = parse_int(rest)?;
            let reply = read_items(r, pairs.saturating_mul(2))?;
            if tag == b'|' {
                // An attribute precedes the real reply: skip it.
                read_reply(r)
            } else {
                Ok(reply)
            }
        }
        b'=' => {
            let blob = read_blob(r, parse_int(rest)?)?;
            // Verbatim strings start with a 3-letter format and a colon: "txt:".
            Ok(Reply::Bulk(blob.map(|b| {
                if b.len() >= 4 && b[3] == b':' {
                    b[4..].to_vec()
                } else {
                    b
                }
            })))
        }
        b'!' => {
            let blob = read_blob(r, parse_int(rest)?)?.unwrap_or_default();
            Ok(Reply::Error(String::from_utf8_lossy(&blob).into_owned()))
        }
        other => Err(format!(
            "unknown RESP type byte {:?} in line {:?}",
            char::from(other),
            String::from_utf8_lossy(&line)
        )),
    }
}

/// Sends one command to `127.0.0.1:port` on a fresh connection and returns its reply.
///
/// A server error reply is `Ok(Reply::Error(..))`; `Err` is a connection or protocol failure
/// (refused, timed out after [`DEFAULT_TIMEOUT`], closed).
pub fn cmd(port: u16, args: &[&str]) -> Result<Reply, String> {
    cmd_timeout(port, args, DEFAULT_TIMEOUT)
}

/// [`cmd`] with a custom read/write timeout.
pub fn cmd_timeout(port: u16, args: &[&str], timeout: Duration) -> Result<Reply, String> {
    RawConn::connect_timeout(port, timeout)?.cmd(args)
}

/// [`cmd`] for harness/test code that expects success: panics on a connection failure or an error reply.
pub fn cmd_ok(port: u16, args: &[&str]) -> Reply {
    match cmd(port, args) {
        Ok(Reply::Error(e)) => panic!("`{}` on port {port} failed: {e}", args.join(" ")),
        Ok(reply) => reply,
        Err(e) => panic!("`{}` on port {port} failed: {e}", args.join(" ")),
    }
}

/// The text of `INFO <section>`.
pub fn info(port: u16, section: &str) -> Result<String, String> {
    info_timeout(port, section, DEFAULT_TIMEOUT)
}

pub(crate) fn info_timeout(port: u16, section: &str, timeout: Duration) -> Result<String, String> {
    let reply = cmd_timeout(port, &["INFO", section], timeout)?.into_result()?;
    reply
        .to_text()
        .ok_or_else(|| format!("INFO {section} on port {port}: unexpected reply {reply}"))
}

/// Finds `field:value` in an INFO text.
pub fn parse_info_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|line| {
        let (k, v) = line.trim_end().split_once(':')?;
        (k == field).then(|| v.to_owned())
    })
}

/// One field of `INFO <section>`, e.g. `info_field(port, "replication", "role")`.
/// `None` when the server does not answer or has no such field.
pub fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    parse_info_field(&info(port, section).ok()?, field)
}

/// `calls=N` of `cmdstat_<command>` in `INFO commandstats` (0 when the command was never called or the
/// server does not answer). `command` is case-insensitive; subcommands use `|`, e.g. `"client|kill"`.
/// Reset the counters with `CONFIG RESETSTAT`.
pub fn commandstats_calls(port: u16, command: &str) -> u64 {
    let Ok(text) = info(port, "commandstats") else {
        return 0;
    };
    let key = format!("cmdstat_{}", command.to_ascii_lowercase());
    parse_info_field(&text, &key)
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn parse(bytes: &[u8]) -> Reply {
        read_reply(&mut Cursor::new(bytes.to_vec())).expect("valid RESP")
    }

    #[test]
    fn parses_resp2() {
        assert_eq!(parse(b"+OK\r\n"), Reply::Simple("OK".into()));
        assert!(parse(b"+OK\r\n").is_ok());
        assert_eq!(parse(b"-ERR x\r\n").as_error(), Some("ERR x"));
        assert_eq!(parse(b":-42\r\n").as_int(), Some(-42));
        assert_eq!(parse(b"$3\r\na\r\n\r\n").as_bytes(), Some(&b"a\r\n"[..]));
        assert!(parse(b"$-1\r\n").is_nil());
        assert!(parse(b"*-1\r\n").is_nil());
        let arr = parse(b"*3\r\n$6\r\nmaster\r\n:12\r\n*0\r\n");
        let items = arr.as_array().expect("array");
        assert_eq!(items[0].as_str(), Some("master"));
        assert_eq!(items[1].as_int(), Some(12));
        assert_eq!(items[2], Reply::Array(vec![]));
    }

    #[test]
    fn parses_resp3() {
        assert!(parse(b"_\r\n").is_nil());
        assert_eq!(parse(b"#t\r\n"), Reply::Int(1));
        assert_eq!(parse(b",1.5\r\n").as_str(), Some("1.5"));
        assert_eq!(parse(b"=7\r\ntxt:abc\r\n").as_str(), Some("abc"));
        assert_eq!(
            parse(b"%1\r\n+a\r\n:1\r\n").to_pairs(),
            vec![("a".to_owned(), "1".to_owned())]
        );
    }

    #[test]
    fn info_fields() {
        let text = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n";
        assert_eq!(parse_info_field(text, "role").as_deref(), Some("master"));
        assert_eq!(
            parse_info_field(text, "connected_slaves").as_deref(),
            Some("2")
        );
        assert_eq!(parse_info_field(text, "nope"), None);
    }
}
