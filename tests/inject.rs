//! `tokenmeter inject` as a user runs it: the binary on stdin and stdout, against the example
//! manifests in k8s/examples, and held to the hand-written manifests in k8s/ so the two cannot
//! drift apart. (kubernetes-validate --strict runs on the examples in tests/k8s.rs.)

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_yaml::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn inject(input: &str, args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .arg("inject")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn injected(input: &str, args: &[&str]) -> String {
    let out = inject(input, args);
    assert!(
        out.status.success(),
        "inject {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("no {kind}"))
}

fn container<'a>(deployment: &'a Value, list: &str, name: &str) -> &'a Value {
    deployment["spec"]["template"]["spec"][list]
        .as_sequence()
        .unwrap_or_else(|| panic!("no {list}"))
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

/// Removes the environment variable `name` from a container and returns its entry.
fn take_env(container: &mut Value, name: &str) -> Value {
    let env = container["env"]
        .as_sequence_mut()
        .expect("the sidecar has an env list");
    let at = env
        .iter()
        .position(|v| v["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {name} in {env:?}"));
    env.remove(at)
}

/// What an env entry that reads a pod label (`fieldPath: metadata.labels['KEY']`) gives in
/// this Deployment's pods: the pod template's label.
fn deployment_from_label<'a>(deployment: &'a Value, entry: &Value) -> Option<&'a str> {
    let path = entry["valueFrom"]["fieldRef"]["fieldPath"]
        .as_str()
        .unwrap_or_else(|| panic!("not a fieldRef: {entry:?}"));
    let label = path
        .strip_prefix("metadata.labels['")
        .and_then(|rest| rest.strip_suffix("']"))
        .unwrap_or_else(|| panic!("not a label: {path}"));
    deployment["spec"]["template"]["metadata"]["labels"][label].as_str()
}

/// The records of an injected pod name it: pod and namespace from the downward API, the
/// injected Deployment by name, in both forms.
#[test]
fn the_injected_sidecar_names_its_pod_namespace_and_deployment() {
    let plain = read("k8s/examples/vllm.yaml");
    for (args, list) in [
        (&[][..], "initContainers"),
        (&["--classic"][..], "containers"),
    ] {
        let out = documents(&injected(&plain, args));
        let mut sidecar = container(find(&out, "Deployment"), list, "tokenmeter").clone();
        for (name, field) in [
            ("TOKENMETER_POD", "metadata.name"),
            ("TOKENMETER_NAMESPACE", "metadata.namespace"),
        ] {
            let entry = take_env(&mut sidecar, name);
            assert_eq!(
                entry["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
                Some(field),
                "{args:?} {name}"
            );
        }
        let entry = take_env(&mut sidecar, "TOKENMETER_DEPLOYMENT");
        assert_eq!(entry["value"].as_str(), Some("vllm"), "{args:?}");
        assert_eq!(sidecar["env"].as_sequence().map(Vec::len), Some(0));
    }
}

#[test]
fn the_vllm_example_injects_to_the_expected_manifests() {
    let plain = read("k8s/examples/vllm.yaml");
    for (args, expected) in [
        (&[][..], "k8s/examples/vllm.injected.yaml"),
        (
            &["--classic"][..],
            "k8s/examples/vllm.injected-classic.yaml",
        ),
    ] {
        let out = injected(&plain, args);
        assert_eq!(
            out,
            read(expected),
            "tokenmeter inject {args:?} < k8s/examples/vllm.yaml differs from {expected}; \
             regenerate it if the change is intended"
        );
    }
}

#[test]
fn injecting_twice_changes_nothing() {
    for (args, path) in [
        (&[][..], "k8s/examples/vllm.injected.yaml"),
        (
            &["--classic"][..],
            "k8s/examples/vllm.injected-classic.yaml",
        ),
        // The other form on an injected pod keeps the sidecar it has rather than adding one.
        (&["--classic"][..], "k8s/examples/vllm.injected.yaml"),
        (&[][..], "k8s/deployment.yaml"),
        (&[][..], "k8s/deployment-classic.yaml"),
    ] {
        let text = read(path);
        assert_eq!(
            injected(&text, args),
            text,
            "inject {args:?} changed {path}"
        );
    }
}

#[test]
fn the_injected_sidecar_is_the_one_in_the_k8s_manifests() {
    let plain = read("k8s/examples/vllm.yaml");
    for (args, manifest, list) in [
        (&[][..], "k8s/deployment.yaml", "initContainers"),
        (
            &["--classic"][..],
            "k8s/deployment-classic.yaml",
            "containers",
        ),
    ] {
        let out = documents(&injected(&plain, args));
        let docs = documents(&read(manifest));
        let mut ours = container(find(&out, "Deployment"), list, "tokenmeter").clone();
        let mut theirs = container(find(&docs, "Deployment"), list, "tokenmeter").clone();
        // The manifests pin no version of their own; the example's image is the crate's.
        ours["image"] = theirs["image"].clone();
        // The one difference allowed: the deployment the records name. The manifests read it
        // from the pod's label, inject writes the injected workload's name; each must give
        // its own Deployment's name.
        let ours_deployment = take_env(&mut ours, "TOKENMETER_DEPLOYMENT");
        let theirs_deployment = take_env(&mut theirs, "TOKENMETER_DEPLOYMENT");
        assert_eq!(
            ours_deployment["value"].as_str(),
            find(&out, "Deployment")["metadata"]["name"].as_str(),
            "inject names the Deployment it injected"
        );
        assert_eq!(
            deployment_from_label(find(&docs, "Deployment"), &theirs_deployment),
            find(&docs, "Deployment")["metadata"]["name"].as_str(),
            "{manifest}: the label TOKENMETER_DEPLOYMENT reads must name the Deployment"
        );
        assert_eq!(
            &ours, &theirs,
            "{manifest} and `tokenmeter inject {args:?}` disagree"
        );
        let volume = |d: &Value| {
            d["spec"]["template"]["spec"]["volumes"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|v| v["name"].as_str() == Some("tokenmeter-config"))
                .cloned()
                .unwrap()
        };
        assert_eq!(
            volume(find(&out, "Deployment")),
            volume(find(&docs, "Deployment"))
        );
    }
}

#[test]
fn the_service_now_targets_tokenmeter_and_the_rest_passes_through() {
    let plain = read("k8s/examples/vllm.yaml");
    let out = injected(&plain, &[]);
    let service = find(&documents(&out), "Service").clone();
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"].as_str(),
        Some("tm-http")
    );
    assert_eq!(service["spec"]["ports"][0]["port"].as_u64(), Some(80));
    // The ServiceAccount needed no change: its text, comments and all, is the input's.
    let tail = &plain[plain.rfind("---\n").unwrap()..];
    assert!(out.ends_with(tail), "the ServiceAccount was rewritten");
    // The sidecar sends to the model container's port.
    let deployment = find(&documents(&out), "Deployment").clone();
    let args = container(&deployment, "initContainers", "tokenmeter")["args"].clone();
    assert_eq!(
        args[args.as_sequence().unwrap().len() - 1].as_str(),
        Some("http://127.0.0.1:8000")
    );
}

