//! Saving a directory's changes as an image with progress, and printing what a Notebook becomes.

use crate::cli::UsageError;
use crate::cli::build::{CommitArgs, RenderArgs};
use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use labforge_builder::cache::BlobCache;
use labforge_builder::save::{CacheOutcome, SaveOptions, SaveProgress, save};
use labforge_builder::source::ChangeSource;
use labforge_notebook_controller::BuilderConfig;
use std::process::ExitCode;
use std::time::Duration;

pub(crate) fn render(args: &RenderArgs) -> anyhow::Result<ExitCode> {
    let text = if args.file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    let notebooks = labforge_notebook_controller::render::parse_notebooks(&text, &args.namespace)
        .with_context(|| format!("parsing {}", args.file.display()))?;
    print!(
        "{}",
        labforge_notebook_controller::render::render_yaml(&notebooks, &BuilderConfig::from(args))?
    );
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn build_commit(args: &CommitArgs) -> anyhow::Result<ExitCode> {
    let parsed =
        ChangeSource::try_from(args).and_then(|source| Ok((source, SaveOptions::try_from(args)?)));
    let (source, options) = parsed.map_err(UsageError)?;
    if let Some(BlobCache::S3(cache)) = &options.cache
        && let Err(err) = cache.ensure_bucket().await
    {
        tracing::warn!("{err}");
    }
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    let reporter = bar.clone();
    let what = args
        .root
        .as_ref()
        .map(|r| r.display().to_string())
        .or_else(|| args.container.clone())
        .unwrap_or_default();
    let saved = save(
        &source,
        args.base.as_deref(),
        &args.target,
        &options,
        move |p| match p {
            SaveProgress::Indexing { layer, layers } => {
                reporter.set_message(format!("indexing base image: layer {layer}/{layers}"))
            }
            SaveProgress::Scanning { entries } => {
                reporter.set_message(format!("scanning: {entries} files"))
            }
            SaveProgress::Scanned(header) => reporter.set_message(format!(
                "scanned {} files: {} changed, {} removed, {} to write",
                header.scanned,
                header.changed,
                header.deleted,
                indicatif::HumanBytes(header.content_bytes)
            )),
            SaveProgress::Writing { bytes, total } => reporter.set_message(format!(
                "writing layer: {} of {} file data",
                indicatif::HumanBytes(bytes),
                indicatif::HumanBytes(total)
            )),
            SaveProgress::Uploading { layer_bytes } => reporter.set_message(format!(
                "uploading layer ({})",
                indicatif::HumanBytes(layer_bytes)
            )),
            SaveProgress::CacheUnavailable(reason) => {
                reporter.println(format!("cache unavailable, saving without it: {reason}"))
            }
        },
    )
    .await
    .with_context(|| format!("saving {what} as {}", args.target));
    bar.finish_and_clear();
    let saved = saved?;
    let cache = match &saved.cache {
        CacheOutcome::Disabled => String::new(),
        CacheOutcome::Hit => "; cache hit".to_owned(),
        CacheOutcome::Stored => "; cached".to_owned(),
        // Why is the warning's to tell, on a line of its own.
        CacheOutcome::Unavailable(_) => "; saved uncached, the cache was unavailable".to_owned(),
        CacheOutcome::Unused => String::new(),
    };
    let image = saved
        .image
        .as_ref()
        .context("the save pushed nothing, which a commit always does")?;
    match &saved.layer {
        Some(layer) => {
            println!(
                "pushed {}@{} (layer {}, {} files, {}{cache})",
                image.reference,
                image.manifest_digest,
                layer.digest,
                saved.header.changed,
                indicatif::HumanBytes(layer.size)
            );
            for line in summary_lines(&saved.summary) {
                println!("  {line}");
            }
        }
        None => println!(
            "pushed {}@{} (no changes since the base image{cache})",
            image.reference, image.manifest_digest
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// The change summary under the digest line: a line per package ecosystem that changed, then
/// the file totals.
pub(crate) fn summary_lines(summary: &labforge_builder::summary::ChangeSummary) -> Vec<String> {
    let mut lines: Vec<String> = summary
        .package_lines()
        .into_iter()
        .map(|(ecosystem, changes)| format!("{ecosystem}: {changes}"))
        .collect();
    if !summary.unknown.is_empty() {
        lines.push(format!(
            "not compared (too large to read): {}",
            summary.unknown.join(", ")
        ));
    }
    let files = &summary.files;
    lines.push(format!(
        "files: {} added, {} changed, {} deleted; {} written, {} deleted",
        files.added,
        files.changed,
        files.deleted,
        indicatif::HumanBytes(files.written_bytes),
        indicatif::HumanBytes(files.deleted_bytes)
    ));
    lines
}
