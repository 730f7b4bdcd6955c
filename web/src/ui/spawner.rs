//! The new-notebook page: the spawner form built from the catalog, the namespace's saved images
//! and the GPUs this machine has.

use super::{Viewer, chosen_namespace, page, to_login};
use crate::api::ApiState;
use crate::config::SpawnerConfig;
use crate::model::{SavedImage, ServerType};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde::Deserialize;
use std::collections::BTreeSet;

#[derive(Deserialize, Default)]
pub(super) struct NewQuery {
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    ns: Option<String>,
}

/// The saved images a spawner form offers: the namespace's own, and those other namespaces
/// shared with it.
#[derive(Clone, Copy, Default)]
pub(super) struct SavedChoices<'a> {
    own: &'a [SavedImage],
    shared: &'a [SavedImage],
}

/// The image choices for `server_type`: the catalog's (its default selected unless an image is
/// preset; those `preparing` said so), then the user's saved images for that server, then those
/// shared with them.
pub(super) fn image_options(
    config: &SpawnerConfig,
    choices: SavedChoices<'_>,
    preset_image: Option<&str>,
    preparing: &BTreeSet<String>,
    server_type: ServerType,
) -> Markup {
    let for_this_server = |images: &'_ [SavedImage]| -> Vec<SavedImage> {
        images
            .iter()
            .filter(|i| i.server_type.is_none_or(|t| t == server_type))
            .cloned()
            .collect()
    };
    let saved = for_this_server(choices.own);
    let shared = for_this_server(choices.shared);
    html! {
        optgroup label="Catalog" {
            @for image in config.images.iter().filter(|i| i.server_type == server_type) {
                option value=(image.image) selected[preset_image.is_none() && image.default] {
                    (image.image)
                    @if !image.description.is_empty() {
                        " — " (image.description)
                    }
                    @if preparing.contains(&image.image) {
                        " (being prepared)"
                    }
                }
            }
        }
        @if !saved.is_empty() {
            optgroup label="Your saved images" {
                @for image in &saved {
                    option value=(image.image) {
                        (image.image) " — saved from " (image.notebook)
                    }
                }
            }
        }
        @if !shared.is_empty() {
            optgroup label="Shared with you" {
                @for image in &shared {
                    option value=(image.image) {
                        (image.image) " — shared by " (image.namespace)
                    }
                }
            }
        }
    }
}

/// The image select for one server type (as the form's `serverType` values name it); only the
/// checked type's shows. `preparing`: its default image is not ready to run here yet.
pub(super) fn image_select(
    server_type: &str,
    shown: bool,
    options: Markup,
    preparing: bool,
) -> Markup {
    let id = format!("image-{server_type}");
    html! {
        label for=(id) data-type=(server_type) hidden[!shown] { "Image" }
        select id=(id) name=(id) data-type=(server_type) hidden[!shown] { (options) }
        @if preparing {
            p.hint.preparing data-type=(server_type) hidden[!shown] {
                "This image is being prepared on this machine: a notebook made now starts once it is ready, in a few minutes."
            }
        }
    }
}

/// The custom image field where the admin allows one (holding `preset_image`), else only the
/// place where the image's error shows.
pub(super) fn custom_image_field(config: &SpawnerConfig, preset_image: Option<&str>) -> Markup {
    html! {
        @if config.allow_custom_images {
            label for="customImage" {
                "Custom image " span.hint { "(instead of the list)" }
            }
            input
                #customImage
                name="customImage"
                placeholder="registry.example.com/team/image:tag"
                value=(preset_image.unwrap_or_default());
            p.error data-error-for="image" data-input="customImage" {}
        } @else {
            p.error data-error-for="image" {}
        }
    }
}

