//! The change summary of a save: which Python, conda and Debian packages the new layer added,
//! upgraded (or downgraded) and removed, and how many files it added, changed and deleted.
//!
//! A saved image is otherwise an opaque digest; the summary is what a person (the CLI, the web
//! app's saved-images list, someone reading the registry) needs to tell saves apart.
//!
//! It costs no extra pass over the root, and the agent knows nothing about it:
//!
//! - Package databases are files at well-known paths: `…/site-packages/<dist>.dist-info/METADATA`,
//!   `…/site-packages/<dist>.egg-info/PKG-INFO` (or an `.egg-info` file), `<prefix>/conda-meta/
//!   <package>.json` and `var/lib/dpkg/status`. A `pip install` changes exactly those files, so the
//!   scan already puts them in the change set, and removals arrive as whiteouts of their
//!   directories. [`PackageSet`] is a [`LayerObserver`]: while the change-set tar streams through the
//!   tee that builds the child index, it recognises these paths and reads their content (only the
//!   header section of core metadata, two fields of a conda record, the installed packages of dpkg's
//!   status) from the bytes that pass by anyway. Because metadata files are recognised by the
//!   builder rather than marked by the scanner, the agent's wire format is unchanged and agents
//!   already mounted in running notebooks keep working.
//! - "Before" is the parent image's [`PackageSet`]: built the same way in the same pass when the
//!   baseline index is built by streaming the parent's layers, or read from the cache next to the
//!   index, keyed by manifest digest. A saved image's set is its parent's with the new layer
//!   applied, cached under the saved image's digest, so the next save on top of it starts from the
//!   cache as its index does.
//! - Memory stays bounded: a set holds one name and version per package; reads are capped
//!   ([`CORE_METADATA_CAP`], [`CONDA_RECORD_CAP`], [`DPKG_STATUS_CAP`]) and lines are cut at
//!   [`LINE_CAP`]. Python and conda fall back to the names their files carry (`c-2.0.dist-info`,
//!   `numpy-1.26.4-py311_0.json`); a dpkg status file over its cap is recorded as unknown and its
//!   packages left out of the comparison rather than reported as removed.
//!
//! File totals come from applying the layer to the index ([`LayerStats`]): the index knows what
//! each path was before.

use labforge_snapshot::{EntryKind, LayerObserver, LayerStats};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// Bytes of Python core metadata read: the header section is small; the long description that
/// follows it (a whole README, often) is not needed.
pub const CORE_METADATA_CAP: u64 = 1 << 20;
/// A conda record lists every file of its package: several MiB for the largest packages.
pub const CONDA_RECORD_CAP: u64 = 64 << 20;
/// dpkg's status file is a few MiB on a full system.
pub const DPKG_STATUS_CAP: u64 = 64 << 20;
/// Bytes kept of one line of metadata (the fields read are short; descriptions are skipped).
pub const LINE_CAP: usize = 4096;
/// Characters kept of a name or version read from a file.
const FIELD_CAP: usize = 200;
/// Bytes of one package annotation; longer lists are cut, saying how many more there are.
pub const ANNOTATION_CAP: usize = 1024;

/// Manifest annotation keys.
pub const PYTHON_ANNOTATION: &str = "dev.labforge.summary.python";
pub const CONDA_ANNOTATION: &str = "dev.labforge.summary.conda";
pub const DEBIAN_ANNOTATION: &str = "dev.labforge.summary.debian";
pub const FILES_ANNOTATION: &str = "dev.labforge.summary.files";
pub const UNKNOWN_ANNOTATION: &str = "dev.labforge.summary.unknown";

/// Bumped when what a [`PackageSet`] records changes, so sets cached by older builders are
/// rebuilt instead of compared with new ones.
const PACKAGE_SET_FORMAT: u32 = 1;

/// What a save changed, for people. Serialized (camelCase) for the web app; the manifest carries
/// a compact form in annotations (see [`ChangeSummary::annotations`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ChangeSummary {
    pub files: FileTotals,
    /// Distributions in `site-packages`/`dist-packages` (`*.dist-info`, `*.egg-info`).
    pub python: PackageChanges,
    /// Packages of conda environments (`<prefix>/conda-meta/*.json`).
    pub conda: PackageChanges,
    /// Installed packages of dpkg's database (`/var/lib/dpkg/status`).
    pub debian: PackageChanges,
    /// Package database files (absolute paths) too large to read: their packages are left out of
    /// the comparison. Empty but for pathological images.
    pub unknown: Vec<String>,
}

/// What the new layer did to the image's files (directories are not counted: a layer carries
/// the parents of every changed entry whether they changed or not).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FileTotals {
    /// Files, symlinks and other non-directories at paths the base image had none at.
    pub added: u64,
    /// Non-directories replacing the base image's at the same path.
    pub changed: u64,
    /// The base image's non-directories that are gone.
    pub deleted: u64,
    /// File content bytes of the added and changed files.
    pub written_bytes: u64,
    /// Sizes of the deleted files.
    pub deleted_bytes: u64,
}

impl From<LayerStats> for FileTotals {
    fn from(stats: LayerStats) -> Self {
        FileTotals {
            added: stats.added,
            changed: stats.changed,
            deleted: stats.deleted,
            written_bytes: stats.written_bytes,
            deleted_bytes: stats.deleted_bytes,
        }
    }
}

