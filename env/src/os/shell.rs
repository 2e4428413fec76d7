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

use std::cell::Cell;

use super::fs::{self, Fs, FsError, Node};

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

/// A word after quote removal; `pattern` keeps quoted glob characters escaped with `\`.
/// Variables are substituted when the command runs, at the recorded byte offsets.
#[derive(Clone, Debug, Default)]
struct Word {
    text: String,
    pattern: String,
    glob: bool,
    started: bool,
    quoted: bool,
    /// Whether the word has a character or quotes of its own (else an empty expansion drops it).
    literal: bool,
    /// `(offset in text, offset in pattern, name)` of each variable reference.
    vars: Vec<(usize, usize, String)>,
}

impl Word {
    fn plain(&mut self, c: char) {
        self.started = true;
        self.literal = true;
        self.text.push(c);
        if c == '\\' {
            self.pattern.push('\\');
        }
        self.pattern.push(c);
        if matches!(c, '*' | '?') {
            self.glob = true;
        }
    }

    fn quoted(&mut self, c: char) {
        self.started = true;
        self.quoted = true;
        self.literal = true;
        self.text.push(c);
        if matches!(c, '*' | '?' | '\\') {
            self.pattern.push('\\');
        }
        self.pattern.push(c);
    }

    fn quoted_str(&mut self, s: &str) {
        self.started = true;
        self.quoted = true;
        self.literal = true;
        for c in s.chars() {
            self.quoted(c);
        }
    }

