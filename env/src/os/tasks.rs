//! Instances: a seeded file system, and a task on it with its oracle plan and its check.
//!
//! Every instance gets a fresh file system (home directory with documents, scripts and an
//! inbox, logs, a config file, data files and a scratch directory under `/tmp/work`), all
//! generated from fixed word lists so a word-level tokenizer covers every name and line. Then
//! one template of the instance's difficulty is drawn and fills in its parameters; a template
//! whose question would be ambiguous for this file system (a tie, nothing to find) declines and
//! the next candidate is drawn.

use rand::Rng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::fs::{self, Fs, Node};
use super::tools::{ANSWER, BASH, FINISH};
use crate::ToolCall;

/// User names in the access log and the inbox.
pub const USERS: [&str; 12] = [
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "oscar",
    "peggy",
];
/// File name stems.
pub const STEMS: [&str; 20] = [
    "report", "notes", "todo", "draft", "summary", "budget", "plan", "ideas", "letter", "memo",
    "readme", "index", "data", "results", "backup", "archive", "invoice", "agenda", "minutes",
    "journal",
];
/// File name extensions.
pub const EXTS: [&str; 8] = ["txt", "log", "tmp", "csv", "sh", "md", "conf", "bak"];
/// Words of documents, messages and data files.
pub const WORDS: [&str; 32] = [
    "alpha", "beta", "gamma", "delta", "apple", "banana", "cherry", "river", "mountain", "forest",
    "cloud", "stone", "paper", "window", "garden", "market", "silver", "orange", "purple",
    "yellow", "coffee", "tea", "bread", "music", "planet", "rocket", "ocean", "desert", "winter",
    "summer", "spring", "autumn",
];
/// Log levels.
pub const LEVELS: [&str; 4] = ["INFO", "WARN", "ERROR", "DEBUG"];
/// Words of log messages.
pub const MESSAGES: [&str; 12] = [
    "started",
    "stopped",
    "connected",
    "failed",
    "timeout",
    "request",
    "served",
    "cache",
    "miss",
    "retry",
    "login",
    "logout",
];
/// Pages in the access log.
pub const PAGES: [&str; 6] = [
    "index.html",
    "about.html",
    "login.html",
    "cart.html",
    "search.html",
    "help.html",
];
/// HTTP statuses in the access log.
pub const STATUSES: [&str; 4] = ["200", "200", "404", "500"];
/// Service directories under `/var/app`.
pub const SERVICES: [&str; 6] = ["web", "api", "worker", "cron", "mail", "auth"];
/// Words that mark what a script does.
pub const KEYWORDS: [&str; 5] = ["deploy", "build", "clean", "test", "sync"];
/// Keys of `/etc/app.conf`.
pub const CONFIG_KEYS: [&str; 5] = ["port", "host", "workers", "level", "retries"];
/// Values of the `level` key.
pub const CONFIG_LEVELS: [&str; 3] = ["info", "warn", "debug"];
/// Directory and file names that every instance uses.
pub const FIXED_NAMES: [&str; 30] = [
    "etc",
    "hostname",
    "passwd",
    "app.conf",
    "home",
    "user",
    "docs",
    "scripts",
    "inbox",
    "tmp",
    "work",
    "cache",
    "var",
    "log",
    "access.log",
    "app.log",
    "app",
    "old",
    "data",
    "nums.txt",
    "words.txt",
    "projects",
    "count.txt",
    "sorted.txt",
    "urgent",
    "root",
    "sandbox",
    "bin",
    "sh",
    "GET",
];

/// The fixed text of every instruction template (for the vocabulary).
pub const TEMPLATE_TEXT: &str = "How many lines are in the file ? What is the first last line of \
    How many lines in contain What is the value of in Create the directory . Make the script \
    executable (mode 755). Delete the file Write the word into a new file How many files are \
    there in and its subdirectories? What is the largest smallest number in Which user appears \
    most often in Each line starts with a user name. How many different users appear in Write \
    the number of lines of that contain into the file Write the lines of in sorted order into \
    Delete every file ending in directly in but not those in its subdirectories. How many \
    requests in returned status Create the directory and copy every file from into it. Delete \
    all files ending in under including its subdirectories; keep everything else. Make every \
    script in that contains the word executable (mode 755); leave the other scripts unchanged. \
    Which file under contains the most lines with Answer with its full path. Move every file \
    in that contains the word into a new directory How many lines containing are there in \
    total in the files under";

