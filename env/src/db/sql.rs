//! The SQLite side of the task: opening a locked-down in-memory database, running one
//! statement with limits, rendering results as text, hashing a table and normalizing answers.
//!
//! Limits on a statement (see [`run`]):
//! - one statement per call; an empty query is refused;
//! - a budget of [`MAX_VM_STEPS`] virtual-machine steps, counted by a progress handler (so a
//!   runaway query, such as a recursive CTE that never ends, stops at the same point on every
//!   machine and the episode stays reproducible), with a wall-clock backstop of
//!   [`MAX_STATEMENT_TIME`];
//! - at most [`MAX_ROWS_SHOWN`] rows shown (with the number of rows), at most
//!   [`MAX_CELL_CHARS`] characters per value, at most [`MAX_ROWS_COUNTED`] rows read;
//! - strings and blobs of at most [`MAX_VALUE_BYTES`] bytes, at most 4096 pages (16 MiB) of
//!   database, temporary storage in memory.
//!
//! Refused by an authorizer: `ATTACH`/`DETACH` (they would open files), `PRAGMA`,
//! transactions and savepoints (an episode is one implicit transaction per statement),
//! temporary tables/views/triggers and virtual tables (they would escape cloning), and
//! `load_extension`.

use std::time::{Duration, Instant};

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::limits::Limit;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, ErrorCode};

/// Most rows an observation shows.
pub const MAX_ROWS_SHOWN: usize = 20;
/// Most rows read from one query (the rest are reported as "more than").
pub const MAX_ROWS_COUNTED: usize = 10_000;
/// Most characters of one value shown.
pub const MAX_CELL_CHARS: usize = 60;
/// Largest string or blob a statement may build, in bytes.
pub const MAX_VALUE_BYTES: i32 = 65_536;
/// SQLite virtual-machine steps between two calls of the progress handler.
const STEPS_PER_TICK: i32 = 1_000;
/// Most virtual-machine steps one statement may take.
pub const MAX_VM_STEPS: u64 = 10_000_000;
/// Wall-clock backstop for one statement (the step budget normally ends it first).
pub const MAX_STATEMENT_TIME: Duration = Duration::from_secs(2);
/// Most pages of the database (4 KiB each).
const MAX_PAGES: u32 = 4096;

/// Opens an in-memory database and runs `script` on it, before any limit is set (the script
/// is ours). Call [`lock_down`] before the agent may use it.
pub fn open(script: &str) -> rusqlite::Result<Connection> {
    let conn = blank()?;
    conn.execute_batch(script)?;
    Ok(conn)
}

/// An empty in-memory database with temporary storage in memory and the page cap set.
pub fn blank() -> rusqlite::Result<Connection> {
    let conn = Connection::open_in_memory()?;
    conn.execute_batch(&format!(
        "PRAGMA temp_store = MEMORY; PRAGMA max_page_count = {MAX_PAGES};"
    ))?;
    Ok(conn)
}

/// Sets the limits and the authorizer (see the module docs).
pub fn lock_down(conn: &mut Connection) -> rusqlite::Result<()> {
    conn.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0)?;
    conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)?;
    conn.set_limit(Limit::SQLITE_LIMIT_COLUMN, 64)?;
    conn.set_limit(Limit::SQLITE_LIMIT_TRIGGER_DEPTH, 10)?;
    conn.authorizer(Some(authorize))?;
    Ok(())
}

fn authorize(context: AuthContext<'_>) -> Authorization {
    match context.action {
        AuthAction::Attach { .. }
        | AuthAction::Detach { .. }
        | AuthAction::Pragma { .. }
        | AuthAction::Transaction { .. }
        | AuthAction::Savepoint { .. }
        | AuthAction::CreateTempIndex { .. }
        | AuthAction::CreateTempTable { .. }
        | AuthAction::CreateTempTrigger { .. }
        | AuthAction::CreateTempView { .. }
        | AuthAction::CreateVtable { .. }
        | AuthAction::DropVtable { .. }
        | AuthAction::Unknown { .. } => Authorization::Deny,
        AuthAction::Function {
            function_name: "load_extension",
        } => Authorization::Deny,
        _ => Authorization::Allow,
    }
}

