//! The snapshot contract: the index of an image plus the layer written from a scan of a changed
//! root is exactly the index of that root, for a corpus of tricky changes.
#![allow(clippy::unwrap_used)]

use labforge_snapshot::protocol::ChangeSetHeader;
use labforge_snapshot::{
    BaselineIndex, ChangeSet, EntryKind, LayerStats, NoObserver, ScanOptions, scan,
    write_change_set,
};
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

fn layer_of(root: &Path, changes: &ChangeSet) -> Vec<u8> {
    let (tar, _) = write_change_set(root, changes, Vec::new(), |_, _| {}).unwrap();
    tar
}

/// The index of `root` as a single layer holding all of it.
fn full_index(root: &Path) -> BaselineIndex {
    let everything = scan(
        root,
        &BaselineIndex::default(),
        &ScanOptions::default(),
        |_| {},
    )
    .unwrap();
    let mut index = BaselineIndex::default();
    index
        .apply_layer(0, &layer_of(root, &everything)[..])
        .unwrap();
    index
}

fn write(root: &Path, rel: &str, body: &str) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, body).unwrap();
}

fn base_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "etc/motd", "hello");
    write(root, "opt/pkg/a.py", "a");
    write(root, "opt/pkg/b.py", "bb");
    write(root, "opt/pkg/sub/c.py", "ccc");
    write(root, "opt/keep/k.txt", "k");
    write(root, "var/cache/x/1", "1");
    write(root, "var/lib/file-becomes-dir", "f");
    write(root, "srv/old/tree/deep.txt", "deep");
    write(root, "usr/bin/tool", "#!/bin/sh\n");
    symlink("tool", root.join("usr/bin/alias")).unwrap();
    fs::create_dir_all(root.join("home/jovyan/work")).unwrap();
    write(root, "home/jovyan/work/notes.txt", "mounted workspace");
    dir
}

const LONG: &str = "a-very-long-directory-name-that-is-well-past-one-hundred-bytes-so-ustar-cannot-hold-it-in-its-name-field";

