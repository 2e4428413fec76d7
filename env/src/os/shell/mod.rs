//! A small POSIX-like shell over the in-memory [`Fs`]: lexing, parsing and the commands.
//!
//! Supported: words with `'...'`, `"..."` and `\` quoting; `$HOME`, `$USER`, `$PWD`, `$SHELL`
//! and `$?` (expanded when each command runs; other variables are empty);
//! `~`; globs `*` and `?` in unquoted words; pipes `|`; `;`, newlines, `&&` and `||`;
//! redirections `>`, `>>`, `<`, `2>`, `2>>`, `2>&1` and `/dev/null` as a target; `#` comments.
//! Commands: `cat cd chmod cp cut echo find grep head ls mkdir mv pwd rm sort tail touch uniq
//! wc`. Anything else is `bash: NAME: command not found`.
//!
//! Every stream is capped at [`MAX_STREAM`] bytes, a pipeline at [`MAX_PIPELINE`] commands, a
//! script at [`MAX_COMMANDS`] commands and [`MAX_WORK`] units of reading; the file system has
//! its own limits. The terminal output of a script is cut at [`MAX_OUTPUT_CHARS`] characters
//! with a note.
//!
//! One concept a module, so each can be read and tested alone: `lex` turns a script into
//! tokens, `parse` groups them into pipelines, `expand` substitutes variables and globs when a
//! command runs, `glob` and `regex` match names and lines, and `commands` holds the commands.
//! This module runs a parsed script: sequencing, pipelines, redirections and the work budget.

mod commands;
mod expand;
mod glob;
mod lex;
mod parse;
mod regex;

use std::cell::Cell;

use super::fs::{self, Fs, FsError};

pub use commands::ls::mode_string;
pub use glob::glob_match;
use lex::Redir;
use parse::{Cmd, Link};

/// The home directory (`~`) and the start directory.
pub const HOME: &str = "/home/user";
/// The shell user's name, as `ls -l` and `$USER` show it.
pub const USER: &str = "user";
/// Longest terminal output of one script, in characters; the rest is cut with a note.
pub const MAX_OUTPUT_CHARS: usize = 800;
/// Most bytes one command's output (or the terminal buffer) may hold.
pub const MAX_STREAM: usize = 64 * 1024;
/// Most commands in one pipeline.
pub const MAX_PIPELINE: usize = 8;
/// Most commands in one script.
pub const MAX_COMMANDS: usize = 32;
/// Most arguments one command may get after glob expansion.
pub const MAX_ARGS: usize = 512;
/// Most work units one script may spend: a byte read by a text command is one unit, and `grep`
/// also pays a unit per byte for every 16 atoms of its pattern. Bounds the time of any step.
pub const MAX_WORK: usize = 4 * 1024 * 1024;
/// Most atoms in a `grep` pattern (matching costs pattern length times line length).
pub const MAX_PATTERN: usize = 64;

/// The commands the shell knows.
pub const COMMANDS: [&str; 19] = [
    "cat", "cd", "chmod", "cp", "cut", "echo", "find", "grep", "head", "ls", "mkdir", "mv", "pwd",
    "rm", "sort", "tail", "touch", "uniq", "wc",
];

/// The note appended to a cut output.
pub const CUT_NOTE: &str = "[output truncated: longer than 800 characters]";

/// A bounded output stream.
#[derive(Default)]
struct Out {
    text: String,
}

impl Out {
    fn push(&mut self, s: &str) {
        let room = MAX_STREAM.saturating_sub(self.text.len());
        if s.len() <= room {
            self.text.push_str(s);
        } else {
            let mut cut = room;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            self.text.push_str(s.get(..cut).unwrap_or_default());
        }
    }

    fn line(&mut self, s: &str) {
        self.push(s);
        self.push("\n");
    }
}

/// The shell: a file system, a working directory and the last exit status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shell {
    fs: Fs,
    cwd: String,
    status: i32,
    /// Work spent by the running script, against [`MAX_WORK`].
    work: Cell<usize>,
}

