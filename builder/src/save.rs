//! Saving an environment: the one operation behind `labforge build commit`, the ImageBuild
//! reconciler and the web app's save button.
//!
//! ```text
//! base image ──manifest, config──▶ parent        (registry)
//! parent ──index by manifest digest (cache) or streamed layers──▶ baseline index
//! source (directory | agent in a container) ──scan vs baseline──▶ header (change-set key) + tar
//! key ──cache hit──▶ layer descriptor + child index: nothing compressed, nothing uploaded twice
//! tar ──tee──▶ child index (parent index + this layer)
//!     └─────▶ LayerStream (diff_id, compress, digest) ──▶ staged file ──▶ cache, registry
//! parent layers + new layer, config, manifest (tag last) ──▶ registry; child index ──▶ cache
//! ```
//!
//! Each index travels with the image's [`PackageSet`] (built in the same pass over the parent's
//! layers, cached next to the index, and carried through the tee like the child index), so a save
//! can say what it changed ([`ChangeSummary`], see [`crate::summary`]) without a second look at
//! the root or the base image.
//!
//! The cache only ever saves work: when it is unreachable the save goes on without it and says so.

use crate::cache::{BlobCache, CacheError};
use crate::digest::Digest;
use crate::image::{ImageConfig, RuntimeConfig};
use crate::layer::{Compression, LayerDescriptor, LayerError, LayerStream};
use crate::registry::{
    DOCKER_LAYER_MEDIA_TYPE, LayerBlob, ParentImage, PushedImage, RegistryClient, RegistryError,
    RegistryOptions,
};
use crate::source::{ChangeSource, RunningChangeSet, SourceError};
use crate::summary::{ChangeSummary, FileTotals, PackageSet, summarize};
use crate::upload::{BlobSink, StreamedUpload};
use futures::TryStreamExt;
use labforge_snapshot::BaselineIndex;
use labforge_snapshot::LayerStats;
use labforge_snapshot::guard::GuardedChangeSet;
use labforge_snapshot::index::IndexError;
use labforge_snapshot::protocol::ChangeSetHeader;
use std::collections::BTreeMap;
use std::io::{self, BufWriter, Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("indexing the base image: {0}")]
    Index(#[source] IndexError),
    #[error("compressing the layer: {0}")]
    Layer(#[from] LayerError),
    #[error("scratch file in {dir}: {source}")]
    Scratch {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("base layer {digest} has media type {media_type:?}, which labforge cannot read")]
    UnknownLayerType { digest: String, media_type: String },
    #[error("a save task stopped unexpectedly")]
    TaskPanicked,
}

/// How to save.
#[derive(Clone, Debug)]
pub struct SaveOptions {
    pub compression: Compression,
    pub registry: RegistryOptions,
    pub cache: Option<BlobCache>,
    /// Runtime defaults when there is no base image (a tree committed from scratch).
    pub runtime: RuntimeConfig,
    /// Where the compressed layer is staged before upload.
    pub scratch_dir: PathBuf,
    /// The history entry's `created_by`.
    pub created_by: String,
    /// When no file changed since the base (directories' own entries aside): push the target
    /// anyway (the base's content, or a layer of directory entries, as `docker commit` would), or
    /// push nothing ([`Saved::image`] is then `None`).
    pub push_unchanged: bool,
}

/// Progress of a save, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SaveProgress {
    Indexing { layer: usize, layers: usize },
    Scanning { entries: u64 },
    Scanned(ChangeSetHeader),
    Writing { bytes: u64, total: u64 },
    Uploading { layer_bytes: u64 },
    CacheUnavailable(String),
}

/// What the cache did for a save.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    Disabled,
    /// The same change set was saved before: no compression, no upload.
    Hit,
    /// Written to the cache for the next time.
    Stored,
    /// The cache could not be reached; the save went on without it.
    Unavailable(String),
    /// Nothing was written, so nothing was cached.
    Unused,
}

/// Where the baseline index came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexOrigin {
    Empty,
    Cache,
    Layers,
}