fn mutate(root: &Path) {
    // Deletions: a file, and a whole tree (one whiteout for its top).
    fs::remove_file(root.join("etc/motd")).unwrap();
    fs::remove_dir_all(root.join("srv/old")).unwrap();
    // A directory removed and recreated with new content: an opaque whiteout.
    fs::remove_dir_all(root.join("opt/pkg")).unwrap();
    write(root, "opt/pkg/new.py", "new");
    // Directory replaced by a file and file replaced by a directory.
    fs::remove_dir_all(root.join("var/cache/x")).unwrap();
    write(root, "var/cache/x", "now a file");
    fs::remove_file(root.join("var/lib/file-becomes-dir")).unwrap();
    write(root, "var/lib/file-becomes-dir/inside", "i");
    // A symlink retargeted, a new one, hardlinks, a setuid binary, an empty dir, a fifo.
    fs::remove_file(root.join("usr/bin/alias")).unwrap();
    symlink("../../etc/elsewhere", root.join("usr/bin/alias")).unwrap();
    symlink("/nonexistent/dangling", root.join("usr/bin/dangling")).unwrap();
    write(root, "usr/bin/twin-a", "twins");
    fs::hard_link(root.join("usr/bin/twin-a"), root.join("usr/bin/twin-b")).unwrap();
    fs::set_permissions(
        root.join("usr/bin/tool"),
        fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    fs::create_dir_all(root.join("usr/share/empty")).unwrap();
    let fifo = root.join("usr/share/fifo");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    // Long and unicode names, and a long symlink target.
    write(root, &format!("{LONG}/{LONG}/{LONG}/file.txt"), "long");
    write(root, "données/naïve-文件.txt", "unicode");
    symlink(
        format!("{LONG}/{LONG}/{LONG}/file.txt"),
        root.join("long-link"),
    )
    .unwrap();
    // An extended attribute on a new file.
    write(root, "opt/keep/caps.bin", "x");
    xattr_set(
        &root.join("opt/keep/caps.bin"),
        "user.labforge.test",
        b"kept",
    );
    // Under a mount point (here: an ignored path): neither saved nor deleted.
    fs::remove_file(root.join("home/jovyan/work/notes.txt")).unwrap();
    write(root, "home/jovyan/work/scratch.txt", "not saved");
}

fn xattr_set(path: &Path, name: &str, value: &[u8]) {
    xattr::set(path, name, value).unwrap();
}

fn without(index: &BaselineIndex, prefix: &str) -> Vec<(PathBuf, labforge_snapshot::IndexEntry)> {
    index
        .iter()
        .filter(|(p, _)| !p.starts_with(prefix))
        .map(|(p, e)| (p.clone(), e.clone()))
        .collect()
}

#[test]
fn base_index_plus_change_layer_equals_index_of_the_changed_tree() {
    let tree = base_tree();
    let root = tree.path();
    let baseline = full_index(root);
    mutate(root);

    let options = ScanOptions {
        ignore: vec![PathBuf::from("/home/jovyan/work")],
        ..Default::default()
    };
    let changes = scan(root, &baseline, &options, |_| {}).unwrap();
    assert_eq!(changes.opaque, [PathBuf::from("opt/pkg")]);
    assert_eq!(
        changes.deleted,
        [PathBuf::from("etc/motd"), PathBuf::from("srv/old")]
    );
    let replaced: Vec<_> = changes
        .entries
        .iter()
        .filter(|e| e.replaces)
        .map(|e| e.path.display().to_string())
        .collect();
    assert_eq!(replaced, ["var/cache/x", "var/lib/file-becomes-dir"]);
    assert_eq!(changes.skipped, [PathBuf::from("home/jovyan/work")]);

    let layer = layer_of(root, &changes);
    let mut saved = baseline.clone();
    saved.apply_layer(1, &layer[..]).unwrap();
    let expected = full_index(root);
    // The ignored workspace keeps what the image had there, whatever happens under the mount.
    assert_eq!(
        without(&saved, "home/jovyan/work"),
        without(&expected, "home/jovyan/work")
    );
    assert_eq!(
        saved
            .get(Path::new("home/jovyan/work/notes.txt"))
            .map(|e| e.kind),
        Some(EntryKind::File)
    );
    assert!(
        saved
            .get(Path::new("home/jovyan/work/scratch.txt"))
            .is_none()
    );

    let tool = saved.get(Path::new("usr/bin/tool")).unwrap();
    assert_eq!(tool.mode, 0o4755, "setuid bit kept");
    let long = format!("{LONG}/{LONG}/{LONG}/file.txt");
    assert_eq!(saved.get(Path::new(&long)).unwrap().size, 4);
    assert_eq!(
        saved.get(Path::new("long-link")).unwrap().link(),
        Some(Path::new(&long))
    );
    assert_eq!(
        saved.get(Path::new("opt/keep/caps.bin")).unwrap().xattrs()["user.labforge.test"],
        b"kept"
    );
    assert_eq!(
        saved.get(Path::new("usr/share/fifo")).unwrap().kind,
        EntryKind::Fifo
    );
}

/// Non-directory paths of an index, with their sizes.
fn non_directories(index: &BaselineIndex) -> std::collections::BTreeMap<PathBuf, u64> {
    index
        .iter()
        .filter(|(_, e)| e.kind != EntryKind::Dir)
        .map(|(p, e)| (p.clone(), e.size))
        .collect()
}

#[test]
fn layer_stats_agree_with_the_indexes_before_and_after() {
    use std::os::unix::fs::MetadataExt;
    let tree = base_tree();
    let root = tree.path();
    let baseline = full_index(root);
    mutate(root);
    let options = ScanOptions {
        ignore: vec![PathBuf::from("/home/jovyan/work")],
        ..Default::default()
    };
    let changes = scan(root, &baseline, &options, |_| {}).unwrap();
    let in_layer: std::collections::BTreeSet<&Path> =
        changes.entries.iter().map(|e| e.path.as_path()).collect();
    // Hardlinked names carry their body once.
    let mut inodes = std::collections::HashSet::new();
    let written: u64 = changes
        .entries
        .iter()
        .filter(|e| e.meta.is_file() && inodes.insert((e.meta.dev(), e.meta.ino())))
        .map(|e| e.meta.len())
        .sum();

    let mut saved = baseline.clone();
    let stats = saved
        .apply_layer_with(1, &layer_of(root, &changes)[..], false, &mut NoObserver)
        .unwrap();

    // Counted independently: what was a non-directory before and after, and what the layer wrote.
    let (before, after) = (non_directories(&baseline), non_directories(&saved));
    let added = after.keys().filter(|p| !before.contains_key(*p)).count();
    let changed = after
        .keys()
        .filter(|p| before.contains_key(*p) && in_layer.contains(p.as_path()))
        .count();
    let deleted: Vec<&PathBuf> = before.keys().filter(|p| !after.contains_key(*p)).collect();
    assert_eq!(
        stats,
        LayerStats {
            added: added as u64,
            changed: changed as u64,
            deleted: deleted.len() as u64,
            written_bytes: written,
            deleted_bytes: deleted.iter().map(|p| before[*p]).sum(),
        }
    );
    // The corpus has every kind: deletions (a file, a tree, an opaque directory's old files, a
    // file that became a directory), in-place changes (a retargeted symlink, a chmod), new files.
    assert!(
        stats.added > 5 && stats.changed >= 2 && stats.deleted >= 5,
        "{stats:?}"
    );
}

#[test]
fn no_change_means_an_empty_change_set_and_a_stable_key() {
    let tree = base_tree();
    let root = tree.path();
    let baseline = full_index(root);
    let first = scan(root, &baseline, &ScanOptions::default(), |_| {}).unwrap();
    assert!(first.is_empty(), "{first:?}");
    assert_eq!(first.scanned, baseline.len() as u64);

    write(root, "opt/keep/new.txt", "x");
    let a = scan(root, &baseline, &ScanOptions::default(), |_| {}).unwrap();
    let b = scan(root, &baseline, &ScanOptions::default(), |_| {}).unwrap();
    assert_eq!(
        a.key("sha256:p"),
        b.key("sha256:p"),
        "same changes, same key"
    );
    assert_ne!(
        a.key("sha256:p"),
        a.key("sha256:q"),
        "the parent is part of the key"
    );
    // Rewriting a file with the same size and mtime still moves its ctime, hence the key.
    let mtime = fs::metadata(root.join("opt/keep/new.txt"))
        .unwrap()
        .modified()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(root.join("opt/keep/new.txt"), "y").unwrap();
    fs::File::options()
        .write(true)
        .open(root.join("opt/keep/new.txt"))
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let c = scan(root, &baseline, &ScanOptions::default(), |_| {}).unwrap();
    assert_ne!(a.key("sha256:p"), c.key("sha256:p"));
}

#[test]
fn content_verification_finds_a_same_size_same_mtime_rewrite() {
    let tree = base_tree();
    let root = tree.path();
    let baseline = full_index(root);
    let path = root.join("opt/keep/k.txt");
    let mtime = fs::metadata(&path).unwrap().modified().unwrap();
    fs::write(&path, "K").unwrap();
    fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let quick = scan(root, &baseline, &ScanOptions::default(), |_| {}).unwrap();
    assert!(quick.is_empty(), "metadata alone cannot see it");
    let paranoid = ScanOptions {
        verify_content: true,
        ..Default::default()
    };
    let verified = scan(root, &baseline, &paranoid, |_| {}).unwrap();
    let paths: Vec<_> = verified.entries.iter().map(|e| e.path.clone()).collect();
    assert_eq!(paths, [PathBuf::from("opt/keep/k.txt")]);
}

#[test]
fn mount_points_from_mountinfo_are_skipped() {
    let tree = base_tree();
    let root = tree.path();
    let baseline = full_index(root);
    write(root, "var/cache/x/2", "added under a mount");
    let mountinfo = tree.path().join("mountinfo");
    fs::write(
        &mountinfo,
        format!(
            "22 1 0:21 / / rw - overlay overlay rw\n30 22 0:40 / {} rw - tmpfs tmpfs rw\n",
            root.join("var/cache").display()
        ),
    )
    .unwrap();
    let options = ScanOptions {
        mountinfo: Some(mountinfo),
        ignore: vec![PathBuf::from("/mountinfo")],
        ..Default::default()
    };
    let changes = scan(root, &baseline, &options, |_| {}).unwrap();
    assert!(changes.is_empty(), "{changes:?}");
    assert_eq!(
        changes.skipped,
        [PathBuf::from("mountinfo"), PathBuf::from("var/cache")]
    );
}

#[test]
fn header_line_round_trips_and_leaves_the_tar_in_place() {
    let tree = base_tree();
    let root = tree.path();
    let changes = scan(
        root,
        &BaselineIndex::default(),
        &ScanOptions::default(),
        |_| {},
    )
    .unwrap();
    let mut stream = Vec::new();
    let header = ChangeSetHeader::new(&changes, "sha256:parent");
    header.write_line(&mut stream).unwrap();
    stream.extend_from_slice(&layer_of(root, &changes));
    let mut reader = std::io::BufReader::new(&stream[..]);
    assert_eq!(ChangeSetHeader::read_line(&mut reader).unwrap(), header);
    let mut index = BaselineIndex::default();
    index.apply_layer(0, reader).unwrap();
    assert_eq!(index.len() as u64, header.changed);
    assert!(ChangeSetHeader::read_line(&b""[..]).is_err());
}

#[test]
fn unreadable_file_is_reported_by_path() {
    let tree = base_tree();
    let root = tree.path();
    let changes = scan(
        root,
        &BaselineIndex::default(),
        &ScanOptions::default(),
        |_| {},
    )
    .unwrap();
    fs::remove_file(root.join("usr/bin/tool")).unwrap();
    let err = write_change_set(root, &changes, Vec::new(), |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("usr/bin/tool"), "{err}");
}

#[test]
fn every_entry_comes_with_its_parent_directories_as_they_are() {
    let base = base_tree();
    let root = base.path();
    fs::set_permissions(root.join("opt/pkg"), fs::Permissions::from_mode(0o775)).unwrap();
    let index = full_index(root);
    // Only a file deep in an unchanged directory, and a deletion in another.
    fs::write(root.join("opt/pkg/sub/c.py"), "changed").unwrap();
    fs::remove_file(root.join("var/cache/x/1")).unwrap();
    let changes = scan(root, &index, &ScanOptions::default(), |_| {}).unwrap();
    let tar = layer_of(root, &changes);
    let mut archive = tar::Archive::new(&tar[..]);
    let entries: Vec<(String, u32, tar::EntryType)> = archive
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let path = e
                .path()
                .unwrap()
                .to_string_lossy()
                .trim_end_matches('/')
                .to_owned();
            (path, e.header().mode().unwrap(), e.header().entry_type())
        })
        .collect();
    let position = |p: &str| entries.iter().position(|e| e.0 == p);
    for dir in [
        "opt",
        "opt/pkg",
        "opt/pkg/sub",
        "var",
        "var/cache",
        "var/cache/x",
    ] {
        let i = position(dir).unwrap_or_else(|| panic!("{dir} missing from {entries:?}"));
        assert_eq!(entries[i].2, tar::EntryType::Directory);
        // Each appears once, before what is inside it.
        assert_eq!(entries.iter().filter(|e| e.0 == dir).count(), 1, "{dir}");
    }
    assert_eq!(entries[position("opt/pkg").unwrap()].1, 0o775);
    assert!(position("opt/pkg").unwrap() < position("opt/pkg/sub/c.py").unwrap());
    assert!(position("var/cache/x").unwrap() < position("var/cache/x/.wh.1").unwrap());
    // Unchanged siblings stay out.
    assert_eq!(position("opt/keep"), None);
    assert_eq!(position("etc"), None);
}
