//! SFTP over a session channel: what `scp` (OpenSSH 9 and later), `sftp` and editors' remote
//! file views speak. The container's files, as the container's user sees them; relative paths
//! start at the user's home.

use russh_sftp::protocol::{
    Attrs, Data, File, FileAttributes, Handle, Name, OpenFlags, Status, StatusCode, Version,
};
use russh_sftp::server::StatusReply;
use std::collections::HashMap;
use std::io::{ErrorKind, SeekFrom};
use std::path::{Path, PathBuf};
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _, AsyncWriteExt as _};

/// Largest read answered at once (what OpenSSH asks for).
const MAX_READ: u32 = 256 * 1024;
/// Directory entries per READDIR answer.
const ENTRIES_PER_ANSWER: usize = 128;

/// An error as SFTP reports it: a status and the OS's words.
pub struct Failure(StatusCode, String);

impl From<std::io::Error> for Failure {
    fn from(err: std::io::Error) -> Self {
        let code = match err.kind() {
            ErrorKind::NotFound => StatusCode::NoSuchFile,
            ErrorKind::PermissionDenied => StatusCode::PermissionDenied,
            _ => StatusCode::Failure,
        };
        Self(code, err.to_string())
    }
}

impl From<Failure> for StatusReply {
    fn from(Failure(code, message): Failure) -> Self {
        StatusReply::from(code).with_message(message)
    }
}

fn no_handle() -> Failure {
    Failure(StatusCode::Failure, "no such handle".into())
}

fn ok(id: u32) -> Status {
    Status {
        id,
        status_code: StatusCode::Ok,
        error_message: "Ok".into(),
        language_tag: "en-US".into(),
    }
}

enum Open {
    File(tokio::fs::File),
    /// A directory's entries not yet listed; `None` once the listing began with `.` and `..`.
    Dir(Option<PathBuf>, Vec<File>),
}

/// The open files and directories of one SFTP session.
#[derive(Default)]
pub struct Files {
    open: HashMap<String, Open>,
    next: u64,
}

impl Files {
    fn keep(&mut self, open: Open) -> String {
        self.next += 1;
        let handle = self.next.to_string();
        self.open.insert(handle.clone(), open);
        handle
    }

    fn file(&mut self, handle: &str) -> Result<&mut tokio::fs::File, Failure> {
        match self.open.get_mut(handle) {
            Some(Open::File(file)) => Ok(file),
            _ => Err(no_handle()),
        }
    }
}

/// `path` as the client means it: relative to the user's home.
fn resolve(path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        path.to_owned()
    } else {
        crate::server::home().join(path)
    }
}

/// `path` with `.` and `..` taken out, without following links (what `realpath` answers for a
/// path that does not exist yet).
fn lexically_normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(name) => out.push(name),
            _ => {}
        }
    }
    out
}

async fn listing(dir: &Path) -> Result<Vec<File>, Failure> {
    let mut entries = tokio::fs::read_dir(dir).await?;
    let mut files = Vec::new();
    for name in [".", ".."] {
        if let Ok(meta) = tokio::fs::metadata(dir.join(name)).await {
            files.push(File::new(name, FileAttributes::from(&meta)));
        }
    }
    while let Some(entry) = entries.next_entry().await? {
        let Ok(meta) = tokio::fs::symlink_metadata(entry.path()).await else {
            continue;
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        files.push(File::new(name, FileAttributes::from(&meta)));
    }
    Ok(files)
}

async fn set_attributes(path: &Path, attrs: &FileAttributes) -> Result<(), Failure> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(size) = attrs.size {
        let file = tokio::fs::OpenOptions::new().write(true).open(path).await?;
        file.set_len(size).await?;
    }
    if let Some(mode) = attrs.permissions {
        tokio::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7777)).await?;
    }
    if let (Some(atime), Some(mtime)) = (attrs.atime, attrs.mtime) {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(atime.into());
        let mt = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime.into());
        let file = std::fs::File::options()
            .write(true)
            .open(path)
            .or_else(|_| {
                // A directory or a file the user may not write: times still set through a read.
                std::fs::File::open(path)
            })?;
        file.set_times(std::fs::FileTimes::new().set_accessed(at).set_modified(mt))?;
    }
    Ok(())
}

impl russh_sftp::server::Handler for Files {
    type Error = Failure;

    fn unimplemented(&self) -> Self::Error {
        Failure(StatusCode::OpUnsupported, "not supported".into())
    }

    async fn init(
        &mut self,
        _version: u32,
        _extensions: HashMap<String, String>,
    ) -> Result<Version, Self::Error> {
        Ok(Version::new())
    }

