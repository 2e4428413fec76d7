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