/// The GPU vendor and count, or a line saying there are none here.
pub(super) fn gpu_fields(config: &SpawnerConfig) -> Markup {
    if config.gpu_vendors.is_empty() {
        return html! { p.hint { "No GPUs are available here." } };
    }
    html! {
        div.pair {
            div {
                label for="gpuVendor" { "GPU vendor" }
                select #gpuVendor name="gpuVendor" {
                    option value="" { "None" }
                    @for vendor in &config.gpu_vendors {
                        option value=(vendor.limits_key) { (vendor.name) }
                    }
                }
                p.error data-error-for="gpus.vendor" {}
            }
            div {
                label for="gpuCount" { "GPUs" }
                input
                    #gpuCount
                    name="gpuCount"
                    type="number"
                    min="0"
                    max=(config.defaults.max_gpus)
                    value="0";
                p.error data-error-for="gpus.count" {}
            }
        }
    }
}

/// The notebook's name, server type and image.
pub(super) fn notebook_fields(
    config: &SpawnerConfig,
    saved: SavedChoices<'_>,
    preset_image: Option<&str>,
    preparing: &BTreeSet<String>,
) -> Markup {
    let options = |server_type| image_options(config, saved, preset_image, preparing, server_type);
    let being_prepared = |server_type| {
        config
            .default_image(server_type)
            .is_some_and(|image| preparing.contains(image))
    };
    // RStudio only where the catalog has an image for it.
    let offers_rstudio = config.default_image(ServerType::Rstudio).is_some();
    html! {
        fieldset {
            legend { "Notebook" }
            label for="name" { "Name" }
            input
                #name
                name="name"
                required
                maxlength="63"
                pattern=r"[a-z0-9]([a-z0-9\-]*[a-z0-9])?"
                autocomplete="off"
                aria-describedby="name-hint";
            p.hint #name-hint { "Lowercase letters, digits and '-'." }
            p.error data-error-for="name" data-input="name" {}
            span.label #type-label { "Server type" }
            div.radios role="radiogroup" aria-labelledby="type-label" {
                @for (value, label, server_type) in [("jupyter", "JupyterLab", ServerType::Jupyter), ("vscode", "VSCode", ServerType::Vscode)] {
                    (server_radio(value, label, value == "jupyter", being_prepared(server_type)))
                }
                @if offers_rstudio {
                    (server_radio("rstudio", "RStudio", false, being_prepared(ServerType::Rstudio)))
                }
            }
            (image_select("jupyter", true, options(ServerType::Jupyter), being_prepared(ServerType::Jupyter)))
            (image_select("vscode", false, options(ServerType::Vscode), being_prepared(ServerType::Vscode)))
            @if offers_rstudio {
                (image_select("rstudio", false, options(ServerType::Rstudio), being_prepared(ServerType::Rstudio)))
            }
            (custom_image_field(config, preset_image))
            label for="imagePullPolicy" { "Image pull policy" }
            select #imagePullPolicy name="imagePullPolicy" {
                option selected { "IfNotPresent" }
                option { "Always" }
                option { "Never" }
            }
            p.error data-error-for="imagePullPolicy" {}
        }
    }
}

/// One server type's radio button; `preparing`: its default image is not ready here yet.
pub(super) fn server_radio(value: &str, label: &str, checked: bool, preparing: bool) -> Markup {
    html! {
        label {
            input type="radio" name="serverType" value=(value) checked[checked];
            " " (label)
            @if preparing {
                " " span.hint { "(being prepared)" }
            }
        }
    }
}

/// CPU, memory, GPUs and shared memory, starting from the admin's defaults.
pub(super) fn resource_fields(config: &SpawnerConfig) -> Markup {
    let d = &config.defaults;
    html! {
        fieldset {
            legend { "Resources" }
            (request_and_limit("cpu", "CPU", &d.cpu))
            (request_and_limit("memory", "Memory", &d.memory))
            p.hint #quota-use hidden {}
            (gpu_fields(config))
            label for="shmSize" { "Shared memory (/dev/shm)" }
            input #shmSize name="shmSize" value=(d.shm_size);
            p.error data-error-for="shmSize" {}
        }
    }
}