/// What solves the task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Goal {
    /// Answer with `answer_action`; the trimmed answer must equal this.
    Answer(String),
    /// Change the file system, then call `finish_action`; the final state must pass.
    State(Expect),
}

/// Conditions on the final file system of a state-changing task.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expect {
    /// Directories that must exist.
    pub dirs: Vec<String>,
    /// Files that must exist with this content (compared without trailing whitespace).
    pub files: Vec<(String, String)>,
    /// Paths that must not exist.
    pub absent: Vec<String>,
    /// Paths that must have these permission bits.
    pub modes: Vec<(String, u16)>,
}

impl Expect {
    /// Whether `fs` meets every condition.
    pub fn check(&self, fs: &Fs) -> bool {
        self.dirs.iter().all(|d| fs.is_dir(d))
            && self
                .files
                .iter()
                .all(|(p, c)| fs.read(p).is_ok_and(|t| t.trim_end() == c.trim_end()))
            && self.absent.iter().all(|p| fs.get(p).is_none())
            && self
                .modes
                .iter()
                .all(|(p, m)| fs.get(p).is_some_and(|n| n.mode() == *m))
    }
}

/// One generated instance: the start file system, the instruction, the goal and the oracle's
/// calls.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    /// The template's name, e.g. `count_ext`.
    pub template: &'static str,
    /// The user message.
    pub instruction: String,
    /// The file system at reset.
    pub fs: Fs,
    /// What solves it.
    pub goal: Goal,
    /// The oracle's calls, the last being `answer_action` or `finish_action`.
    pub plan: Vec<ToolCall>,
}

impl Task {
    /// The instance's content as text: template, instruction and every node (path, mode,
    /// content). Equal texts mean equal instances; the split is decided by its hash.
    pub fn canonical(&self) -> String {
        let mut s = format!("{}\n{}\n", self.template, self.instruction);
        for (path, node) in self.fs.iter() {
            match node {
                Node::Dir { mode } => s.push_str(&format!("d {mode:o} {path}\n")),
                Node::File { mode, content } => {
                    s.push_str(&format!("f {mode:o} {path} {}\n", content.len()));
                    s.push_str(content);
                }
            }
        }
        s
    }
}

/// The templates of each difficulty: 1 is one command, 2 a pipeline (or a glob or a
/// redirection), 3 several steps whose later commands depend on what the earlier ones showed.
pub const TEMPLATES: [&[&str]; 3] = [
    &[
        "line_count",
        "first_last_line",
        "level_count",
        "config_value",
        "make_dir",
        "make_executable",
        "delete_file",
        "write_word",
    ],
    &[
        "count_ext",
        "largest_smallest",
        "top_user",
        "distinct_users",
        "status_count",
        "save_count",
        "sort_words",
        "delete_glob",
    ],
    &[
        "backup_txt",
        "delete_tmp_tree",
        "chmod_keyword",
        "most_errors",
        "move_urgent",
        "total_errors",
    ],
];

fn bash(script: String) -> ToolCall {
    ToolCall::new(BASH, [("script", json!(script))])
}

fn answer(text: String) -> ToolCall {
    ToolCall::new(ANSWER, [("answer", json!(text))])
}

fn finish() -> ToolCall {
    ToolCall::new(FINISH, [])
}

fn distinct<'a>(rng: &mut ChaCha8Rng, list: &[&'a str], k: usize) -> Vec<&'a str> {
    let mut v = list.to_vec();
    v.shuffle(rng);
    v.truncate(k);
    v
}

fn pick<'a>(rng: &mut ChaCha8Rng, list: &[&'a str]) -> &'a str {
    list.choose(rng).copied().unwrap_or_default()
}

fn words(rng: &mut ChaCha8Rng, n: usize) -> String {
    (0..n)
        .map(|_| pick(rng, &WORDS))
        .collect::<Vec<_>>()
        .join(" ")
}

