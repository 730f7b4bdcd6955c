//! deploy/'s Deployments: hardened, probed and reachable through their Services, and every
//! flag and variable they pass accepted by the binary (bad ones refused with exit code 64).

use crate::deploy::{all_objects, find};
use crate::support::deploy::{build, deploy_dir, strings};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

pub(super) fn deployments() -> Vec<(String, Value)> {
    all_objects()
        .into_iter()
        .filter(|(_, o)| o["kind"] == "Deployment")
        .collect()
}

pub(super) fn deployment_container<'a>(objects: &'a [Value], name: &str) -> &'a Value {
    &find(objects, "Deployment", name).unwrap()["spec"]["template"]["spec"]["containers"][0]
}

pub(super) fn env_value(container: &Value, name: &str) -> Option<String> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
        .map(str::to_owned)
}

/// The value after `flag` in the container's args.
pub(super) fn flag_value(container: &Value, flag: &str) -> Option<String> {
    let args = strings(&container["args"]);
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).cloned()
}

#[test]
pub(super) fn deployments_are_hardened_probed_and_reachable_through_their_services() {
    let objects: Vec<Value> = all_objects().into_iter().map(|(_, o)| o).collect();
    let deployments = deployments();
    assert_eq!(
        deployments.len(),
        4,
        "controller, ImageBuild reconciler, proxy, web app"
    );
    for (file, deployment) in &deployments {
        let name = deployment["metadata"]["name"].as_str().unwrap();
        let at = format!("{file}: {name}");
        // Two replicas at least, or a singleton by design: one replica, replaced not rolled.
        let replicas = deployment["spec"]["replicas"].as_i64().unwrap();
        assert!(
            replicas >= 2
                || (replicas == 1 && deployment["spec"]["strategy"]["type"] == "Recreate"),
            "{at}: replicas"
        );
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{at}");
        assert!(
            pod["securityContext"]["runAsUser"].as_i64().unwrap() > 0,
            "{at}"
        );
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{at}"
        );
        assert!(
            pod.get("hostNetwork").is_none() && pod.get("hostPID").is_none(),
            "{at}"
        );
        let selector = &deployment["spec"]["selector"]["matchLabels"];
        for (key, value) in selector.as_object().unwrap() {
            assert_eq!(
                &deployment["spec"]["template"]["metadata"]["labels"][key], value,
                "{at}"
            );
        }
        let containers = pod["containers"].as_array().unwrap();
        for container in containers {
            let security = &container["securityContext"];
            assert_eq!(security["readOnlyRootFilesystem"], true, "{at}");
            assert_eq!(security["allowPrivilegeEscalation"], false, "{at}");
            assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"], "{at}");
            assert!(
                security.get("privileged").is_none_or(|p| p == false),
                "{at}"
            );
            let resources = &container["resources"];
            for key in ["cpu", "memory"] {
                assert!(
                    resources["requests"][key].is_string(),
                    "{at}: requests.{key}"
                );
            }
            assert!(
                resources["limits"]["memory"].is_string(),
                "{at}: limits.memory"
            );
            let ports: BTreeSet<String> = container["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["name"].as_str().unwrap().to_owned())
                .collect();
            for probe in ["livenessProbe", "readinessProbe"] {
                let get = &container[probe]["httpGet"];
                assert!(get["path"].is_string(), "{at}: {probe}");
                assert!(
                    ports.contains(get["port"].as_str().unwrap_or_default()),
                    "{at}: {probe} port {} is no named container port",
                    get["port"]
                );
            }
        }
        // Mounted volumes exist, and ConfigMaps they name are in deploy/.
        let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
        for container in containers {
            for mount in container["volumeMounts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                let volume = volumes
                    .iter()
                    .find(|v| v["name"] == mount["name"])
                    .unwrap_or_else(|| panic!("{at}: volume {}", mount["name"]));
                // Only scratch space (an emptyDir) is writable.
                if volume.get("emptyDir").is_none() {
                    assert_eq!(mount["readOnly"], true, "{at}: mounts are read-only");
                }
                if let Some(name) = volume["configMap"]["name"].as_str() {
                    assert!(
                        find(&objects, "ConfigMap", name).is_some(),
                        "{at}: ConfigMap {name}"
                    );
                }
            }
        }
    }

    // Each Service selects a Deployment in its namespace, on ports that Deployment names.
    for service in objects.iter().filter(|o| o["kind"] == "Service") {
        let name = &service["metadata"]["name"];
        let selector = service["spec"]["selector"].as_object().unwrap();
        let target = deployments
            .iter()
            .map(|(_, d)| d)
            .find(|d| {
                d["metadata"]["namespace"] == service["metadata"]["namespace"]
                    && selector
                        .iter()
                        .all(|(k, v)| &d["spec"]["template"]["metadata"]["labels"][k] == v)
            })
            .unwrap_or_else(|| panic!("Service {name} selects no Deployment"));
        let ports: Vec<&Value> = target["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| c["ports"].as_array().unwrap())
            .collect();
        for port in service["spec"]["ports"].as_array().unwrap() {
            assert!(
                ports.iter().any(|p| p["name"] == port["targetPort"]),
                "Service {name}: targetPort {}",
                port["targetPort"]
            );
        }
    }

    // What the issue asks of the proxy and the web app, precisely.
    let base = build(&deploy_dir());
    let proxy = deployment_container(&base, "labforge-proxy");
    let port = |container: &Value, name: &str| {
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["containerPort"]
            .as_i64()
            .unwrap()
    };
    assert_eq!(proxy["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(proxy["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(port(proxy, "http-admin"), 8081);
    assert_eq!(port(proxy, "http"), 8000);
    assert_eq!(flag_value(proxy, "--listen").unwrap(), "0.0.0.0:8000");
    assert_eq!(flag_value(proxy, "--admin-addr").unwrap(), "0.0.0.0:8081");
    let proxy_service = find(&base, "Service", "labforge-proxy").unwrap();
    let service_port = |service: &Value, target: &str| {
        service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["targetPort"] == target)
            .unwrap()["port"]
            .as_i64()
            .unwrap()
    };
    assert_eq!(service_port(proxy_service, "http"), 80);
    assert_eq!(service_port(proxy_service, "http-admin"), 8081);
    for object in &base {
        if object["kind"] == "Service" {
            assert!(
                object["spec"]["type"].is_null() || object["spec"]["type"] == "ClusterIP",
                "{}: trusts a header, so only the auth proxy may reach it",
                object["metadata"]["name"]
            );
        }
    }
    let web = deployment_container(&base, "labforge-web");
    assert_eq!(web["readinessProbe"]["httpGet"]["path"], "/api/healthz");
    assert_eq!(
        flag_value(web, "--listen").unwrap(),
        format!("0.0.0.0:{}", port(web, "http"))
    );
}

/// The web app's spawner configuration is what `labforge web --spawner-config` reads, mounted where
/// the flag points.
#[test]
pub(super) fn the_spawner_configmap_is_a_valid_spawner_config_at_the_flags_path() {
    let base = build(&deploy_dir());
    let web = find(&base, "Deployment", "labforge-web").unwrap();
    let container = &web["spec"]["template"]["spec"]["containers"][0];
    let path = PathBuf::from(flag_value(container, "--spawner-config").unwrap());
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| path.starts_with(m["mountPath"].as_str().unwrap()))
        .expect("--spawner-config lies in a mounted volume");
    let volume = web["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let config_map = find(
        &base,
        "ConfigMap",
        volume["configMap"]["name"].as_str().unwrap(),
    )
    .unwrap();
    let key = path
        .strip_prefix(mount["mountPath"].as_str().unwrap())
        .unwrap()
        .to_str()
        .unwrap();
    let json = config_map["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("the ConfigMap has no key {key}"));
    let config: labforge_web::config::SpawnerConfig = serde_json::from_str(json).unwrap();
    use labforge_web::model::ServerType;
    for server_type in [ServerType::Jupyter, ServerType::Vscode] {
        assert!(
            config.default_image(server_type).is_some(),
            "{server_type:?}"
        );
    }
    assert!(!config.gpu_vendors.is_empty());
}

/// What a container runs: the image's entrypoint `labforge` with a subcommand as the first
/// argument, or the `labforge-proxy` binary its `command` names.
pub(super) struct Invocation {
    pub(super) binary: fn() -> std::process::Command,
    /// `labforge <subcommand>` or `labforge-proxy`, for messages.
    pub(super) name: String,
    /// The subcommand, when there is one.
    pub(super) subcommand: Vec<String>,
    /// Everything after it.
    pub(super) args: Vec<String>,
}

impl Invocation {
    pub(super) fn of(file: &str, container: &Value) -> Self {
        let mut args = strings(&container["args"]);
        match container.get("command") {
            None => {
                let subcommand = args.remove(0);
                Invocation {
                    binary: crate::labforge,
                    name: format!("labforge {subcommand}"),
                    subcommand: vec![subcommand],
                    args,
                }
            }
            Some(command) => {
                assert_eq!(
                    strings(command),
                    ["labforge-proxy"],
                    "{file}: the image's binaries are labforge (its entrypoint) and labforge-proxy"
                );
                Invocation {
                    binary: crate::labforge_proxy,
                    name: "labforge-proxy".into(),
                    subcommand: Vec::new(),
                    args,
                }
            }
        }
    }

    /// The binary with the subcommand, ready for more arguments.
    pub(super) fn command(&self) -> std::process::Command {
        let mut command = (self.binary)();
        command.args(&self.subcommand);
        command
    }

    pub(super) fn help(&self) -> String {
        let output = self.command().arg("--help").output().unwrap();
        assert!(output.status.success(), "{} --help", self.name);
        String::from_utf8(output.stdout).unwrap()
    }
}

/// Whether `text` names `flag` as a whole word (`--admin` is not `--admin-addr`).
pub(super) fn names_flag(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + flag.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '-')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_')
    })
}