/// The result of a save.
#[derive(Clone, Debug)]
pub struct Saved {
    /// The new layer; `None` when nothing changed (the target then names the base's content).
    pub layer: Option<LayerDescriptor>,
    /// What was pushed; `None` when no file changed and [`SaveOptions::push_unchanged`] is off.
    pub image: Option<PushedImage>,
    pub header: ChangeSetHeader,
    pub cache: CacheOutcome,
    pub index: IndexOrigin,
    /// What the new layer changed: packages added, upgraded and removed, file totals (empty when
    /// nothing changed). Also in the manifest's `dev.labforge.summary.*` annotations, compactly.
    pub summary: ChangeSummary,
}

impl Saved {
    /// A save that kept nothing ([`SaveOptions::push_unchanged`] off).
    fn nothing_pushed(header: ChangeSetHeader, cache: CacheOutcome, index: IndexOrigin) -> Self {
        Saved {
            layer: None,
            image: None,
            header,
            cache,
            index,
            summary: ChangeSummary::default(),
        }
    }
}

/// Saves what changed in `source` since `base` (or all of it, without a base) as one new layer on
/// `base`, pushed as `target`.
pub async fn save(
    source: &ChangeSource,
    base: Option<&str>,
    target: &str,
    options: &SaveOptions,
    progress: impl Fn(SaveProgress) + Send + Sync + Clone + 'static,
) -> Result<Saved, SaveError> {
    let registry = RegistryClient::new(&options.registry, target)?;
    let cache = CacheState::new(options.cache.as_ref(), progress.clone());
    let parent = match base {
        Some(base) => Some(registry.resolve(base).await?),
        None => None,
    };
    let compression = layer_compression(parent.as_ref(), options.compression);
    let parent_key = parent
        .as_ref()
        .map_or_else(|| "scratch".to_owned(), |p| p.manifest_digest.to_string());
    let (baseline, packages, index, baseline_encoded) =
        baseline_index(&registry, parent.as_ref(), &cache, &progress).await?;
    let baseline = Arc::new(baseline);

    let running = start_scan(source, &baseline, &parent_key, progress.clone()).await?;
    let header = running.header.clone();
    progress(SaveProgress::Scanned(header.clone()));
    let started = std::time::Instant::now();
    tracing::info!(
        scanned = header.scanned,
        changed = header.changed,
        deleted = header.deleted,
        "scanned"
    );

    let unchanged = header.changed == 0 && header.deleted == 0 && parent.is_some();
    if unchanged && !options.push_unchanged {
        running.abandon();
        tracing::info!("nothing changed since the base: nothing pushed");
        let outcome = cache.reported(cache.unless_disabled(CacheOutcome::Unused));
        return Ok(Saved::nothing_pushed(header, outcome, index));
    }
    let keys = ChangeSetKeys::of(&header.key, compression);
    let staged = staging_file(&options.scratch_dir)?;
    let mut outcome = cache.unless_disabled(CacheOutcome::Stored);

    // Each branch ends with the child index encoded and no index but the baseline in memory: an
    // index of a 100k-file image is tens of MiB, so two at once would double the peak.
    let child = if unchanged {
        running.abandon();
        let encoded = baseline_encoded.unwrap_or_else(|| encode_index(&baseline));
        drop(baseline);
        Child::of_parent(encoded, packages.clone())
    } else if let Some(hit) = cached_change_set(&registry, target, &cache, &keys, &staged).await {
        running.abandon();
        outcome = CacheOutcome::Hit;
        Child::from(hit)
    } else {
        drop(baseline_encoded);
        let new = NewLayer {
            running,
            baseline,
            packages: packages.clone(),
            layer_number: parent.as_ref().map_or(0, |p| p.layers().len()),
            compression,
        };
        write_child(&registry, target, new, &staged, &cache, &keys, &progress).await?
    };
    let files = child.files;
    let summary = summarize(&packages, &child.packages, files);
    for (ecosystem, line) in summary.package_lines() {
        tracing::info!("{ecosystem}: {line}");
    }
    // Only directories' own entries changed (their times: a container's start touches `/etc`,
    // for one; or a directory made, removed or given another mode): no file to keep, and such a
    // change alone is not kept. A layer already streamed to the registry stays there unreferenced
    // until its garbage collection.
    if !options.push_unchanged && files.added + files.changed + files.deleted == 0 {
        tracing::info!("no file changed since the base: nothing pushed");
        let outcome = cache.reported(outcome);
        return Ok(Saved::nothing_pushed(header, outcome, index));
    }

    let layer = listed_layer(child.layer, parent.as_ref());
    let now = now_rfc3339();
    let config = image_config(parent.as_ref(), options, layer.as_ref(), &now);
    if let Some(layer) = &layer {
        progress(SaveProgress::Uploading {
            layer_bytes: layer.size,
        });
    }
    let base = base.zip(parent.as_ref());
    let annotations = image_annotations(now, &header, base, layer.is_some().then_some(&summary));
    tracing::info!(elapsed = ?started.elapsed(), "layer ready");
    let blob = layer.as_ref().map(|descriptor| LayerBlob {
        descriptor: descriptor.clone(),
        path: staged.path().to_owned(),
        streamed: child.streamed,
    });
    // The blob is cached while the push finishes: both only read the staged file.
    let (image, ()) = tokio::join!(
        registry.push_image(target, &config, parent.as_ref(), blob, &annotations),
        cache_blob(&cache, child.blob_to_cache.as_deref(), staged.path())
    );
    let image = image?;
    cache_image_index(&cache, &image, &child.index_encoded, &child.packages).await;
    Ok(Saved {
        layer,
        image: Some(image),
        header,
        cache: cache.reported(outcome),
        index,
        summary,
    })
}

