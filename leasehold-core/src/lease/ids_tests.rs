use super::*;

/// Two texts with the same readable part (`tenant-a`) whose 48-bit FNV-1a hashes were equal
/// (`b938e1edc8d8`): the earlier `derive` gave both the key `tenant-a-b938e1edc8d8`. They were
/// found by a birthday search over 2^26 separator variants of one name, in seconds: any
/// tenant could have picked a name that shares another's key.
#[test]
fn derive_keeps_apart_texts_that_collided_under_48_bit_fnv() {
    let (a, b) = ("tenant: :_ : ___// a", "tenant _: :: _ _/: a");
    let (ka, kb) = (LeaseKey::derive(a), LeaseKey::derive(b));
    assert_ne!(ka, kb, "{a:?} and {b:?} share a derived key");
    assert!(ka.as_str().starts_with("tenant-a-"), "{ka}");
    assert!(kb.as_str().starts_with("tenant-a-"), "{kb}");
}

/// The documented format, pinned: a change of hash or layout changes every derived key, and
/// must be a deliberate, announced change.
#[test]
fn derived_keys_are_the_readable_part_and_128_bits_of_sha_256() {
    for (text, key) in [
        ("Tenant/42", "tenant-42-6d211b502ab0c8948c7249f3d1b0d6a7"),
        ("tenant-42", "tenant-42-f71d3741b2bc6cc82a75e7d32a4bf9c0"),
        ("", "k-e3b0c44298fc1c149afbf4c8996fb924"),
    ] {
        assert_eq!(LeaseKey::derive(text).as_str(), key, "{text:?}");
    }
}

#[test]
fn derived_keys_are_legal_and_fit_for_any_text() {
    let long = "A".repeat(10_000);
    let long_sep = "/".repeat(10_000);
    let long_mixed = "ab/".repeat(1_000);
    for text in [
        "",
        "-",
        "..",
        "é€🦀",
        "--x--",
        long.as_str(),
        long_sep.as_str(),
        long_mixed.as_str(),
    ] {
        let key = LeaseKey::derive(text);
        assert!(key.as_str().len() <= MAX_KEY_LEN, "{key}");
        assert_eq!(
            LeaseKey::new(key.as_str()).ok(),
            Some(key.clone()),
            "{text:?}"
        );
        assert_eq!(LeaseKey::derive(text), key, "deterministic");
    }
}

proptest::proptest! {
    #[test]
    fn any_text_derives_a_legal_key_ending_in_its_hash(text in ".{0,300}") {
        let key = LeaseKey::derive(&text);
        proptest::prop_assert!(LeaseKey::new(key.as_str()).is_ok(), "{key}");
        let (_, hash) = key.as_str().rsplit_once('-').unwrap();
        proptest::prop_assert_eq!(hash.len(), 2 * DERIVED_HASH_BYTES);
    }
}