/// A resource's request, from the admin's default, beside its limit (`<field>Limit`), which is
/// the request unless set.
pub(super) fn request_and_limit(field: &str, label: &str, request: &str) -> Markup {
    let limit = format!("{field}Limit");
    html! {
        div.pair {
            div {
                label for=(field) { (label) " request" }
                input id=(field) name=(field) value=(request);
                p.error data-error-for=(field) {}
            }
            div {
                label for=(limit) { (label) " limit" }
                input id=(limit) name=(limit) placeholder="same as request";
                p.error data-error-for=(limit) {}
            }
        }
    }
}

/// The workspace volume (new, existing or none) and the data volumes.
pub(super) fn storage_fields(defaults: &crate::config::Defaults) -> Markup {
    html! {
        fieldset {
            legend { "Storage" }
            span.label #ws-label { "Workspace (/home/jovyan)" }
            div.radios role="radiogroup" aria-labelledby="ws-label" {
                label { input type="radio" name="workspace" value="new" checked; " New" }
                label { input type="radio" name="workspace" value="existing"; " Existing" }
                label { input type="radio" name="workspace" value="none"; " None" }
            }
            label for="workspaceSize" { "Size" }
            input #workspaceSize name="workspaceSize" value=(defaults.workspace_size);
            p.error data-error-for="workspace.size" {}
            label for="workspaceName" hidden { "Existing volume name" }
            input #workspaceName name="workspaceName" list="workspace-volumes" hidden;
            datalist #workspace-volumes {}
            p.error data-error-for="workspace.name" data-input="workspaceName" {}
            div #volumes {}
            button.secondary #add-volume type="button" { "Add a data volume" }
        }
    }
}

pub(super) fn spawner_form(
    config: &SpawnerConfig,
    saved: SavedChoices<'_>,
    preset_image: Option<&str>,
    preparing: &BTreeSet<String>,
) -> Markup {
    html! {
        form.card #spawner novalidate {
            (notebook_fields(config, saved, preset_image, preparing))
            (resource_fields(config))
            (storage_fields(&config.defaults))
            fieldset {
                legend { "Environment" }
                label {
                    input #autoSave name="autoSave" type="checkbox" checked[config.defaults.auto_save];
                    " Save the environment before each stop, so installed packages survive stops and culling"
                }
            }
            fieldset {
                legend { "Environment variables" }
                div #envs {}
                button.secondary #add-env type="button" { "Add a variable" }
                p.error data-error-for="environment" {}
            }
            p.error #form-error role="alert" {}
            button #create type="submit" { "Create notebook" }
        }
    }
}