/// The package changes of one ecosystem, each list sorted by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PackageChanges {
    pub added: Vec<Package>,
    /// Version changes in either direction: a downgrade is listed here too.
    pub upgraded: Vec<Upgrade>,
    pub removed: Vec<Package>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Package {
    /// As the package's metadata spells it; Debian packages of `Multi-Arch: same` carry their
    /// architecture (`libc6:i386`), as dpkg names them.
    pub name: String,
    pub version: String,
    /// Where it is installed: the site-packages directory (Python), the environment's prefix
    /// (conda), `/` (Debian).
    pub location: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Upgrade {
    pub name: String,
    pub from: String,
    pub to: String,
    pub location: String,
}

/// Package ecosystems the summary knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ecosystem {
    Python,
    Conda,
    Debian,
}

impl Ecosystem {
    pub const ALL: [Ecosystem; 3] = [Ecosystem::Python, Ecosystem::Conda, Ecosystem::Debian];

    pub fn label(self) -> &'static str {
        match self {
            Ecosystem::Python => "python",
            Ecosystem::Conda => "conda",
            Ecosystem::Debian => "debian",
        }
    }

    /// How the ecosystem's own tools pin a version (`pip install a==1`, `conda install a=1`,
    /// `apt install a=1`), so a listed item can be pasted into a reinstall.
    pub fn pin(self) -> &'static str {
        match self {
            Ecosystem::Python => "==",
            Ecosystem::Conda | Ecosystem::Debian => "=",
        }
    }

    pub fn annotation(self) -> &'static str {
        match self {
            Ecosystem::Python => PYTHON_ANNOTATION,
            Ecosystem::Conda => CONDA_ANNOTATION,
            Ecosystem::Debian => DEBIAN_ANNOTATION,
        }
    }

    /// The key two versions of one package share.
    fn key(self, name: &str) -> String {
        match self {
            Ecosystem::Python => normalize_python_name(name),
            Ecosystem::Conda | Ecosystem::Debian => name.to_ascii_lowercase(),
        }
    }
}

impl ChangeSummary {
    pub fn packages(&self, ecosystem: Ecosystem) -> &PackageChanges {
        match ecosystem {
            Ecosystem::Python => &self.python,
            Ecosystem::Conda => &self.conda,
            Ecosystem::Debian => &self.debian,
        }
    }

    fn packages_mut(&mut self, ecosystem: Ecosystem) -> &mut PackageChanges {
        match ecosystem {
            Ecosystem::Python => &mut self.python,
            Ecosystem::Conda => &mut self.conda,
            Ecosystem::Debian => &mut self.debian,
        }
    }

    /// The compact package lines, one per ecosystem that changed: (`python`, `added: a==1.0; …`).
    pub fn package_lines(&self) -> Vec<(&'static str, String)> {
        Ecosystem::ALL
            .into_iter()
            .filter(|e| !self.packages(*e).is_empty())
            .map(|e| (e.label(), self.packages(e).compact(e.pin(), ANNOTATION_CAP)))
            .collect()
    }

    /// Manifest annotations: [`FILES_ANNOTATION`] always, one per ecosystem that changed, and
    /// [`UNKNOWN_ANNOTATION`] when a database could not be read. Each value is at most
    /// [`ANNOTATION_CAP`] bytes (`unknown` aside, which names at most a few paths).
    pub fn annotations(&self) -> BTreeMap<String, String> {
        let mut annotations = BTreeMap::from([(FILES_ANNOTATION.to_owned(), self.files.compact())]);
        for ecosystem in Ecosystem::ALL {
            let changes = self.packages(ecosystem);
            if !changes.is_empty() {
                annotations.insert(
                    ecosystem.annotation().to_owned(),
                    changes.compact(ecosystem.pin(), ANNOTATION_CAP),
                );
            }
        }
        if !self.unknown.is_empty() {
            annotations.insert(UNKNOWN_ANNOTATION.to_owned(), self.unknown.join(", "));
        }
        annotations
    }
}

impl FileTotals {
    /// `added: 12, changed: 3, deleted: 5; bytes written: 40960, bytes deleted: 1024`.
    pub fn compact(&self) -> String {
        format!(
            "added: {}, changed: {}, deleted: {}; bytes written: {}, bytes deleted: {}",
            self.added, self.changed, self.deleted, self.written_bytes, self.deleted_bytes
        )
    }
}

impl PackageChanges {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.upgraded.is_empty() && self.removed.is_empty()
    }

    /// `added: a==1.0, b==2.0; upgraded: c 1.0->2.0; removed: d==0.1` (with `pin` between name
    /// and version), at most `cap` bytes when it can be: every list is cut to the same length and
    /// says how many more it has (`added: a==1.0 (+41 more)`).
    pub fn compact(&self, pin: &str, cap: usize) -> String {
        let longest = self
            .added
            .len()
            .max(self.upgraded.len())
            .max(self.removed.len());
        let full = self.render(pin, longest);
        if full.len() <= cap {
            return full;
        }
        // The length grows with the items kept (but for the few bytes of a "(+N more)" going
        // away), so a binary search finds (nearly) the most that fit.
        let (mut fits, mut too_many) = (0, longest);
        while too_many - fits > 1 {
            let middle = (fits + too_many) / 2;
            if self.render(pin, middle).len() <= cap {
                fits = middle;
            } else {
                too_many = middle;
            }
        }
        self.render(pin, fits)
    }

    fn render(&self, pin: &str, keep: usize) -> String {
        let added: Vec<String> = self
            .added
            .iter()
            .map(|p| format!("{}{pin}{}", p.name, p.version))
            .collect();
        let upgraded: Vec<String> = self
            .upgraded
            .iter()
            .map(|u| format!("{} {}->{}", u.name, u.from, u.to))
            .collect();
        let removed: Vec<String> = self
            .removed
            .iter()
            .map(|p| format!("{}{pin}{}", p.name, p.version))
            .collect();
        [
            ("added", added),
            ("upgraded", upgraded),
            ("removed", removed),
        ]
        .into_iter()
        .filter(|(_, items)| !items.is_empty())
        .map(|(label, items)| {
            let shown = items.len().min(keep);
            let more = items.len() - shown;
            match (shown, more) {
                (0, n) => format!("{label}: {n} packages"),
                (_, 0) => format!("{label}: {}", items.join(", ")),
                (_, n) => format!("{label}: {} (+{n} more)", items[..shown].join(", ")),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
    }
}

/// The packages an image's package databases declare, by database file.
///
/// It follows layers with the index's semantics (whiteouts, opaque directories, replaced
/// directories), as a [`LayerObserver`] while a layer is applied to the index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackageSet {
    files: BTreeMap<PathBuf, Declared>,
}

/// (name, version) of each package a database file declares; `None` when the file was too large
/// to read.
type Declared = Option<Vec<(String, String)>>;

#[derive(Serialize)]
struct StoredSet<'a> {
    format: u32,
    files: &'a BTreeMap<PathBuf, Declared>,
}