/// The result of a statement.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    /// The column names (empty for a statement that returns no rows).
    pub columns: Vec<String>,
    /// The first [`MAX_ROWS_SHOWN`] rows, values rendered by [`render`].
    pub rows: Vec<Vec<String>>,
    /// How many rows the statement returned (up to [`MAX_ROWS_COUNTED`]).
    pub total: usize,
    /// Whether there were more than [`MAX_ROWS_COUNTED`] rows.
    pub more: bool,
    /// Rows inserted, updated or deleted.
    pub changed: u64,
    /// Whether the statement could change the database.
    pub writes: bool,
}

impl Output {
    /// The observation: a header line (`name | salary`), one line per row (values separated by
    /// ` | `) and a count line (`(3 rows)`, `(45 rows, 20 shown)`); or `Query OK, 2 rows
    /// affected.` for a statement that returns no rows.
    pub fn observation(&self) -> String {
        if self.columns.is_empty() {
            let s = if self.changed == 1 { "" } else { "s" };
            return format!("Query OK, {} row{s} affected.", self.changed);
        }
        let mut out = self.columns.join(" | ");
        for row in &self.rows {
            out.push('\n');
            out.push_str(&row.join(" | "));
        }
        let count = match (self.total, self.more) {
            (_, true) => format!("(more than {MAX_ROWS_COUNTED} rows, {MAX_ROWS_SHOWN} shown)"),
            (1, _) => "(1 row)".to_string(),
            (n, _) if n > self.rows.len() => format!("({n} rows, {} shown)", self.rows.len()),
            (n, _) => format!("({n} rows)"),
        };
        out.push('\n');
        out.push_str(&count);
        out
    }
}

/// Runs one statement under the limits; the error is the observation.
pub fn run(conn: &mut Connection, sql: &str) -> Result<Output, String> {
    limited(conn, |conn| run_unlimited(conn, sql))?
}

/// Calls `f` with the step budget and the wall-clock backstop set on `conn`.
fn limited<T>(conn: &mut Connection, f: impl FnOnce(&Connection) -> T) -> Result<T, String> {
    let start = Instant::now();
    let mut ticks: u64 = 0;
    let max_ticks = MAX_VM_STEPS / STEPS_PER_TICK as u64;
    conn.progress_handler(
        STEPS_PER_TICK,
        Some(move || {
            ticks += 1;
            ticks > max_ticks || start.elapsed() > MAX_STATEMENT_TIME
        }),
    )
    .map_err(describe)?;
    let result = f(conn);
    conn.progress_handler(0, None::<fn() -> bool>)
        .map_err(describe)?;
    Ok(result)
}

fn run_unlimited(conn: &Connection, sql: &str) -> Result<Output, String> {
    let before = conn.total_changes();
    let mut stmt = conn.prepare(sql).map_err(describe)?;
    let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
    let writes = !stmt.readonly();
    let mut rows_out = Vec::new();
    let mut total = 0;
    let mut more = false;
    {
        let mut rows = stmt.query([]).map_err(describe)?;
        while let Some(row) = rows.next().map_err(describe)? {
            if total == MAX_ROWS_COUNTED {
                more = true;
                break;
            }
            total += 1;
            if rows_out.len() < MAX_ROWS_SHOWN {
                let mut values = Vec::with_capacity(columns.len());
                for i in 0..columns.len() {
                    let value = row.get_ref(i).map_err(describe)?;
                    values.push(truncate(render(value)));
                }
                rows_out.push(values);
            }
        }
    }
    Ok(Output {
        columns,
        rows: rows_out,
        total,
        more,
        changed: conn.total_changes().saturating_sub(before),
        writes,
    })
}