impl Shell {
    /// A shell in [`HOME`] over `fs`.
    pub fn new(fs: Fs) -> Shell {
        Shell {
            fs,
            cwd: HOME.to_string(),
            status: 0,
            work: Cell::new(0),
        }
    }

    /// The file system.
    pub fn fs(&self) -> &Fs {
        &self.fs
    }

    /// The working directory.
    pub fn cwd(&self) -> &str {
        &self.cwd
    }

    /// Runs `script` and returns its terminal output (stdout and stderr in the order written),
    /// cut at [`MAX_OUTPUT_CHARS`] characters with [`CUT_NOTE`] appended.
    pub fn run(&mut self, script: &str) -> String {
        self.work.set(0);
        let mut term = Out::default();
        match lex::lex(script).and_then(parse::parse) {
            Ok(lines) => {
                for (link, pipeline) in lines {
                    let go = match link {
                        Link::Seq => true,
                        Link::And => self.status == 0,
                        Link::Or => self.status != 0,
                    };
                    if go {
                        self.status = self.pipeline(&pipeline, &mut term);
                    }
                }
            }
            Err(message) => {
                term.line(&message);
                self.status = 2;
            }
        }
        let text = term.text;
        match text.char_indices().nth(MAX_OUTPUT_CHARS) {
            Some((cut, _)) => {
                let mut s = text.get(..cut).unwrap_or_default().to_string();
                if !s.ends_with('\n') {
                    s.push('\n');
                }
                s.push_str(CUT_NOTE);
                s
            }
            None => text,
        }
    }

    /// Runs one pipeline; returns the exit status of its last command.
    fn pipeline(&mut self, pipeline: &[Cmd], term: &mut Out) -> i32 {
        let mut input = String::new();
        let mut status = 0;
        let n = pipeline.len();
        for (k, cmd) in pipeline.iter().enumerate() {
            let mut out = Out::default();
            let mut err = Out::default();
            status = self.command(cmd, &input, &mut out, &mut err);
            term.push(&err.text);
            if k + 1 == n {
                term.push(&out.text);
            } else {
                input = out.text;
            }
        }
        status
    }

    fn path(&self, arg: &str) -> Result<String, FsError> {
        fs::resolve(&self.cwd, HOME, arg)
    }

    /// Spends `units` of the script's work; `false` (with an error line) once it is used up.
    fn charge(&self, cmd: &str, units: usize, err: &mut Out) -> bool {
        let work = self.work.get().saturating_add(units);
        self.work.set(work);
        if work > MAX_WORK {
            err.line(&format!(
                "{cmd}: this script read more than {MAX_WORK} bytes, the sandbox's limit"
            ));
            return false;
        }
        true
    }

