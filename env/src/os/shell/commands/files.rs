//! `mkdir`, `touch`, `rm`, `cp` and `mv`: the commands that change the tree.

use super::super::{Out, Shell};
use super::options;
use crate::os::fs::{self, FsError};

impl Shell {
    pub(super) fn mkdir(&mut self, args: &[String], err: &mut Out) -> i32 {
        let Some((flags, dirs)) = options("mkdir", args, "p", err) else {
            return 1;
        };
        if dirs.is_empty() {
            err.line("mkdir: missing operand");
            return 1;
        }
        let mut status = 0;
        for d in dirs {
            if let Err(e) = self
                .path(d)
                .and_then(|p| self.fs.mkdir(&p, flags.contains('p')))
            {
                err.line(&format!(
                    "mkdir: cannot create directory '{d}': {}",
                    e.message()
                ));
                status = 1;
            }
        }
        status
    }

    pub(super) fn touch(&mut self, args: &[String], err: &mut Out) -> i32 {
        let Some((_, files)) = options("touch", args, "", err) else {
            return 1;
        };
        if files.is_empty() {
            err.line("touch: missing file operand");
            return 1;
        }
        let mut status = 0;
        for f in files {
            let result = self.path(f).and_then(|p| {
                if self.fs.get(&p).is_some() {
                    Ok(())
                } else {
                    self.fs.write(&p, "", false)
                }
            });
            if let Err(e) = result {
                err.line(&format!("touch: cannot touch '{f}': {}", e.message()));
                status = 1;
            }
        }
        status
    }

    pub(super) fn rm(&mut self, args: &[String], err: &mut Out) -> i32 {
        let Some((flags, files)) = options("rm", args, "rfR", err) else {
            return 1;
        };
        let recursive = flags.contains('r') || flags.contains('R');
        let force = flags.contains('f');
        if files.is_empty() && !force {
            err.line("rm: missing operand");
            return 1;
        }
        let mut status = 0;
        for f in files {
            if matches!(f.trim_end_matches('/').rsplit('/').next(), Some("." | "..")) {
                err.line(&format!(
                    "rm: refusing to remove '.' or '..' directory: skipping '{f}'"
                ));
                status = 1;
                continue;
            }
            let path = match self.path(f) {
                Ok(p) => p,
                Err(e) => {
                    err.line(&format!("rm: cannot remove '{f}': {}", e.message()));
                    status = 1;
                    continue;
                }
            };
            if path == "/" {
                if recursive {
                    err.line("rm: it is dangerous to operate recursively on '/'");
                    err.line("rm: use --no-preserve-root to override this failsafe");
                } else {
                    err.line(&format!("rm: cannot remove '{f}': Is a directory"));
                }
                status = 1;
                continue;
            }
            let result = match self.fs.get(&path) {
                None if force => Ok(()),
                Some(n) if n.is_dir() && !recursive => Err(FsError::IsDir),
                _ => self.fs.remove(&path, recursive),
            };
            if let Err(e) = result {
                err.line(&format!("rm: cannot remove '{f}': {}", e.message()));
                status = 1;
            }
        }
        status
    }

