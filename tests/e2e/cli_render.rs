//! `labforge render` and `labforge crds` through the real binary.

use crate::labforge;
use serde::Deserialize;
use serde_json::Value;

fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

#[test]
fn render_prints_the_objects_a_notebook_yields() {
    let sample = labforge_tests::repo_root().join("crds/samples/codeserver.yaml");
    let out = labforge()
        .args(["render", "--istio-gateway", "istio-system/lab", "-f"])
        .arg(&sample)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = yaml_documents(&String::from_utf8_lossy(&out.stdout));
    let kinds: Vec<_> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["StatefulSet", "Service", "VirtualService", "NetworkPolicy"]
    );
    let policy = &docs[3]["spec"];
    assert_eq!(
        policy["podSelector"]["matchLabels"]["statefulset"],
        "vscode"
    );
    assert_eq!(
        policy["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "kubeflow"
    );
    assert_eq!(docs[0]["metadata"]["namespace"], "bob");
    let route = &docs[2]["spec"]["http"][0];
    assert_eq!(
        route["rewrite"]["uri"], "/",
        "code-server's rewrite annotation"
    );
    assert_eq!(route["match"][0]["uri"]["prefix"], "/notebook/bob/vscode/");
    assert_eq!(docs[2]["spec"]["gateways"][0], "istio-system/lab");
}

#[test]
fn render_names_what_is_wrong_with_its_input() {
    let missing = labforge()
        .args(["render", "-f", "/nonexistent/nb.yaml"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/nb.yaml"));

    let dir = tempfile::tempdir().unwrap();
    let pod = dir.path().join("pod.yaml");
    std::fs::write(&pod, "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n").unwrap();
    let wrong_kind = labforge()
        .args(["render", "-f"])
        .arg(&pod)
        .output()
        .unwrap();
    assert!(!wrong_kind.status.success());
    assert!(String::from_utf8_lossy(&wrong_kind.stderr).contains("not a kubeflow.org Notebook"));
}

#[test]
fn crds_prints_the_committed_crd_files() {
    let out = labforge().arg("crds").output().unwrap();
    assert!(out.status.success());
    let root = labforge_tests::repo_root();
    let expected = [
        "crds/notebooks.kubeflow.org.yaml",
        "crds/imagebuilds.labforge.dev.yaml",
    ]
    .map(|p| std::fs::read_to_string(root.join(p)).unwrap())
    .concat();
    assert!(
        String::from_utf8_lossy(&out.stdout) == expected,
        "labforge crds differs from crds/*.yaml"
    );
}
