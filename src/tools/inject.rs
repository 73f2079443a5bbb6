//! `tokenmeter inject`: adds the tokenmeter sidecar to Kubernetes manifests, like
//! `linkerd inject --manual`.
//!
//! Reads one or many YAML documents and writes them back with each Deployment and StatefulSet
//! given the sidecar (a native sidecar by default, a second container with `--classic`), the
//! ConfigMap volume it reads its configuration from (a directory mount, so hot reload sees the
//! ConfigMap's updates), its probes and its restricted security context, all as in `k8s/`; the
//! upstream is the model container's first `containerPort`. The sidecar's environment names who
//! writes its records: the pod and its namespace from the downward API, and the workload's own
//! name as the deployment (the downward API has no field for it). Each Service that selects those pods
//! and sends to the model server's port is moved to tokenmeter's port, so all traffic is
//! measured. A document that needs no change is written back byte for byte, comments included,
//! which makes injecting twice a no-op.

use std::fmt;
use std::io::Read;
use std::process::ExitCode;

use clap::Args;
use serde_yaml::{Mapping, Value};

use crate::Identity;

/// The sidecar's container name; its presence marks a pod template as injected.
pub const CONTAINER: &str = "tokenmeter";
/// Port names in the pod; distinct from names a model server's container is likely to use.
pub const PROXY_PORT_NAME: &str = "tm-http";
pub const ADMIN_PORT_NAME: &str = "tm-admin";
const VOLUME: &str = "tokenmeter-config";
const CONFIG_DIR: &str = "/etc/tokenmeter";

/// Flags of `tokenmeter inject`.
#[derive(Args, Clone, Debug)]
pub struct InjectArgs {
    /// The tokenmeter image.
    #[arg(long, default_value = concat!("tokenmeter:", env!("CARGO_PKG_VERSION")))]
    pub image: String,
    /// The ConfigMap holding tokenmeter.yaml, mounted at /etc/tokenmeter.
    #[arg(long, value_name = "NAME", default_value = "tokenmeter")]
    pub configmap: String,
    /// The port clients (and the Service) connect to.
    #[arg(long, value_name = "PORT", default_value_t = 8080)]
    pub proxy_port: u16,
    /// The admin port: /metrics, /healthz, /readyz.
    #[arg(long, value_name = "PORT", default_value_t = 9464)]
    pub admin_port: u16,
    /// The model server's port [default: the first containerPort of the first container].
    #[arg(long, value_name = "PORT")]
    pub upstream_port: Option<u16>,
    /// A second container instead of a native sidecar, for clusters before Kubernetes 1.29.
    #[arg(long)]
    pub classic: bool,
}

impl Default for InjectArgs {
    fn default() -> Self {
        InjectArgs {
            image: concat!("tokenmeter:", env!("CARGO_PKG_VERSION")).into(),
            configmap: "tokenmeter".into(),
            proxy_port: 8080,
            admin_port: 9464,
            upstream_port: None,
            classic: false,
        }
    }
}

/// Why the input cannot be injected; one line, naming the document and the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectError(pub String);

impl fmt::Display for InjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InjectError {}

/// Reads manifests on stdin, writes them injected to stdout; exit 2 with one line on bad input.
pub fn main(args: InjectArgs) -> ExitCode {
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("tokenmeter inject: cannot read stdin: {e}");
        return ExitCode::from(2);
    }
    match inject(&input, &args) {
        Ok(output) => {
            print!("{output}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tokenmeter inject: {e}");
            ExitCode::from(2)
        }
    }
}

/// One YAML document as it came in: the separator line before it (if any) and its text.
struct Document<'a> {
    separator: &'a str,
    text: &'a str,
    value: Value,
    changed: bool,
}

/// What a Service must select to reach an injected pod, and the port it must stop targeting.
struct Workload {
    namespace: Option<String>,
    labels: Mapping,
    model_port: u16,
    model_port_name: Option<String>,
}