fn log_lines(rng: &mut ChaCha8Rng, n: usize) -> String {
    let mut s = String::new();
    for _ in 0..n {
        s.push_str(&format!(
            "{} {} {}\n",
            pick(rng, &LEVELS),
            pick(rng, &MESSAGES),
            pick(rng, &MESSAGES)
        ));
    }
    s
}

/// Adds a file; generated sizes are far below the limits, so this cannot fail.
fn put(fs: &mut Fs, path: &str, content: &str) {
    let _ = fs.mkdir(fs::parent(path), true);
    let _ = fs.write(path, content, false);
}

/// The file system every instance starts from, drawn from `rng`.
pub fn world(rng: &mut ChaCha8Rng) -> Fs {
    let mut fs = Fs::default();
    for d in [
        "/root",
        "/home/user",
        "/tmp/work/cache",
        "/var/log",
        "/data",
    ] {
        let _ = fs.mkdir(d, true);
    }
    put(&mut fs, "/etc/hostname", "sandbox\n");
    put(
        &mut fs,
        "/etc/passwd",
        "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n",
    );
    let mut keys = CONFIG_KEYS.to_vec();
    keys.shuffle(rng);
    let conf: String = keys
        .iter()
        .map(|&k| {
            let v = match k {
                "port" => rng.random_range(1..=999).to_string(),
                "host" => pick(rng, &WORDS).to_string(),
                "workers" => rng.random_range(1..=16).to_string(),
                "level" => pick(rng, &CONFIG_LEVELS).to_string(),
                _ => rng.random_range(0..=9).to_string(),
            };
            format!("{k}={v}\n")
        })
        .collect();
    put(&mut fs, "/etc/app.conf", &conf);
    // Documents.
    let n = rng.random_range(3..=6);
    for stem in distinct(rng, &STEMS, n) {
        let ext = pick(rng, &["txt", "txt", "md", "log", "bak"]);
        let lines = rng.random_range(1..=4);
        let body: String = (0..lines).map(|_| words(rng, 3) + "\n").collect();
        put(&mut fs, &format!("/home/user/docs/{stem}.{ext}"), &body);
    }
    // Scripts, each marked with one keyword.
    let n = rng.random_range(2..=5);
    for stem in distinct(rng, &STEMS, n) {
        let body = format!(
            "#!/bin/sh\n# {}\necho {}\n",
            pick(rng, &KEYWORDS),
            pick(rng, &WORDS)
        );
        put(&mut fs, &format!("/home/user/scripts/{stem}.sh"), &body);
    }
    // Inbox messages, some urgent.
    let n = rng.random_range(3..=6);
    for stem in distinct(rng, &STEMS, n) {
        let mut line = words(rng, 3);
        if rng.random_bool(0.4) {
            line.push_str(" urgent");
        }
        let body = format!("from {}\n{line} {}\n", pick(rng, &USERS), pick(rng, &WORDS));
        put(&mut fs, &format!("/home/user/inbox/{stem}.txt"), &body);
    }
    // The access log: a few users with skewed frequencies.
    let k = rng.random_range(3..=6);
    let users = distinct(rng, &USERS, k);
    let n = rng.random_range(10..=24);
    let mut access = String::new();
    for _ in 0..n {
        let i = rng
            .random_range(0..users.len() * 2)
            .min(rng.random_range(0..users.len()));
        access.push_str(&format!(
            "{} GET /{} {}\n",
            users.get(i).copied().unwrap_or("alice"),
            pick(rng, &PAGES),
            pick(rng, &STATUSES)
        ));
    }
    put(&mut fs, "/var/log/access.log", &access);
    let n = rng.random_range(8..=20);
    put(&mut fs, "/var/log/app.log", &log_lines(rng, n));
    // Services.
    let k = rng.random_range(2..=4);
    for svc in distinct(rng, &SERVICES, k) {
        let _ = fs.mkdir(&format!("/var/app/{svc}"), true);
        let n = rng.random_range(1..=3);
        for stem in distinct(rng, &STEMS, n) {
            write_service_file(rng, &mut fs, &format!("/var/app/{svc}"), stem);
        }
        if rng.random_bool(0.5) {
            let n = rng.random_range(1..=2);
            for stem in distinct(rng, &STEMS, n) {
                write_service_file(rng, &mut fs, &format!("/var/app/{svc}/old"), stem);
            }
        }
    }
    // Data.
    let n = rng.random_range(5..=15);
    let nums: String = (0..n)
        .map(|_| format!("{}\n", rng.random_range(1..=999)))
        .collect();
    put(&mut fs, "/data/nums.txt", &nums);
    let n = rng.random_range(4..=10);
    let list: String = distinct(rng, &WORDS, n)
        .iter()
        .map(|w| format!("{w}\n"))
        .collect();
    put(&mut fs, "/data/words.txt", &list);
    // Scratch files.
    let n = rng.random_range(2..=5);
    for stem in distinct(rng, &STEMS, n) {
        let ext = pick(rng, &["tmp", "tmp", "txt", "log", "bak"]);
        put(
            &mut fs,
            &format!("/tmp/work/{stem}.{ext}"),
            &(words(rng, 2) + "\n"),
        );
    }
    let n = rng.random_range(1..=3);
    for stem in distinct(rng, &STEMS, n) {
        let ext = pick(rng, &["tmp", "txt"]);
        put(
            &mut fs,
            &format!("/tmp/work/cache/{stem}.{ext}"),
            &(words(rng, 2) + "\n"),
        );
    }
    fs
}

