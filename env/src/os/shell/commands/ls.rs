//! `ls`, and the `-l` mode string that tasks also print.

use super::super::{Out, Shell, USER};
use super::options;
use crate::os::fs::{self, Node};

impl Shell {
    pub(super) fn ls(&self, args: &[String], out: &mut Out, err: &mut Out) -> i32 {
        let Some((flags, mut operands)) = options("ls", args, "al1h", err) else {
            return 2;
        };
        let all = flags.contains('a');
        let long = flags.contains('l');
        if operands.is_empty() {
            operands.push(".");
        }
        let many = operands.len() > 1;
        let mut status = 0;
        let mut first = true;
        for op in operands {
            let node = self.path(op).map(|p| (self.fs.get(&p).cloned(), p));
            let (node, path) = match node {
                Ok((Some(n), p)) => (n, p),
                Ok((None, _)) | Err(_) => {
                    err.line(&format!(
                        "ls: cannot access '{op}': No such file or directory"
                    ));
                    status = 2;
                    continue;
                }
            };
            let mut entries: Vec<(String, Node)> = Vec::new();
            if node.is_dir() {
                if all {
                    entries.push((".".to_string(), node.clone()));
                    let up = self.fs.get(fs::parent(&path)).cloned().unwrap_or(node);
                    entries.push(("..".to_string(), up));
                }
                for (p, n) in self.fs.children(&path) {
                    let name = fs::name(p);
                    if all || !name.starts_with('.') {
                        entries.push((name.to_string(), n.clone()));
                    }
                }
                if many {
                    if !first {
                        out.push("\n");
                    }
                    out.line(&format!("{op}:"));
                }
            } else {
                entries.push((op.to_string(), node));
            }
            first = false;
            let width = entries
                .iter()
                .map(|(_, n)| size(n).to_string().len())
                .max()
                .unwrap_or(1);
            for (name, n) in entries {
                if long {
                    out.line(&format!(
                        "{} 1 {USER} {USER} {:>width$} {name}",
                        mode_string(&n),
                        size(&n)
                    ));
                } else {
                    out.line(&name);
                }
            }
        }
        status
    }
}

fn size(node: &Node) -> usize {
    match node {
        Node::Dir { .. } => 4096,
        Node::File { content, .. } => content.len(),
    }
}

/// `drwxr-xr-x` / `-rw-r--r--`.
pub fn mode_string(node: &Node) -> String {
    let mode = node.mode();
    let mut s = String::with_capacity(10);
    s.push(if node.is_dir() { 'd' } else { '-' });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::super::run_fresh;

    #[test]
    fn ls() {
        assert_eq!(
            run_fresh("ls; ls /data; ls -a /data/sub; ls -1 /data/sub"),
            "a.log\nnums.txt\nsub\nt.csv\nwords.txt\n.\n..\nb.log\nb.log\n"
        );
        assert_eq!(
            run_fresh("ls -l /data; ls -la /data/sub"),
            "-rw-r--r-- 1 user user   23 a.log\n-rw-r--r-- 1 user user    7 nums.txt\ndrwxr-xr-x 1 user user 4096 sub\n-rw-r--r-- 1 user user   27 t.csv\n-rw-r--r-- 1 user user   25 words.txt\ndrwxr-xr-x 1 user user 4096 .\ndrwxr-xr-x 1 user user 4096 ..\n-rw-r--r-- 1 user user    8 b.log\n"
        );
        assert_eq!(
            run_fresh("ls /data/nums.txt /data/sub /data"),
            "/data/nums.txt\n\n/data/sub:\nb.log\n\n/data:\na.log\nnums.txt\nsub\nt.csv\nwords.txt\n"
        );
    }

    #[test]
    fn ls_errors() {
        assert_eq!(
            run_fresh("ls /nope; echo $?"),
            "ls: cannot access '/nope': No such file or directory\n2\n"
        );
        assert_eq!(
            run_fresh("ls /nope /data/sub; echo $?"),
            "ls: cannot access '/nope': No such file or directory\n/data/sub:\nb.log\n2\n"
        );
        assert_eq!(
            run_fresh("ls --all; echo $?"),
            "ls: unrecognized option '--all'\nTry 'ls --help' for more information.\n2\n"
        );
    }
}