#[derive(Deserialize)]
struct LoadedSet {
    format: u32,
    files: BTreeMap<PathBuf, Declared>,
}

impl PackageSet {
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// zstd-compressed JSON, for the cache.
    pub fn encode(&self) -> Vec<u8> {
        let stored = StoredSet {
            format: PACKAGE_SET_FORMAT,
            files: &self.files,
        };
        serde_json::to_vec(&stored)
            .ok()
            .and_then(|json| zstd::encode_all(&json[..], 3).ok())
            .unwrap_or_default()
    }

    /// A set [`PackageSet::encode`] wrote; `None` for anything else, including sets of another
    /// format (the caller rebuilds them).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let decoder = zstd::stream::read::Decoder::new(bytes).ok()?;
        let loaded: LoadedSet = serde_json::from_reader(BufReader::new(decoder)).ok()?;
        (loaded.format == PACKAGE_SET_FORMAT).then_some(PackageSet {
            files: loaded.files,
        })
    }

    fn forget(&mut self, path: &Path) {
        self.files.remove(path);
        self.forget_below(path);
    }

    fn forget_below(&mut self, dir: &Path) {
        let doomed: Vec<PathBuf> = self
            .files
            .range::<Path, _>((std::ops::Bound::Excluded(dir), std::ops::Bound::Unbounded))
            .take_while(|(p, _)| p.starts_with(dir))
            .map(|(p, _)| p.clone())
            .collect();
        for path in doomed {
            self.files.remove(&path);
        }
    }
}

impl LayerObserver for PackageSet {
    fn wants(&self, path: &Path) -> bool {
        Database::of(path).is_some()
    }

    fn removed(&mut self, path: &Path) {
        self.forget(path);
    }

    fn emptied(&mut self, dir: &Path) {
        self.forget_below(dir);
    }

    fn entry(
        &mut self,
        path: &Path,
        kind: EntryKind,
        content: Option<&mut dyn Read>,
    ) -> io::Result<()> {
        if kind == EntryKind::Dir {
            self.files.remove(path);
        } else {
            self.forget(path);
        }
        if let (Some(content), Some(database)) = (content, Database::of(path)) {
            let declared = database.read(path, content)?;
            self.files.insert(path.to_owned(), declared);
        }
        Ok(())
    }

    fn linked(&mut self, path: &Path, target: &Path) {
        self.forget(path);
        // The same content means the same packages only for the same kind of database.
        if let Some(database) = Database::of(path)
            && Database::of(target) == Some(database)
            && let Some(declared) = self.files.get(target).cloned()
        {
            self.files.insert(path.to_owned(), declared);
        }
    }
}

/// A package database file, recognised by its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Database {
    /// `<site>/<dist>-<version>.dist-info/METADATA`
    DistInfo,
    /// `<site>/<dist>.egg-info/PKG-INFO`, or `<site>/<dist>-<version>-py3.X.egg-info` as a file.
    EggInfo,
    /// `<prefix>/conda-meta/<name>-<version>-<build>.json`
    CondaMeta,
    /// `var/lib/dpkg/status`
    DpkgStatus,
}

impl Database {
    fn of(path: &Path) -> Option<Database> {
        let text = path.to_str()?;
        if text == "var/lib/dpkg/status" {
            return Some(Database::DpkgStatus);
        }
        let name = path.file_name()?.to_str()?;
        let parent = path.parent()?;
        let parent_name = parent.file_name().and_then(|n| n.to_str()).unwrap_or("");
        // Only installed distributions: vendored copies inside packages
        // (`setuptools/_vendor/*.dist-info`) are not what the environment has installed.
        let installed = |dist_dir: &Path| {
            dist_dir
                .parent()
                .and_then(|site| site.file_name())
                .is_some_and(|site| site == "site-packages" || site == "dist-packages")
        };
        if name == "METADATA" && parent_name.ends_with(".dist-info") && installed(parent) {
            Some(Database::DistInfo)
        } else if (name == "PKG-INFO" && parent_name.ends_with(".egg-info") && installed(parent))
            || (name.ends_with(".egg-info") && installed(path))
        {
            Some(Database::EggInfo)
        } else if name.ends_with(".json") && parent_name == "conda-meta" {
            Some(Database::CondaMeta)
        } else {
            None
        }
    }

    fn ecosystem(self) -> Ecosystem {
        match self {
            Database::DistInfo | Database::EggInfo => Ecosystem::Python,
            Database::CondaMeta => Ecosystem::Conda,
            Database::DpkgStatus => Ecosystem::Debian,
        }
    }