    pub(super) fn cp_mv(&mut self, copy: bool, args: &[String], err: &mut Out) -> i32 {
        let cmd = if copy { "cp" } else { "mv" };
        let allowed = if copy { "rRf" } else { "f" };
        let Some((flags, operands)) = options(cmd, args, allowed, err) else {
            return 1;
        };
        let recursive = flags.contains('r') || flags.contains('R');
        let (dest, sources) = match operands.split_last() {
            None => {
                err.line(&format!("{cmd}: missing file operand"));
                return 1;
            }
            Some((d, [])) => {
                err.line(&format!(
                    "{cmd}: missing destination file operand after '{d}'"
                ));
                return 1;
            }
            Some((d, s)) => (*d, s),
        };
        let dest_path = match self.path(dest) {
            Ok(p) => p,
            Err(e) => {
                err.line(&format!("{cmd}: cannot stat '{dest}': {}", e.message()));
                return 1;
            }
        };
        let into_dir = self.fs.is_dir(&dest_path);
        if sources.len() > 1 && !into_dir {
            err.line(&format!("{cmd}: target '{dest}' is not a directory"));
            return 1;
        }
        let mut status = 0;
        for &s in sources {
            let src = match self.path(s) {
                Ok(p) if self.fs.get(&p).is_some() => p,
                _ => {
                    err.line(&format!(
                        "{cmd}: cannot stat '{s}': No such file or directory"
                    ));
                    status = 1;
                    continue;
                }
            };
            let is_dir = self.fs.is_dir(&src);
            if copy && is_dir && !recursive {
                err.line(&format!("cp: -r not specified; omitting directory '{s}'"));
                status = 1;
                continue;
            }
            let target = if into_dir {
                fs::join(&dest_path, fs::name(&src))
            } else {
                dest_path.clone()
            };
            if target == src {
                err.line(&format!("{cmd}: '{s}' and '{dest}' are the same file"));
                status = 1;
                continue;
            }
            if is_dir && (src == "/" || target.starts_with(&format!("{src}/"))) {
                if copy {
                    err.line(&format!(
                        "cp: cannot copy a directory, '{s}', into itself, '{dest}'"
                    ));
                } else {
                    err.line(&format!(
                        "mv: cannot move '{s}' to a subdirectory of itself, '{dest}'"
                    ));
                }
                status = 1;
                continue;
            }
            let result = if copy {
                self.fs.copy(&src, &target)
            } else {
                self.fs.rename(&src, &target)
            };
            if let Err(e) = result {
                err.line(&format!(
                    "{cmd}: cannot {} '{s}' to '{dest}': {}",
                    if copy { "copy" } else { "move" },
                    e.message()
                ));
                status = 1;
            }
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::run_fresh;

    #[test]
    fn mkdir() {
        assert_eq!(
            run_fresh("mkdir /data/new && ls /data; mkdir -p /a/b/c && ls /a/b; mkdir -p /data"),
            "a.log\nnew\nnums.txt\nsub\nt.csv\nwords.txt\nc\n"
        );
    }

    #[test]
    fn mkdir_errors() {
        assert_eq!(
            run_fresh("mkdir; echo $?; mkdir /data; echo $?; mkdir /x/y; echo $?"),
            "mkdir: missing operand\n1\nmkdir: cannot create directory '/data': File exists\n1\nmkdir: cannot create directory '/x/y': No such file or directory\n1\n"
        );
        assert_eq!(
            run_fresh("mkdir -z d; echo $?; mkdir /data/nums.txt/d; echo $?"),
            "mkdir: invalid option -- 'z'\nTry 'mkdir --help' for more information.\n1\nmkdir: cannot create directory '/data/nums.txt/d': Not a directory\n1\n"
        );
    }

    #[test]
    fn touch() {
        // An existing file keeps its content.
        assert_eq!(
            run_fresh("touch /data/new /data/nums.txt; ls /data; cat /data/nums.txt"),
            "a.log\nnew\nnums.txt\nsub\nt.csv\nwords.txt\n5\n12\n3\n"
        );
    }

    #[test]
    fn touch_errors() {
        assert_eq!(
            run_fresh("touch; echo $?; touch /nope/x; echo $?; touch -a f; echo $?"),
            "touch: missing file operand\n1\ntouch: cannot touch '/nope/x': No such file or directory\n1\ntouch: invalid option -- 'a'\nTry 'touch --help' for more information.\n1\n"
        );
    }

    #[test]
    fn rm() {
        assert_eq!(
            run_fresh("rm /data/nums.txt; ls /data; rm -r /data/sub; ls /data"),
            "a.log\nsub\nt.csv\nwords.txt\na.log\nt.csv\nwords.txt\n"
        );
        assert_eq!(
            run_fresh("rm -f /nope; echo $?; rm -rf /data; ls /"),
            "0\nhome\n"
        );
    }

    #[test]
    fn rm_errors() {
        assert_eq!(
            run_fresh("rm; echo $?; rm /data/sub; echo $?; rm /nope; echo $?; rm -x f; echo $?"),
            "rm: missing operand\n1\nrm: cannot remove '/data/sub': Is a directory\n1\nrm: cannot remove '/nope': No such file or directory\n1\nrm: invalid option -- 'x'\nTry 'rm --help' for more information.\n1\n"
        );
        assert_eq!(
            run_fresh("rm .; echo $?; rm /data/..; echo $?; rm /; echo $?; rm -rf /; echo $?"),
            "rm: refusing to remove '.' or '..' directory: skipping '.'\n1\nrm: refusing to remove '.' or '..' directory: skipping '/data/..'\n1\nrm: cannot remove '/': Is a directory\n1\nrm: it is dangerous to operate recursively on '/'\nrm: use --no-preserve-root to override this failsafe\n1\n"
        );
    }

    #[test]
    fn cp() {
        assert_eq!(
            run_fresh(
                "cp /data/nums.txt /data/n2; cat /data/n2; cp -r /data/sub /data/sub2; ls /data/sub2"
            ),
            "5\n12\n3\nb.log\n"
        );
        assert_eq!(
            run_fresh("cp /data/*.txt /data/sub; ls /data/sub"),
            "b.log\nnums.txt\nwords.txt\n"
        );
    }

    #[test]
    fn cp_errors() {
        assert_eq!(
            run_fresh("cp; echo $?; cp a; echo $?; cp /data/sub /x; echo $?; cp /nope /x; echo $?"),
            "cp: missing file operand\n1\ncp: missing destination file operand after 'a'\n1\ncp: -r not specified; omitting directory '/data/sub'\n1\ncp: cannot stat '/nope': No such file or directory\n1\n"
        );
        assert_eq!(
            run_fresh(
                "cp /data/nums.txt /data/a.log /data/t.csv; echo $?; cp /data/nums.txt /data/nums.txt; echo $?; cp -z a b; echo $?"
            ),
            "cp: target '/data/t.csv' is not a directory\n1\ncp: '/data/nums.txt' and '/data/nums.txt' are the same file\n1\ncp: invalid option -- 'z'\nTry 'cp --help' for more information.\n1\n"
        );
    }

    #[test]
    fn mv() {
        assert_eq!(
            run_fresh(
                "mv /data/nums.txt /data/sub/ && ls /data/sub; mv /data/sub/nums.txt /data/n; cat /data/n"
            ),
            "b.log\nnums.txt\n5\n12\n3\n"
        );
        assert_eq!(
            run_fresh("mv /data/sub /data/s2; ls /data /data/s2"),
            "/data:\na.log\nnums.txt\ns2\nt.csv\nwords.txt\n\n/data/s2:\nb.log\n"
        );
    }

    #[test]
    fn mv_errors() {
        assert_eq!(
            run_fresh("mv; echo $?; mv /nope x; echo $?; mv /data /data/sub; echo $?"),
            "mv: missing file operand\n1\nmv: cannot stat '/nope': No such file or directory\n1\nmv: cannot move '/data' to a subdirectory of itself, '/data/sub'\n1\n"
        );
        assert_eq!(
            run_fresh("mv -r a b; echo $?; mv /data/a.log /data/a.log; echo $?; mv a b c; echo $?"),
            "mv: invalid option -- 'r'\nTry 'mv --help' for more information.\n1\nmv: '/data/a.log' and '/data/a.log' are the same file\n1\nmv: target 'c' is not a directory\n1\n"
        );
    }
}