    /// Sets up redirections, runs the command, routes its output.
    fn command(&mut self, cmd: &Cmd, stdin: &str, out: &mut Out, err: &mut Out) -> i32 {
        let mut args = Vec::new();
        for w in &cmd.words {
            self.expand(w, &mut args);
        }
        if args.len() > MAX_ARGS {
            err.line("bash: argument list too long");
            return 126;
        }
        let mut input: Option<String> = None;
        // `None` target: /dev/null. Files are truncated when the redirection is set up.
        let mut stdout: Option<Option<String>> = None;
        let mut stderr: Option<Option<String>> = None;
        let mut err_to_out = false;
        for (redir, target) in &cmd.redirs {
            if *redir == Redir::ErrToOut {
                err_to_out = true;
                continue;
            }
            let mut names = Vec::new();
            self.expand(target, &mut names);
            let [name] = names.as_slice() else {
                err.line(&format!("bash: {}: ambiguous redirect", target.text));
                return 1;
            };
            let fail = |err: &mut Out, e: FsError| {
                err.line(&format!("bash: {name}: {}", e.message()));
                1
            };
            if name == "/dev/null" {
                match redir {
                    Redir::In => input = Some(String::new()),
                    Redir::Out | Redir::Append => stdout = Some(None),
                    _ => stderr = Some(None),
                }
                continue;
            }
            let path = match self.path(name) {
                Ok(p) => p,
                Err(e) => return fail(err, e),
            };
            match redir {
                Redir::In => match self.fs.read(&path) {
                    Ok(text) => input = Some(text.to_string()),
                    Err(e) => return fail(err, e),
                },
                _ => {
                    let append = matches!(redir, Redir::Append | Redir::ErrAppend);
                    if let Err(e) = self.fs.write(&path, "", append) {
                        return fail(err, e);
                    }
                    if matches!(redir, Redir::Out | Redir::Append) {
                        stdout = Some(Some(path));
                    } else {
                        stderr = Some(Some(path));
                    }
                }
            }
        }
        let mut o = Out::default();
        let mut e = Out::default();
        let status = match args.split_first() {
            Some((name, rest)) => self.builtin(
                name,
                rest,
                input.as_deref().unwrap_or(stdin),
                &mut o,
                &mut e,
            ),
            None => 0,
        };
        if err_to_out {
            o.push(&e.text);
            e.text.clear();
        }
        for (text, target, is_err) in [(&e.text, &stderr, true), (&o.text, &stdout, false)] {
            match target {
                None if is_err => err.push(text),
                None => out.push(text),
                Some(None) => {}
                Some(Some(path)) => {
                    if let Err(x) = self.fs.write(path, text, true) {
                        err.line(&format!("bash: {path}: {}", x.message()));
                    }
                }
            }
        }
        status
    }
}

/// The shell the tests share: small files under `/data`, started in [`HOME`].
#[cfg(test)]
fn test_shell() -> Shell {
    let mut fs = Fs::default();
    let files = [
        ("/data/nums.txt", "5\n12\n3\n"),
        ("/data/a.log", "ERROR x\nINFO y\nERROR z\n"),
        ("/data/sub/b.log", "ERROR q\n"),
        ("/data/words.txt", "pear\napple\npear\npear\nfig\n"),
        ("/data/t.csv", "id,name,qty\n1,ab,3\n2,cd,10\n"),
    ];
    fs.mkdir(HOME, true).unwrap();
    fs.mkdir("/data/sub", true).unwrap();
    for (path, text) in files {
        fs.write(path, text, false).unwrap();
    }
    Shell::new(fs)
}