    /// Where the file's packages are installed, as an absolute path.
    fn location(self, path: &Path) -> String {
        let dir = match self {
            // `<site>/<dist>.dist-info/METADATA`, `<site>/<dist>.egg-info/PKG-INFO`
            Database::DistInfo | Database::CondaMeta => path.parent().and_then(Path::parent),
            Database::EggInfo if path.ends_with("PKG-INFO") => path.parent().and_then(Path::parent),
            Database::EggInfo => path.parent(),
            Database::DpkgStatus => None,
        };
        format!("/{}", dir.unwrap_or(Path::new("")).display())
    }

    /// The packages a database file declares; `None` when it is over its cap.
    fn read(self, path: &Path, content: &mut dyn Read) -> io::Result<Declared> {
        let found = match self {
            Database::DistInfo | Database::EggInfo => {
                parse_core_metadata(BufReader::new(content.take(CORE_METADATA_CAP)))?
                    .or_else(|| python_name_from_path(path))
            }
            Database::CondaMeta => parse_conda_record(content.take(CONDA_RECORD_CAP))
                .or_else(|| conda_name_from_file(path.file_name()?.to_str()?)),
            Database::DpkgStatus => return parse_dpkg_status(content),
        };
        Ok(Some(found.into_iter().collect()))
    }
}

/// `Name` and `Version` from the header section of Python core metadata (`METADATA`,
/// `PKG-INFO`); `None` when either is missing.
pub fn parse_core_metadata(mut input: impl BufRead) -> io::Result<Option<(String, String)>> {
    let (mut name, mut version) = (None, None);
    let mut line = Vec::new();
    while read_line_capped(&mut input, &mut line)? {
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        if text.is_empty() {
            break; // the end of the headers; the description follows
        }
        if text.starts_with([' ', '\t']) {
            continue; // a folded continuation of the previous header
        }
        if let Some((key, value)) = text.split_once(':') {
            let slot = match key.trim().to_ascii_lowercase().as_str() {
                "name" => &mut name,
                "version" => &mut version,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(clean(value));
            }
        }
        if name.is_some() && version.is_some() {
            break;
        }
    }
    Ok(name
        .zip(version)
        .filter(|(n, v): &(String, String)| !n.is_empty() && !v.is_empty()))
}

/// `name` and `version` of a conda package record (`conda-meta/*.json`), streamed: the rest of
/// the record (every file of the package) is skipped without being kept.
pub fn parse_conda_record(input: impl Read) -> Option<(String, String)> {
    #[derive(Deserialize)]
    struct Record {
        name: String,
        version: String,
    }
    let record: Record = serde_json::from_reader(BufReader::new(input)).ok()?;
    let (name, version) = (clean(&record.name), clean(&record.version));
    (!name.is_empty() && !version.is_empty()).then_some((name, version))
}

/// Name and version from a conda record's file name, `<name>-<version>-<build>.json` (names may
/// hold dashes, versions and builds may not): what conda itself calls the package's dist name.
fn conda_name_from_file(file: &str) -> Option<(String, String)> {
    let stem = file.strip_suffix(".json")?;
    let mut parts = stem.rsplitn(3, '-');
    let (_build, version, name) = (parts.next()?, parts.next()?, parts.next()?);
    (!name.is_empty() && !version.is_empty()).then(|| (clean(name), clean(version)))
}

/// Name and version from a distribution's directory or file name: `c-2.0.dist-info`,
/// `c-2.0-py3.11.egg-info` (no version in a development install's `c.egg-info`: `None`).
fn python_name_from_path(path: &Path) -> Option<(String, String)> {
    let file = path.file_name()?.to_str()?;
    let dist = if file == "METADATA" || file == "PKG-INFO" {
        path.parent()?.file_name()?.to_str()?
    } else {
        file
    };
    if let Some(stem) = dist.strip_suffix(".dist-info") {
        // Versions hold no dash (PEP 440); names in dist-info directories have underscores.
        let (name, version) = stem.rsplit_once('-')?;
        return Some((clean(name), clean(version)));
    }
    let stem = dist.strip_suffix(".egg-info")?;
    let mut parts = stem.split('-');
    let (name, version) = (parts.next()?, parts.next()?);
    Some((clean(name), clean(version)))
}

/// Installed packages of a dpkg status file, as (`binary:Package`, `Version`): stanzas whose
/// `Status` state is `installed` (whatever the selection: `install ok installed`,
/// `hold ok installed`), named with their architecture when `Multi-Arch: same`, as dpkg-query's
/// `${binary:Package}` does. `None` when the file is over [`DPKG_STATUS_CAP`].
pub fn parse_dpkg_status(input: impl Read) -> io::Result<Option<Vec<(String, String)>>> {
    #[derive(Default)]
    struct Stanza {
        package: String,
        version: String,
        status: String,
        architecture: String,
        multi_arch: String,
    }
    impl Stanza {
        fn installed(self) -> Option<(String, String)> {
            let state = self.status.split_whitespace().nth(2);
            if state != Some("installed") || self.package.is_empty() || self.version.is_empty() {
                return None;
            }
            let name = if self.multi_arch == "same" && !self.architecture.is_empty() {
                format!("{}:{}", self.package, self.architecture)
            } else {
                self.package
            };
            Some((name, self.version))
        }
    }

    let mut input = BufReader::new(input.take(DPKG_STATUS_CAP + 1));
    let mut installed = Vec::new();
    let mut stanza = Stanza::default();
    let mut line = Vec::new();
    loop {
        let more = read_line_capped(&mut input, &mut line)?;
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        if !more || text.trim().is_empty() {
            installed.extend(std::mem::take(&mut stanza).installed());
            if !more {
                break;
            }
            continue;
        }
        if text.starts_with([' ', '\t']) {
            continue; // descriptions and conffiles: continuation lines
        }
        if let Some((key, value)) = text.split_once(':') {
            let slot = match key {
                "Package" => &mut stanza.package,
                "Version" => &mut stanza.version,
                "Status" => &mut stanza.status,
                "Architecture" => &mut stanza.architecture,
                "Multi-Arch" => &mut stanza.multi_arch,
                _ => continue,
            };
            *slot = clean(value);
        }
    }
    if input.get_ref().limit() == 0 {
        return Ok(None);
    }
    installed.sort();
    Ok(Some(installed))
}