/// Injects every Deployment and StatefulSet in `input` and retargets the Services selecting them.
pub fn inject(input: &str, args: &InjectArgs) -> Result<String, InjectError> {
    if args.proxy_port == args.admin_port {
        return Err(InjectError(format!(
            "--proxy-port and --admin-port are both {}",
            args.proxy_port
        )));
    }
    let mut docs = split_documents(input)?;
    let mut workloads = Vec::new();
    for (i, doc) in docs.iter_mut().enumerate() {
        for (what, object) in objects(i, &mut doc.value) {
            let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
            if matches!(kind, "Deployment" | "StatefulSet") {
                let (workload, changed) = inject_workload(object, args)
                    .map_err(|e| InjectError(format!("{what}: {e}")))?;
                doc.changed |= changed;
                workloads.push(workload);
            }
        }
    }
    for (i, doc) in docs.iter_mut().enumerate() {
        for (_, object) in objects(i, &mut doc.value) {
            if object.get("kind").and_then(Value::as_str) == Some("Service") {
                doc.changed |= retarget_service(object, &workloads);
            }
        }
    }
    let mut out = String::with_capacity(input.len() + 2048);
    for (i, doc) in docs.iter().enumerate() {
        out.push_str(doc.separator);
        if !doc.changed {
            out.push_str(doc.text);
            continue;
        }
        // Comments above the document survive; those inside a changed one cannot.
        for line in doc.text.lines() {
            let trimmed = line.trim_start();
            if !trimmed.is_empty() && !trimmed.starts_with('#') {
                break;
            }
            out.push_str(line);
            out.push('\n');
        }
        let text = serde_yaml::to_string(&doc.value)
            .map_err(|e| InjectError(format!("{}: cannot write: {e}", describe(i, &doc.value))))?;
        out.push_str(&text);
    }
    Ok(out)
}

/// Splits at `---` lines, keeping every byte so unchanged documents are written back as read.
fn split_documents(input: &str) -> Result<Vec<Document<'_>>, InjectError> {
    let mut pieces = Vec::new();
    let (mut separator, mut start, mut pos) = ("", 0, 0);
    for line in input.split_inclusive('\n') {
        let bare = line.trim_end();
        if bare == "---" || bare.starts_with("--- ") {
            pieces.push((separator, &input[start..pos]));
            separator = &input[pos..pos + line.len()];
            start = pos + line.len();
        }
        pos += line.len();
    }
    pieces.push((separator, &input[start..]));
    let mut docs = Vec::with_capacity(pieces.len());
    for (i, (separator, text)) in pieces.into_iter().enumerate() {
        // A document opening on the separator line (`--- {a: 1}`) is rare; it is refused
        // rather than silently left out.
        let inline = separator
            .trim_end()
            .strip_prefix("---")
            .unwrap_or("")
            .trim();
        if !inline.is_empty() && !inline.starts_with('#') {
            return Err(InjectError(format!(
                "document {}: content on the `---` line is not supported; start it on the next line",
                i + 1
            )));
        }
        let value: Value = serde_yaml::from_str(text).map_err(|e| {
            let e = e
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            InjectError(format!("document {}: not YAML: {e}", i + 1))
        })?;
        if !matches!(value, Value::Null | Value::Mapping(_)) {
            return Err(InjectError(format!(
                "document {}: not a Kubernetes object (a YAML mapping)",
                i + 1
            )));
        }
        docs.push(Document {
            separator,
            text,
            value,
            changed: false,
        });
    }
    Ok(docs)
}

/// The objects in a document: itself, or the items of a `kind: List` (what `kubectl get -o yaml`
/// prints for several objects), each with how an error names it.
fn objects(index: usize, value: &mut Value) -> Vec<(String, &mut Value)> {
    let is_list = value.get("kind").and_then(Value::as_str) == Some("List")
        && value.get("items").is_some_and(Value::is_sequence);
    if !is_list {
        return vec![(describe(index, value), value)];
    }
    let items = value.get_mut("items").and_then(Value::as_sequence_mut);
    items
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(j, item)| {
            let what = describe(index, item).replacen(" (", &format!(" item {} (", j + 1), 1);
            (what, item)
        })
        .collect()
}

