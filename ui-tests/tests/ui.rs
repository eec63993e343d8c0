//! trybuild tests of `#[locked]`: every supported shape compiles (and runs: the pass cases only
//! build the futures), and every misuse fails with a message that says how to fix it, pointing
//! at the token to fix. Regenerate the expected output with `TRYBUILD=overwrite`, then read it.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