/// Reads one line into `line`, keeping at most [`LINE_CAP`] bytes of it (the rest is read and
/// dropped); `false` at the end of the input.
fn read_line_capped(input: &mut impl BufRead, line: &mut Vec<u8>) -> io::Result<bool> {
    line.clear();
    let mut read_any = false;
    loop {
        let available = match input.fill_buf() {
            Ok(available) => available,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        };
        if available.is_empty() {
            return Ok(read_any);
        }
        read_any = true;
        let (used, ended) = match available.iter().position(|b| *b == b'\n') {
            Some(end) => (end + 1, true),
            None => (available.len(), false),
        };
        let room = LINE_CAP.saturating_sub(line.len());
        line.extend_from_slice(&available[..used.min(room)]);
        input.consume(used);
        if ended {
            return Ok(true);
        }
    }
}

/// A name or version read from a file: trimmed, without control characters (it ends up on
/// terminals and in annotations), at most [`FIELD_CAP`] characters.
fn clean(value: &str) -> String {
    value
        .trim()
        .chars()
        .filter(|c| !c.is_control())
        .take(FIELD_CAP)
        .collect()
}

/// PEP 503: lowercase, runs of `-`, `_` and `.` become one `-` (`Foo.Bar_baz` is `foo-bar-baz`).
pub fn normalize_python_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut separator = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            separator = true;
            continue;
        }
        if separator && !out.is_empty() {
            out.push('-');
        }
        separator = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// Packages of one side of the comparison: (ecosystem, location, key) → (name, version).
struct Listing {
    packages: BTreeMap<(Ecosystem, String, String), (String, String)>,
    /// (ecosystem, location) of databases that could not be read, and their paths.
    unknown: BTreeMap<(Ecosystem, String), BTreeSet<String>>,
}

impl Listing {
    fn of(set: &PackageSet) -> Self {
        let mut listing = Listing {
            packages: BTreeMap::new(),
            unknown: BTreeMap::new(),
        };
        for (path, declared) in &set.files {
            let Some(database) = Database::of(path) else {
                continue;
            };
            let ecosystem = database.ecosystem();
            let location = database.location(path);
            match declared {
                // A broken install may leave two records of one package; the last path wins.
                Some(packages) => {
                    for (name, version) in packages {
                        listing.packages.insert(
                            (ecosystem, location.clone(), ecosystem.key(name)),
                            (name.clone(), version.clone()),
                        );
                    }
                }
                None => {
                    listing
                        .unknown
                        .entry((ecosystem, location))
                        .or_default()
                        .insert(format!("/{}", path.display()));
                }
            }
        }
        listing
    }
}