/// The compression of the new layer.
fn layer_compression(parent: Option<&ParentImage>, configured: Compression) -> Compression {
    match parent {
        // Docker schema 2 manifests know gzip layers only.
        Some(p) if p.docker => Compression::Gzip { level: 6 },
        _ => configured,
    }
}

/// The new layer as the image's manifest lists it.
fn listed_layer(
    mut layer: Option<LayerDescriptor>,
    parent: Option<&ParentImage>,
) -> Option<LayerDescriptor> {
    // A Docker manifest's layers have Docker's media type.
    if let (Some(layer), Some(parent)) = (layer.as_mut(), parent)
        && parent.docker
    {
        layer.media_type = DOCKER_LAYER_MEDIA_TYPE;
    }
    layer
}

/// The new image's config: its parent's (or one from the runtime defaults, without a parent),
/// with the new layer, if any, appended.
fn image_config(
    parent: Option<&ParentImage>,
    options: &SaveOptions,
    layer: Option<&LayerDescriptor>,
    created: &str,
) -> ImageConfig {
    let mut config = match parent {
        Some(parent) => parent.config.clone(),
        None => ImageConfig::scratch(&options.runtime),
    };
    if let Some(layer) = layer {
        config.append_layer(&layer.diff_id, &options.created_by, created);
    }
    config
}

/// Caches the blob of a layer this save wrote, from the staged file, under `key`.
async fn cache_blob<P: Fn(SaveProgress)>(
    cache: &CacheState<'_, P>,
    key: Option<&str>,
    staged: &std::path::Path,
) {
    if let Some(key) = key {
        cache.put_file(key, staged).await;
    }
}

/// What the new image has on top of its parent, however the save came by it.
struct Child {
    /// `None` when the image is its parent's content.
    layer: Option<LayerDescriptor>,
    index_encoded: Vec<u8>,
    packages: PackageSet,
    files: FileTotals,
    /// The registry upload a layer written by this save was streamed to.
    streamed: Option<StreamedUpload>,
    /// Where a layer written by this save goes in the cache.
    blob_to_cache: Option<String>,
}

impl Child {
    /// No new layer: the parent's content, index and packages.
    fn of_parent(index_encoded: Vec<u8>, packages: PackageSet) -> Self {
        Child {
            layer: None,
            index_encoded,
            packages,
            files: FileTotals::default(),
            streamed: None,
            blob_to_cache: None,
        }
    }
}