fn describe(index: usize, value: &Value) -> String {
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("?");
    let name = value
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("?");
    format!("document {} ({kind}/{name})", index + 1)
}

fn key(name: &str) -> Value {
    Value::String(name.into())
}

/// The mapping under `name`, created empty when absent; an error when it is something else.
fn mapping_at<'a>(map: &'a mut Mapping, name: &str, path: &str) -> Result<&'a mut Mapping, String> {
    map.entry(key(name))
        .or_insert_with(|| Value::Mapping(Mapping::new()))
        .as_mapping_mut()
        .ok_or_else(|| format!("{path}{name} is not a mapping"))
}

fn sequence_at<'a>(
    map: &'a mut Mapping,
    name: &str,
    path: &str,
) -> Result<&'a mut Vec<Value>, String> {
    let value = map
        .entry(key(name))
        .or_insert_with(|| Value::Sequence(Vec::new()));
    if value.is_null() {
        *value = Value::Sequence(Vec::new());
    }
    value
        .as_sequence_mut()
        .ok_or_else(|| format!("{path}{name} is not a list"))
}

fn name_of(value: &Value) -> Option<&str> {
    value.get("name").and_then(Value::as_str)
}

fn port_number(value: &Value) -> Option<u16> {
    value
        .get("containerPort")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
}

/// Adds the sidecar to one workload (unless it has it) and says what its Services must select.
fn inject_workload(value: &mut Value, args: &InjectArgs) -> Result<(Workload, bool), String> {
    let root = value.as_mapping_mut().ok_or("not a mapping")?;
    let namespace = root
        .get("metadata")
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .map(String::from);
    let name = root
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .map(String::from);
    let spec = mapping_at(root, "spec", "")?;
    let template = mapping_at(spec, "template", "spec.")?;
    let labels = template
        .get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_mapping)
        .cloned()
        .unwrap_or_default();
    let pod = mapping_at(template, "spec", "spec.template.")?;
    let path = "spec.template.spec.";

    let containers = pod
        .get("containers")
        .and_then(Value::as_sequence)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            format!("{path}containers is missing or empty: no model server to measure")
        })?;
    let init = pod.get("initContainers").and_then(Value::as_sequence);
    let all = || containers.iter().chain(init.into_iter().flatten());
    let injected = all().any(|c| name_of(c) == Some(CONTAINER));

    // The model server: the first container (other than tokenmeter) that declares a port.
    let model = containers
        .iter()
        .filter(|c| name_of(c) != Some(CONTAINER))
        .flat_map(|c| {
            c.get("ports")
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
                .filter_map(move |p| port_number(p).map(|n| (c, p, n)))
        })
        .next();
    let (model_port, model_port_name) = match (args.upstream_port, model) {
        (Some(port), found) => {
            let name = found
                .filter(|(_, _, n)| *n == port)
                .and_then(|(_, p, _)| name_of(p).map(String::from));
            (port, name)
        }
        (None, Some((_, p, n))) => (n, name_of(p).map(String::from)),
        (None, None) => {
            return Err(
                "cannot tell the model server's port: no container declares a containerPort \
                 (give --upstream-port)"
                    .into(),
            )
        }
    };
    let workload = Workload {
        namespace,
        labels,
        model_port,
        model_port_name,
    };
    if injected {
        return Ok((workload, false));
    }

    for c in all() {
        for p in c
            .get("ports")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            let taken = port_number(p);
            if taken == Some(args.proxy_port) || taken == Some(args.admin_port) {
                let flag = if taken == Some(args.proxy_port) {
                    "--proxy-port"
                } else {
                    "--admin-port"
                };
                return Err(format!(
                    "container {} already uses port {}; choose another with {flag}",
                    name_of(c).unwrap_or("?"),
                    taken.unwrap_or(0)
                ));
            }
        }
    }
    if model_port == args.proxy_port || model_port == args.admin_port {
        return Err(format!(
            "the model server's port {model_port} is also tokenmeter's; choose another with --proxy-port or --admin-port"
        ));
    }

    let container = sidecar(args, model_port, name.as_deref());
    let list = if args.classic {
        "containers"
    } else {
        "initContainers"
    };
    sequence_at(pod, list, path)?.push(container);
    let volumes = sequence_at(pod, "volumes", path)?;
    if !volumes.iter().any(|v| name_of(v) == Some(VOLUME)) {
        volumes.push(volume(&args.configmap));
    }
    Ok((workload, true))
}