/// The summary of going from `before` (the parent image's packages) to `after` (the saved
/// image's), with the layer's file totals.
pub fn summarize(before: &PackageSet, after: &PackageSet, files: FileTotals) -> ChangeSummary {
    let (old, new) = (Listing::of(before), Listing::of(after));
    let mut summary = ChangeSummary {
        files,
        ..ChangeSummary::default()
    };
    let unknown_groups: BTreeSet<&(Ecosystem, String)> =
        old.unknown.keys().chain(new.unknown.keys()).collect();
    summary.unknown = old
        .unknown
        .values()
        .chain(new.unknown.values())
        .flatten()
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let keys: BTreeSet<&(Ecosystem, String, String)> =
        old.packages.keys().chain(new.packages.keys()).collect();
    for key in keys {
        let (ecosystem, location, _) = key;
        if unknown_groups.contains(&(*ecosystem, location.clone())) {
            continue;
        }
        let changes = summary.packages_mut(*ecosystem);
        let package = |(name, version): &(String, String)| Package {
            name: name.clone(),
            version: version.clone(),
            location: location.clone(),
        };
        match (old.packages.get(key), new.packages.get(key)) {
            (None, Some(added)) => changes.added.push(package(added)),
            (Some(removed), None) => changes.removed.push(package(removed)),
            (Some((_, from)), Some((name, to))) if from != to => changes.upgraded.push(Upgrade {
                name: name.clone(),
                from: from.clone(),
                to: to.clone(),
                location: location.clone(),
            }),
            _ => {}
        }
    }
    for ecosystem in Ecosystem::ALL {
        let changes = summary.packages_mut(ecosystem);
        let order = |name: &str, location: &str| (ecosystem.key(name), location.to_owned());
        changes.added.sort_by_key(|p| order(&p.name, &p.location));
        changes.removed.sort_by_key(|p| order(&p.name, &p.location));
        changes
            .upgraded
            .sort_by_key(|u| order(&u.name, &u.location));
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;
    use labforge_snapshot::BaselineIndex;

    #[test]
    fn core_metadata_gives_name_and_version_from_the_headers_only() {
        let metadata = "Metadata-Version: 2.1\nName: Foo.Bar\nSummary: a thing\n  folded: Version: 9\nVersion: 1.2.3\n\nName: not-a-header\n";
        assert_eq!(
            parse_core_metadata(metadata.as_bytes()).unwrap(),
            Some(("Foo.Bar".into(), "1.2.3".into()))
        );
        // The description after the blank line is never read as headers.
        let body_only = "Metadata-Version: 2.1\nName: x\n\nVersion: 1\n";
        assert_eq!(parse_core_metadata(body_only.as_bytes()).unwrap(), None);
        // CRLF, odd case, control characters.
        let windows = "name: wheel\x07\r\nVERSION:  0.42 \r\n";
        assert_eq!(
            parse_core_metadata(windows.as_bytes()).unwrap(),
            Some(("wheel".into(), "0.42".into()))
        );
    }

    #[test]
    fn a_huge_metadata_line_is_cut_not_kept() {
        let mut metadata = format!("Name: {}\nVersion: 1\n", "n".repeat(10 * LINE_CAP));
        metadata.push_str("\nbody");
        let (name, version) = parse_core_metadata(metadata.as_bytes()).unwrap().unwrap();
        assert_eq!((name.len(), version.as_str()), (FIELD_CAP, "1"));
    }

    #[test]
    fn conda_records_stream_past_the_file_lists() {
        let record = r#"{"build":"py311_0","depends":["python"],"files":["a","b"],
            "paths_data":{"paths":[{"_path":"a"}]},"name":"numpy","version":"1.26.4"}"#;
        assert_eq!(
            parse_conda_record(record.as_bytes()),
            Some(("numpy".into(), "1.26.4".into()))
        );
        assert_eq!(parse_conda_record(&b"{\"name\": \"x\""[..]), None);
        assert_eq!(
            conda_name_from_file("ca-certificates-2024.2.2-h06a4308_0.json"),
            Some(("ca-certificates".into(), "2024.2.2".into()))
        );
        assert_eq!(conda_name_from_file("history"), None);
    }

    #[test]
    fn python_names_come_from_paths_when_metadata_has_none() {
        let path = |p: &str| python_name_from_path(Path::new(p));
        assert_eq!(
            path("site-packages/typing_extensions-4.12.2.dist-info/METADATA"),
            Some(("typing_extensions".into(), "4.12.2".into()))
        );
        assert_eq!(
            path("dist-packages/six-1.16.0-py3.11.egg-info"),
            Some(("six".into(), "1.16.0".into()))
        );
        assert_eq!(path("site-packages/dev.egg-info/PKG-INFO"), None);
    }

    #[test]
    fn dpkg_status_lists_installed_packages_with_multi_arch_names() {
        let status = "\
Package: base-files
Status: install ok installed
Version: 12.4+deb12u5
Architecture: amd64
Description: Debian base system
 miscellaneous files
 Version: 0 (a continuation line, not a field)

Package: old
Status: deinstall ok config-files
Version: 1.0

Package: libc6
Status: hold ok installed
Multi-Arch: same
Architecture: i386
Version: 2.36-9

Package: half
Status: install reinstreq half-installed
Version: 3
";
        assert_eq!(
            parse_dpkg_status(status.as_bytes()).unwrap(),
            Some(vec![
                ("base-files".into(), "12.4+deb12u5".into()),
                ("libc6:i386".into(), "2.36-9".into()),
            ])
        );
    }

    #[test]
    fn a_dpkg_status_over_the_cap_is_unknown() {
        let huge = std::io::repeat(b'x').take(DPKG_STATUS_CAP + 10);
        assert_eq!(parse_dpkg_status(huge).unwrap(), None);
    }

    #[test]
    fn python_names_are_normalized_for_comparison() {
        assert_eq!(normalize_python_name("Foo.Bar__baz"), "foo-bar-baz");
        assert_eq!(
            normalize_python_name("typing_extensions"),
            "typing-extensions"
        );
    }

    #[test]
    fn databases_are_recognised_by_path_and_vendored_copies_are_not() {
        let of = |p: &str| Database::of(Path::new(p));
        let site = "opt/conda/lib/python3.11/site-packages";
        assert_eq!(
            of(&format!("{site}/a-1.0.dist-info/METADATA")),
            Some(Database::DistInfo)
        );
        assert_eq!(
            of("usr/lib/python3/dist-packages/b.egg-info/PKG-INFO"),
            Some(Database::EggInfo)
        );
        assert_eq!(
            of(&format!("{site}/c-1.0-py3.11.egg-info")),
            Some(Database::EggInfo)
        );
        assert_eq!(
            of("opt/conda/conda-meta/zlib-1.3-h0_0.json"),
            Some(Database::CondaMeta)
        );
        assert_eq!(of("var/lib/dpkg/status"), Some(Database::DpkgStatus));
        assert_eq!(of("srv/var/lib/dpkg/status"), None);
        assert_eq!(
            of(&format!(
                "{site}/setuptools/_vendor/jaraco.text-3.12.1.dist-info/METADATA"
            )),
            None
        );
        assert_eq!(of(&format!("{site}/a-1.0.dist-info/RECORD")), None);
        assert_eq!(
            Database::DistInfo.location(Path::new(&format!("{site}/a-1.0.dist-info/METADATA"))),
            format!("/{site}")
        );
        assert_eq!(
            Database::CondaMeta.location(Path::new("opt/conda/conda-meta/z-1-h.json")),
            "/opt/conda"
        );
        assert_eq!(
            Database::DpkgStatus.location(Path::new("var/lib/dpkg/status")),
            "/"
        );
    }

    /// (database path, its packages or `None` for unreadable)
    type Files<'a> = [(&'a str, Option<&'a [(&'a str, &'a str)]>)];

    fn set(entries: &Files) -> PackageSet {
        PackageSet {
            files: entries
                .iter()
                .map(|(path, packages)| {
                    (
                        PathBuf::from(path),
                        packages.map(|p| {
                            p.iter()
                                .map(|(n, v)| (n.to_string(), v.to_string()))
                                .collect()
                        }),
                    )
                })
                .collect(),
        }
    }

    const SITE: &str = "usr/lib/python3/site-packages";

    #[test]
    fn the_diff_lists_added_upgraded_downgraded_and_removed_packages() {
        let before = set(&[
            (
                &format!("{SITE}/a-1.0.dist-info/METADATA"),
                Some(&[("a", "1.0")]),
            ),
            (
                &format!("{SITE}/b-1.0.dist-info/METADATA"),
                Some(&[("b", "1.0")]),
            ),
            (
                &format!("{SITE}/C-1.0.dist-info/METADATA"),
                Some(&[("C", "1.0")]),
            ),
            (
                &format!("{SITE}/down-2.0.dist-info/METADATA"),
                Some(&[("down", "2.0")]),
            ),
            (
                "var/lib/dpkg/status",
                Some(&[("curl", "7.88"), ("libc6", "2.36"), ("vim", "9.0")]),
            ),
            (
                "opt/conda/conda-meta/zlib-1.2-h_0.json",
                Some(&[("zlib", "1.2")]),
            ),
        ]);
        let after = set(&[
            (
                &format!("{SITE}/a-1.0.dist-info/METADATA"),
                Some(&[("a", "1.0")]),
            ),
            (
                &format!("{SITE}/c-2.0.dist-info/METADATA"),
                Some(&[("c", "2.0")]),
            ),
            (
                &format!("{SITE}/down-1.5.dist-info/METADATA"),
                Some(&[("down", "1.5")]),
            ),
            (
                &format!("{SITE}/e-3.0.dist-info/METADATA"),
                Some(&[("e", "3.0")]),
            ),
            (
                &format!("{SITE}/d-0.1.dist-info/METADATA"),
                Some(&[("d", "0.1")]),
            ),
            (
                "var/lib/dpkg/status",
                Some(&[("curl", "7.88"), ("git", "2.39"), ("libc6", "2.37")]),
            ),
            (
                "opt/conda/conda-meta/zlib-1.2-h_0.json",
                Some(&[("zlib", "1.2")]),
            ),
            (
                "opt/conda/conda-meta/xz-5.4-h_0.json",
                Some(&[("xz", "5.4")]),
            ),
        ]);
        let files = FileTotals {
            added: 5,
            ..FileTotals::default()
        };
        let summary = summarize(&before, &after, files);
        let location = format!("/{SITE}");
        let package = |name: &str, version: &str, location: &str| Package {
            name: name.into(),
            version: version.into(),
            location: location.into(),
        };
        let upgrade = |name: &str, from: &str, to: &str, location: &str| Upgrade {
            name: name.into(),
            from: from.into(),
            to: to.into(),
            location: location.into(),
        };
        assert_eq!(
            summary.python,
            PackageChanges {
                added: vec![
                    package("d", "0.1", &location),
                    package("e", "3.0", &location)
                ],
                upgraded: vec![
                    upgrade("c", "1.0", "2.0", &location),
                    upgrade("down", "2.0", "1.5", &location)
                ],
                removed: vec![package("b", "1.0", &location)],
            }
        );
        assert_eq!(
            summary.debian,
            PackageChanges {
                added: vec![package("git", "2.39", "/")],
                upgraded: vec![upgrade("libc6", "2.36", "2.37", "/")],
                removed: vec![package("vim", "9.0", "/")],
            }
        );
        assert_eq!(
            summary.conda.added,
            vec![package("xz", "5.4", "/opt/conda")]
        );
        assert!(summary.conda.upgraded.is_empty() && summary.conda.removed.is_empty());
        assert_eq!(summary.files, files);

        let annotations = summary.annotations();
        assert_eq!(
            annotations[PYTHON_ANNOTATION],
            "added: d==0.1, e==3.0; upgraded: c 1.0->2.0, down 2.0->1.5; removed: b==1.0"
        );
        assert_eq!(
            annotations[DEBIAN_ANNOTATION],
            "added: git=2.39; upgraded: libc6 2.36->2.37; removed: vim=9.0"
        );
        assert_eq!(annotations[CONDA_ANNOTATION], "added: xz=5.4");
        assert_eq!(
            annotations[FILES_ANNOTATION],
            "added: 5, changed: 0, deleted: 0; bytes written: 0, bytes deleted: 0"
        );
        assert!(!annotations.contains_key(UNKNOWN_ANNOTATION));
    }

    #[test]
    fn the_same_name_in_two_environments_is_two_packages() {
        let before = set(&[(
            "usr/lib/python3/dist-packages/six-1.16.0.dist-info/METADATA",
            Some(&[("six", "1.16.0")]),
        )]);
        let mut after = before.clone();
        after.files.insert(
            PathBuf::from("opt/conda/lib/python3.11/site-packages/six-1.17.0.dist-info/METADATA"),
            Some(vec![("six".into(), "1.17.0".into())]),
        );
        let summary = summarize(&before, &after, FileTotals::default());
        assert_eq!(summary.python.added.len(), 1);
        assert_eq!(
            summary.python.added[0].location,
            "/opt/conda/lib/python3.11/site-packages"
        );
        assert!(summary.python.upgraded.is_empty());
    }

    #[test]
    fn an_unreadable_database_is_named_and_not_compared() {
        let before = set(&[("var/lib/dpkg/status", Some(&[("vim", "9.0")]))]);
        let after = set(&[("var/lib/dpkg/status", None)]);
        let summary = summarize(&before, &after, FileTotals::default());
        assert!(summary.debian.is_empty(), "not reported as removed");
        assert_eq!(summary.unknown, ["/var/lib/dpkg/status"]);
        assert_eq!(
            summary.annotations()[UNKNOWN_ANNOTATION],
            "/var/lib/dpkg/status"
        );
    }

    #[test]
    fn long_lists_are_cut_evenly_and_say_how_many_more() {
        let many = |prefix: &str, n: usize| -> Vec<Package> {
            (0..n)
                .map(|i| Package {
                    name: format!("{prefix}-package-{i:04}"),
                    version: "1.0.0".into(),
                    location: "/".into(),
                })
                .collect()
        };
        let changes = PackageChanges {
            added: many("new", 1500),
            upgraded: vec![Upgrade {
                name: "only".into(),
                from: "1".into(),
                to: "2".into(),
                location: "/".into(),
            }],
            removed: many("old", 40),
        };
        let text = changes.compact("=", ANNOTATION_CAP);
        assert!(text.len() <= ANNOTATION_CAP, "{} bytes", text.len());
        assert!(text.len() > ANNOTATION_CAP - 100, "uses the room: {text}");
        assert!(
            text.starts_with("added: new-package-0000=1.0.0, "),
            "{text}"
        );
        assert!(
            text.contains("; upgraded: only 1->2; removed: old-package-0000=1.0.0"),
            "{text}"
        );
        let kept = text.matches("new-package").count();
        assert!(text.contains(&format!("(+{} more)", 1500 - kept)), "{text}");
        assert_eq!(
            text.matches("old-package").count(),
            kept,
            "both lists cut to the same length"
        );
        // No room at all: counts only.
        assert_eq!(
            changes.compact("=", 10),
            "added: 1500 packages; upgraded: 1 packages; removed: 40 packages"
        );
    }

    #[test]
    fn the_summary_serializes_in_camel_case_for_the_web_app() {
        let summary = ChangeSummary {
            files: FileTotals {
                written_bytes: 3,
                ..FileTotals::default()
            },
            ..ChangeSummary::default()
        };
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["files"]["writtenBytes"], 3);
        assert_eq!(json["python"]["upgraded"], serde_json::json!([]));
        assert_eq!(
            serde_json::from_value::<ChangeSummary>(json).unwrap(),
            summary
        );
    }

    /// An uncompressed layer from (path, body); directories end with `/`, whiteouts are files.
    fn layer(entries: &[(&str, &str)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, body) in entries {
            let mut header = tar::Header::new_gnu();
            let dir = path.ends_with('/');
            header.set_entry_type(if dir {
                tar::EntryType::Directory
            } else {
                tar::EntryType::Regular
            });
            header.set_mode(0o644);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(1_700_000_000);
            header.set_size(body.len() as u64);
            builder
                .append_data(&mut header, path, body.as_bytes())
                .unwrap();
        }
        builder.into_inner().unwrap()
    }

    fn metadata(name: &str, version: &str) -> String {
        format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nA long description.\n")
    }

    #[test]
    fn a_package_set_follows_layers_like_the_index() {
        let site = "opt/env/lib/python3.11/site-packages";
        let (a, b, c1) = (
            metadata("a", "1.0"),
            metadata("b", "1.0"),
            metadata("c", "1.0"),
        );
        let base = layer(&[
            (&format!("{site}/a-1.0.dist-info/METADATA"), &a),
            (&format!("{site}/b-1.0.dist-info/METADATA"), &b),
            (&format!("{site}/c-1.0.dist-info/METADATA"), &c1),
            (
                &format!("{site}/c-1.0.dist-info/RECORD"),
                "c/__init__.py,,\n",
            ),
            (
                "opt/conda/conda-meta/zlib-1.2-h_0.json",
                r#"{"name":"zlib","version":"1.2"}"#,
            ),
            (
                "var/lib/dpkg/status",
                "Package: vim\nStatus: install ok installed\nVersion: 9.0\n",
            ),
        ]);
        let mut index = BaselineIndex::default();
        let mut before = PackageSet::default();
        index
            .apply_layer_with(0, &base[..], true, &mut before)
            .unwrap();

        // pip uninstall b, upgrade c (its old directory goes), add d; conda's prefix rebuilt
        // (an opaque whiteout), dpkg's status rewritten.
        let (c2, d) = (metadata("c", "2.0"), metadata("d", "0.1"));
        let top = layer(&[
            (&format!("{site}/.wh.b-1.0.dist-info"), ""),
            (&format!("{site}/.wh.c-1.0.dist-info"), ""),
            ("opt/conda/conda-meta/.wh..wh..opq", ""),
            (&format!("{site}/c-2.0.dist-info/METADATA"), &c2),
            (&format!("{site}/d-0.1.dist-info/METADATA"), &d),
            (
                "opt/conda/conda-meta/xz-5.4-h_0.json",
                "not json: the file name tells",
            ),
            (
                "var/lib/dpkg/status",
                "Package: vim\nStatus: install ok installed\nVersion: 9.1\n\n\
                 Package: git\nStatus: install ok installed\nVersion: 2.39\n",
            ),
        ]);
        let mut after = before.clone();
        let stats = index
            .apply_layer_with(1, &top[..], false, &mut after)
            .unwrap();
        let summary = summarize(&before, &after, stats.into());
        let lines: BTreeMap<_, _> = summary.package_lines().into_iter().collect();
        assert_eq!(
            lines["python"],
            "added: d==0.1; upgraded: c 1.0->2.0; removed: b==1.0"
        );
        assert_eq!(lines["conda"], "added: xz=5.4; removed: zlib=1.2");
        assert_eq!(lines["debian"], "added: git=2.39; upgraded: vim 9.0->9.1");
        assert_eq!(
            (
                summary.files.added,
                summary.files.changed,
                summary.files.deleted
            ),
            (3, 1, 4),
            "c-2.0, d, xz added; status changed; b, c-1.0 (2 files), zlib deleted"
        );

        // The cache keeps the set as it is.
        assert_eq!(PackageSet::decode(&after.encode()), Some(after));
        assert_eq!(PackageSet::decode(b"not zstd"), None);
    }
}