impl From<CachedChangeSet> for Child {
    /// The layer of a change set saved before, which is cached already.
    fn from(hit: CachedChangeSet) -> Self {
        Child {
            layer: Some(hit.layer),
            index_encoded: hit.index_encoded,
            packages: hit.packages,
            files: hit.files,
            streamed: None,
            blob_to_cache: None,
        }
    }
}

/// Writes `new` as the new layer and caches it, streaming it to `target` as it is written when
/// the registry takes an upload.
async fn write_child<P: Fn(SaveProgress) + Send + Clone + 'static>(
    registry: &RegistryClient,
    target: &str,
    new: NewLayer,
    staged: &tempfile::NamedTempFile,
    cache: &CacheState<'_, P>,
    keys: &ChangeSetKeys,
    progress: &P,
) -> Result<Child, SaveError> {
    let (streamed, sink) = registry.start_upload(target).await.unzip();
    let staging = Staging {
        file: staged,
        upload: sink,
    };
    let (layer, index_encoded, packages, files) =
        write_and_cache(new, staging, cache, keys, progress.clone()).await?;
    let blob_to_cache = Some(blob_key(&layer.digest));
    Ok(Child {
        layer: Some(layer),
        index_encoded,
        packages,
        files,
        streamed,
        blob_to_cache,
    })
}

/// The new image's annotations: when it was made, from which change set, on which base (its
/// name and digest), and what changed in its packages when it has a new layer.
fn image_annotations(
    created: String,
    header: &ChangeSetHeader,
    base: Option<(&str, &ParentImage)>,
    summary: Option<&ChangeSummary>,
) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::from([
        ("org.opencontainers.image.created".to_owned(), created),
        ("dev.labforge.change-set".to_owned(), header.key.clone()),
    ]);
    if let Some((name, parent)) = base {
        annotations.insert("org.opencontainers.image.base.name".into(), name.to_owned());
        annotations.insert(
            "org.opencontainers.image.base.digest".into(),
            parent.manifest_digest.to_string(),
        );
    }
    if let Some(summary) = summary {
        annotations.extend(summary.annotations());
    }
    annotations
}

/// Caches a pushed image's index and packages, so that a save on it needs neither read again.
async fn cache_image_index<P: Fn(SaveProgress)>(
    cache: &CacheState<'_, P>,
    image: &PushedImage,
    index_encoded: &[u8],
    packages: &PackageSet,
) {
    cache
        .put_bytes(&index_key(&image.manifest_digest), index_encoded)
        .await;
    cache
        .put_bytes(&packages_key(&image.manifest_digest), &packages.encode())
        .await;
}

/// A new file in `scratch_dir` for the layer being written (removed when dropped).
fn staging_file(scratch_dir: &std::path::Path) -> Result<tempfile::NamedTempFile, SaveError> {
    tempfile::Builder::new()
        .prefix("labforge-layer-")
        .tempfile_in(scratch_dir)
        .map_err(|source| SaveError::Scratch {
            dir: scratch_dir.to_owned(),
            source,
        })
}

/// Starts scanning `source` against `baseline` on a blocking thread, reporting entries as they
/// are scanned.
async fn start_scan(
    source: &ChangeSource,
    baseline: &Arc<BaselineIndex>,
    parent_key: &str,
    progress: impl Fn(SaveProgress) + Send + Sync + 'static,
) -> Result<RunningChangeSet, SaveError> {
    let source = source.clone();
    let baseline = Arc::clone(baseline);
    let parent_key = parent_key.to_owned();
    let started = tokio::task::spawn_blocking(move || {
        crate::source::start(&source, baseline, &parent_key, |entries| {
            progress(SaveProgress::Scanning { entries })
        })
    })
    .await
    .map_err(|_| SaveError::TaskPanicked)?;
    Ok(started?)
}

/// A change set to write as a new layer on the parent's `layer_number` layers.
struct NewLayer {
    running: RunningChangeSet,
    baseline: Arc<BaselineIndex>,
    packages: PackageSet,
    layer_number: usize,
    compression: Compression,
}

