//! Deserializers that bound every list, map and string of the schema while the YAML is read.
//!
//! serde_yaml expands aliases as it deserializes (`*a` replays the events of `&a`) and stops
//! only after 100 jumps per event of the document: a 220 KB file of aliases grew the process
//! past 3 GB. Here each list and map fails at its first element past its limit, before reading
//! that element (which is skipped, not expanded), and each string fails before it is copied. So
//! whatever the aliases, the configuration built is never larger than the limits allow, and the
//! parser's work is in proportion to it. None of the schema's types buffers a value of unknown
//! shape (serde's untagged enums would), which is what makes the limits a bound.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// The longest string anywhere in a configuration: names, paths, globs, header values, URLs.
pub const MAX_STRING_BYTES: usize = 1024;

/// A string of at most [`MAX_STRING_BYTES`], refused before it is copied.
#[derive(Debug, Clone, Copy)]
pub struct Text;

impl<'de> DeserializeSeed<'de> for Text {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for Text {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        check_length(v).map(str::to_owned)
    }
}

/// Refuses a string longer than [`MAX_STRING_BYTES`], naming only its length.
pub fn check_length<E: de::Error>(v: &str) -> Result<&str, E> {
    if v.len() > MAX_STRING_BYTES {
        return Err(E::custom(format!(
            "a string of {} bytes; at most {MAX_STRING_BYTES} are allowed",
            v.len()
        )));
    }
    Ok(v)
}

/// A value of a type whose own `Deserialize` is already bounded.
pub struct Plain<T>(PhantomData<T>);

impl<T> Plain<T> {
    pub const fn new() -> Self {
        Plain(PhantomData)
    }
}

impl<T> Clone for Plain<T> {
    fn clone(&self) -> Self {
        Plain::new()
    }
}

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for Plain<T> {
    type Value = T;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        T::deserialize(d)
    }
}

/// A value that may be absent (`null`, `~` or left out).
#[derive(Clone)]
pub struct Optional<S>(pub S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Optional<S> {
    type Value = Option<S::Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for Optional<S> {
    type Value = Option<S::Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value or nothing")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(d).map(Some)
    }
}

/// A list of at most `max` elements, each read with `element`.
#[derive(Clone)]
pub struct List<S> {
    pub element: S,
    pub max: usize,
    /// What the elements are, plural, for the message: "routes", "methods".
    pub what: &'static str,
}

impl<'de, S: DeserializeSeed<'de> + Clone> DeserializeSeed<'de> for List<S> {
    type Value = Vec<S::Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, S: DeserializeSeed<'de> + Clone> Visitor<'de> for List<S> {
    type Value = Vec<S::Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a list of at most {} {}", self.max, self.what)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        loop {
            if out.len() == self.max {
                // Skipped, not expanded: an alias here costs nothing.
                return match seq.next_element::<IgnoredAny>()? {
                    None => Ok(out),
                    Some(_) => Err(de::Error::custom(too_many(self.max, self.what))),
                };
            }
            match seq.next_element_seed(self.element.clone())? {
                Some(element) => out.push(element),
                None => return Ok(out),
            }
        }
    }
}

/// A map of at most `max` entries, in the order written (a repeated key counts each time).
#[derive(Clone)]
pub struct Entries<K, V> {
    pub key: K,
    pub value: V,
    pub max: usize,
    pub what: &'static str,
}

impl<'de, K, V> DeserializeSeed<'de> for Entries<K, V>
where
    K: DeserializeSeed<'de> + Clone,
    V: DeserializeSeed<'de> + Clone,
{
    type Value = Vec<(K::Value, V::Value)>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, K, V> Visitor<'de> for Entries<K, V>
where
    K: DeserializeSeed<'de> + Clone,
    V: DeserializeSeed<'de> + Clone,
{
    type Value = Vec<(K::Value, V::Value)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a map of at most {} {}", self.max, self.what)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        loop {
            if out.len() == self.max {
                return match map.next_key::<IgnoredAny>()? {
                    None => Ok(out),
                    Some(_) => Err(de::Error::custom(too_many(self.max, self.what))),
                };
            }
            match map.next_key_seed(self.key.clone())? {
                Some(key) => {
                    let value = map.next_value_seed(self.value.clone())?;
                    out.push((key, value));
                }
                None => return Ok(out),
            }
        }
    }
}

fn too_many(max: usize, what: &str) -> String {
    format!("more than {max} {what}; at most {max} are allowed")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(text: &str, max: usize) -> Result<Vec<String>, String> {
        let d = serde_yaml::Deserializer::from_str(text);
        List {
            element: Text,
            max,
            what: "names",
        }
        .deserialize(d)
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_list_fails_at_its_first_element_past_the_limit() {
        assert_eq!(list("[a, b]", 2).unwrap(), ["a", "b"]);
        let e = list("[a, b, c]", 2).unwrap_err();
        assert!(e.contains("more than 2 names"), "{e}");
        // The element past the limit is an alias to a huge list: skipped, not expanded.
        let e = list("[&x [[a]], b, *x]", 2).unwrap_err();
        assert!(
            e.contains("invalid type: sequence, expected a string"),
            "{e}"
        );
        let e = list(&format!("[{}]", "a".repeat(MAX_STRING_BYTES + 1)), 2).unwrap_err();
        assert!(e.contains("a string of 1025 bytes"), "{e}");
    }

    #[test]
    fn a_map_counts_repeated_keys() {
        let d = serde_yaml::Deserializer::from_str("{a: &v x, a: *v}");
        let e = Entries {
            key: Text,
            value: Text,
            max: 1,
            what: "headers",
        }
        .deserialize(d)
        .unwrap_err()
        .to_string();
        assert!(e.contains("more than 1 headers"), "{e}");
    }
}