/// A setting clap accepts but the proxy cannot use stops both binaries before anything binds,
/// with exit code 64 and a message naming the binary and the flag.
#[test]
pub(super) fn a_bad_proxy_setting_exits_64_naming_the_binary_and_the_flag() {
    let mut labforge = crate::labforge();
    labforge.arg("proxy");
    for (mut command, program) in [
        (labforge, "labforge"),
        (crate::labforge_proxy(), "labforge-proxy"),
    ] {
        let out = command
            .args(["--access", "static", "--member", "alice"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{program}: {stderr}");
        assert!(
            stderr.starts_with(&format!("{program}: error: --member")),
            "{program}: {stderr}"
        );
    }
}

/// Kubeflow's culling variables are settings too: one neither command can read stops `labforge
/// up` and `labforge controller` with exit code 64 and the variable named, before anything is
/// made.
#[test]
pub(super) fn a_bad_culling_variable_exits_64_naming_it() {
    let data_dir = tempfile::tempdir().unwrap();
    let mut up = crate::labforge();
    up.arg("up")
        .arg("--data-dir")
        .arg(data_dir.path().join("lab"));
    let mut controller = crate::labforge();
    controller.arg("controller");
    for (mut command, what) in [(up, "up"), (controller, "controller")] {
        let out = command.env("ENABLE_CULLING", "sometimes").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{what}: {stderr}");
        assert!(
            stderr.contains("ENABLE_CULLING") && stderr.contains("sometimes"),
            "{what}: {stderr}"
        );
    }
    assert!(
        !data_dir.path().join("lab").exists(),
        "up made its data dir before refusing"
    );
}

#[test]
pub(super) fn every_flag_and_variable_the_deployments_pass_is_accepted_by_the_binary() {
    // The check below is meaningful: clap parses values before it answers --help.
    let mut labforge_proxy = crate::labforge();
    labforge_proxy.arg("proxy");
    for mut refused in [labforge_proxy, crate::labforge_proxy()] {
        let refused = refused
            .args(["--listen", "not-an-address", "--help"])
            .output()
            .unwrap();
        assert!(
            !refused.status.success(),
            "a bad value is refused before --help"
        );
    }

    for (file, deployment) in deployments() {
        for container in deployment["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
        {
            let invocation = Invocation::of(&file, container);
            let name = &invocation.name;
            let text = invocation.help();
            for arg in &invocation.args {
                if let Some(flag) = arg.strip_prefix("--") {
                    let flag = format!("--{}", flag.split('=').next().unwrap());
                    assert!(
                        names_flag(&text, &flag),
                        "{file}: `{name} --help` does not know {flag}"
                    );
                }
            }
            for env in container["env"].as_array().cloned().unwrap_or_default() {
                let name = env["name"].as_str().unwrap();
                assert!(
                    text.contains(name),
                    "{file}: `{} --help` does not name {name}",
                    invocation.name
                );
            }
            // The whole argument list parses (values included).
            let output = invocation
                .command()
                .args(&invocation.args)
                .arg("--help")
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "{file}: {name} {}: {}",
                invocation.args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}