/// The output of `script` run by a fresh [`test_shell`].
#[cfg(test)]
fn run_fresh(script: &str) -> String {
    test_shell().run(script)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipelines_and_sequencing() {
        let mut sh = test_shell();
        assert_eq!(sh.run("sort -n /data/nums.txt | tail -n 1"), "12\n");
        assert_eq!(sh.run("sort -n -r /data/nums.txt | head -n 1"), "12\n");
        assert_eq!(sh.run("grep -c ERROR /data/a.log"), "2\n");
        assert_eq!(sh.run("cat /data/*.log | grep -v ERROR"), "INFO y\n");
        assert_eq!(
            sh.run("find /data -type f -name '*.log'"),
            "/data/a.log\n/data/sub/b.log\n"
        );
        assert_eq!(sh.run("cd /data && pwd; cd sub || echo no"), "/data\n");
        assert_eq!(
            sh.run("cd /nope && echo yes || echo no"),
            "bash: cd: /nope: No such file or directory\nno\n"
        );
        assert_eq!(sh.run("wc -l /data/nums.txt"), "3 /data/nums.txt\n");
        assert_eq!(
            sh.run("echo 'a b' \"$HOME\" ~ x~"),
            "a b /home/user /home/user x~\n"
        );
        assert_eq!(sh.run("echo 1 > f; echo 2 >> f; cat f | wc -l"), "2\n");
        assert_eq!(sh.run("cat f >> f; cat f"), "1\n2\n1\n2\n");
        assert_eq!(sh.run("foo"), "bash: foo: command not found\n");
        assert_eq!(
            sh.run("ls -z"),
            "ls: invalid option -- 'z'\nTry 'ls --help' for more information.\n"
        );
        assert_eq!(
            sh.run("echo a | | b"),
            "bash: syntax error near unexpected token `|'\n"
        );
        assert_eq!(sh.run("printf x 2>/dev/null || echo failed"), "failed\n");
    }

    #[test]
    fn listing_modes_and_copies() {
        let mut sh = test_shell();
        sh.run("mkdir -p /x/y && touch /x/y/s.sh && chmod 755 /x/y/s.sh");
        assert_eq!(sh.run("ls -l /x/y"), "-rwxr-xr-x 1 user user 0 s.sh\n");
        sh.run("chmod go-rx /x/y/s.sh");
        assert_eq!(
            sh.run("ls -l /x/y/s.sh"),
            "-rwx------ 1 user user 0 /x/y/s.sh\n"
        );
        assert_eq!(
            sh.run("cp -r /x /x/y"),
            "cp: cannot copy a directory, '/x', into itself, '/x/y'\n"
        );
        assert_eq!(sh.run("cp /data/*.log /x && ls /x"), "a.log\ny\n");
        assert_eq!(sh.run("mv /x/a.log /x/y/ && ls /x/y"), "a.log\ns.sh\n");
        assert_eq!(
            sh.run("rm -rf /"),
            "rm: it is dangerous to operate recursively on '/'\nrm: use --no-preserve-root to override this failsafe\n"
        );
        assert_eq!(
            sh.run("cut -d ' ' -f 2 /data/a.log | sort | uniq -c"),
            "      1 x\n      1 y\n      1 z\n"
        );
        assert!(sh.run(&"echo x | ".repeat(9)).contains("pipeline too long"));
    }

    #[test]
    fn and_or_and_status() {
        assert_eq!(
            run_fresh("ls /nope || echo failed && echo after"),
            "ls: cannot access '/nope': No such file or directory\nfailed\nafter\n"
        );
        assert_eq!(
            run_fresh("echo ok && ls /nope && echo no; echo $?"),
            "ok\nls: cannot access '/nope': No such file or directory\n2\n"
        );
        assert_eq!(run_fresh("echo a;echo b&&echo c||echo d"), "a\nb\nc\n");
        assert_eq!(run_fresh("echo a\necho b"), "a\nb\n");
        // A syntax error runs nothing and leaves status 2 for the next script.
        let mut sh = test_shell();
        assert_eq!(
            sh.run("echo a; echo b |"),
            "bash: syntax error: unexpected end of file\n"
        );
        assert_eq!(sh.run("echo $?"), "2\n");
    }

    #[test]
    fn redirections() {
        assert_eq!(
            run_fresh("echo hi > f; echo more >> f; cat < f"),
            "hi\nmore\n"
        );
        assert_eq!(
            run_fresh("cat /nope 2> e; echo $?; cat e"),
            "1\ncat: /nope: No such file or directory\n"
        );
        assert_eq!(
            run_fresh("cat /nope 2>> e; cat /nope 2>> e; wc -l e"),
            "2 e\n"
        );
        assert_eq!(run_fresh("cat /nope 2>&1 | wc -l"), "1\n");
        assert_eq!(
            run_fresh("cat /nope > out 2>&1; cat out"),
            "cat: /nope: No such file or directory\n"
        );
        assert_eq!(
            run_fresh("echo x 2>/dev/null; echo 2 > /dev/null; echo \"2\">f; cat f"),
            "x\n2\n"
        );
        assert_eq!(run_fresh("cat < /dev/null | wc -c"), "0\n");
        // A glob with one match is the target.
        assert_eq!(
            run_fresh("cd /data; echo x > *.log; echo $?; cat a.log"),
            "0\nx\n"
        );
    }

    #[test]
    fn redirection_errors() {
        assert_eq!(
            run_fresh("cat < /nope; echo $?"),
            "bash: /nope: No such file or directory\n1\n"
        );
        assert_eq!(
            run_fresh("echo x > /nope/f; echo $?"),
            "bash: /nope/f: No such file or directory\n1\n"
        );
        assert_eq!(run_fresh("echo x > /data"), "bash: /data: Is a directory\n");
        assert_eq!(
            run_fresh("echo x > /data/*.txt; echo $?"),
            "bash: /data/*.txt: ambiguous redirect\n1\n"
        );
        assert_eq!(run_fresh("echo x > $NOPE"), "bash: : ambiguous redirect\n");
    }

    #[test]
    fn programs_that_are_not_commands() {
        assert_eq!(
            run_fresh("foo; echo $?; /bin/ls; echo $?; /data/nums.txt; echo $?; ./x; echo $?"),
            "bash: foo: command not found\n127\nbash: /bin/ls: No such file or directory\n127\nbash: /data/nums.txt: running programs is not supported in this sandbox\n127\nbash: ./x: No such file or directory\n127\n"
        );
        assert_eq!(
            run_fresh("cd /data; D=1 echo $PWD/*.log"),
            "bash: D=1: command not found\n"
        );
    }

    #[test]
    fn pipeline_and_script_limits() {
        let pipe = |n: usize| format!("echo 1{}", " | cat".repeat(n - 1));
        assert_eq!(run_fresh(&pipe(MAX_PIPELINE)), "1\n");
        assert_eq!(
            run_fresh(&pipe(MAX_PIPELINE + 1)),
            "bash: pipeline too long (at most 8 commands in this sandbox)\n"
        );
        let seq = |n: usize| "echo a;".repeat(n);
        assert_eq!(run_fresh(&seq(MAX_COMMANDS)), "a\n".repeat(MAX_COMMANDS));
        // Nothing runs when the script is too long.
        assert_eq!(
            run_fresh(&seq(MAX_COMMANDS + 1)),
            "bash: script too long (at most 32 commands in this sandbox)\n"
        );
        let args = |n: usize| format!("echo{}", " a".repeat(n));
        // The command's name counts as one of the arguments.
        assert_eq!(
            run_fresh(&format!("{} | wc -w", args(MAX_ARGS - 1))),
            "511\n"
        );
        assert_eq!(
            run_fresh(&format!("{}; echo $?", args(MAX_ARGS))),
            "bash: argument list too long\n126\n"
        );
    }

    #[test]
    fn output_is_cut_with_a_note() {
        let x = |n: usize| "x".repeat(n);
        // 800 characters with the newline: kept whole.
        let whole = format!("{}\n", x(MAX_OUTPUT_CHARS - 1));
        assert_eq!(
            run_fresh(&format!("echo {}", x(MAX_OUTPUT_CHARS - 1))),
            whole
        );
        assert_eq!(
            run_fresh(&format!("echo {}", x(900))),
            format!("{}\n{CUT_NOTE}", x(MAX_OUTPUT_CHARS))
        );
        // Cut just after a newline: no blank line before the note.
        assert_eq!(
            run_fresh(&format!("echo {}; echo b", x(MAX_OUTPUT_CHARS - 1))),
            format!("{whole}{CUT_NOTE}")
        );
        // Characters, not bytes.
        assert_eq!(
            run_fresh(&format!("echo {}", "é".repeat(900))),
            format!("{}\n{CUT_NOTE}", "é".repeat(MAX_OUTPUT_CHARS))
        );
    }

    #[test]
    fn streams_and_work_are_bounded() {
        let mut sh = test_shell();
        sh.fs.write("/big", &"y".repeat(MAX_STREAM), false).unwrap();
        assert_eq!(sh.run("cat /big /big | wc -c"), format!("{MAX_STREAM}\n"));
        // 64 reads of 64 KiB are exactly the budget; the 65th is refused.
        let cat = |n: usize| format!("cat{} > /dev/null; echo $?", " /big".repeat(n));
        assert_eq!(sh.run(&cat(MAX_WORK / MAX_STREAM)), "0\n");
        assert_eq!(
            sh.run(&cat(MAX_WORK / MAX_STREAM + 1)),
            "cat: this script read more than 4194304 bytes, the sandbox's limit\n1\n"
        );
        // The budget is per script.
        assert_eq!(sh.run("wc -c /big"), "65536 /big\n");
    }
}
