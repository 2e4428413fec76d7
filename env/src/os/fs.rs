//! The in-memory file system the shell runs on: a sorted map from absolute paths to nodes.
//!
//! Nothing here touches the host. Every operation is bounded: total file bytes, node count,
//! path depth and name length have limits, so no script can exhaust memory.

use std::collections::BTreeMap;

/// Most bytes of file content the whole file system may hold.
pub const MAX_BYTES: usize = 256 * 1024;
/// Most nodes (files and directories, the root included).
pub const MAX_NODES: usize = 1024;
/// Most components of a path (`/a/b` has two).
pub const MAX_DEPTH: usize = 24;
/// Longest file name, in bytes.
pub const MAX_NAME: usize = 64;

/// A file or a directory, with its permission bits (metadata only: the shell user may read and
/// write everything, as root could).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// A directory.
    Dir {
        /// Permission bits, e.g. `0o755`.
        mode: u16,
    },
    /// A text file.
    File {
        /// Permission bits, e.g. `0o644`.
        mode: u16,
        /// The content.
        content: String,
    },
}

impl Node {
    /// The permission bits.
    pub fn mode(&self) -> u16 {
        match self {
            Node::Dir { mode } | Node::File { mode, .. } => *mode,
        }
    }

    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        matches!(self, Node::Dir { .. })
    }
}

/// Why a file system operation failed; [`FsError::message`] is the text bash prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsError {
    /// The path does not exist.
    NotFound,
    /// A component of the path is a file.
    NotDir,
    /// A file was expected, the path is a directory.
    IsDir,
    /// The path exists already.
    Exists,
    /// The byte or node limit was reached.
    NoSpace,
    /// A directory to remove is not empty.
    NotEmpty,
    /// A name or the path is too long.
    NameTooLong,
    /// The operation makes no sense (e.g. on the root).
    Invalid,
}

impl FsError {
    /// The error text, as the coreutils print it.
    pub fn message(self) -> &'static str {
        match self {
            FsError::NotFound => "No such file or directory",
            FsError::NotDir => "Not a directory",
            FsError::IsDir => "Is a directory",
            FsError::Exists => "File exists",
            FsError::NoSpace => "No space left on device",
            FsError::NotEmpty => "Directory not empty",
            FsError::NameTooLong => "File name too long",
            FsError::Invalid => "Invalid argument",
        }
    }
}

/// The parent of a normalized absolute path (`/` for top-level entries and the root).
pub fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// The last component of a normalized absolute path (empty for the root).
pub fn name(path: &str) -> &str {
    path.rfind('/').map_or(path, |i| &path[i + 1..])
}

/// `dir/name` for a normalized directory path.
pub fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// Normalizes `arg` against the working directory `cwd` and the home directory `home`: `~`
/// expands to `home`, `.` and `..` are resolved lexically (`..` of the root is the root).
pub fn resolve(cwd: &str, home: &str, arg: &str) -> Result<String, FsError> {
    let (base, rest) = if arg == "~" {
        (home, "")
    } else if let Some(rest) = arg.strip_prefix("~/") {
        (home, rest)
    } else if arg.starts_with('/') {
        ("/", arg)
    } else {
        (cwd, arg)
    };
    let mut parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p if p.len() > MAX_NAME => return Err(FsError::NameTooLong),
            p => {
                parts.push(p);
                if parts.len() > MAX_DEPTH {
                    return Err(FsError::NameTooLong);
                }
            }
        }
    }
    if parts.is_empty() {
        return Ok("/".to_string());
    }
    let mut out = String::with_capacity(arg.len() + base.len() + 1);
    for p in parts {
        out.push('/');
        out.push_str(p);
    }
    Ok(out)
}

/// The file system: nodes by normalized absolute path (`/`, `/home`, `/home/user`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fs {
    nodes: BTreeMap<String, Node>,
    bytes: usize,
}

impl Default for Fs {
    /// Only the root directory.
    fn default() -> Self {
        let mut nodes = BTreeMap::new();
        nodes.insert("/".to_string(), Node::Dir { mode: 0o755 });
        Fs { nodes, bytes: 0 }
    }
}

impl Fs {
    /// The node at `path`.
    pub fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    /// Whether `path` is a directory.
    pub fn is_dir(&self, path: &str) -> bool {
        self.get(path).is_some_and(Node::is_dir)
    }

    /// The content of the file at `path`.
    pub fn read(&self, path: &str) -> Result<&str, FsError> {
        match self.get(path) {
            Some(Node::File { content, .. }) => Ok(content),
            Some(Node::Dir { .. }) => Err(FsError::IsDir),
            None => Err(self.missing(path)),
        }
    }

    /// Total bytes of file content.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of nodes, the root included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether only the root exists (never true for a generated instance).
    pub fn is_empty(&self) -> bool {
        self.nodes.len() <= 1
    }

