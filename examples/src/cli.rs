//! Command-line helpers shared by the example binaries: argument checks, flag values,
//! error reports and percentiles.

use std::fmt;

use anyhow::bail;

/// The value at quantile `q` (0.0..=1.0) of an ascending slice; 0 when empty.
#[must_use]
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let last = sorted.len() - 1;
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let index = ((last as f64) * q.clamp(0.0, 1.0)).round() as usize;
    sorted[index.min(last)]
}

/// What a binary's command line may hold: `flags` (alone) and `valued` (each followed by a
/// value), with `usage` to show.
#[derive(Debug, Clone, Copy)]
pub struct Usage<'a> {
    /// Flags that stand alone, e.g. `--quick`.
    pub flags: &'a [&'a str],
    /// Flags followed by a value, e.g. `--seconds 8`.
    pub valued: &'a [&'a str],
    /// The usage line(s) printed by `--help` and after a bad argument.
    pub text: &'a str,
}

impl Usage<'_> {
    /// Checks `args` (the command line after the program name): `Ok(true)` to go on,
    /// `Ok(false)` after printing the usage for `--help` / `-h`.
    ///
    /// # Errors
    /// An argument this binary does not know, or a valued flag without its value: the error
    /// names it and shows the usage.
    pub fn check<I: IntoIterator<Item = String>>(&self, args: I) -> anyhow::Result<bool> {
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--help" || arg == "-h" {
                println!("{}", self.text);
                return Ok(false);
            }
            if self.flags.contains(&arg.as_str()) {
                continue;
            }
            if self.valued.contains(&arg.as_str()) {
                if args.next().is_none() {
                    bail!("{arg} needs a value\n{}", self.text);
                }
                continue;
            }
            bail!("unknown argument `{arg}`\n{}", self.text);
        }
        Ok(true)
    }

    /// [`Usage::check`] on this process's command line.
    ///
    /// # Errors
    /// As [`Usage::check`].
    pub fn check_command_line(&self) -> anyhow::Result<bool> {
        self.check(std::env::args().skip(1))
    }
}

/// The value following `--name` on the command line, parsed.
///
/// # Errors
/// When the flag is present without a value, or the value does not parse.
pub fn flag_value<T: std::str::FromStr>(name: &str) -> anyhow::Result<Option<T>>
where
    T::Err: fmt::Display,
{
    let args: Vec<String> = std::env::args().collect();
    let Some(index) = args.iter().position(|arg| arg == name) else {
        return Ok(None);
    };
    let Some(value) = args.get(index + 1) else {
        bail!("{name} needs a value");
    };
    parse_value(name, value).map(Some)
}

/// `value` of flag `name` parsed, or an error naming both.
fn parse_value<T: std::str::FromStr>(name: &str, value: &str) -> anyhow::Result<T>
where
    T::Err: fmt::Display,
{
    value.parse().map_err(|e: T::Err| {
        let why = e.to_string();
        // `NonZeroUsize`'s own wording ("number would be zero for non-zero type").
        if why.contains("zero for non-zero") {
            anyhow::anyhow!("{name} {value}: must be at least 1")
        } else {
            anyhow::anyhow!("{name} {value}: {why}")
        }
    })
}

/// True when `--name` is on the command line.
#[must_use]
pub fn has_flag(name: &str) -> bool {
    std::env::args().any(|arg| arg == name)
}

/// `error` and its causes on one line, as anyhow's `{:#}` prints them, without a cause the
/// message before it already quotes (a [`sage_lock::LockError::Backend`] shows fred's error in
/// its own message, and returns it as its source too).
#[must_use]
pub fn report(error: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// What an example's `main` returns for `result`: its exit code, or, after printing the error
/// with [`report`] (each cause once, no backtrace), failure.
pub fn finish<T: std::process::Termination>(result: anyhow::Result<T>) -> std::process::ExitCode {
    match result {
        Ok(value) => value.report(),
        Err(error) => {
            eprintln!("error: {}", report(&error));
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn report_quotes_each_cause_once() {
        let quoted = anyhow::Error::new(std::io::Error::other("refused"))
            .context("could not connect: refused");
        assert_eq!(super::report(&quoted), "could not connect: refused");
        let chained =
            anyhow::Error::new(std::io::Error::other("refused")).context("could not connect");
        assert_eq!(super::report(&chained), "could not connect: refused");
    }

    use super::Usage;

    const USAGE: Usage<'static> = Usage {
        flags: &["--quick"],
        valued: &["--seconds"],
        text: "usage: x [--quick] [--seconds S]",
    };

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|arg| (*arg).to_owned()).collect()
    }

    #[test]
    fn known_arguments_pass_and_help_stops() {
        assert!(USAGE.check(args(&[])).expect("empty"));
        assert!(
            USAGE
                .check(args(&["--seconds", "3", "--quick"]))
                .expect("known")
        );
        assert!(!USAGE.check(args(&["--quick", "--help"])).expect("help"));
        assert!(!USAGE.check(args(&["-h"])).expect("help"));
    }

    #[test]
    fn a_bad_argument_is_named_with_the_usage() {
        let unknown = USAGE
            .check(args(&["--quik"]))
            .expect_err("unknown")
            .to_string();
        assert!(
            unknown.contains("`--quik`") && unknown.contains("usage: x"),
            "{unknown}"
        );
        let missing = USAGE
            .check(args(&["--seconds"]))
            .expect_err("missing value")
            .to_string();
        assert!(missing.contains("--seconds needs a value"), "{missing}");
    }

    #[test]
    fn a_zero_count_says_the_least_allowed() {
        let zero = super::parse_value::<std::num::NonZeroUsize>("--instances", "0")
            .expect_err("zero")
            .to_string();
        assert_eq!(zero, "--instances 0: must be at least 1");
        let word = super::parse_value::<std::num::NonZeroUsize>("--instances", "two")
            .expect_err("word")
            .to_string();
        assert!(word.starts_with("--instances two: invalid digit"), "{word}");
    }
}
