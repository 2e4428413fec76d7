//! `cd`, `pwd` and `echo`: the commands about where the shell is and what it says.

use super::super::{HOME, Out, Shell};
use crate::os::fs::FsError;

impl Shell {
    pub(super) fn cd(&mut self, args: &[String], err: &mut Out) -> i32 {
        let target = match args {
            [] => HOME,
            [one] => one.as_str(),
            _ => {
                err.line("bash: cd: too many arguments");
                return 1;
            }
        };
        match self.path(target) {
            Ok(p) if self.fs.is_dir(&p) => {
                self.cwd = p;
                0
            }
            Ok(p) => {
                let e = if self.fs.get(&p).is_some() {
                    FsError::NotDir
                } else {
                    FsError::NotFound
                };
                err.line(&format!("bash: cd: {target}: {}", e.message()));
                1
            }
            Err(e) => {
                err.line(&format!("bash: cd: {target}: {}", e.message()));
                1
            }
        }
    }

    pub(super) fn pwd(&self, out: &mut Out) -> i32 {
        out.line(&self.cwd);
        0
    }
}

pub(super) fn echo(args: &[String], out: &mut Out) -> i32 {
    let mut newline = true;
    let mut rest = args;
    while let Some((first, tail)) = rest.split_first() {
        if first.len() > 1
            && first.starts_with('-')
            && first.chars().skip(1).all(|c| matches!(c, 'n' | 'e' | 'E'))
        {
            if first.contains('n') {
                newline = false;
            }
            rest = tail;
        } else {
            break;
        }
    }
    out.push(&rest.join(" "));
    if newline {
        out.push("\n");
    }
    0
}
