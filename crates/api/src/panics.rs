//! What a caught panic said, for the log line that reports it.

use std::any::Any;

/// The text a panic was raised with (`panic!("...")` or a formatted message), when it
/// has one.
pub fn message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_read_from_either_string_type() {
        let owned: Box<dyn Any + Send> = Box::new(String::from("owned"));
        let fixed: Box<dyn Any + Send> = Box::new("fixed");
        let other: Box<dyn Any + Send> = Box::new(3);
        assert_eq!(message(&*owned), "owned");
        assert_eq!(message(&*fixed), "fixed");
        assert_eq!(message(&*other), "(no message)");
    }
}