#[test]
fn flags_set_the_image_configmap_and_ports() {
    let plain =
        read("k8s/examples/vllm.yaml").replace("containerPort: 8000", "containerPort: 8080");
    let out = injected(
        &plain,
        &[
            "--image",
            "registry.example/tm:1.2",
            "--configmap",
            "tm-conf",
            "--proxy-port",
            "9000",
            "--admin-port",
            "9001",
        ],
    );
    let docs = documents(&out);
    let d = find(&docs, "Deployment");
    let c = container(d, "initContainers", "tokenmeter");
    assert_eq!(c["image"].as_str(), Some("registry.example/tm:1.2"));
    assert_eq!(c["ports"][0]["containerPort"].as_u64(), Some(9000));
    assert_eq!(c["ports"][1]["containerPort"].as_u64(), Some(9001));
    let args: Vec<&str> = c["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.contains(&"0.0.0.0:9000") && args.contains(&"http://127.0.0.1:8080"),
        "{args:?}"
    );
    let volumes = d["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .unwrap();
    assert_eq!(volumes[0]["configMap"]["name"].as_str(), Some("tm-conf"));
}

#[test]
fn bad_input_exits_2_with_one_line() {
    for (input, args, expected) in [
        ("{not yaml", &[][..], "not YAML"),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {template: {spec: {containers: []}}}\n",
            &[][..],
            "containers is missing or empty",
        ),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {template: {spec: {containers: [{name: s, image: s}]}}}\n",
            &[][..],
            "(give --upstream-port)",
        ),
        (&read("k8s/examples/vllm.yaml"), &["--proxy-port", "8000"][..], "--proxy-port"),
    ] {
        let out = inject(input, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{input:?}: {err}");
        assert!(out.stdout.is_empty(), "{input:?}: wrote output despite the error");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("tokenmeter inject: ") && err.contains(expected), "{err}");
    }
}