    async fn open(
        &mut self,
        id: u32,
        filename: String,
        flags: OpenFlags,
        attrs: FileAttributes,
    ) -> Result<Handle, Self::Error> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut options: std::fs::OpenOptions = flags.into();
        if let Some(mode) = attrs.permissions {
            options.mode(mode & 0o7777);
        }
        let file = tokio::fs::OpenOptions::from(options)
            .open(resolve(&filename))
            .await?;
        Ok(Handle {
            id,
            handle: self.keep(Open::File(file)),
        })
    }

    async fn close(&mut self, id: u32, handle: String) -> Result<Status, Self::Error> {
        match self.open.remove(&handle) {
            Some(Open::File(mut file)) => {
                file.flush().await?;
                Ok(ok(id))
            }
            Some(Open::Dir(..)) => Ok(ok(id)),
            None => Err(no_handle()),
        }
    }

    async fn read(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        len: u32,
    ) -> Result<Data, Self::Error> {
        let file = self.file(&handle)?;
        file.seek(SeekFrom::Start(offset)).await?;
        let mut data = vec![0u8; len.min(MAX_READ) as usize];
        let n = file.read(&mut data).await?;
        if n == 0 && len > 0 {
            return Err(Failure(StatusCode::Eof, "end of file".into()));
        }
        data.truncate(n);
        Ok(Data { id, data })
    }

    async fn write(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<Status, Self::Error> {
        let file = self.file(&handle)?;
        file.seek(SeekFrom::Start(offset)).await?;
        file.write_all(&data).await?;
        Ok(ok(id))
    }

    async fn lstat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let meta = tokio::fs::symlink_metadata(resolve(&path)).await?;
        Ok(Attrs {
            id,
            attrs: FileAttributes::from(&meta),
        })
    }

    async fn stat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let meta = tokio::fs::metadata(resolve(&path)).await?;
        Ok(Attrs {
            id,
            attrs: FileAttributes::from(&meta),
        })
    }

    async fn fstat(&mut self, id: u32, handle: String) -> Result<Attrs, Self::Error> {
        let meta = self.file(&handle)?.metadata().await?;
        Ok(Attrs {
            id,
            attrs: FileAttributes::from(&meta),
        })
    }

    async fn setstat(
        &mut self,
        id: u32,
        path: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        set_attributes(&resolve(&path), &attrs).await?;
        Ok(ok(id))
    }

    async fn fsetstat(
        &mut self,
        id: u32,
        handle: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        use std::os::unix::fs::PermissionsExt as _;
        let file = self.file(&handle)?;
        if let Some(size) = attrs.size {
            file.set_len(size).await?;
        }
        if let Some(mode) = attrs.permissions {
            file.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))
                .await?;
        }
        if let (Some(atime), Some(mtime)) = (attrs.atime, attrs.mtime) {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(atime.into());
            let mt = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime.into());
            let std_file = file.try_clone().await?.into_std().await;
            std_file.set_times(std::fs::FileTimes::new().set_accessed(at).set_modified(mt))?;
        }
        Ok(ok(id))
    }

    async fn opendir(&mut self, id: u32, path: String) -> Result<Handle, Self::Error> {
        let dir = resolve(&path);
        if !tokio::fs::metadata(&dir).await?.is_dir() {
            return Err(Failure(StatusCode::Failure, "not a directory".into()));
        }
        Ok(Handle {
            id,
            handle: self.keep(Open::Dir(Some(dir), Vec::new())),
        })
    }

    async fn readdir(&mut self, id: u32, handle: String) -> Result<Name, Self::Error> {
        let Some(Open::Dir(dir, left)) = self.open.get_mut(&handle) else {
            return Err(no_handle());
        };
        if let Some(path) = dir.take() {
            *left = listing(&path).await?;
        }
        if left.is_empty() {
            return Err(Failure(StatusCode::Eof, "end of directory".into()));
        }
        let take = left.len().min(ENTRIES_PER_ANSWER);
        Ok(Name {
            id,
            files: left.drain(..take).collect(),
        })
    }

    async fn remove(&mut self, id: u32, filename: String) -> Result<Status, Self::Error> {
        tokio::fs::remove_file(resolve(&filename)).await?;
        Ok(ok(id))
    }

    async fn mkdir(
        &mut self,
        id: u32,
        path: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        let path = resolve(&path);
        tokio::fs::create_dir(&path).await?;
        if attrs.permissions.is_some() {
            set_attributes(&path, &attrs).await?;
        }
        Ok(ok(id))
    }

    async fn rmdir(&mut self, id: u32, path: String) -> Result<Status, Self::Error> {
        tokio::fs::remove_dir(resolve(&path)).await?;
        Ok(ok(id))
    }

    async fn realpath(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        let path = resolve(&path);
        let real = tokio::fs::canonicalize(&path)
            .await
            .unwrap_or_else(|_| lexically_normal(&path));
        Ok(Name {
            id,
            files: vec![File::dummy(real.to_string_lossy())],
        })
    }

    async fn rename(
        &mut self,
        id: u32,
        oldpath: String,
        newpath: String,
    ) -> Result<Status, Self::Error> {
        tokio::fs::rename(resolve(&oldpath), resolve(&newpath)).await?;
        Ok(ok(id))
    }

    async fn readlink(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        let target = tokio::fs::read_link(resolve(&path)).await?;
        Ok(Name {
            id,
            files: vec![File::dummy(target.to_string_lossy())],
        })
    }

    async fn symlink(
        &mut self,
        id: u32,
        linkpath: String,
        targetpath: String,
    ) -> Result<Status, Self::Error> {
        tokio::fs::symlink(targetpath, resolve(&linkpath)).await?;
        Ok(ok(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn realpath_of_a_path_not_there_yet_is_its_normal_form() {
        assert_eq!(
            lexically_normal(Path::new("/home/jovyan/./a/../b.txt")),
            Path::new("/home/jovyan/b.txt")
        );
        assert_eq!(lexically_normal(Path::new("/../..")), Path::new("/"));
    }
}
