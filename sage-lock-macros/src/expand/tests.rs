use super::*;

fn expand_str(args: TokenStream, item: TokenStream) -> String {
    expand(args, item).to_string()
}

#[test]
fn rewrites_the_body_and_keeps_the_signature() {
    let out = expand_str(
        quote!(
            key = "account:{id}",
            wait = "2s",
            namespace = "account-updates"
        ),
        quote! {
            /// Docs.
            #[inline]
            pub async fn update(id: u64, delta: i64) -> Result<(), AppError> {
                #![allow(unused)]
                apply(id, delta)?;
                Ok(())
            }
        },
    );
    println!("{out}");
    assert!(out.starts_with("# [doc = r\" Docs.\"] # [inline] pub async fn update"));
    assert!(out.contains("# ! [allow (unused)]"));
    assert!(
        out.contains(":: sage_lock :: __private :: lock_shape :: < Result < () , AppError > > ()")
    );
    assert!(out.contains(
        ":: sage_lock :: __private :: with_lock (sage_lock_shape , sage_lock_client , sage_lock_key"
    ));
    assert!(
        out.contains("if false { return sage_lock_shape . fake_return () ; } apply (id , delta) ?")
    );
    assert!(out.contains(". literal (\"account:\") . display (& id) . finish ()"));
    assert!(out.contains(". namespace (\"account-updates\")"));
    assert!(out.contains("from_millis (2000u64)"));
    assert!(!out.contains("compile_error"));
}

#[test]
fn try_lock_uses_the_body_type() {
    let out = expand_str(
        quote!(key = id, try_lock, crate = ::my::sage),
        quote! {
            async fn settle(id: u64) -> anyhow::Result<Option<u8>> { Ok(1) }
        },
    );
    println!("{out}");
    assert!(out.contains(
        ":: my :: sage :: __private :: try_lock_shape :: < anyhow :: Result < Option < u8 > > > ()"
    ));
    assert!(out.contains(":: my :: sage :: __private :: try_with_lock (sage_lock_shape"));
    assert!(out.contains("return sage_lock_shape . fake_body () ;"));
    assert!(out.contains("encode_key (& (id))"));
}

#[test]
fn modes_pick_their_entry_points() {
    let out = expand_str(
        quote!(key = "doc:{id}", wait = "1s", mode = "read"),
        quote!(
            async fn read(id: u64) -> Result<(), E> {
                Ok(())
            }
        ),
    );
    assert!(out.contains(":: sage_lock :: __private :: with_primitive (sage_lock_shape , sage_lock_client , :: sage_lock :: __private :: Primitive :: Read"), "{out}");
    let out = expand_str(
        quote!(key = "pool", try_lock, permits = 3),
        quote!(
            async fn run() -> Result<Option<()>, E> {
                Ok(())
            }
        ),
    );
    assert!(out.contains("try_with_primitive"), "{out}");
    assert!(out.contains("Primitive :: Semaphore (3u32)"), "{out}");
    let out = expand_str(
        quote!(key = ["a:{from}", to], wait = "1s"),
        quote!(
            async fn mv(from: u64, to: u64) -> Result<(), E> {
                Ok(())
            }
        ),
    );
    assert!(
        out.contains(":: std :: vec :: Vec < :: std :: vec :: Vec < u8 >"),
        "{out}"
    );
    assert!(
        out.contains(":: sage_lock :: __private :: with_locks (sage_lock_shape"),
        "{out}"
    );
    assert!(out.contains("encode_key (& (to))"), "{out}");
}

#[test]
fn errors_keep_the_original_function() {
    let out = expand_str(
        quote!(key = "{nope}", wait = "2 parsecs"),
        quote!(
            fn plain(id: u64) -> u64 {
                id
            }
        ),
    );
    assert!(out.starts_with("fn plain (id : u64) -> u64 { id }"));
    assert_eq!(out.matches("compile_error").count(), 3, "{out}");
}