pub(super) async fn new_page(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<NewQuery>,
) -> Response {
    let Some(user) = state.access.identify(&headers).await else {
        return to_login(&state.base_path);
    };
    let namespace = match chosen_namespace(&state, &user, query.ns).await {
        Ok(namespace) => namespace,
        Err(refused) => return refused,
    };
    let saved = state
        .backend
        .saved_images(&namespace)
        .await
        .unwrap_or_default();
    let shared = state
        .backend
        .images_shared_with(&namespace)
        .await
        .unwrap_or_default();
    page(
        &state.base_path,
        "New notebook",
        Some(Viewer {
            user: &user,
            namespace: &namespace,
        }),
        html! {
            h1 { "New notebook" }
            (spawner_form(
                &state.config,
                SavedChoices {
                    own: &saved,
                    shared: &shared,
                },
                query.image.as_deref(),
                &state.preparing.images(),
            ))
        },
        Some("new.js"),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_says_which_catalog_images_are_being_prepared() {
        let config = crate::config::default_spawner("registry.local");
        let vscode = config
            .default_image(ServerType::Vscode)
            .expect("the default catalog has code-server")
            .to_owned();
        let ready =
            spawner_form(&config, SavedChoices::default(), None, &BTreeSet::new()).into_string();
        assert!(!ready.contains("being prepared"), "{ready}");
        let form = spawner_form(
            &config,
            SavedChoices::default(),
            None,
            &BTreeSet::from([vscode.clone()]),
        )
        .into_string();
        assert!(
            form.contains(r#"value="vscode"> VSCode <span class="hint">(being prepared)</span>"#),
            "{form}"
        );
        assert!(
            !form.contains(r#"JupyterLab <span class="hint">"#),
            "{form}"
        );
        let option = form
            .split(&format!(r#"<option value="{vscode}""#))
            .nth(1)
            .and_then(|rest| rest.split("</option>").next())
            .unwrap_or_else(|| panic!("no option for {vscode} in {form}"));
        assert!(option.ends_with(" (being prepared)"), "{option}");
        assert!(
            form.contains(r#"<p class="hint preparing" data-type="vscode" hidden>"#),
            "{form}"
        );
    }

    #[test]
    fn the_form_offers_the_catalog_and_only_available_gpus() {
        let mut config = crate::config::default_spawner("registry.local");
        let form =
            spawner_form(&config, SavedChoices::default(), None, &BTreeSet::new()).into_string();
        assert!(
            form.contains(r#"<option value="registry.local/labforge/jupyterlab:latest" selected>"#)
        );
        assert!(form.contains("No GPUs are available here."));
        config.gpu_vendors.push(crate::config::GpuVendor {
            limits_key: "nvidia.com/gpu".into(),
            name: "NVIDIA".into(),
            cdi_kind: None,
            smi: None,
        });
        config.allow_custom_images = false;
        let saved = crate::model::SavedImage {
            image: "registry.local/alice/lab:v1".into(),
            digest: "sha256:00".into(),
            notebook: "lab".into(),
            namespace: "alice".into(),
            base: String::new(),
            server_type: Some(crate::model::ServerType::Jupyter),
            layer_bytes: 1,
            files_changed: 1,
            files_deleted: 0,
            created: String::new(),
            summary: None,
            shared_with: Vec::new(),
        };
        let code = crate::model::SavedImage {
            image: "registry.local/alice/code:v1".into(),
            server_type: Some(crate::model::ServerType::Vscode),
            ..saved.clone()
        };
        let unknown = crate::model::SavedImage {
            image: "registry.local/alice/old:v1".into(),
            server_type: None,
            ..saved.clone()
        };
        let bobs = crate::model::SavedImage {
            image: "registry.local/bob/lab:v1".into(),
            namespace: "bob".into(),
            ..saved.clone()
        };
        let own = [saved, code, unknown];
        let choices = SavedChoices {
            own: &own,
            shared: std::slice::from_ref(&bobs),
        };
        let form = spawner_form(&config, choices, None, &BTreeSet::new()).into_string();
        assert!(form.contains(
            r#"<optgroup label="Shared with you"><option value="registry.local/bob/lab:v1">registry.local/bob/lab:v1 — shared by bob</option>"#
        ));
        assert!(form.contains(
            r#"<optgroup label="Your saved images"><option value="registry.local/alice/lab:v1">"#
        ));
        assert!(form.contains(r#"<option value="nvidia.com/gpu">NVIDIA</option>"#));
        assert!(!form.contains("customImage"));
        // Each select offers the saves of its server type, and those of unknown type.
        let select = |id: &str| {
            let start = form.find(&format!(r#"<select id="{id}""#)).unwrap();
            form[start..].split("</select>").next().unwrap().to_owned()
        };
        let (jupyter, vscode) = (select("image-jupyter"), select("image-vscode"));
        assert!(jupyter.contains("lab:v1") && !jupyter.contains("code:v1"));
        assert!(vscode.contains("code:v1") && !vscode.contains("lab:v1"));
        assert!(jupyter.contains("old:v1") && vscode.contains("old:v1"));
    }
}