    /// Every node in path order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Node)> {
        self.nodes.iter()
    }

    /// Every node strictly below `dir`, in path order.
    pub fn descendants<'a>(&'a self, dir: &str) -> impl Iterator<Item = (&'a String, &'a Node)> {
        let prefix = if dir == "/" {
            "/".to_string()
        } else {
            format!("{dir}/")
        };
        self.nodes
            .range(prefix.clone()..)
            .take_while(move |(p, _)| p.starts_with(&prefix))
            .filter(|(p, _)| p.as_str() != "/")
    }

    /// The entries directly in `dir`, in name order.
    pub fn children<'a>(&'a self, dir: &str) -> impl Iterator<Item = (&'a String, &'a Node)> {
        let skip = if dir == "/" { 1 } else { dir.len() + 1 };
        self.descendants(dir)
            .filter(move |(p, _)| !p[skip..].contains('/'))
    }

    /// Why `path` cannot be found: a file on the way, or nothing there.
    fn missing(&self, path: &str) -> FsError {
        let mut dir = parent(path);
        loop {
            match self.get(dir) {
                Some(Node::File { .. }) => return FsError::NotDir,
                Some(Node::Dir { .. }) => return FsError::NotFound,
                None if dir == "/" => return FsError::NotFound,
                None => dir = parent(dir),
            }
        }
    }

    /// Checks that the parent of `path` is a directory.
    fn parent_dir(&self, path: &str) -> Result<(), FsError> {
        match self.get(parent(path)) {
            Some(Node::Dir { .. }) => Ok(()),
            Some(Node::File { .. }) => Err(FsError::NotDir),
            None => Err(self.missing(parent(path))),
        }
    }

    fn insert(&mut self, path: String, node: Node) -> Result<(), FsError> {
        let added = match &node {
            Node::File { content, .. } => content.len(),
            Node::Dir { .. } => 0,
        };
        let old = match self.nodes.get(&path) {
            Some(Node::File { content, .. }) => content.len(),
            Some(Node::Dir { .. }) => 0,
            None if self.nodes.len() >= MAX_NODES => return Err(FsError::NoSpace),
            None => 0,
        };
        let bytes = self.bytes - old + added;
        if bytes > MAX_BYTES {
            return Err(FsError::NoSpace);
        }
        self.bytes = bytes;
        self.nodes.insert(path, node);
        Ok(())
    }

    /// Creates the directory `path`; with `parents`, also the missing directories above it, and
    /// an existing directory is fine.
    pub fn mkdir(&mut self, path: &str, parents: bool) -> Result<(), FsError> {
        match self.get(path) {
            Some(Node::Dir { .. }) if parents => return Ok(()),
            Some(_) => return Err(FsError::Exists),
            None => {}
        }
        if parents && path != "/" {
            match self.get(parent(path)) {
                Some(Node::File { .. }) => return Err(FsError::NotDir),
                Some(Node::Dir { .. }) => {}
                None => self.mkdir(parent(path), true)?,
            }
        }
        self.parent_dir(path)?;
        self.insert(path.to_string(), Node::Dir { mode: 0o755 })
    }

    /// Writes `content` to the file `path` (created with mode 644 if missing), replacing or
    /// appending to what was there.
    pub fn write(&mut self, path: &str, content: &str, append: bool) -> Result<(), FsError> {
        match self.nodes.get(path) {
            Some(Node::Dir { .. }) => Err(FsError::IsDir),
            Some(Node::File { mode, content: old }) => {
                let mode = *mode;
                let new = if append {
                    if self.bytes + content.len() > MAX_BYTES {
                        return Err(FsError::NoSpace);
                    }
                    let mut s = old.clone();
                    s.push_str(content);
                    s
                } else {
                    content.to_string()
                };
                self.insert(path.to_string(), Node::File { mode, content: new })
            }
            None => {
                self.parent_dir(path)?;
                self.insert(
                    path.to_string(),
                    Node::File {
                        mode: 0o644,
                        content: content.to_string(),
                    },
                )
            }
        }
    }

    /// Sets the permission bits of `path`.
    pub fn chmod(&mut self, path: &str, new: u16) -> Result<(), FsError> {
        match self.nodes.get_mut(path) {
            Some(Node::Dir { mode } | Node::File { mode, .. }) => {
                *mode = new & 0o7777;
                Ok(())
            }
            None => Err(self.missing(path)),
        }
    }

    /// Removes `path`; a non-empty directory only with `recursive`. The root is refused.
    pub fn remove(&mut self, path: &str, recursive: bool) -> Result<(), FsError> {
        if path == "/" {
            return Err(FsError::Invalid);
        }
        match self.get(path) {
            None => return Err(self.missing(path)),
            Some(Node::Dir { .. }) => {
                let below: Vec<String> = self.descendants(path).map(|(p, _)| p.clone()).collect();
                if !below.is_empty() && !recursive {
                    return Err(FsError::NotEmpty);
                }
                for p in below {
                    self.drop_node(&p);
                }
            }
            Some(Node::File { .. }) => {}
        }
        self.drop_node(path);
        Ok(())
    }

    fn drop_node(&mut self, path: &str) {
        if let Some(Node::File { content, .. }) = self.nodes.remove(path) {
            self.bytes -= content.len();
        }
    }

    /// Copies `from` to `to` (which must not exist as a directory); directories with all they
    /// contain. Fails without changes if the limits would be exceeded.
    pub fn copy(&mut self, from: &str, to: &str) -> Result<(), FsError> {
        if to == from || from == "/" || to.starts_with(&format!("{from}/")) {
            return Err(FsError::Invalid);
        }
        let node = self.get(from).cloned().ok_or_else(|| self.missing(from))?;
        if self.is_dir(to) {
            return Err(FsError::IsDir);
        }
        self.parent_dir(to)?;
        let below: Vec<(String, Node)> = if node.is_dir() {
            self.descendants(from)
                .map(|(p, n)| (format!("{to}{}", &p[from.len()..]), n.clone()))
                .collect()
        } else {
            Vec::new()
        };
        let extra: usize = below
            .iter()
            .chain(std::iter::once(&(to.to_string(), node.clone())))
            .map(|(_, n)| match n {
                Node::File { content, .. } => content.len(),
                Node::Dir { .. } => 0,
            })
            .sum();
        if self.bytes + extra > MAX_BYTES || self.nodes.len() + below.len() + 1 > MAX_NODES {
            return Err(FsError::NoSpace);
        }
        if below
            .iter()
            .any(|(p, _)| p.split('/').count() > MAX_DEPTH + 1)
        {
            return Err(FsError::NameTooLong);
        }
        self.insert(to.to_string(), node)?;
        for (p, n) in below {
            self.insert(p, n)?;
        }
        Ok(())
    }

    /// Moves `from` to `to` (which must not exist as a directory), with everything below it.
    pub fn rename(&mut self, from: &str, to: &str) -> Result<(), FsError> {
        if from == "/" || to.starts_with(&format!("{from}/")) {
            return Err(FsError::Invalid);
        }
        if from == to {
            return Ok(());
        }
        if self.get(from).is_none() {
            return Err(self.missing(from));
        }
        if self.is_dir(to) {
            return Err(FsError::IsDir);
        }
        self.parent_dir(to)?;
        let moved: Vec<String> = std::iter::once(from.to_string())
            .chain(self.descendants(from).map(|(p, _)| p.clone()))
            .collect();
        if moved
            .iter()
            .any(|p| to.matches('/').count() + p[from.len()..].matches('/').count() > MAX_DEPTH)
        {
            return Err(FsError::NameTooLong);
        }
        self.drop_node(to);
        for p in moved {
            if let Some(node) = self.nodes.remove(&p) {
                self.nodes.insert(format!("{to}{}", &p[from.len()..]), node);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_normalizes() {
        let r = |a| resolve("/home/user", "/home/user", a);
        assert_eq!(r("docs/../x/./y"), Ok("/home/user/x/y".to_string()));
        assert_eq!(r("../../../../.."), Ok("/".to_string()));
        assert_eq!(r("~/a"), Ok("/home/user/a".to_string()));
        assert_eq!(r("/"), Ok("/".to_string()));
        assert_eq!(r(&"a/".repeat(30)), Err(FsError::NameTooLong));
    }

    #[test]
    fn limits_hold() {
        let mut fs = Fs::default();
        fs.mkdir("/a", false).unwrap();
        assert_eq!(fs.mkdir("/a", false), Err(FsError::Exists));
        assert_eq!(fs.mkdir("/b/c", false), Err(FsError::NotFound));
        fs.write("/a/f", &"x".repeat(MAX_BYTES), false).unwrap();
        assert_eq!(fs.write("/a/g", "y", false), Err(FsError::NoSpace));
        assert_eq!(fs.write("/a/f", "y", true), Err(FsError::NoSpace));
        assert_eq!(fs.copy("/a", "/b"), Err(FsError::NoSpace));
        assert_eq!(fs.copy("/a", "/a/b"), Err(FsError::Invalid));
        fs.remove("/a", true).unwrap();
        assert_eq!(fs.bytes(), 0);
        assert_eq!(fs.len(), 1);
        assert_eq!(fs.remove("/", true), Err(FsError::Invalid));
        for i in 0..MAX_NODES - 1 {
            fs.write(&format!("/f{i}"), "", false).unwrap();
        }
        assert_eq!(fs.write("/g", "", false), Err(FsError::NoSpace));
    }

    #[test]
    fn children_and_rename() {
        let mut fs = Fs::default();
        fs.mkdir("/a/b", true).unwrap();
        fs.write("/a/b.txt", "t", false).unwrap();
        fs.write("/a/b/c", "c", false).unwrap();
        let kids: Vec<&String> = fs.children("/a").map(|(p, _)| p).collect();
        assert_eq!(kids, ["/a/b", "/a/b.txt"]);
        fs.rename("/a/b", "/z").unwrap();
        assert_eq!(fs.read("/z/c"), Ok("c"));
        assert_eq!(fs.read("/a/b/c"), Err(FsError::NotFound));
        assert_eq!(fs.read("/a/b.txt/c"), Err(FsError::NotDir));
    }
}