/// Writes `new` as a layer (staged, and streamed to the registry when an upload is open), then
/// caches its record, its index and its packages under `keys`. Returns the layer, its index
/// encoded, its packages and its file totals; no index but the encoded one stays in memory.
async fn write_and_cache<P: Fn(SaveProgress)>(
    new: NewLayer,
    staging: Staging<'_>,
    cache: &CacheState<'_, P>,
    keys: &ChangeSetKeys,
    progress: impl Fn(SaveProgress) + Send + 'static,
) -> Result<(LayerDescriptor, Vec<u8>, PackageSet, FileTotals), SaveError> {
    let written = write_layer(
        new.running,
        new.baseline,
        new.packages,
        new.layer_number,
        new.compression,
        staging,
        progress,
    )
    .await?;
    let (layer, files) = (written.layer, FileTotals::from(written.stats));
    let mut record = LayerRecord::from(&layer);
    record.files = Some(files);
    cache
        .put_bytes(
            &keys.record,
            &serde_json::to_vec(&record).unwrap_or_default(),
        )
        .await;
    let encoded = encode_index(&written.index);
    drop(written.index);
    cache.put_bytes(&keys.child_index, &encoded).await;
    cache
        .put_bytes(&keys.child_packages, &written.packages.encode())
        .await;
    Ok((layer, encoded, written.packages, files))
}

/// Cache keys: every builder sharing a cache (replicas, the CLI, the web app) must agree on them.
fn blob_key(digest: &Digest) -> String {
    format!("blobs/sha256/{}", digest.hex())
}

fn index_key(manifest: &Digest) -> String {
    format!("indexes/sha256/{}.json.zst", manifest.hex())
}

/// An image's [`PackageSet`], next to its index.
fn packages_key(manifest: &Digest) -> String {
    format!("indexes/sha256/{}.packages.json.zst", manifest.hex())
}

/// Where a change set's record, child index and child package set are cached.
struct ChangeSetKeys {
    record: String,
    child_index: String,
    child_packages: String,
}

impl ChangeSetKeys {
    /// The keys of change set `change_set` (its header's key) compressed with `compression`.
    fn of(change_set: &str, compression: Compression) -> Self {
        let key = change_set.trim_start_matches("sha256:");
        Self {
            record: format!("changesets/{key}-{}.json", compression.name()),
            child_index: format!("changesets/{key}.index.json.zst"),
            child_packages: format!("changesets/{key}.packages.json.zst"),
        }
    }
}

/// zstd-compressed JSON, streamed both ways: the uncompressed JSON is never held in memory.
fn encode_index(index: &BaselineIndex) -> Vec<u8> {
    let encoded = zstd::stream::write::Encoder::new(Vec::new(), 3).and_then(|mut encoder| {
        serde_json::to_writer(&mut encoder, index)?;
        encoder.finish()
    });
    encoded.unwrap_or_default()
}

fn decode_index(bytes: &[u8]) -> Option<BaselineIndex> {
    let decoder = zstd::stream::read::Decoder::new(bytes).ok()?;
    serde_json::from_reader(std::io::BufReader::new(decoder)).ok()
}

/// Whether `bytes` decode as an index, checked as they stream, holding none of it.
fn index_decodes(bytes: &[u8]) -> bool {
    zstd::stream::read::Decoder::new(bytes)
        .is_ok_and(|decoder| BaselineIndex::check_json(std::io::BufReader::new(decoder)).is_ok())
}

/// What the cache remembers of a saved change set.
#[derive(serde::Serialize, serde::Deserialize)]
struct LayerRecord {
    media_type: String,
    digest: String,
    size: u64,
    diff_id: String,
    uncompressed_size: u64,
    entries: u64,
    /// The layer's file totals, for its change summary. Records of builders that predate the
    /// summary have none: such a record is not a hit, and the layer is written again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    files: Option<FileTotals>,
}

