//! Who writes the records: the pod, its namespace and its deployment, so that the records of a
//! whole fleet, merged, still say where each request was served.
//!
//! Each name comes from its environment variable when that is set and not empty (in Kubernetes,
//! the downward API sets them: `k8s/deployment.yaml`, `tokenmeter inject`), else from the file's
//! `identity:` section, else it is unknown (`null` in the record). The environment wins because
//! it is the more specific source: a ConfigMap is shared by every replica, often by several
//! deployments, while the downward API speaks for this one pod. An empty variable counts as
//! unset, because the downward API gives an empty value for a label the pod does not carry.
//!
//! No fallback to `HOSTNAME`: it is the pod's name only in an ordinary pod (with `hostNetwork`
//! it is the node's), and a process started by systemd has none, so the record would say
//! something different depending on how the process was started. `TOKENMETER_POD=$(hostname)`
//! says it on purpose.
//!
//! The names are resolved once, when the record's writer starts (at start and at a reload that
//! changes the record or the identity), never per request.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use super::{bounded, excerpt};

/// The longest name: a Kubernetes object name (a DNS subdomain) is at most this long.
pub const MAX_NAME_BYTES: usize = 253;

/// The pod, namespace and deployment a record names; `None` is unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Identity {
    #[serde(deserialize_with = "name")]
    pub pod: Option<String>,
    #[serde(deserialize_with = "name")]
    pub namespace: Option<String>,
    #[serde(deserialize_with = "name")]
    pub deployment: Option<String>,
}

impl Identity {
    /// The environment variables the names come from.
    pub const ENV_POD: &'static str = "TOKENMETER_POD";
    pub const ENV_NAMESPACE: &'static str = "TOKENMETER_NAMESPACE";
    pub const ENV_DEPLOYMENT: &'static str = "TOKENMETER_DEPLOYMENT";

    /// What this process records: each name from `env` when set and not empty, else from
    /// `self` (the file's section). A name from the environment must be a name, as the file's
    /// must; the error names the variable.
    pub fn resolve(&self, env: impl Fn(&str) -> Option<String>) -> Result<Identity, String> {
        let pick = |var: &str, file: &Option<String>| -> Result<Option<String>, String> {
            match env(var).filter(|v| !v.is_empty()) {
                Some(value) => check_name(&value)
                    .map(|()| Some(value))
                    .map_err(|e| format!("{var}: {e}")),
                None => Ok(file.clone()),
            }
        };
        Ok(Identity {
            pod: pick(Self::ENV_POD, &self.pod)?,
            namespace: pick(Self::ENV_NAMESPACE, &self.namespace)?,
            deployment: pick(Self::ENV_DEPLOYMENT, &self.deployment)?,
        })
    }

    /// [`Identity::resolve`] against this process's environment.
    pub fn from_environment(&self) -> Result<Identity, String> {
        self.resolve(|var| std::env::var(var).ok())
    }
}

/// A name as Kubernetes writes pod, namespace and label values: letters, digits, `-`, `_` and
/// `.`, at most [`MAX_NAME_BYTES`]. Anything else is refused rather than written into every
/// record of a fleet, where `report` would group by it.
pub fn check_name(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("empty: leave it out when it is not known".into());
    }
    if value.len() > MAX_NAME_BYTES
        || !value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(format!(
            "`{}` must be at most {MAX_NAME_BYTES} letters, digits, `-`, `_` and `.`, as Kubernetes names are",
            excerpt(value)
        ));
    }
    Ok(())
}

struct NameVisitor;

// Checked inside the visitor so that serde_yaml names the field and its line.
impl Visitor<'_> for NameVisitor {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a name, like llm-7d9f8c6b5-x2x4q")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        let v = bounded::check_length(v)?;
        check_name(v).map_err(E::custom)?;
        Ok(Some(v.to_owned()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

fn name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    d.deserialize_any(NameVisitor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    fn named(pod: Option<&str>, namespace: Option<&str>, deployment: Option<&str>) -> Identity {
        Identity {
            pod: pod.map(String::from),
            namespace: namespace.map(String::from),
            deployment: deployment.map(String::from),
        }
    }

    #[test]
    fn the_file_section_parses_and_is_optional() {
        let c = Config::parse("identity:\n  pod: host-a\n  deployment: chat\n", "t.yaml").unwrap();
        assert_eq!(c.identity, named(Some("host-a"), None, Some("chat")));
        assert_eq!(
            Config::parse("# nothing\n", "t.yaml").unwrap().identity,
            Identity::default()
        );
        let c = Config::parse("identity: {namespace: ~}\n", "t.yaml").unwrap();
        assert_eq!(c.identity, Identity::default());
    }

    #[test]
    fn a_bad_name_in_the_file_names_the_field_and_line() {
        for (text, field, problem) in [
            ("identity:\n  pod: a b\n", "identity.pod", "`a b` must be"),
            (
                "identity:\n  namespace: \"\"\n",
                "identity.namespace",
                "empty",
            ),
            (
                "identity:\n  deployment: [x]\n",
                "identity.deployment",
                "a name",
            ),
            (
                "identity:\n  node: n1\n",
                "identity",
                "unknown field `node`",
            ),
        ] {
            let e = Config::parse(text, "t.yaml").unwrap_err().to_string();
            assert!(
                e.contains("t.yaml")
                    && e.contains(field)
                    && e.contains(problem)
                    && e.contains("line 2"),
                "{text:?} gave {e}"
            );
        }
        let long = format!("identity:\n  pod: {}\n", "a".repeat(MAX_NAME_BYTES + 1));
        let e = Config::parse(&long, "t.yaml").unwrap_err().to_string();
        assert!(
            e.contains("identity.pod") && e.contains("at most 253"),
            "{e}"
        );
    }

    /// The environment wins over the file, name by name; an empty variable is unset.
    #[test]
    fn the_environment_wins_and_the_file_fills_what_it_leaves_unset() {
        let file = named(Some("file-pod"), Some("file-ns"), Some("file-deploy"));
        let vars = [
            (Identity::ENV_POD, "llm-7d9f8c6b5-x2x4q"),
            (Identity::ENV_NAMESPACE, ""),
            ("HOSTNAME", "node-1"),
        ];
        assert_eq!(
            file.resolve(env(&vars)).unwrap(),
            named(
                Some("llm-7d9f8c6b5-x2x4q"),
                Some("file-ns"),
                Some("file-deploy")
            )
        );
        // Nothing anywhere: unknown, and HOSTNAME is not taken for the pod.
        assert_eq!(
            Identity::default().resolve(env(&vars[2..])).unwrap(),
            Identity::default()
        );
        let all = [
            (Identity::ENV_POD, "p"),
            (Identity::ENV_NAMESPACE, "n"),
            (Identity::ENV_DEPLOYMENT, "d"),
        ];
        assert_eq!(
            file.resolve(env(&all)).unwrap(),
            named(Some("p"), Some("n"), Some("d"))
        );
    }

    #[test]
    fn a_bad_name_in_the_environment_names_the_variable() {
        let e = Identity::default()
            .resolve(env(&[(Identity::ENV_DEPLOYMENT, "chat model")]))
            .unwrap_err();
        assert!(
            e.starts_with("TOKENMETER_DEPLOYMENT: `chat model` must be"),
            "{e}"
        );
    }
}
