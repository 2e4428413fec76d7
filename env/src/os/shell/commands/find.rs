//! `find` with `-name`, `-iname`, `-type` and `-maxdepth`.

use super::super::glob::glob_match;
use super::super::{Out, Shell};
use crate::os::fs::{self, Node};

impl Shell {
    pub(super) fn find(&self, args: &[String], out: &mut Out, err: &mut Out) -> i32 {
        let split = args
            .iter()
            .position(|a| a.starts_with('-') || a == "!" || a == "(")
            .unwrap_or(args.len());
        let (starts, expr) = args.split_at(split);
        let mut name: Option<(String, bool)> = None;
        let mut kind: Option<bool> = None;
        let mut max_depth = usize::MAX;
        let mut it = expr.iter();
        while let Some(a) = it.next() {
            let Some(value) = it.next() else {
                if matches!(a.as_str(), "-name" | "-iname" | "-type" | "-maxdepth") {
                    err.line(&format!("find: missing argument to `{a}'"));
                } else {
                    err.line(&format!("find: unknown predicate `{a}'"));
                }
                return 1;
            };
            match a.as_str() {
                "-name" => name = Some((value.clone(), false)),
                "-iname" => name = Some((value.to_lowercase(), true)),
                "-type" => match value.as_str() {
                    "f" => kind = Some(false),
                    "d" => kind = Some(true),
                    _ => {
                        err.line(&format!("find: Unknown argument to -type: {value}"));
                        return 1;
                    }
                },
                "-maxdepth" => match value.parse() {
                    Ok(n) => max_depth = n,
                    Err(_) => {
                        err.line(&format!(
                            "find: Expected a positive decimal integer argument to -maxdepth, but got `{value}'"
                        ));
                        return 1;
                    }
                },
                _ => {
                    err.line(&format!("find: unknown predicate `{a}'"));
                    return 1;
                }
            }
        }
        let starts: Vec<&str> = if starts.is_empty() {
            vec!["."]
        } else {
            starts.iter().map(String::as_str).collect()
        };
        let matches = |path: &str, node: &Node| -> bool {
            kind.is_none_or(|d| d == node.is_dir())
                && name.as_ref().is_none_or(|(pat, lower)| {
                    let n = if path == "/" { "/" } else { fs::name(path) };
                    if *lower {
                        glob_match(pat, &n.to_lowercase())
                    } else {
                        glob_match(pat, n)
                    }
                })
        };
        let mut status = 0;
        for s in starts {
            let Some((root, node)) = self
                .path(s)
                .ok()
                .and_then(|p| self.fs.get(&p).map(|n| (p, n)))
            else {
                err.line(&format!("find: '{s}': No such file or directory"));
                status = 1;
                continue;
            };
            let shown = if s == "/" {
                ""
            } else {
                s.trim_end_matches('/')
            };
            if matches(if s == "." { "." } else { &root }, node) {
                out.line(s);
            }
            for (p, n) in self.fs.descendants(&root) {
                let rel = if root == "/" {
                    p.as_str()
                } else {
                    p.get(root.len()..).unwrap_or_default()
                };
                if rel.matches('/').count() <= max_depth && matches(p, n) {
                    out.line(&format!("{shown}{rel}"));
                }
            }
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::run_fresh;

    #[test]
    fn find() {
        assert_eq!(
            run_fresh("find /data -name '*.txt'; find /data -maxdepth 1 -type d"),
            "/data/nums.txt\n/data/words.txt\n/data\n/data/sub\n"
        );
        assert_eq!(
            run_fresh(
                "cd /data; find . -name '*.log'; find sub/ -type f; find / -maxdepth 1 -name data"
            ),
            "./a.log\n./sub/b.log\nsub/b.log\n/data\n"
        );
        assert_eq!(
            run_fresh("find /data -iname 'NUMS*'; find -type d"),
            "/data/nums.txt\n.\n"
        );
    }

    #[test]
    fn find_errors() {
        assert_eq!(
            run_fresh(
                "find /nope; echo $?; find /data -type x; echo $?; find /data -name; echo $?"
            ),
            "find: '/nope': No such file or directory\n1\nfind: Unknown argument to -type: x\n1\nfind: missing argument to `-name'\n1\n"
        );
        assert_eq!(
            run_fresh(
                "find /data -foo bar; echo $?; find /data -maxdepth x; echo $?; find /data -foo; echo $?"
            ),
            "find: unknown predicate `-foo'\n1\nfind: Expected a positive decimal integer argument to -maxdepth, but got `x'\n1\nfind: unknown predicate `-foo'\n1\n"
        );
    }
}