impl From<&LayerDescriptor> for LayerRecord {
    fn from(layer: &LayerDescriptor) -> Self {
        LayerRecord {
            media_type: layer.media_type.to_owned(),
            digest: layer.digest.to_string(),
            size: layer.size,
            diff_id: layer.diff_id.to_string(),
            uncompressed_size: layer.uncompressed_size,
            entries: layer.entries,
            files: None,
        }
    }
}

impl LayerRecord {
    fn descriptor(&self) -> Option<LayerDescriptor> {
        let media_type = [Compression::default(), Compression::Gzip { level: 6 }]
            .into_iter()
            .map(Compression::media_type)
            .find(|m| *m == self.media_type)?;
        Some(LayerDescriptor {
            media_type,
            digest: Digest::parse(&self.digest)?,
            size: self.size,
            diff_id: Digest::parse(&self.diff_id)?,
            uncompressed_size: self.uncompressed_size,
            entries: self.entries,
        })
    }
}

/// The cache as a save sees it: every operation best-effort, and after the first failure no
/// more attempts (an unreachable server would otherwise cost a timeout per key).
struct CacheState<'a, P> {
    cache: Option<&'a BlobCache>,
    failure: Mutex<Option<String>>,
    progress: P,
}

impl<'a, P: Fn(SaveProgress)> CacheState<'a, P> {
    fn new(cache: Option<&'a BlobCache>, progress: P) -> Self {
        Self {
            cache,
            failure: Mutex::new(None),
            progress,
        }
    }

    fn enabled(&self) -> bool {
        self.cache.is_some()
    }

    /// `outcome` when there is a cache to speak of, else [`CacheOutcome::Disabled`].
    fn unless_disabled(&self, outcome: CacheOutcome) -> CacheOutcome {
        if self.enabled() {
            outcome
        } else {
            CacheOutcome::Disabled
        }
    }

    fn unavailable(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }

    /// `outcome`, unless the cache failed meanwhile: then why.
    fn reported(&self, outcome: CacheOutcome) -> CacheOutcome {
        self.unavailable()
            .map_or(outcome, CacheOutcome::Unavailable)
    }

    fn usable(&self) -> Option<&'a BlobCache> {
        if self.unavailable().is_some() {
            return None;
        }
        self.cache
    }

    fn record<T>(&self, result: Result<T, CacheError>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(err) => {
                let reason = labforge_messages::error_chain(&err);
                tracing::warn!("cache unavailable, saving without it: {reason}");
                (self.progress)(SaveProgress::CacheUnavailable(reason.clone()));
                if let Ok(mut failure) = self.failure.lock() {
                    failure.get_or_insert(reason);
                }
                None
            }
        }
    }

    async fn get_bytes(&self, key: &str) -> Option<Vec<u8>> {
        let cache = self.usable()?;
        self.record(cache.get_bytes(key).await).flatten()
    }

    async fn get_to_file(&self, key: &str, path: &std::path::Path) -> bool {
        let Some(cache) = self.usable() else {
            return false;
        };
        self.record(cache.get_to_file(key, path).await)
            .unwrap_or(false)
    }

    async fn put_bytes(&self, key: &str, bytes: &[u8]) {
        if let Some(cache) = self.usable() {
            self.record(cache.put_bytes(key, bytes).await);
        }
    }

    async fn put_file(&self, key: &str, path: &std::path::Path) {
        if let Some(cache) = self.usable() {
            self.record(cache.put_file(key, path).await);
        }
    }
}