fn write_service_file(rng: &mut ChaCha8Rng, fs: &mut Fs, dir: &str, stem: &str) {
    let ext = pick(rng, &["log", "log", "txt", "conf"]);
    let body = match ext {
        "log" => {
            let n = rng.random_range(2..=8);
            log_lines(rng, n)
        }
        "conf" => format!("port={}\n", rng.random_range(1..=999)),
        _ => words(rng, 3) + "\n",
    };
    put(fs, &format!("{dir}/{stem}.{ext}"), &body);
}

/// Files (not directories) below `dir`, with their content, in path order.
fn files_under(fs: &Fs, dir: &str) -> Vec<(String, String)> {
    fs.descendants(dir)
        .filter_map(|(p, n)| match n {
            Node::File { content, .. } => Some((p.clone(), content.clone())),
            Node::Dir { .. } => None,
        })
        .collect()
}

fn files_in(fs: &Fs, dir: &str) -> Vec<(String, String)> {
    fs.children(dir)
        .filter_map(|(p, n)| match n {
            Node::File { content, .. } => Some((p.clone(), content.clone())),
            Node::Dir { .. } => None,
        })
        .collect()
}

fn count_lines_with(text: &str, word: &str) -> usize {
    text.lines().filter(|l| l.contains(word)).count()
}

/// A task's parts before assembly: instruction, goal, plan.
type Parts = (String, Goal, Vec<ToolCall>);

