//! Object names as upstream's apimachinery makes them: `generateName` completions and
//! safe encodings, from an alphabet without vowels (no words) and without 0, 1 and 3
//! (no look-alikes).

/// upstream's `rand` alphabet.
pub const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Characters `generateName` gets appended, as upstream's name generator.
const GENERATED_SUFFIX: usize = 5;
/// The longest object name that a DNS label allows.
const MAX_NAME: usize = 63;

/// Each byte as one character of the safe alphabet (upstream's `rand.SafeEncodeString`).
pub fn safe_encode(bytes: impl IntoIterator<Item = u8>) -> String {
    bytes
        .into_iter()
        .map(|b| SAFE_ALPHABET[b as usize % SAFE_ALPHABET.len()] as char)
        .collect()
}

/// `n` random characters of the safe alphabet (at most 16).
pub fn random_suffix(n: usize) -> String {
    safe_encode(uuid::Uuid::new_v4().into_bytes().into_iter().take(n))
}

/// A name for `generateName: prefix`: the prefix, cut to leave room for five random
/// characters within 63 bytes (never inside a character), then the random characters.
pub fn generate_name(prefix: &str) -> String {
    let mut cut = prefix.len().min(MAX_NAME - GENERATED_SUFFIX);
    while !prefix.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{}", &prefix[..cut], random_suffix(GENERATED_SUFFIX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_names_keep_the_prefix_and_fit_63_bytes() {
        let name = generate_name("web-");
        assert!(name.starts_with("web-") && name.len() == 9, "{name}");
        assert!(name[4..].bytes().all(|b| SAFE_ALPHABET.contains(&b)));
        assert_eq!(generate_name(&"a".repeat(80)).len(), 63);
    }

    #[test]
    fn a_long_prefix_is_never_cut_inside_a_character() {
        // 57 ASCII bytes and a two-byte 'é': the 58-byte cut would split it.
        let name = generate_name(&format!("{}é", "a".repeat(57)));
        assert_eq!(&name[..57], "a".repeat(57));
        assert_eq!(name.len(), 62);
        let name = generate_name(&"é".repeat(40));
        assert!(name.len() <= 63 && name.starts_with("éé"), "{name}");
    }

    #[test]
    fn safe_encoding_maps_bytes_into_the_alphabet() {
        assert_eq!(safe_encode([0, 1, 26, 27]), "bc9b");
    }
}
