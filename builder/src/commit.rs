//! Committing a directory tree as an image: the library operation behind `labforge build commit`.
//!
//! The layer is written to a scratch file first (hashing on the way), then streamed to the registry;
//! the scratch file is removed whatever happens.

use crate::image::{ImageConfig, RuntimeConfig};
use crate::layer::{Compression, LayerDescriptor, LayerError, LayerWriter};
use crate::registry::{LayerBlob, PushedImage, RegistryClient, RegistryError, RegistryOptions};
use std::io::BufWriter;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("{root} is not a directory")]
    NotADirectory { root: PathBuf },
    #[error("writing the layer")]
    Layer(#[from] LayerError),
    #[error("pushing the image")]
    Registry(#[from] RegistryError),
    #[error("scratch file in {dir}")]
    Scratch {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the layer writer stopped unexpectedly")]
    WriterPanicked,
}

/// How to commit.
#[derive(Clone, Debug)]
pub struct CommitOptions {
    pub compression: Compression,
    pub registry: RegistryOptions,
    /// Runtime defaults of the new image (user, cmd, env, ...).
    pub runtime: RuntimeConfig,
    /// Where the compressed layer is staged before upload.
    pub scratch_dir: PathBuf,
}

/// Progress of a commit, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitProgress {
    Writing { entries: u64, bytes: u64 },
    Uploading { layer_bytes: u64 },
}

/// The result of a commit.
#[derive(Clone, Debug)]
pub struct Committed {
    pub layer: LayerDescriptor,
    pub image: PushedImage,
}

/// Commits everything below `root` as the only layer of a new image and pushes it to `target`.
pub async fn commit_tree(
    root: &Path,
    target: &str,
    options: &CommitOptions,
    progress: impl Fn(CommitProgress) + Send + Sync + Clone + 'static,
) -> Result<Committed, CommitError> {
    if !root.is_dir() {
        return Err(CommitError::NotADirectory {
            root: root.to_owned(),
        });
    }
    let scratch = |source| CommitError::Scratch {
        dir: options.scratch_dir.clone(),
        source,
    };
    let staged = tempfile::Builder::new()
        .prefix("labforge-layer-")
        .tempfile_in(&options.scratch_dir)
        .map_err(scratch)?;
    let staged_file = staged.reopen().map_err(scratch)?;

    let root_owned = root.to_owned();
    let compression = options.compression;
    let report = progress.clone();
    let layer = tokio::task::spawn_blocking(move || -> Result<LayerDescriptor, LayerError> {
        let mut writer =
            LayerWriter::new(BufWriter::with_capacity(1 << 20, staged_file), compression)?
                .with_progress(move |entries, bytes| {
                    report(CommitProgress::Writing { entries, bytes })
                });
        writer.append_tree(&root_owned)?;
        let (_, descriptor) = writer.finish()?;
        Ok(descriptor)
    })
    .await
    .map_err(|_| CommitError::WriterPanicked)??;

    progress(CommitProgress::Uploading {
        layer_bytes: layer.size,
    });
    let mut config = ImageConfig::scratch(&options.runtime);
    config.append_layer(
        &layer.diff_id,
        &format!("labforge build commit --root {}", root.display()),
        &now_rfc3339(),
    );
    let blobs = [LayerBlob {
        descriptor: layer.clone(),
        path: staged.path().to_owned(),
    }];
    let image = RegistryClient::new(&options.registry)
        .push_image(target, &config, &blobs)
        .await?;
    Ok(Committed { layer, image })
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