/// The parent's index and package set (empty without a parent): from the cache by manifest
/// digest, or both built in one pass by streaming its layers. An index cached without its package
/// set (by a builder that predates the summary) is built again, once.
///
/// The index comes encoded too when it was at hand, so an unchanged or cached save stores its
/// image's index without encoding 100k entries again.
async fn baseline_index<P: Fn(SaveProgress) + Send + Sync + Clone + 'static>(
    registry: &RegistryClient,
    parent: Option<&ParentImage>,
    cache: &CacheState<'_, P>,
    progress: &P,
) -> Result<(BaselineIndex, PackageSet, IndexOrigin, Option<Vec<u8>>), SaveError> {
    let Some(parent) = parent else {
        return Ok((
            BaselineIndex::default(),
            PackageSet::default(),
            IndexOrigin::Empty,
            None,
        ));
    };
    let key = index_key(&parent.manifest_digest);
    let packages_key = packages_key(&parent.manifest_digest);
    if let Some(bytes) = cache.get_bytes(&key).await
        && let Some(index) = decode_index(&bytes)
        && let Some(packages) = cache
            .get_bytes(&packages_key)
            .await
            .and_then(|b| PackageSet::decode(&b))
    {
        return Ok((index, packages, IndexOrigin::Cache, Some(bytes)));
    }
    let layers = parent.layers();
    let mut index = BaselineIndex::default();
    let mut packages = PackageSet::default();
    for (number, layer) in layers.iter().enumerate() {
        progress(SaveProgress::Indexing {
            layer: number + 1,
            layers: layers.len(),
        });
        let media_type = layer["mediaType"].as_str().unwrap_or_default().to_owned();
        let digest = layer["digest"].as_str().unwrap_or_default().to_owned();
        let stream = registry.layer_stream(parent, layer).await?;
        let reader = tokio_util::io::StreamReader::new(stream.map_err(io::Error::other));
        (index, packages) = tokio::task::spawn_blocking(move || -> Result<_, SaveError> {
            let bridge = tokio_util::io::SyncIoBridge::new(reader);
            let tar: Box<dyn Read> = if media_type.ends_with("gzip") {
                Box::new(flate2::read::GzDecoder::new(bridge))
            } else if media_type.ends_with("zstd") {
                Box::new(zstd::stream::read::Decoder::new(bridge).map_err(|e| {
                    SaveError::Index(IndexError::Layer {
                        layer: number,
                        source: e,
                    })
                })?)
            } else if media_type.ends_with(".tar") || media_type.ends_with("tar.diff") {
                Box::new(bridge)
            } else {
                return Err(SaveError::UnknownLayerType { digest, media_type });
            };
            index
                .apply_layer_with(number, tar, true, &mut packages)
                .map_err(SaveError::Index)?;
            Ok((index, packages))
        })
        .await
        .map_err(|_| SaveError::TaskPanicked)??;
    }
    let encoded = encode_index(&index);
    cache.put_bytes(&key, &encoded).await;
    cache.put_bytes(&packages_key, &packages.encode()).await;
    Ok((index, packages, IndexOrigin::Layers, Some(encoded)))
}

/// A change set saved before (same key), as the cache remembers it.
struct CachedChangeSet {
    layer: LayerDescriptor,
    index_encoded: Vec<u8>,
    packages: PackageSet,
    files: FileTotals,
}

/// A change set saved before (same key): its layer, fetched into `staged` unless the target
/// repository has it already, the index and package set it led to, and its file totals.
async fn cached_change_set<P: Fn(SaveProgress)>(
    registry: &RegistryClient,
    target: &str,
    cache: &CacheState<'_, P>,
    keys: &ChangeSetKeys,
    staged: &tempfile::NamedTempFile,
) -> Option<CachedChangeSet> {
    let record: LayerRecord = serde_json::from_slice(&cache.get_bytes(&keys.record).await?).ok()?;
    let layer = record.descriptor()?;
    let files = record.files?;
    let index_encoded = cache.get_bytes(&keys.child_index).await?;
    // Checked to decode, without building it: it is stored again as it is.
    if !index_decodes(&index_encoded) {
        return None;
    }
    let packages = PackageSet::decode(&cache.get_bytes(&keys.child_packages).await?)?;
    if !registry.has_blob(target, &layer.digest).await
        && !cache
            .get_to_file(&blob_key(&layer.digest), staged.path())
            .await
    {
        return None;
    }
    Some(CachedChangeSet {
        layer,
        index_encoded,
        packages,
        files,
    })
}