/// The sidecar container, as in k8s/deployment.yaml (tests/inject.rs holds the two together),
/// but for the deployment its records name: the manifests read it from the pod's `app` label,
/// inject writes the name of the workload it injects (`workload`), which it knows.
fn sidecar(args: &InjectArgs, model_port: u16, workload: Option<&str>) -> Value {
    let native = if args.classic {
        ""
    } else {
        "restartPolicy: Always\n"
    };
    let deployment = match workload {
        Some(name) => format!(
            "  - name: {}\n    value: {}\n",
            Identity::ENV_DEPLOYMENT,
            serde_json::to_string(name).unwrap_or_default()
        ),
        None => String::new(),
    };
    let yaml = format!(
        r#"name: {CONTAINER}
image: {image}
imagePullPolicy: IfNotPresent
{native}args:
  - --config
  - {CONFIG_DIR}/tokenmeter.yaml
  - --listen
  - 0.0.0.0:{proxy}
  - --admin
  - 0.0.0.0:{admin}
  - --upstream
  - http://127.0.0.1:{model_port}
env:
  - name: {pod_env}
    valueFrom:
      fieldRef: {{fieldPath: metadata.name}}
  - name: {namespace_env}
    valueFrom:
      fieldRef: {{fieldPath: metadata.namespace}}
{deployment}ports:
  - {{name: {PROXY_PORT_NAME}, containerPort: {proxy}}}
  - {{name: {ADMIN_PORT_NAME}, containerPort: {admin}}}
startupProbe:
  httpGet: {{path: /healthz, port: {ADMIN_PORT_NAME}}}
  periodSeconds: 1
  failureThreshold: 30
readinessProbe:
  httpGet: {{path: /readyz, port: {ADMIN_PORT_NAME}}}
  periodSeconds: 5
livenessProbe:
  httpGet: {{path: /healthz, port: {ADMIN_PORT_NAME}}}
  periodSeconds: 10
  failureThreshold: 3
resources:
  requests: {{cpu: 50m, memory: 32Mi}}
  limits: {{memory: 128Mi}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  capabilities: {{drop: [ALL]}}
  seccompProfile: {{type: RuntimeDefault}}
volumeMounts:
  - {{name: {VOLUME}, mountPath: {CONFIG_DIR}, readOnly: true}}
"#,
        image = serde_json::to_string(&args.image).unwrap_or_default(),
        pod_env = Identity::ENV_POD,
        namespace_env = Identity::ENV_NAMESPACE,
        proxy = args.proxy_port,
        admin = args.admin_port,
    );
    serde_yaml::from_str(&yaml).unwrap_or(Value::Null)
}

fn volume(configmap: &str) -> Value {
    let mut config_map = Mapping::new();
    config_map.insert(key("name"), key(configmap));
    let mut volume = Mapping::new();
    volume.insert(key("name"), key(VOLUME));
    volume.insert(key("configMap"), Value::Mapping(config_map));
    Value::Mapping(volume)
}

/// Moves the ports of a Service that target an injected model server to tokenmeter's port.
fn retarget_service(value: &mut Value, workloads: &[Workload]) -> bool {
    let namespace = value
        .get("metadata")
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .map(String::from);
    let Some(spec) = value.get_mut("spec").and_then(Value::as_mapping_mut) else {
        return false;
    };
    let Some(selector) = spec.get("selector").and_then(Value::as_mapping).cloned() else {
        return false;
    };
    // A Service with no selector (endpoints managed by hand) selects nothing here.
    let Some(workload) = workloads.iter().find(|w| {
        w.namespace == namespace
            && !selector.is_empty()
            && selector.iter().all(|(k, v)| w.labels.get(k) == Some(v))
    }) else {
        return false;
    };
    let Some(ports) = spec.get_mut("ports").and_then(Value::as_sequence_mut) else {
        return false;
    };
    let mut changed = false;
    for port in ports.iter_mut().filter_map(Value::as_mapping_mut) {
        let target = port.get("targetPort").or_else(|| port.get("port"));
        let to_model = match target {
            Some(Value::Number(n)) => n.as_u64() == Some(u64::from(workload.model_port)),
            Some(Value::String(s)) => {
                Some(s.as_str()) == workload.model_port_name.as_deref()
                    || s.parse::<u16>().ok() == Some(workload.model_port)
            }
            _ => false,
        };
        if to_model {
            port.insert(key("targetPort"), key(PROXY_PORT_NAME));
            changed = true;
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata: {name: m}
spec:
  selector: {matchLabels: {app: m}}
  template:
    metadata: {labels: {app: m, tier: gpu}}
    spec:
      containers:
        - name: server
          image: server:1
          ports: [{name: api, containerPort: 8000}]
";

    fn pod(out: &str) -> Value {
        let v: Value = serde_yaml::from_str(out).unwrap();
        v["spec"]["template"]["spec"].clone()
    }

    #[test]
    fn the_upstream_is_the_model_containers_first_port() {
        let out = inject(PLAIN, &InjectArgs::default()).unwrap();
        let sidecar = &pod(&out)["initContainers"][0];
        assert_eq!(sidecar["name"], key(CONTAINER));
        assert_eq!(sidecar["restartPolicy"], key("Always"));
        let args: Vec<&str> = sidecar["args"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(
            args.ends_with(&["--upstream", "http://127.0.0.1:8000"]),
            "{args:?}"
        );
    }

    /// The sidecar's records name their pod and namespace (downward API) and the workload
    /// injected as their deployment.
    #[test]
    fn the_sidecar_names_its_pod_namespace_and_workload() {
        for (input, workload) in [
            (PLAIN.to_string(), "m"),
            (
                PLAIN
                    .replace("kind: Deployment", "kind: StatefulSet")
                    .replace("{name: m}", "{name: \"db-1\"}"),
                "db-1",
            ),
        ] {
            let out = inject(&input, &InjectArgs::default()).unwrap();
            let env = &pod(&out)["initContainers"][0]["env"];
            let var = |name: &str| {
                env.as_sequence()
                    .unwrap()
                    .iter()
                    .find(|v| v["name"] == key(name))
                    .unwrap_or_else(|| panic!("no {name} in {env:?}"))
                    .clone()
            };
            let field = |v: Value| v["valueFrom"]["fieldRef"]["fieldPath"].clone();
            assert_eq!(field(var("TOKENMETER_POD")), key("metadata.name"));
            assert_eq!(
                field(var("TOKENMETER_NAMESPACE")),
                key("metadata.namespace")
            );
            assert_eq!(var("TOKENMETER_DEPLOYMENT")["value"], key(workload));
        }
    }

    #[test]
    fn classic_adds_a_second_container_after_the_model_server() {
        let args = InjectArgs {
            classic: true,
            ..InjectArgs::default()
        };
        let p = pod(&inject(PLAIN, &args).unwrap());
        assert_eq!(p["containers"][0]["name"], key("server"));
        assert_eq!(p["containers"][1]["name"], key(CONTAINER));
        assert!(p["containers"][1].get("restartPolicy").is_none());
        assert!(p.get("initContainers").is_none());
    }

    #[test]
    fn only_services_selecting_the_pods_and_sending_to_the_model_port_move() {
        let input = format!(
            "{PLAIN}---\n\
             apiVersion: v1\nkind: Service\nmetadata: {{name: a}}\n\
             spec: {{selector: {{app: m}}, ports: [{{port: 80, targetPort: api}}, {{name: x, port: 9000}}]}}\n\
             ---\n\
             apiVersion: v1\nkind: Service\nmetadata: {{name: b}}\n\
             spec: {{selector: {{app: other}}, ports: [{{port: 80, targetPort: 8000}}]}}\n\
             ---\n\
             apiVersion: v1\nkind: Service\nmetadata: {{name: c, namespace: elsewhere}}\n\
             spec: {{selector: {{app: m}}, ports: [{{port: 8000}}]}}\n"
        );
        let out = inject(&input, &InjectArgs::default()).unwrap();
        let docs: Vec<Value> = out
            .split("\n---\n")
            .map(|d| serde_yaml::from_str(d).unwrap())
            .collect();
        assert_eq!(
            docs[1]["spec"]["ports"][0]["targetPort"],
            key(PROXY_PORT_NAME)
        );
        assert!(docs[1]["spec"]["ports"][1].get("targetPort").is_none());
        assert!(out.ends_with(
            &input[input
                .find("apiVersion: v1\nkind: Service\nmetadata: {name: b}")
                .unwrap()..]
        ));
    }

    #[test]
    fn the_items_of_a_list_are_injected_too() {
        // `kubectl get deploy,svc -o yaml` prints one List holding both.
        let deployment: Value = serde_yaml::from_str(PLAIN).unwrap();
        let service: Value = serde_yaml::from_str(
            "{apiVersion: v1, kind: Service, metadata: {name: m}, spec: {selector: {app: m}, ports: [{port: 80, targetPort: 8000}]}}",
        )
        .unwrap();
        let mut list = Mapping::new();
        list.insert(key("apiVersion"), key("v1"));
        list.insert(key("kind"), key("List"));
        list.insert(key("items"), Value::Sequence(vec![deployment, service]));
        let input = serde_yaml::to_string(&list).unwrap();
        let out: Value =
            serde_yaml::from_str(&inject(&input, &InjectArgs::default()).unwrap()).unwrap();
        let items = &out["items"];
        assert_eq!(
            items[0]["spec"]["template"]["spec"]["initContainers"][0]["name"],
            key(CONTAINER)
        );
        assert_eq!(
            items[1]["spec"]["ports"][0]["targetPort"],
            key(PROXY_PORT_NAME)
        );
        let bad = input.replace("containerPort: 8000", "hostPort: 8000");
        let e = inject(&bad, &InjectArgs::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("document 1 item 1 (Deployment/m): cannot tell"),
            "{e}"
        );
    }

    #[test]
    fn injecting_twice_changes_nothing() {
        let once = inject(PLAIN, &InjectArgs::default()).unwrap();
        assert_eq!(inject(&once, &InjectArgs::default()).unwrap(), once);
    }

    #[test]
    fn bad_input_is_one_line_naming_the_document() {
        let cases = [
            ("a: [1\n", "document 1: not YAML"),
            ("- 1\n", "document 1: not a Kubernetes object"),
            (
                "kind: Deployment\nmetadata: {name: d}\nspec: {template: {spec: {}}}\n",
                "document 1 (Deployment/d): spec.template.spec.containers is missing or empty",
            ),
            (
                "kind: Deployment\nmetadata: {name: d}\nspec: {template: {spec: {containers: [{name: s}]}}}\n",
                "no container declares a containerPort (give --upstream-port)",
            ),
        ];
        for (input, expected) in cases {
            let e = inject(
                &format!("kind: ConfigMap\n---\n{input}"),
                &InjectArgs::default(),
            )
            .unwrap_err()
            .to_string();
            let e = e.replace("document 2", "document 1");
            assert!(e.contains(expected), "{input:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn a_port_already_taken_in_the_pod_is_refused() {
        let input = PLAIN.replace("8000", "8080");
        let e = inject(&input, &InjectArgs::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("already uses port 8080; choose another with --proxy-port"),
            "{e}"
        );
    }
}