    fn var(&mut self, name: String) {
        self.started = true;
        self.quoted = true;
        self.vars.push((self.text.len(), self.pattern.len(), name));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Redir {
    Out,
    Append,
    In,
    Err,
    ErrAppend,
    ErrToOut,
}

#[derive(Debug)]
enum Tok {
    Word(Word),
    Pipe,
    And,
    Or,
    Semi,
    Redir(Redir),
}

impl Tok {
    fn show(&self) -> &'static str {
        match self {
            Tok::Word(_) => "word",
            Tok::Pipe => "|",
            Tok::And => "&&",
            Tok::Or => "||",
            Tok::Semi => ";",
            Tok::Redir(Redir::Out) => ">",
            Tok::Redir(Redir::Append) => ">>",
            Tok::Redir(Redir::In) => "<",
            Tok::Redir(Redir::Err) => "2>",
            Tok::Redir(Redir::ErrAppend) => "2>>",
            Tok::Redir(Redir::ErrToOut) => "2>&1",
        }
    }
}

#[derive(Debug, Default)]
struct Cmd {
    words: Vec<Word>,
    redirs: Vec<(Redir, Word)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    Seq,
    And,
    Or,
}

fn syntax(token: &str) -> String {
    format!("bash: syntax error near unexpected token `{token}'")
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
        match Self::lex(script).and_then(parse) {
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

    fn var(&self, name: &str) -> String {
        match name {
            "HOME" => HOME.to_string(),
            "USER" => USER.to_string(),
            "PWD" => self.cwd.clone(),
            "SHELL" => "/bin/bash".to_string(),
            "?" => self.status.to_string(),
            _ => String::new(),
        }
    }

    fn lex(script: &str) -> Result<Vec<Tok>, String> {
        let chars: Vec<char> = script.chars().collect();
        let mut toks = Vec::new();
        let mut word = Word::default();
        let mut i = 0;
        fn flush(word: &mut Word, toks: &mut Vec<Tok>) {
            if word.started {
                toks.push(Tok::Word(std::mem::take(word)));
            }
        }
        while let Some(&c) = chars.get(i) {
            let next = chars.get(i + 1).copied();
            i += 1;
            match c {
                ' ' | '\t' | '\r' => flush(&mut word, &mut toks),
                '\n' | ';' => {
                    flush(&mut word, &mut toks);
                    toks.push(Tok::Semi);
                }
                '#' if !word.started => {
                    while chars.get(i).is_some_and(|&c| c != '\n') {
                        i += 1;
                    }
                }
                '|' => {
                    flush(&mut word, &mut toks);
                    if next == Some('|') {
                        i += 1;
                        toks.push(Tok::Or);
                    } else {
                        toks.push(Tok::Pipe);
                    }
                }
                '&' => {
                    flush(&mut word, &mut toks);
                    if next == Some('&') {
                        i += 1;
                        toks.push(Tok::And);
                    } else {
                        return Err(
                            "bash: background jobs (&) are not supported in this sandbox"
                                .to_string(),
                        );
                    }
                }
                '>' => {
                    let stderr = word.started && !word.quoted && word.text == "2";
                    if stderr {
                        word = Word::default();
                    } else {
                        flush(&mut word, &mut toks);
                    }
                    let append = next == Some('>');
                    if append {
                        i += 1;
                    }
                    let redir = match (stderr, append) {
                        (true, false)
                            if chars.get(i) == Some(&'&') && chars.get(i + 1) == Some(&'1') =>
                        {
                            i += 2;
                            Redir::ErrToOut
                        }
                        (true, false) => Redir::Err,
                        (true, true) => Redir::ErrAppend,
                        (false, false) => Redir::Out,
                        (false, true) => Redir::Append,
                    };
                    toks.push(Tok::Redir(redir));
                }
                '<' => {
                    flush(&mut word, &mut toks);
                    toks.push(Tok::Redir(Redir::In));
                }
                '(' | ')' if !word.started => return Err(syntax(&c.to_string())),
                '`' => {
                    return Err(
                        "bash: command substitution is not supported in this sandbox".to_string(),
                    );
                }
                '\'' => {
                    word.started = true;
                    word.quoted = true;
                    word.literal = true;
                    loop {
                        match chars.get(i) {
                            None => {
                                return Err("bash: unexpected EOF while looking for matching `''"
                                    .to_string());
                            }
                            Some('\'') => {
                                i += 1;
                                break;
                            }
                            Some(&c) => {
                                word.quoted(c);
                                i += 1;
                            }
                        }
                    }
                }
                '"' => {
                    word.started = true;
                    word.quoted = true;
                    word.literal = true;
                    loop {
                        match chars.get(i) {
                            None => {
                                return Err("bash: unexpected EOF while looking for matching `\"'"
                                    .to_string());
                            }
                            Some('"') => {
                                i += 1;
                                break;
                            }
                            Some('\\')
                                if chars
                                    .get(i + 1)
                                    .is_some_and(|c| matches!(c, '$' | '`' | '"' | '\\')) =>
                            {
                                if let Some(&c) = chars.get(i + 1) {
                                    word.quoted(c);
                                }
                                i += 2;
                            }
                            Some('$') => match dollar(&chars, i + 1) {
                                Some((name, j)) => {
                                    word.var(name);
                                    i = j;
                                }
                                None => {
                                    word.quoted('$');
                                    i += 1;
                                }
                            },
                            Some('`') => {
                                return Err(
                                    "bash: command substitution is not supported in this sandbox"
                                        .to_string(),
                                );
                            }
                            Some(&c) => {
                                word.quoted(c);
                                i += 1;
                            }
                        }
                    }
                }
                '\\' => match next {
                    Some('\n') => i += 1,
                    Some(n) => {
                        word.quoted(n);
                        i += 1;
                    }
                    None => word.quoted('\\'),
                },
                '$' if next == Some('(') => {
                    return Err(
                        "bash: command substitution is not supported in this sandbox".to_string(),
                    );
                }
                '$' => match dollar(&chars, i) {
                    Some((name, j)) => {
                        word.var(name);
                        i = j;
                    }
                    None => word.plain('$'),
                },
                '~' if !word.started
                    && next.is_none_or(|n| {
                        n == '/' || n.is_whitespace() || matches!(n, ';' | '|' | '&' | '>' | '<')
                    }) =>
                {
                    word.quoted_str(HOME);
                }
                c => word.plain(c),
            }
        }
        flush(&mut word, &mut toks);
        Ok(toks)
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

    /// Expands a word: variables are substituted, then an unquoted glob becomes the sorted
    /// matching paths (or stays as written when nothing matches, as in bash). A word made only
    /// of unquoted variables that are empty disappears.
    fn expand(&self, word: &Word, into: &mut Vec<String>) {
        let mut text = String::with_capacity(word.text.len());
        let mut pattern = String::with_capacity(word.pattern.len());
        let (mut t0, mut p0) = (0, 0);
        for (t, p, name) in &word.vars {
            text.push_str(word.text.get(t0..*t).unwrap_or_default());
            pattern.push_str(word.pattern.get(p0..*p).unwrap_or_default());
            let value = self.var(name);
            text.push_str(&value);
            for c in value.chars() {
                if matches!(c, '*' | '?' | '\\') {
                    pattern.push('\\');
                }
                pattern.push(c);
            }
            (t0, p0) = (*t, *p);
        }
        text.push_str(word.text.get(t0..).unwrap_or_default());
        pattern.push_str(word.pattern.get(p0..).unwrap_or_default());
        if text.is_empty() && !word.literal {
            return;
        }
        let found = if word.glob {
            self.glob(&pattern)
        } else {
            Vec::new()
        };
        if found.is_empty() {
            into.push(text);
        } else {
            into.extend(found);
        }
    }

    fn glob(&self, pattern: &str) -> Vec<String> {
        let mut candidates = vec![if pattern.starts_with('/') {
            "/".to_string()
        } else {
            String::new()
        }];
        for comp in pattern.split('/').filter(|c| !c.is_empty()) {
            let mut next = Vec::new();
            let wild = has_wildcard(comp);
            let literal = unescape(comp);
            for c in &candidates {
                let join = |name: &str| -> String {
                    if c.is_empty() {
                        name.to_string()
                    } else if c.ends_with('/') {
                        format!("{c}{name}")
                    } else {
                        format!("{c}/{name}")
                    }
                };
                if !wild {
                    next.push(join(&literal));
                    continue;
                }
                let dir = if c.is_empty() { "." } else { c.as_str() };
                let Ok(dir) = self.path(dir) else { continue };
                for (p, _) in self.fs.children(&dir) {
                    let name = fs::name(p);
                    if name.starts_with('.') && !comp.starts_with('.') {
                        continue;
                    }
                    if glob_match(comp, name) && next.len() < MAX_ARGS {
                        next.push(join(name));
                    }
                }
                if next.len() >= MAX_ARGS {
                    break;
                }
            }
            candidates = next;
        }
        candidates.retain(|c| self.path(c).is_ok_and(|p| self.fs.get(&p).is_some()));
        candidates.sort();
        candidates
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

    fn builtin(
        &mut self,
        name: &str,
        args: &[String],
        stdin: &str,
        out: &mut Out,
        err: &mut Out,
    ) -> i32 {
        match name {
            "cat" => self.cat(args, stdin, out, err),
            "cd" => self.cd(args, err),
            "chmod" => self.chmod(args, err),
            "cp" => self.cp_mv(true, args, err),
            "cut" => self.cut(args, stdin, out, err),
            "echo" => echo(args, out),
            "find" => self.find(args, out, err),
            "grep" => self.grep(args, stdin, out, err),
            "head" => self.head_tail(true, args, stdin, out, err),
            "ls" => self.ls(args, out, err),
            "mkdir" => self.mkdir(args, err),
            "mv" => self.cp_mv(false, args, err),
            "pwd" => {
                out.line(&self.cwd);
                0
            }
            "rm" => self.rm(args, err),
            "sort" => self.sort(args, stdin, out, err),
            "tail" => self.head_tail(false, args, stdin, out, err),
            "touch" => self.touch(args, err),
            "uniq" => self.uniq(args, stdin, out, err),
            "wc" => self.wc(args, stdin, out, err),
            _ if name.contains('/') => {
                match self.path(name).map(|p| self.fs.get(&p).is_some()) {
                    Ok(true) => err.line(&format!(
                        "bash: {name}: running programs is not supported in this sandbox"
                    )),
                    _ => err.line(&format!("bash: {name}: No such file or directory")),
                }
                127
            }
            _ => {
                err.line(&format!("bash: {name}: command not found"));
                127
            }
        }
    }

    /// Reads the inputs of a text command: the files named, or stdin when none (or `-`).
    /// Errors are reported as `cmd: NAME: message`; returns `(display name, text)` pairs and
    /// whether an error occurred.
    fn inputs<'a>(
        &'a self,
        cmd: &str,
        files: &[&str],
        stdin: &'a str,
        err: &mut Out,
    ) -> (Vec<(String, &'a str)>, bool) {
        if files.is_empty() {
            let ok = self.charge(cmd, stdin.len(), err);
            return (
                if ok {
                    vec![(String::new(), stdin)]
                } else {
                    Vec::new()
                },
                !ok,
            );
        }
        let mut failed = false;
        let mut texts = Vec::new();
        for &f in files {
            if f == "-" {
                if !self.charge(cmd, stdin.len(), err) {
                    return (texts, true);
                }
                texts.push(("(standard input)".to_string(), stdin));
                continue;
            }
            match self.path(f).and_then(|p| self.fs.read(&p)) {
                Ok(text) if !self.charge(cmd, text.len(), err) => return (texts, true),
                Ok(text) => texts.push((f.to_string(), text)),
                Err(e) => {
                    err.line(&format!("{cmd}: {f}: {}", e.message()));
                    failed = true;
                }
            }
        }
        (texts, failed)
    }

    fn cat(&self, args: &[String], stdin: &str, out: &mut Out, err: &mut Out) -> i32 {
        let Some((_, files)) = options("cat", args, "", err) else {
            return 1;
        };
        let (texts, failed) = self.inputs("cat", &files, stdin, err);
        for (_, t) in texts {
            out.push(t);
        }
        i32::from(failed)
    }

    fn cd(&mut self, args: &[String], err: &mut Out) -> i32 {
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

    fn ls(&self, args: &[String], out: &mut Out, err: &mut Out) -> i32 {
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

    fn mkdir(&mut self, args: &[String], err: &mut Out) -> i32 {
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

    fn touch(&mut self, args: &[String], err: &mut Out) -> i32 {
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

    fn rm(&mut self, args: &[String], err: &mut Out) -> i32 {
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

    fn cp_mv(&mut self, copy: bool, args: &[String], err: &mut Out) -> i32 {
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

    fn chmod(&mut self, args: &[String], err: &mut Out) -> i32 {
        let mut recursive = false;
        let mut mode = None;
        let mut files = Vec::new();
        for a in args {
            if a == "-R" {
                recursive = true;
            } else if mode.is_none() {
                mode = Some(a.as_str());
            } else {
                files.push(a.as_str());
            }
        }
        let Some(mode) = mode else {
            err.line("chmod: missing operand");
            return 1;
        };
        if mode.starts_with('-') && parse_mode(mode, 0).is_none() {
            let c = mode.chars().nth(1).unwrap_or('-');
            err.line(&format!("chmod: invalid option -- '{c}'"));
            err.line("Try 'chmod --help' for more information.");
            return 1;
        }
        if parse_mode(mode, 0).is_none() {
            err.line(&format!("chmod: invalid mode: '{mode}'"));
            return 1;
        }
        if files.is_empty() {
            err.line(&format!("chmod: missing operand after '{mode}'"));
            return 1;
        }
        let mut status = 0;
        for f in files {
            let Ok(path) = self
                .path(f)
                .and_then(|p| self.fs.get(&p).map(|_| p.clone()).ok_or(FsError::NotFound))
            else {
                err.line(&format!(
                    "chmod: cannot access '{f}': No such file or directory"
                ));
                status = 1;
                continue;
            };
            let mut targets = vec![path.clone()];
            if recursive {
                targets.extend(self.fs.descendants(&path).map(|(p, _)| p.clone()));
            }
            for t in targets {
                let old = self.fs.get(&t).map_or(0, Node::mode);
                if let Some(new) = parse_mode(mode, old) {
                    // The path was just listed, so this cannot fail.
                    let _ = self.fs.chmod(&t, new);
                }
            }
        }
        status
    }

    fn head_tail(
        &self,
        head: bool,
        args: &[String],
        stdin: &str,
        out: &mut Out,
        err: &mut Out,
    ) -> i32 {
        let cmd = if head { "head" } else { "tail" };
        let mut count: Option<&str> = None;
        let mut files = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "-n" {
                match it.next() {
                    Some(n) => count = Some(n),
                    None => {
                        err.line(&format!("{cmd}: option requires an argument -- 'n'"));
                        return 1;
                    }
                }
            } else if let Some(n) = a.strip_prefix("-n") {
                count = Some(n);
            } else if a.len() > 1
                && a.starts_with('-')
                && a.chars().skip(1).all(|c| c.is_ascii_digit())
            {
                count = a.get(1..);
            } else if a.starts_with('-') && a.len() > 1 {
                let c = a.chars().nth(1).unwrap_or('-');
                err.line(&format!("{cmd}: invalid option -- '{c}'"));
                err.line(&format!("Try '{cmd} --help' for more information."));
                return 1;
            } else {
                files.push(a.as_str());
            }
        }
        let (from_start, digits) = match count {
            None => (false, "10"),
            Some(n) if !head && n.starts_with('+') => (true, n.get(1..).unwrap_or_default()),
            Some(n) => (false, n),
        };
        let Ok(n) = digits.parse::<usize>() else {
            err.line(&format!(
                "{cmd}: invalid number of lines: '{}'",
                count.unwrap_or_default()
            ));
            return 1;
        };
        let (texts, failed) = self.inputs(cmd, &files, stdin, err);
        let many = texts.len() > 1;
        for (k, (name, text)) in texts.iter().enumerate() {
            if many {
                if k > 0 {
                    out.push("\n");
                }
                out.line(&format!("==> {name} <=="));
            }
            let lines: Vec<&str> = text.split_inclusive('\n').collect();
            let range = if head {
                0..n.min(lines.len())
            } else if from_start {
                n.saturating_sub(1).min(lines.len())..lines.len()
            } else {
                lines.len().saturating_sub(n)..lines.len()
            };
            for l in lines.get(range).unwrap_or_default() {
                out.push(l);
            }
        }
        i32::from(failed)
    }

    fn wc(&self, args: &[String], stdin: &str, out: &mut Out, err: &mut Out) -> i32 {
        let Some((flags, files)) = options("wc", args, "lwcm", err) else {
            return 1;
        };
        let mut which: Vec<usize> = [('l', 0), ('w', 1), ('c', 2)]
            .into_iter()
            .filter(|(f, _)| flags.contains(*f) || (*f == 'c' && flags.contains('m')))
            .map(|(_, i)| i)
            .collect();
        if which.is_empty() {
            which = vec![0, 1, 2];
        }
        let (texts, failed) = self.inputs("wc", &files, stdin, err);
        let mut rows: Vec<([usize; 3], String)> = texts
            .iter()
            .map(|(name, t)| {
                let counts = [
                    t.matches('\n').count(),
                    t.split_whitespace().count(),
                    t.len(),
                ];
                (counts, name.clone())
            })
            .collect();
        if rows.len() > 1 {
            let mut total = [0; 3];
            for (c, _) in &rows {
                for (t, x) in total.iter_mut().zip(c) {
                    *t += x;
                }
            }
            rows.push((total, "total".to_string()));
        }
        let single = rows.len() == 1 && which.len() == 1;
        let width = rows
            .iter()
            .flat_map(|(c, _)| which.iter().filter_map(|&i| c.get(i)))
            .map(|n| n.to_string().len())
            .max()
            .unwrap_or(1);
        for (counts, name) in rows {
            let numbers: Vec<String> = which
                .iter()
                .filter_map(|&i| counts.get(i))
                .map(|n| {
                    if single {
                        n.to_string()
                    } else {
                        format!("{n:>width$}")
                    }
                })
                .collect();
            let mut line = numbers.join(" ");
            if !name.is_empty() {
                line.push(' ');
                line.push_str(&name);
            }
            out.line(&line);
        }
        i32::from(failed)
    }

    fn sort(&self, args: &[String], stdin: &str, out: &mut Out, err: &mut Out) -> i32 {
        let Some((flags, files)) = options("sort", args, "nru", err) else {
            return 2;
        };
        let (texts, failed) = self.inputs("sort", &files, stdin, err);
        let mut lines: Vec<&str> = texts.iter().flat_map(|(_, t)| t.lines()).collect();
        let numeric = flags.contains('n');
        let key = |l: &str| -> f64 { if numeric { leading_number(l) } else { 0.0 } };
        lines.sort_by(|a, b| {
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| a.cmp(b))
        });
        if flags.contains('r') {
            lines.reverse();
        }
        if flags.contains('u') {
            lines.dedup_by(|a, b| if numeric { key(a) == key(b) } else { a == b });
        }
        for l in lines {
            out.line(l);
        }
        if failed { 2 } else { 0 }
    }

    fn uniq(&self, args: &[String], stdin: &str, out: &mut Out, err: &mut Out) -> i32 {
        let Some((flags, files)) = options("uniq", args, "cdu", err) else {
            return 1;
        };
        if files.len() > 1 {
            err.line("uniq: writing to an output file is not supported in this sandbox");
            return 1;
        }
        let (texts, failed) = self.inputs("uniq", &files, stdin, err);
        let mut groups: Vec<(usize, &str)> = Vec::new();
        for l in texts.iter().flat_map(|(_, t)| t.lines()) {
            match groups.last_mut() {
                Some((n, last)) if *last == l => *n += 1,
                _ => groups.push((1, l)),
            }
        }
        for (n, l) in groups {
            if (flags.contains('d') && n < 2) || (flags.contains('u') && n > 1) {
                continue;
            }
            if flags.contains('c') {
                out.line(&format!("{n:>7} {l}"));
            } else {
                out.line(l);
            }
        }
        i32::from(failed)
    }

    fn cut(&self, args: &[String], stdin: &str, out: &mut Out, err: &mut Out) -> i32 {
        let mut delim: Option<&str> = None;
        let mut list: Option<&str> = None;
        let mut files = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let (opt, attached) = match a.strip_prefix("-d").or_else(|| a.strip_prefix("-f")) {
                Some(rest) if a.starts_with("-d") => ('d', rest),
                Some(rest) => ('f', rest),
                None if a.starts_with('-') && a.len() > 1 => {
                    let c = a.chars().nth(1).unwrap_or('-');
                    err.line(&format!("cut: invalid option -- '{c}'"));
                    err.line("Try 'cut --help' for more information.");
                    return 1;
                }
                None => {
                    files.push(a.as_str());
                    continue;
                }
            };
            let value = if attached.is_empty() {
                match it.next() {
                    Some(v) => v.as_str(),
                    None => {
                        err.line(&format!("cut: option requires an argument -- '{opt}'"));
                        return 1;
                    }
                }
            } else {
                attached
            };
            if opt == 'd' {
                delim = Some(value);
            } else {
                list = Some(value);
            }
        }
        let Some(list) = list else {
            err.line("cut: you must specify a list of bytes, characters, or fields");
            return 1;
        };
        let delim = delim.unwrap_or("\t");
        let mut chars = delim.chars();
        let (Some(d), None) = (chars.next(), chars.next()) else {
            err.line("cut: the delimiter must be a single character");
            return 1;
        };
        let ranges = match parse_fields(list) {
            Ok(r) => r,
            Err(m) => {
                err.line(&m);
                return 1;
            }
        };
        let (texts, failed) = self.inputs("cut", &files, stdin, err);
        for l in texts.iter().flat_map(|(_, t)| t.lines()) {
            if !l.contains(d) {
                out.line(l);
                continue;
            }
            let picked: Vec<&str> = l
                .split(d)
                .enumerate()
                .filter(|(i, _)| ranges.iter().any(|(a, b)| (*a..=*b).contains(&(i + 1))))
                .map(|(_, f)| f)
                .collect();
            out.line(&picked.join(&d.to_string()));
        }
        i32::from(failed)
    }

    fn grep(&self, args: &[String], stdin: &str, out: &mut Out, err: &mut Out) -> i32 {
        let Some((flags, operands)) = options("grep", args, "cinvlFrRh", err) else {
            return 2;
        };
        let Some((pattern, files)) = operands.split_first() else {
            err.line("Usage: grep [OPTION]... PATTERNS [FILE]...");
            return 2;
        };
        let ignore = flags.contains('i');
        let regex = match Regex::new(pattern, flags.contains('F'), ignore) {
            Ok(r) => r,
            Err(m) => {
                err.line(&m);
                return 2;
            }
        };
        let recursive = flags.contains('r') || flags.contains('R');
        let mut failed = false;
        let mut texts: Vec<(String, &str)> = Vec::new();
        if files.is_empty() {
            texts.push(("(standard input)".to_string(), stdin));
        }
        for &f in files {
            match self.path(f) {
                Ok(p) if recursive && self.fs.is_dir(&p) => {
                    let base = f.trim_end_matches('/');
                    for (q, n) in self.fs.descendants(&p) {
                        if let Node::File { content, .. } = n {
                            let rel = q.get(p.len()..).unwrap_or_default();
                            let rel = if p == "/" { q.as_str() } else { rel };
                            texts.push((format!("{base}{rel}"), content.as_str()));
                        }
                    }
                }
                Ok(p) => match self.fs.read(&p) {
                    Ok(t) => texts.push((f.to_string(), t)),
                    Err(e) => {
                        err.line(&format!("grep: {f}: {}", e.message()));
                        failed = true;
                    }
                },
                Err(e) => {
                    err.line(&format!("grep: {f}: {}", e.message()));
                    failed = true;
                }
            }
        }
        let bytes: usize = texts.iter().map(|(_, t)| t.len()).sum();
        let cost = bytes.saturating_mul(1 + regex.atoms.len() / 16);
        if !self.charge("grep", cost, err) {
            return 2;
        }
        let prefix = (files.len() > 1 || recursive) && !flags.contains('h');
        let invert = flags.contains('v');
        let mut any = false;
        for (name, text) in &texts {
            let mut count = 0;
            for (i, line) in text.lines().enumerate() {
                if regex.matches(line) == invert {
                    continue;
                }
                count += 1;
                any = true;
                if flags.contains('l') {
                    break;
                }
                if flags.contains('c') {
                    continue;
                }
                let mut s = String::new();
                if prefix {
                    s.push_str(name);
                    s.push(':');
                }
                if flags.contains('n') {
                    s.push_str(&format!("{}:", i + 1));
                }
                s.push_str(line);
                out.line(&s);
            }
            if flags.contains('l') {
                if count > 0 {
                    out.line(name);
                }
            } else if flags.contains('c') {
                if prefix {
                    out.line(&format!("{name}:{count}"));
                } else {
                    out.line(&count.to_string());
                }
            }
        }
        if failed {
            2
        } else if any {
            0
        } else {
            1
        }
    }

    fn find(&self, args: &[String], out: &mut Out, err: &mut Out) -> i32 {
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

/// Reads `$NAME`, `${NAME}` or `$?` at `chars[i]` (just after the `$`); returns the name and
/// the index after it, or `None` for a lone `$`.
fn dollar(chars: &[char], i: usize) -> Option<(String, usize)> {
    match chars.get(i) {
        Some('?') => Some(("?".to_string(), i + 1)),
        Some('{') => {
            let end = chars.get(i + 1..)?.iter().position(|&c| c == '}')? + i + 1;
            let name: String = chars.get(i + 1..end)?.iter().collect();
            Some((name, end + 1))
        }
        Some(c) if c.is_ascii_alphabetic() || *c == '_' => {
            let mut j = i;
            while chars
                .get(j)
                .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
            {
                j += 1;
            }
            let name: String = chars.get(i..j)?.iter().collect();
            Some((name, j))
        }
        _ => None,
    }
}

/// Splits leading and interleaved `-xyz` options from operands (`--` ends options). Unknown
/// options are reported bash-style and give `None`.
fn options<'a>(
    cmd: &str,
    args: &'a [String],
    allowed: &str,
    err: &mut Out,
) -> Option<(String, Vec<&'a str>)> {
    let mut flags = String::new();
    let mut operands = Vec::new();
    let mut done = false;
    for a in args {
        if !done && a == "--" {
            done = true;
        } else if !done && a.starts_with("--") {
            err.line(&format!("{cmd}: unrecognized option '{a}'"));
            err.line(&format!("Try '{cmd} --help' for more information."));
            return None;
        } else if !done && a.starts_with('-') && a.len() > 1 {
            for c in a.chars().skip(1) {
                if !allowed.contains(c) {
                    err.line(&format!("{cmd}: invalid option -- '{c}'"));
                    err.line(&format!("Try '{cmd} --help' for more information."));
                    return None;
                }
                flags.push(c);
            }
        } else {
            operands.push(a.as_str());
        }
    }
    Some((flags, operands))
}

fn echo(args: &[String], out: &mut Out) -> i32 {
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

/// Applies a `chmod` mode to `old`: octal (`755`, `0644`) or symbolic (`+x`, `u+rw`, `go-w`,
/// `a=r`).
fn parse_mode(mode: &str, old: u16) -> Option<u16> {
    if !mode.is_empty() && mode.len() <= 4 && mode.chars().all(|c| ('0'..='7').contains(&c)) {
        return u16::from_str_radix(mode, 8).ok();
    }
    let op_at = mode.find(['+', '-', '='])?;
    let (who, rest) = mode.split_at(op_at);
    let mut chars = rest.chars();
    let op = chars.next()?;
    let perms: String = chars.collect();
    if perms.is_empty() || !perms.chars().all(|c| matches!(c, 'r' | 'w' | 'x')) {
        return None;
    }
    if !who.chars().all(|c| matches!(c, 'u' | 'g' | 'o' | 'a')) {
        return None;
    }
    let mut bits = 0u16;
    for p in perms.chars() {
        bits |= match p {
            'r' => 4,
            'w' => 2,
            _ => 1,
        };
    }
    let mut mask = 0u16;
    let who = if who.is_empty() { "a" } else { who };
    for w in who.chars() {
        mask |= match w {
            'u' => bits << 6,
            'g' => bits << 3,
            'o' => bits,
            _ => bits << 6 | bits << 3 | bits,
        };
    }
    Some(match op {
        '+' => old | mask,
        '-' => old & !mask,
        _ => {
            let mut clear = 0u16;
            for w in who.chars() {
                clear |= match w {
                    'u' => 0o700,
                    'g' => 0o070,
                    'o' => 0o007,
                    _ => 0o777,
                };
            }
            (old & !clear) | mask
        }
    })
}

/// `1`, `1,3`, `2-4`, `3-`, `-2` as inclusive 1-based ranges.
fn parse_fields(list: &str) -> Result<Vec<(usize, usize)>, String> {
    let bad = || format!("cut: invalid field value '{list}'");
    let mut out = Vec::new();
    for item in list.split(',') {
        let (a, b) = match item.split_once('-') {
            Some((a, b)) => (
                if a.is_empty() {
                    1
                } else {
                    a.parse().map_err(|_| bad())?
                },
                if b.is_empty() {
                    usize::MAX
                } else {
                    b.parse().map_err(|_| bad())?
                },
            ),
            None => {
                let n = item.parse().map_err(|_| bad())?;
                (n, n)
            }
        };
        if a == 0 || b == 0 {
            return Err("cut: fields are numbered from 1".to_string());
        }
        out.push((a, b));
    }
    Ok(out)
}

/// The number at the start of a line (after blanks), as `sort -n` reads it; 0 if none.
fn leading_number(line: &str) -> f64 {
    let s = line.trim_start();
    let end = s
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || (i == 0 && c == '-')))
        .map_or(s.len(), |(i, _)| i);
    s.get(..end).and_then(|n| n.parse().ok()).unwrap_or(0.0)
}

fn has_wildcard(pattern: &str) -> bool {
    let mut escaped = false;
    for c in pattern.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '*' | '?' => return true,
            _ => {}
        }
    }
    false
}

fn unescape(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len());
    let mut escaped = false;
    for c in pattern.chars() {
        if c == '\\' && !escaped {
            escaped = true;
        } else {
            out.push(c);
            escaped = false;
        }
    }
    out
}

/// Shell wildcard matching of a whole name: `*` any run, `?` one character, `\c` a literal.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum P {
        Star,
        One,
        Lit(char),
    }
    let mut pat = Vec::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        pat.push(match c {
            '*' => P::Star,
            '?' => P::One,
            '\\' => P::Lit(chars.next().unwrap_or('\\')),
            c => P::Lit(c),
        });
    }
    let text: Vec<char> = name.chars().collect();
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match (pat.get(p), text.get(t)) {
            (Some(P::Star), _) => {
                star = Some((p, t));
                p += 1;
            }
            (Some(P::One), Some(_)) => {
                p += 1;
                t += 1;
            }
            (Some(P::Lit(a)), Some(b)) if a == b => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pat.get(p..)
        .is_some_and(|rest| rest.iter().all(|x| *x == P::Star))
}

#[derive(Clone, Debug, PartialEq)]
enum Atom {
    Any,
    Lit(char),
    Class(Vec<(char, char)>, bool),
}

impl Atom {
    fn accepts(&self, c: char) -> bool {
        match self {
            Atom::Any => true,
            Atom::Lit(l) => *l == c,
            Atom::Class(ranges, negated) => {
                ranges.iter().any(|(a, b)| (*a..=*b).contains(&c)) != *negated
            }
        }
    }
}

/// A basic regular expression subset: literals, `.`, `*` (after an atom), `[abc]`, `[a-z]`,
/// `[^...]`, `^` and `$` anchors and `\` escapes. Matching simulates the automaton, so it is
/// linear in the line length.
#[derive(Clone, Debug)]
struct Regex {
    atoms: Vec<(Atom, bool)>,
    start: bool,
    end: bool,
    ignore_case: bool,
}

impl Regex {
    fn new(pattern: &str, fixed: bool, ignore_case: bool) -> Result<Regex, String> {
        let pattern = if ignore_case {
            pattern.to_lowercase()
        } else {
            pattern.to_string()
        };
        let mut atoms: Vec<(Atom, bool)> = Vec::new();
        let mut chars: Vec<char> = pattern.chars().collect();
        let mut start = false;
        let mut end = false;
        if !fixed {
            if chars.first() == Some(&'^') {
                start = true;
                chars.remove(0);
            }
            let escaped_dollar = chars.len() >= 2 && chars.get(chars.len() - 2) == Some(&'\\');
            if chars.last() == Some(&'$') && !escaped_dollar {
                end = true;
                chars.pop();
            }
        }
        let mut i = 0;
        while let Some(&c) = chars.get(i) {
            i += 1;
            if fixed {
                atoms.push((Atom::Lit(c), false));
                continue;
            }
            match c {
                '.' => atoms.push((Atom::Any, false)),
                '*' => match atoms.last_mut() {
                    Some((_, star)) => *star = true,
                    None => atoms.push((Atom::Lit('*'), false)),
                },
                '\\' => {
                    let n = chars.get(i).copied().unwrap_or('\\');
                    i += 1;
                    atoms.push((Atom::Lit(n), false));
                }
                '[' => {
                    let negated = chars.get(i) == Some(&'^');
                    if negated {
                        i += 1;
                    }
                    let mut ranges = Vec::new();
                    let mut first = true;
                    loop {
                        match chars.get(i) {
                            None => return Err("grep: Unmatched [, [^, [:, [., or [=".to_string()),
                            Some(']') if !first => {
                                i += 1;
                                break;
                            }
                            Some(&a) => {
                                if chars.get(i + 1) == Some(&'-')
                                    && chars.get(i + 2).is_some_and(|&b| b != ']')
                                {
                                    let b = chars.get(i + 2).copied().unwrap_or(a);
                                    ranges.push((a, b));
                                    i += 3;
                                } else {
                                    ranges.push((a, a));
                                    i += 1;
                                }
                            }
                        }
                        first = false;
                    }
                    atoms.push((Atom::Class(ranges, negated), false));
                }
                c => atoms.push((Atom::Lit(c), false)),
            }
            if atoms.len() > MAX_PATTERN {
                return Err("grep: pattern too long".to_string());
            }
        }
        if atoms.len() > MAX_PATTERN {
            return Err("grep: pattern too long".to_string());
        }
        Ok(Regex {
            atoms,
            start,
            end,
            ignore_case,
        })
    }

    fn closure(&self, set: &mut [bool]) {
        for i in 0..self.atoms.len() {
            if set.get(i) == Some(&true)
                && self.atoms.get(i).is_some_and(|(_, star)| *star)
                && let Some(next) = set.get_mut(i + 1)
            {
                *next = true;
            }
        }
    }

    fn matches(&self, line: &str) -> bool {
        let m = self.atoms.len();
        let mut set = vec![false; m + 1];
        let mut next = vec![false; m + 1];
        let lowered;
        let line = if self.ignore_case {
            lowered = line.to_lowercase();
            lowered.as_str()
        } else {
            line
        };
        if let Some(s) = set.first_mut() {
            *s = true;
        }
        self.closure(&mut set);
        let accept = |set: &[bool]| set.get(m) == Some(&true);
        if accept(&set) && !self.end {
            return true;
        }
        for c in line.chars() {
            next.iter_mut().for_each(|x| *x = false);
            for (i, (atom, star)) in self.atoms.iter().enumerate() {
                if set.get(i) == Some(&true) && atom.accepts(c) {
                    let j = if *star { i } else { i + 1 };
                    if let Some(x) = next.get_mut(j) {
                        *x = true;
                    }
                }
            }
            if !self.start
                && let Some(x) = next.first_mut()
            {
                *x = true;
            }
            self.closure(&mut next);
            std::mem::swap(&mut set, &mut next);
            if accept(&set) && !self.end {
                return true;
            }
        }
        accept(&set)
    }
}

/// Groups tokens into pipelines joined by `;`, `&&` and `||`.
fn parse(toks: Vec<Tok>) -> Result<Vec<(Link, Vec<Cmd>)>, String> {
    let mut lines: Vec<(Link, Vec<Cmd>)> = Vec::new();
    let mut link = Link::Seq;
    let mut pipeline: Vec<Cmd> = Vec::new();
    let mut cmd = Cmd::default();
    let mut pending: Option<Redir> = None;
    let mut commands = 0usize;
    let mut dangling = false;
    for tok in toks {
        if let Some(r) = pending {
            match tok {
                Tok::Word(w) => {
                    cmd.redirs.push((r, w));
                    pending = None;
                    continue;
                }
                other => return Err(syntax(other.show())),
            }
        }
        match tok {
            Tok::Word(w) => cmd.words.push(w),
            Tok::Redir(Redir::ErrToOut) => cmd.redirs.push((Redir::ErrToOut, Word::default())),
            Tok::Redir(r) => pending = Some(r),
            Tok::Pipe | Tok::And | Tok::Or | Tok::Semi => {
                let empty = cmd.words.is_empty() && cmd.redirs.is_empty();
                if empty {
                    if !matches!(tok, Tok::Semi) || !pipeline.is_empty() || dangling {
                        return Err(syntax(tok.show()));
                    }
                    continue;
                }
                commands += 1;
                pipeline.push(std::mem::take(&mut cmd));
                if pipeline.len() > MAX_PIPELINE {
                    return Err(format!(
                        "bash: pipeline too long (at most {MAX_PIPELINE} commands in this sandbox)"
                    ));
                }
                if matches!(tok, Tok::Pipe) {
                    dangling = true;
                    continue;
                }
                lines.push((link, std::mem::take(&mut pipeline)));
                link = match tok {
                    Tok::And => Link::And,
                    Tok::Or => Link::Or,
                    _ => Link::Seq,
                };
                dangling = !matches!(tok, Tok::Semi);
            }
        }
        if commands > MAX_COMMANDS {
            return Err(format!(
                "bash: script too long (at most {MAX_COMMANDS} commands in this sandbox)"
            ));
        }
    }
    if pending.is_some() {
        return Err(syntax("newline"));
    }
    if cmd.words.is_empty() && cmd.redirs.is_empty() {
        if dangling {
            return Err("bash: syntax error: unexpected end of file".to_string());
        }
    } else {
        commands += 1;
        pipeline.push(cmd);
        if pipeline.len() > MAX_PIPELINE {
            return Err(format!(
                "bash: pipeline too long (at most {MAX_PIPELINE} commands in this sandbox)"
            ));
        }
        lines.push((link, pipeline));
    }
    if commands > MAX_COMMANDS {
        return Err(format!(
            "bash: script too long (at most {MAX_COMMANDS} commands in this sandbox)"
        ));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell() -> Shell {
        let mut fs = Fs::default();
        fs.mkdir(HOME, true).unwrap();
        fs.mkdir("/data/sub", true).unwrap();
        fs.write("/data/nums.txt", "5\n12\n3\n", false).unwrap();
        fs.write("/data/a.log", "ERROR x\nINFO y\nERROR z\n", false)
            .unwrap();
        fs.write("/data/sub/b.log", "ERROR q\n", false).unwrap();
        Shell::new(fs)
    }

    #[test]
    fn pipelines_and_sequencing() {
        let mut sh = shell();
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
    fn regex_subset() {
        let r = |p: &str, l: &str| Regex::new(p, false, false).unwrap().matches(l);
        assert!(r("^ab*c$", "ac"));
        assert!(r("^ab*c$", "abbbc"));
        assert!(!r("^ab*c$", "abbbcd"));
        assert!(r("b.d", "abcde"));
        assert!(r("[0-9][0-9]*", "x42"));
        assert!(!r("^[^a]", "abc"));
        assert!(r("a\\.b", "a.b"));
        assert!(!r("a\\.b", "axb"));
        assert!(r("", "anything"));
        assert!(
            Regex::new("ERROR", false, true)
                .unwrap()
                .matches("an error")
        );
        assert!(glob_match("*.t?t", "a.txt"));
        assert!(!glob_match("*.txt", "a.txt.bak"));
        assert!(glob_match("\\*", "*"));
    }

    #[test]
    fn listing_modes_and_copies() {
        let mut sh = shell();
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
}