/// The observation of a SQLite error.
fn describe(e: rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqliteFailure(err, _) if err.code == ErrorCode::OperationInterrupted => {
            format!(
                "Error: the query was stopped after {MAX_VM_STEPS} steps; it runs too long."
            )
        }
        rusqlite::Error::SqliteFailure(err, _) if err.code == ErrorCode::AuthorizationForStatementDenied => {
            "Error: this statement is not allowed (ATTACH, DETACH, PRAGMA, transactions, temporary and virtual tables are refused).".to_string()
        }
        rusqlite::Error::SqliteFailure(_, Some(message)) => format!("Error: {message}"),
        rusqlite::Error::SqlInputError { msg, .. } => format!("Error: {msg}"),
        rusqlite::Error::MultipleStatement => {
            "Error: give one SQL statement per call.".to_string()
        }
        rusqlite::Error::Empty => "Error: the query is empty.".to_string(),
        other => format!("Error: {other}"),
    }
}

/// A value as observations and answers show it: integers as is, reals by [`number`], text as
/// is, `NULL`, and blobs as `<blob of N bytes>`.
pub fn render(value: ValueRef<'_>) -> String {
    match value {
        ValueRef::Null => "NULL".to_string(),
        ValueRef::Integer(n) => n.to_string(),
        ValueRef::Real(x) => number(x),
        ValueRef::Text(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        ValueRef::Blob(bytes) => format!("<blob of {} bytes>", bytes.len()),
    }
}

/// The canonical form of a number: an integral value without decimals (`85`), anything else
/// rounded to two decimals without trailing zeros (`85.33`, `0.5`).
pub fn number(x: f64) -> String {
    if !x.is_finite() {
        return x.to_string();
    }
    let rounded = (x * 100.0).round() / 100.0;
    if rounded.fract() == 0.0 && rounded.abs() < 1e15 {
        return format!("{}", rounded as i64);
    }
    let s = format!("{rounded:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn truncate(s: String) -> String {
    if s.chars().count() <= MAX_CELL_CHARS {
        return s;
    }
    let mut out: String = s.chars().take(MAX_CELL_CHARS).collect();
    out.push_str("...");
    out
}

/// The canonical form of one answer: trimmed, and a number in canonical form ([`number`]);
/// text is compared as is (case matters).
pub fn normalize(answer: &str) -> String {
    let t = answer.trim();
    match t.parse::<f64>() {
        Ok(x) if x.is_finite() && t.chars().any(|c| c.is_ascii_digit()) => number(x),
        _ => t.to_string(),
    }
}

/// The answers as a sorted multiset of canonical strings.
pub fn canonical(answers: &[String]) -> Vec<String> {
    let mut out: Vec<String> = answers.iter().map(|a| normalize(a)).collect();
    out.sort();
    out
}

/// A hash of a table's content: its column names and the sorted multiset of its rows (row
/// order and rowids do not count). `None` when the table cannot be read (dropped, or replaced
/// by a view that runs past the step budget).
pub fn table_hash(conn: &mut Connection, table: &str) -> Option<u64> {
    limited(conn, |conn| hash_unlimited(conn, table))
        .ok()
        .flatten()
}

fn hash_unlimited(conn: &Connection, table: &str) -> Option<u64> {
    let mut lines: Vec<String> = Vec::new();
    let columns = {
        let mut stmt = conn.prepare(&format!("SELECT * FROM {table}")).ok()?;
        let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
        let mut rows = stmt.query([]).ok()?;
        while let Some(row) = rows.next().ok()? {
            let mut line = String::new();
            for i in 0..columns.len() {
                let value = row.get_ref(i).ok()?;
                // Tag the type so the text '5' and the integer 5 differ.
                let tag = match value {
                    ValueRef::Null => 'n',
                    ValueRef::Integer(_) => 'i',
                    ValueRef::Real(_) => 'r',
                    ValueRef::Text(_) => 't',
                    ValueRef::Blob(_) => 'b',
                };
                line.push(tag);
                line.push_str(&render(value));
                line.push('\u{1f}');
            }
            lines.push(line);
        }
        columns
    };
    lines.sort();
    let text = format!("{}\n{}", columns.join("\u{1f}"), lines.join("\n"));
    Some(crate::content_hash::content_hash(&[], &text))
}