/// Fills in `template` on `fs` (which state templates may not change: the agent does), or
/// `None` when the template does not fit this file system.
pub fn instantiate(template: &str, rng: &mut ChaCha8Rng, fs: &Fs) -> Option<Parts> {
    let read = |p: &str| fs.read(p).unwrap_or_default().to_string();
    let ask = |q: String, script: Vec<String>, a: String| -> Parts {
        let mut plan: Vec<ToolCall> = script.into_iter().map(bash).collect();
        plan.push(answer(a.clone()));
        (q, Goal::Answer(a), plan)
    };
    let change = |q: String, script: Vec<String>, e: Expect| -> Parts {
        let mut plan: Vec<ToolCall> = script.into_iter().map(bash).collect();
        plan.push(finish());
        (q, Goal::State(e), plan)
    };
    let access = read("/var/log/access.log");
    let users: Vec<&str> = access.lines().filter_map(|l| l.split(' ').next()).collect();
    Some(match template {
        "line_count" => {
            let p = pick(
                rng,
                &[
                    "/var/log/access.log",
                    "/var/log/app.log",
                    "/data/nums.txt",
                    "/data/words.txt",
                ],
            );
            let n = read(p).lines().count();
            ask(
                format!("How many lines are in the file {p}?"),
                vec![format!("wc -l {p}")],
                n.to_string(),
            )
        }
        "first_last_line" => {
            let text = read("/data/words.txt");
            let (which, cmd, line) = if rng.random_bool(0.5) {
                ("first", "head", text.lines().next())
            } else {
                ("last", "tail", text.lines().last())
            };
            ask(
                format!("What is the {which} line of /data/words.txt?"),
                vec![format!("{cmd} -n 1 /data/words.txt")],
                line?.to_string(),
            )
        }
        "level_count" => {
            let level = pick(rng, &LEVELS);
            let n = count_lines_with(&read("/var/log/app.log"), level);
            ask(
                format!("How many lines in /var/log/app.log contain {level}?"),
                vec![format!("grep -c {level} /var/log/app.log")],
                n.to_string(),
            )
        }
        "config_value" => {
            let key = pick(rng, &CONFIG_KEYS);
            let conf = read("/etc/app.conf");
            let value = conf
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))?;
            ask(
                format!("What is the value of {key} in /etc/app.conf?"),
                vec![format!("grep ^{key}= /etc/app.conf")],
                value.to_string(),
            )
        }
        "make_dir" => {
            let two = distinct(rng, &WORDS, 2);
            let dir = format!("/home/user/projects/{}", two.join("/"));
            change(
                format!("Create the directory {dir}"),
                vec![format!("mkdir -p {dir}")],
                Expect {
                    dirs: vec![dir],
                    ..Expect::default()
                },
            )
        }
        "make_executable" => {
            let scripts = files_in(fs, "/home/user/scripts");
            let (path, content) = scripts.choose(rng)?.clone();
            change(
                format!("Make the script {path} executable (mode 755)."),
                vec![format!("chmod 755 {path}")],
                Expect {
                    files: vec![(path.clone(), content)],
                    modes: vec![(path, 0o755)],
                    ..Expect::default()
                },
            )
        }
        "delete_file" => {
            let files = files_in(fs, "/tmp/work");
            let (path, _) = files.choose(rng)?.clone();
            change(
                format!("Delete the file {path}"),
                vec![format!("rm {path}")],
                Expect {
                    files: files_under(fs, "/tmp/work")
                        .into_iter()
                        .filter(|(p, _)| *p != path)
                        .collect(),
                    absent: vec![path],
                    ..Expect::default()
                },
            )
        }
        "write_word" => {
            let stem = pick(rng, &STEMS);
            let path = format!("/home/user/{stem}.txt");
            let word = pick(rng, &WORDS);
            change(
                format!("Write the word {word} into a new file {path}"),
                vec![format!("echo {word} > {path}")],
                Expect {
                    files: vec![(path, word.to_string())],
                    ..Expect::default()
                },
            )
        }
        "count_ext" => {
            let ext = pick(rng, &["log", "txt", "conf"]);
            let n = files_under(fs, "/var/app")
                .iter()
                .filter(|(p, _)| p.ends_with(&format!(".{ext}")))
                .count();
            if n == 0 {
                return None;
            }
            ask(
                format!("How many .{ext} files are there in /var/app and its subdirectories?"),
                vec![format!("find /var/app -type f -name '*.{ext}' | wc -l")],
                n.to_string(),
            )
        }
        "largest_smallest" => {
            let nums: Vec<u32> = read("/data/nums.txt")
                .lines()
                .filter_map(|l| l.parse().ok())
                .collect();
            let (which, cmd, n) = if rng.random_bool(0.5) {
                ("largest", "tail", nums.iter().max())
            } else {
                ("smallest", "head", nums.iter().min())
            };
            ask(
                format!("What is the {which} number in /data/nums.txt?"),
                vec![format!("sort -n /data/nums.txt | {cmd} -n 1")],
                n?.to_string(),
            )
        }
        "top_user" => {
            let mut counts: Vec<(usize, &str)> = Vec::new();
            for u in &users {
                match counts.iter_mut().find(|(_, x)| x == u) {
                    Some((n, _)) => *n += 1,
                    None => counts.push((1, u)),
                }
            }
            counts.sort_by_key(|c| std::cmp::Reverse(c.0));
            let top = counts.first()?;
            if counts.get(1).is_some_and(|second| second.0 == top.0) {
                return None;
            }
            ask(
                "Which user appears most often in /var/log/access.log? Each line starts with a user name.".to_string(),
                vec!["cut -d ' ' -f 1 /var/log/access.log | sort | uniq -c | sort -n -r | head -n 1".to_string()],
                top.1.to_string(),
            )
        }
        "distinct_users" => {
            let mut u = users.clone();
            u.sort_unstable();
            u.dedup();
            ask(
                "How many different users appear in /var/log/access.log? Each line starts with a user name.".to_string(),
                vec!["cut -d ' ' -f 1 /var/log/access.log | sort | uniq | wc -l".to_string()],
                u.len().to_string(),
            )
        }
        "status_count" => {
            let status = pick(rng, &["200", "404", "500"]);
            let n = access
                .lines()
                .filter(|l| l.split(' ').nth(3) == Some(status))
                .count();
            ask(
                format!("How many requests in /var/log/access.log returned status {status}?"),
                vec![format!(
                    "cut -d ' ' -f 4 /var/log/access.log | grep -c {status}"
                )],
                n.to_string(),
            )
        }
        "save_count" => {
            let level = pick(rng, &LEVELS);
            let n = count_lines_with(&read("/var/log/app.log"), level);
            change(
                format!(
                    "Write the number of lines of /var/log/app.log that contain {level} into the file /home/user/count.txt"
                ),
                vec![format!(
                    "grep -c {level} /var/log/app.log > /home/user/count.txt"
                )],
                Expect {
                    files: vec![("/home/user/count.txt".to_string(), n.to_string())],
                    ..Expect::default()
                },
            )
        }
        "sort_words" => {
            let mut lines: Vec<String> = read("/data/words.txt")
                .lines()
                .map(str::to_string)
                .collect();
            lines.sort();
            change(
                "Write the lines of /data/words.txt in sorted order into the file /home/user/sorted.txt".to_string(),
                vec!["sort /data/words.txt > /home/user/sorted.txt".to_string()],
                Expect {
                    files: vec![("/home/user/sorted.txt".to_string(), lines.join("\n"))],
                    ..Expect::default()
                },
            )
        }
        "delete_glob" => {
            let (gone, kept): (Vec<_>, Vec<_>) = files_under(fs, "/tmp/work")
                .into_iter()
                .partition(|(p, _)| fs::parent(p) == "/tmp/work" && p.ends_with(".tmp"));
            if gone.is_empty() {
                return None;
            }
            change(
                "Delete every file ending in .tmp directly in /tmp/work, but not those in its subdirectories.".to_string(),
                vec!["rm /tmp/work/*.tmp".to_string()],
                Expect {
                    files: kept,
                    absent: gone.into_iter().map(|(p, _)| p).collect(),
                    ..Expect::default()
                },
            )
        }
        "backup_txt" => {
            let docs = files_in(fs, "/home/user/docs");
            let (txt, other): (Vec<_>, Vec<_>) =
                docs.iter().cloned().partition(|(p, _)| p.ends_with(".txt"));
            if txt.is_empty() {
                return None;
            }
            let into = |p: &str| format!("/home/user/backup/{}", fs::name(p));
            change(
                "Create the directory /home/user/backup and copy every .txt file from /home/user/docs into it.".to_string(),
                vec![
                    "ls /home/user/docs".to_string(),
                    "mkdir /home/user/backup && cp /home/user/docs/*.txt /home/user/backup".to_string(),
                ],
                Expect {
                    dirs: vec!["/home/user/backup".to_string()],
                    files: txt
                        .iter()
                        .map(|(p, c)| (into(p), c.clone()))
                        .chain(docs.iter().cloned())
                        .collect(),
                    absent: other.iter().map(|(p, _)| into(p)).collect(),
                    ..Expect::default()
                },
            )
        }
        "delete_tmp_tree" => {
            let (gone, kept): (Vec<_>, Vec<_>) = files_under(fs, "/tmp/work")
                .into_iter()
                .partition(|(p, _)| p.ends_with(".tmp"));
            if gone.is_empty() {
                return None;
            }
            let list: Vec<&str> = gone.iter().map(|(p, _)| p.as_str()).collect();
            change(
                "Delete all files ending in .tmp under /tmp/work, including its subdirectories; keep everything else.".to_string(),
                vec![
                    "find /tmp/work -type f -name '*.tmp'".to_string(),
                    format!("rm {}", list.join(" ")),
                ],
                Expect {
                    files: kept,
                    absent: gone.iter().map(|(p, _)| p.clone()).collect(),
                    ..Expect::default()
                },
            )
        }
        "chmod_keyword" => {
            let scripts = files_in(fs, "/home/user/scripts");
            let keyword = pick(rng, &KEYWORDS);
            let (hit, miss): (Vec<_>, Vec<_>) =
                scripts.iter().partition(|(_, c)| c.contains(keyword));
            if hit.is_empty() || miss.is_empty() {
                return None;
            }
            let list: Vec<&str> = hit.iter().map(|(p, _)| p.as_str()).collect();
            change(
                format!(
                    "Make every script in /home/user/scripts that contains the word {keyword} executable (mode 755); leave the other scripts unchanged."
                ),
                vec![
                    format!("grep -l {keyword} /home/user/scripts/*.sh"),
                    format!("chmod 755 {}", list.join(" ")),
                ],
                Expect {
                    files: scripts.clone(),
                    modes: hit
                        .iter()
                        .map(|(p, _)| (p.clone(), 0o755))
                        .chain(miss.iter().map(|(p, _)| (p.clone(), 0o644)))
                        .collect(),
                    ..Expect::default()
                },
            )
        }
        "most_errors" => {
            let logs: Vec<(String, usize)> = files_under(fs, "/var/app")
                .into_iter()
                .filter(|(p, _)| p.ends_with(".log"))
                .map(|(p, c)| (p, count_lines_with(&c, "ERROR")))
                .collect();
            if logs.len() < 2 {
                return None;
            }
            let max = logs.iter().map(|(_, n)| *n).max()?;
            let mut best = logs.iter().filter(|(_, n)| *n == max);
            let (path, _) = best.next()?;
            if max == 0 || best.next().is_some() {
                return None;
            }
            let list: Vec<&str> = logs.iter().map(|(p, _)| p.as_str()).collect();
            ask(
                "Which .log file under /var/app contains the most lines with ERROR? Answer with its full path.".to_string(),
                vec![
                    "find /var/app -type f -name '*.log'".to_string(),
                    format!("grep -c ERROR {}", list.join(" ")),
                ],
                path.clone(),
            )
        }
        "move_urgent" => {
            let inbox = files_in(fs, "/home/user/inbox");
            let (hit, miss): (Vec<_>, Vec<_>) = inbox
                .iter()
                .cloned()
                .partition(|(_, c)| c.contains("urgent"));
            if hit.is_empty() || miss.is_empty() {
                return None;
            }
            let list: Vec<&str> = hit.iter().map(|(p, _)| p.as_str()).collect();
            let into = |p: &str| format!("/home/user/urgent/{}", fs::name(p));
            change(
                "Move every file in /home/user/inbox that contains the word urgent into a new directory /home/user/urgent".to_string(),
                vec![
                    "grep -l urgent /home/user/inbox/*".to_string(),
                    format!(
                        "mkdir /home/user/urgent && mv {} /home/user/urgent",
                        list.join(" ")
                    ),
                ],
                Expect {
                    dirs: vec!["/home/user/urgent".to_string()],
                    files: hit
                        .iter()
                        .map(|(p, c)| (into(p), c.clone()))
                        .chain(miss.iter().cloned())
                        .collect(),
                    absent: hit.iter().map(|(p, _)| p.clone()).collect(),
                    ..Expect::default()
                },
            )
        }
        "total_errors" => {
            let logs: Vec<(String, String)> = files_under(fs, "/var/app")
                .into_iter()
                .filter(|(p, _)| p.ends_with(".log"))
                .collect();
            if logs.is_empty() {
                return None;
            }
            let n: usize = logs.iter().map(|(_, c)| count_lines_with(c, "ERROR")).sum();
            let list: Vec<&str> = logs.iter().map(|(p, _)| p.as_str()).collect();
            ask(
                "How many lines containing ERROR are there in total in the .log files under /var/app?".to_string(),
                vec![
                    "find /var/app -type f -name '*.log'".to_string(),
                    format!("cat {} | grep -c ERROR", list.join(" ")),
                ],
                n.to_string(),
            )
        }
        _ => return None,
    })
}