/// A layer written from a change set, and what reading it taught.
struct WrittenLayer {
    layer: LayerDescriptor,
    index: BaselineIndex,
    packages: PackageSet,
    stats: LayerStats,
}

/// Where a compressed layer goes as it is written: the scratch file, which the cache and a
/// retried upload read, and the registry upload that runs alongside, when one was opened.
struct Staging<'a> {
    file: &'a tempfile::NamedTempFile,
    upload: Option<BlobSink>,
}

/// The writer behind [`Staging`].
struct StagingWriter {
    file: BufWriter<std::fs::File>,
    upload: Option<BlobSink>,
}

impl Write for StagingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write_all(buf)?;
        if let Some(upload) = &mut self.upload {
            upload.write_all(buf)?;
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Reads the change-set tar once: into the child index and package set (the package metadata
/// files in it are read as they pass) and through compression into the staging file and upload.
async fn write_layer(
    running: RunningChangeSet,
    baseline: Arc<BaselineIndex>,
    mut packages: PackageSet,
    layer_number: usize,
    compression: Compression,
    staging: Staging<'_>,
    progress: impl Fn(SaveProgress) + Send + 'static,
) -> Result<WrittenLayer, SaveError> {
    let file = staging.file.reopen().map_err(|source| SaveError::Scratch {
        dir: staging.file.path().to_owned(),
        source,
    })?;
    let sink = StagingWriter {
        file: BufWriter::with_capacity(crate::source::STREAM_BUFFER, file),
        upload: staging.upload,
    };
    tokio::task::spawn_blocking(move || {
        let mut running = running;
        let total = running.header.content_bytes;
        let entries = running.header.changed + running.header.deleted;
        let mut stream = LayerStream::new(sink, compression)?;
        // The scan is over, so the baseline is usually ours alone: no copy of the index.
        let mut child = Arc::try_unwrap(baseline).unwrap_or_else(|shared| (*shared).clone());
        // The stream comes from inside the notebook: checked as it is read, before the tar
        // reader holds any of it (see `labforge_snapshot::guard`).
        let mut guarded = GuardedChangeSet::new(&mut running.tar, running.header.content_bytes);
        let read = {
            let mut tee = Tee {
                reader: &mut guarded,
                writer: &mut stream,
                since_report: 0,
                progress: |bytes| progress(SaveProgress::Writing { bytes, total }),
            };
            child
                .apply_layer_with(layer_number, &mut tee, false, &mut packages)
                .map_err(SaveError::Index)
                .and_then(|stats| {
                    // The end-of-archive blocks the tar reader leaves unread belong to the layer.
                    io::copy(&mut tee, &mut io::sink())
                        .map(|_| stats)
                        .map_err(|e| SaveError::Source(SourceError::Stream(e)))
                })
        };
        let violation = guarded.violation().cloned();
        drop(guarded);
        if let Some(violation) = violation {
            // Whatever the agent says, the stream it sent is the reason.
            running.abandon();
            return Err(SaveError::Source(SourceError::ChangeSet(violation)));
        }
        // A producer's own failure (a file it could not read) explains a cut stream best.
        running.finish()?;
        let stats = read?;
        let (sink, layer) = stream.finish(entries)?;
        if let Some(upload) = sink.upload {
            upload.finish();
        }
        Ok(WrittenLayer {
            layer,
            index: child,
            packages,
            stats,
        })
    })
    .await
    .map_err(|_| SaveError::TaskPanicked)?
}

/// Passes everything read through to a writer, reporting uncompressed bytes as they go.
struct Tee<'a, R: ?Sized, W: Write, F> {
    reader: &'a mut R,
    writer: &'a mut LayerStream<W>,
    since_report: u64,
    progress: F,
}

impl<R: Read + ?Sized, W: Write, F: FnMut(u64)> Read for Tee<'_, R, W, F> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.reader.read(buf)?;
        self.writer.write_all(&buf[..n])?;
        self.since_report += n as u64;
        if self.since_report >= 1 << 20 || n == 0 {
            self.since_report = 0;
            (self.progress)(self.writer.written());
        }
        Ok(n)
    }
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
