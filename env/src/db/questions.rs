//! Question and write-task templates, with their gold SQL.
//!
//! - Difficulty 1: one table, a filter and a count, a list, or the row with the highest or
//!   lowest value.
//! - Difficulty 2: one table, aggregates (`SUM`, `AVG`, `MAX`, `MIN`, `COUNT(DISTINCT)`),
//!   `GROUP BY` with `HAVING` or with `ORDER BY ... LIMIT`, top three.
//! - Difficulty 3: two tables joined by a foreign key, with grouping and `HAVING`; and write
//!   tasks (`UPDATE`, `DELETE` with a condition, some through a subquery, and `INSERT`).
//!
//! Every answer is a single column, so the answer is a multiset of values. Thresholds, names
//! and categories are taken from the generated rows, so filters select something.

use std::collections::BTreeSet;

use rand::Rng;
use rand::seq::IndexedRandom;
use rand_chacha::ChaCha8Rng;

use super::schema::{Cell, Data, Kind, Names, TableSpec, fresh_name};

/// What the agent must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Goal {
    /// Answer with the gold query's values.
    Answer,
    /// Change the table at this index of the domain as the gold statement does.
    Write(usize),
}

/// A generated task over one database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Question {
    /// The question or request, without the table info.
    pub text: String,
    /// The gold SQL.
    pub sql: String,
    /// Answer or write.
    pub goal: Goal,
    /// For `ORDER BY ... LIMIT k` questions: a query listing the first `k + 1` sort keys, and
    /// `k`; the instance is kept only if the `k`-th and the next key differ (no tie).
    pub tie: Option<(String, usize)>,
}

/// Words of the templates below, for the vocabulary.
pub(crate) const TEMPLATE_WORDS: &str = "How many have a greater than less than the '? \
    of every whose is with above below Which has highest lowest names titles are \
    What total average rounded to nearest integer among values more different appear in \
    most top 3 are linked Increase by Delete Set Add new , 0 1 2 3";

/// SQL keywords and symbols of the gold statements, for the vocabulary.
pub(crate) const SQL_WORDS: &str = "SELECT COUNT ( * ) FROM WHERE > < = ' ORDER BY DESC ASC \
    LIMIT SUM ROUND AVG MAX MIN DISTINCT GROUP HAVING JOIN ON IN UPDATE SET + DELETE INSERT \
    INTO VALUES , ;";

/// A question of `difficulty` (1..=3) over `data`, or `None` when the drawn template does not
/// fit the drawn table (the caller draws again).
pub fn generate(data: &Data, difficulty: u8, rng: &mut ChaCha8Rng) -> Option<Question> {
    let templates: &[fn(&Data, &mut ChaCha8Rng) -> Option<Question>] = match difficulty {
        1 => &[
            count_above,
            count_category,
            list_category,
            list_above,
            extreme,
        ],
        2 => &[
            sum_category,
            avg_category,
            max_category,
            having_count,
            most_category,
            best_average,
            top_three,
            distinct,
        ],
        _ => &[
            join_count,
            join_sum,
            join_most,
            join_having,
            join_avg_having,
            join_category,
            update_join,
            delete_below,
            update_category,
            delete_join,
            insert,
        ],
    };
    let template = templates.choose(rng)?;
    template(data, rng)
}

/// Index of the first column of `table` matching `f`.
fn column(table: &TableSpec, f: impl Fn(Kind) -> bool) -> Option<usize> {
    table.columns.iter().position(|c| f(c.kind))
}

fn is_name(k: Kind) -> bool {
    matches!(k, Kind::Name(_))
}

fn is_category(k: Kind) -> bool {
    matches!(k, Kind::Category(_))
}

/// A random column of `table` matching `f`.
fn any_column(table: &TableSpec, f: impl Fn(Kind) -> bool, rng: &mut ChaCha8Rng) -> Option<usize> {
    let all: Vec<usize> = (0..table.columns.len())
        .filter(|&i| f(table.columns[i].kind))
        .collect();
    all.choose(rng).copied()
}

fn is_number(k: Kind) -> bool {
    matches!(k, Kind::Number(..))
}

/// A random number column of `table` whose sum means something (not a year).
fn additive_column(table: &TableSpec, rng: &mut ChaCha8Rng) -> Option<usize> {
    let all: Vec<usize> = (0..table.columns.len())
        .filter(|&i| is_number(table.columns[i].kind) && !table.columns[i].name.ends_with("year"))
        .collect();
    all.choose(rng).copied()
}

/// A random table (index) having a column of each kind in `needs`.
fn table_with(data: &Data, needs: &[fn(Kind) -> bool], rng: &mut ChaCha8Rng) -> Option<usize> {
    let all: Vec<usize> = (0..data.domain.tables.len())
        .filter(|&t| {
            needs
                .iter()
                .all(|f| column(&data.domain.tables[t], f).is_some())
        })
        .collect();
    all.choose(rng).copied()
}

/// The value of column `c` in a random row of table `t`.
fn some_value(data: &Data, t: usize, c: usize, rng: &mut ChaCha8Rng) -> Option<Cell> {
    data.rows.get(t)?.choose(rng)?.get(c).cloned()
}

/// A random (child table, foreign-key column, parent table) triple.
fn link(data: &Data, rng: &mut ChaCha8Rng) -> Option<(usize, usize, usize)> {
    let mut links = Vec::new();
    for (t, table) in data.domain.tables.iter().enumerate() {
        for (c, column) in table.columns.iter().enumerate() {
            if let Kind::Ref(p) = column.kind {
                links.push((t, c, p));
            }
        }
    }
    links.choose(rng).copied()
}

/// Whether no table refers to table `t` (so its rows can be deleted).
fn is_leaf(data: &Data, t: usize) -> bool {
    !data
        .domain
        .tables
        .iter()
        .any(|table| table.columns.iter().any(|c| c.kind == Kind::Ref(t)))
}

/// `(table, name column, number column)` names and labels, for the common shapes.
struct Pick<'a> {
    table: &'a TableSpec,
    t: usize,
}

impl Pick<'_> {
    fn name(&self, c: usize) -> &'static str {
        self.table.columns.get(c).map_or("", |c| c.name)
    }
    fn label(&self, c: usize) -> &'static str {
        self.table.columns.get(c).map_or("", |c| c.label)
    }
}

fn pick(data: &Data, t: usize) -> Option<Pick<'_>> {
    Some(Pick {
        table: data.domain.tables.get(t)?,
        t,
    })
}

fn answer(text: String, sql: String) -> Option<Question> {
    Some(Question {
        text,
        sql,
        goal: Goal::Answer,
        tie: None,
    })
}

fn count_above(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let p = pick(data, table_with(data, &[is_number], rng)?)?;
    let c = any_column(p.table, is_number, rng)?;
    let v = some_value(data, p.t, c, rng)?.literal();
    let (word, op) = if rng.random_bool(0.5) {
        ("greater", ">")
    } else {
        ("less", "<")
    };
    answer(
        format!(
            "How many {} have a {} {word} than {v}?",
            p.table.plural,
            p.label(c)
        ),
        format!(
            "SELECT COUNT(*) FROM {} WHERE {} {op} {v}",
            p.table.name,
            p.name(c)
        ),
    )
}

fn count_category(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let p = pick(data, table_with(data, &[is_category], rng)?)?;
    let c = any_column(p.table, is_category, rng)?;
    let v = some_value(data, p.t, c, rng)?.literal();
    answer(
        format!("How many {} have the {} {v}?", p.table.plural, p.label(c)),
        format!(
            "SELECT COUNT(*) FROM {} WHERE {} = {v}",
            p.table.name,
            p.name(c)
        ),
    )
}

fn list_category(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let p = pick(data, table_with(data, &[is_name, is_category], rng)?)?;
    let n = column(p.table, is_name)?;
    let c = any_column(p.table, is_category, rng)?;
    let v = some_value(data, p.t, c, rng)?.literal();
    answer(
        format!(
            "What are the {}s of the {} whose {} is {v}?",
            p.label(n),
            p.table.plural,
            p.label(c)
        ),
        format!(
            "SELECT {} FROM {} WHERE {} = {v}",
            p.name(n),
            p.table.name,
            p.name(c)
        ),
    )
}

fn list_above(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let p = pick(data, table_with(data, &[is_name, is_number], rng)?)?;
    let n = column(p.table, is_name)?;
    let c = any_column(p.table, is_number, rng)?;
    let v = some_value(data, p.t, c, rng)?.literal();
    let (word, op) = if rng.random_bool(0.5) {
        ("above", ">")
    } else {
        ("below", "<")
    };
    answer(
        format!(
            "What are the {}s of the {} with a {} {word} {v}?",
            p.label(n),
            p.table.plural,
            p.label(c)
        ),
        format!(
            "SELECT {} FROM {} WHERE {} {op} {v}",
            p.name(n),
            p.table.name,
            p.name(c)
        ),
    )
}

fn extreme(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let p = pick(data, table_with(data, &[is_name, is_number], rng)?)?;
    let n = column(p.table, is_name)?;
    let c = any_column(p.table, is_number, rng)?;
    let (word, order) = if rng.random_bool(0.5) {
        ("highest", "DESC")
    } else {
        ("lowest", "ASC")
    };
    let (table, col) = (p.table.name, p.name(c));
    Some(Question {
        text: format!(
            "What is the {} of the {} with the {word} {}?",
            p.label(n),
            p.table.singular,
            p.label(c)
        ),
        sql: format!(
            "SELECT {} FROM {table} ORDER BY {col} {order} LIMIT 1",
            p.name(n)
        ),
        goal: Goal::Answer,
        tie: Some((
            format!("SELECT {col} FROM {table} ORDER BY {col} {order} LIMIT 2"),
            1,
        )),
    })
}

fn aggregate_category(
    data: &Data,
    rng: &mut ChaCha8Rng,
    text: impl Fn(&str, &str, &str, &str) -> String,
    select: &str,
) -> Option<Question> {
    let p = pick(data, table_with(data, &[is_category, is_number], rng)?)?;
    let k = any_column(p.table, is_category, rng)?;
    let c = if select.starts_with("SUM") {
        additive_column(p.table, rng)?
    } else {
        any_column(p.table, is_number, rng)?
    };
    let v = some_value(data, p.t, k, rng)?.literal();
    answer(
        text(p.label(c), p.table.plural, p.label(k), &v),
        format!(
            "SELECT {} FROM {} WHERE {} = {v}",
            select.replace('@', p.name(c)),
            p.table.name,
            p.name(k)
        ),
    )
}

fn sum_category(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    aggregate_category(
        data,
        rng,
        |c, plural, k, v| format!("What is the total {c} of {plural} whose {k} is {v}?"),
        "SUM(@)",
    )
}

fn avg_category(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    aggregate_category(
        data,
        rng,
        |c, plural, k, v| {
            format!(
                "What is the average {c} of {plural} whose {k} is {v}, rounded to the nearest integer?"
            )
        },
        "ROUND(AVG(@))",
    )
}

fn max_category(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    if rng.random_bool(0.5) {
        aggregate_category(
            data,
            rng,
            |c, plural, k, v| format!("What is the highest {c} among {plural} whose {k} is {v}?"),
            "MAX(@)",
        )
    } else {
        aggregate_category(
            data,
            rng,
            |c, plural, k, v| format!("What is the lowest {c} among {plural} whose {k} is {v}?"),
            "MIN(@)",
        )
    }
}

fn having_count(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let p = pick(data, table_with(data, &[is_category], rng)?)?;
    let k = any_column(p.table, is_category, rng)?;
    let n = rng.random_range(1..=3);
    answer(
        format!(
            "Which {} values have more than {n} {}?",
            p.label(k),
            p.table.plural
        ),
        format!(
            "SELECT {k} FROM {} GROUP BY {k} HAVING COUNT(*) > {n}",
            p.table.name,
            k = p.name(k)
        ),
    )
}

fn most_category(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let p = pick(data, table_with(data, &[is_category], rng)?)?;
    let kc = any_column(p.table, is_category, rng)?;
    let (k, t) = (p.name(kc), p.table.name);
    Some(Question {
        text: format!("Which {} has the most {}?", p.label(kc), p.table.plural),
        sql: format!("SELECT {k} FROM {t} GROUP BY {k} ORDER BY COUNT(*) DESC LIMIT 1"),
        goal: Goal::Answer,
        tie: Some((
            format!("SELECT COUNT(*) FROM {t} GROUP BY {k} ORDER BY COUNT(*) DESC LIMIT 2"),
            1,
        )),
    })
}

fn best_average(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let p = pick(data, table_with(data, &[is_category, is_number], rng)?)?;
    let kc = any_column(p.table, is_category, rng)?;
    let c = any_column(p.table, is_number, rng)?;
    let (k, col, t) = (p.name(kc), p.name(c), p.table.name);
    Some(Question {
        text: format!(
            "Which {} has the highest average {} of {}?",
            p.label(kc),
            p.label(c),
            p.table.plural
        ),
        sql: format!("SELECT {k} FROM {t} GROUP BY {k} ORDER BY AVG({col}) DESC LIMIT 1"),
        goal: Goal::Answer,
        tie: Some((
            format!("SELECT AVG({col}) FROM {t} GROUP BY {k} ORDER BY AVG({col}) DESC LIMIT 2"),
            1,
        )),
    })
}

fn top_three(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let p = pick(data, table_with(data, &[is_name, is_number], rng)?)?;
    let n = column(p.table, is_name)?;
    let c = any_column(p.table, is_number, rng)?;
    let (col, t) = (p.name(c), p.table.name);
    Some(Question {
        text: format!(
            "What are the {}s of the 3 {} with the highest {}?",
            p.label(n),
            p.table.plural,
            p.label(c)
        ),
        sql: format!("SELECT {} FROM {t} ORDER BY {col} DESC LIMIT 3", p.name(n)),
        goal: Goal::Answer,
        tie: Some((
            format!("SELECT {col} FROM {t} ORDER BY {col} DESC LIMIT 4"),
            3,
        )),
    })
}

fn distinct(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let p = pick(data, table_with(data, &[is_category], rng)?)?;
    let k = any_column(p.table, is_category, rng)?;
    answer(
        format!(
            "How many different {} values appear in {}?",
            p.label(k),
            p.table.plural
        ),
        format!("SELECT COUNT(DISTINCT {}) FROM {}", p.name(k), p.table.name),
    )
}

/// The pieces of a join question: child table, its foreign key, the parent table, the
/// parent's name column, and a parent row's name.
struct Join<'a> {
    child: Pick<'a>,
    fk: usize,
    parent: Pick<'a>,
    name: usize,
    value: String,
}

impl Join<'_> {
    /// `child JOIN parent ON child.fk = parent.id`.
    fn from(&self) -> String {
        format!(
            "{c} JOIN {p} ON {c}.{fk} = {p}.id",
            c = self.child.table.name,
            p = self.parent.table.name,
            fk = self.child.name(self.fk)
        )
    }
    /// `parent.name`.
    fn parent_name(&self) -> String {
        format!("{}.{}", self.parent.table.name, self.parent.name(self.name))
    }
}

fn join<'a>(data: &'a Data, rng: &mut ChaCha8Rng) -> Option<Join<'a>> {
    let (t, fk, p) = link(data, rng)?;
    let parent = pick(data, p)?;
    let name = column(parent.table, is_name)?;
    let value = some_value(data, p, name, rng)?.literal();
    Some(Join {
        child: pick(data, t)?,
        fk,
        parent,
        name,
        value,
    })
}

fn join_count(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let j = join(data, rng)?;
    answer(
        format!(
            "How many {} are linked to the {} {}?",
            j.child.table.plural, j.parent.table.singular, j.value
        ),
        format!(
            "SELECT COUNT(*) FROM {} WHERE {} = {}",
            j.from(),
            j.parent_name(),
            j.value
        ),
    )
}

fn join_sum(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let j = join(data, rng)?;
    let c = additive_column(j.child.table, rng)?;
    answer(
        format!(
            "What is the total {} of the {} linked to the {} {}?",
            j.child.label(c),
            j.child.table.plural,
            j.parent.table.singular,
            j.value
        ),
        format!(
            "SELECT SUM({}.{}) FROM {} WHERE {} = {}",
            j.child.table.name,
            j.child.name(c),
            j.from(),
            j.parent_name(),
            j.value
        ),
    )
}

fn join_most(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let j = join(data, rng)?;
    let group = format!("{} GROUP BY {}.id", j.from(), j.parent.table.name);
    Some(Question {
        text: format!(
            "What is the {} of the {} with the most {}?",
            j.parent.label(j.name),
            j.parent.table.singular,
            j.child.table.plural
        ),
        sql: format!(
            "SELECT {} FROM {group} ORDER BY COUNT(*) DESC LIMIT 1",
            j.parent_name()
        ),
        goal: Goal::Answer,
        tie: Some((
            format!("SELECT COUNT(*) FROM {group} ORDER BY COUNT(*) DESC LIMIT 2"),
            1,
        )),
    })
}

fn join_having(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let j = join(data, rng)?;
    let n = rng.random_range(1..=3);
    answer(
        format!(
            "What are the {}s of the {} with more than {n} {}?",
            j.parent.label(j.name),
            j.parent.table.plural,
            j.child.table.plural
        ),
        format!(
            "SELECT {} FROM {} GROUP BY {}.id HAVING COUNT(*) > {n}",
            j.parent_name(),
            j.from(),
            j.parent.table.name
        ),
    )
}

fn join_avg_having(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let j = join(data, rng)?;
    let c = any_column(j.child.table, is_number, rng)?;
    let v = some_value(data, j.child.t, c, rng)?.literal();
    answer(
        format!(
            "What are the {}s of the {} whose {} have an average {} above {v}?",
            j.parent.label(j.name),
            j.parent.table.plural,
            j.child.table.plural,
            j.child.label(c)
        ),
        format!(
            "SELECT {} FROM {} GROUP BY {}.id HAVING AVG({}.{}) > {v}",
            j.parent_name(),
            j.from(),
            j.parent.table.name,
            j.child.table.name,
            j.child.name(c)
        ),
    )
}

fn join_category(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let j = join(data, rng)?;
    let k = any_column(j.parent.table, is_category, rng)?;
    let c = additive_column(j.child.table, rng)?;
    let v = some_value(data, j.parent.t, k, rng)?.literal();
    answer(
        format!(
            "What is the total {} of the {} whose {} has the {} {v}?",
            j.child.label(c),
            j.child.table.plural,
            j.parent.table.singular,
            j.parent.label(k)
        ),
        format!(
            "SELECT SUM({}.{}) FROM {} WHERE {}.{} = {v}",
            j.child.table.name,
            j.child.name(c),
            j.from(),
            j.parent.table.name,
            j.parent.name(k)
        ),
    )
}

fn write(text: String, sql: String, t: usize) -> Option<Question> {
    Some(Question {
        text,
        sql,
        goal: Goal::Write(t),
        tie: None,
    })
}

fn update_join(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let j = join(data, rng)?;
    let c = any_column(j.child.table, is_number, rng)?;
    let d = rng.random_range(1..=3) * 5;
    let col = j.child.name(c);
    write(
        format!(
            "Increase the {} of every {} linked to the {} {} by {d}",
            j.child.label(c),
            j.child.table.singular,
            j.parent.table.singular,
            j.value
        ),
        format!(
            "UPDATE {} SET {col} = {col} + {d} WHERE {} IN (SELECT id FROM {} WHERE {} = {})",
            j.child.table.name,
            j.child.name(j.fk),
            j.parent.table.name,
            j.parent.name(j.name),
            j.value
        ),
        j.child.t,
    )
}

fn delete_below(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let t = table_with(data, &[is_number], rng)?;
    if !is_leaf(data, t) {
        return None;
    }
    let p = pick(data, t)?;
    let c = any_column(p.table, is_number, rng)?;
    let v = some_value(data, t, c, rng)?.literal();
    write(
        format!(
            "Delete every {} with a {} below {v}",
            p.table.singular,
            p.label(c)
        ),
        format!("DELETE FROM {} WHERE {} < {v}", p.table.name, p.name(c)),
        t,
    )
}

fn update_category(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let p = pick(data, table_with(data, &[is_category, is_number], rng)?)?;
    let k = any_column(p.table, is_category, rng)?;
    let c = any_column(p.table, is_number, rng)?;
    let v = some_value(data, p.t, c, rng)?.literal();
    let Kind::Category(list) = p.table.columns.get(k)?.kind else {
        return None;
    };
    let y = Cell::Text(list.choose(rng)?.to_string()).literal();
    write(
        format!(
            "Set the {} of every {} with a {} above {v} to {y}",
            p.label(k),
            p.table.singular,
            p.label(c)
        ),
        format!(
            "UPDATE {} SET {} = {y} WHERE {} > {v}",
            p.table.name,
            p.name(k),
            p.name(c)
        ),
        p.t,
    )
}

fn delete_join(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let j = join(data, rng)?;
    if !is_leaf(data, j.child.t) {
        return None;
    }
    write(
        format!(
            "Delete every {} linked to the {} {}",
            j.child.table.singular, j.parent.table.singular, j.value
        ),
        format!(
            "DELETE FROM {} WHERE {} IN (SELECT id FROM {} WHERE {} = {})",
            j.child.table.name,
            j.child.name(j.fk),
            j.parent.table.name,
            j.parent.name(j.name),
            j.value
        ),
        j.child.t,
    )
}

fn insert(data: &Data, rng: &mut ChaCha8Rng) -> Option<Question> {
    let t = rng.random_range(0..data.domain.tables.len());
    let p = pick(data, t)?;
    let rows = data.rows.get(t)?;
    let id = rows.len() as i64 + 1;
    let mut described = Vec::new();
    let mut values = Vec::new();
    for column in p.table.columns {
        let cell = match column.kind {
            Kind::Id => Cell::Int(id),
            Kind::Name(names) => {
                if let Names::Unique(list) = names
                    && rows.len() >= list.len()
                {
                    return None;
                }
                let mut used: BTreeSet<String> = rows
                    .iter()
                    .flatten()
                    .filter_map(|cell| match cell {
                        Cell::Text(s) => Some(s.clone()),
                        Cell::Int(_) => None,
                    })
                    .collect();
                Cell::Text(fresh_name(names, &mut used, rng))
            }
            Kind::Category(list) => Cell::Text(list.choose(rng)?.to_string()),
            Kind::Number(min, max) => Cell::Int(rng.random_range(min..=max)),
            Kind::Ref(parent) => {
                let n = data.rows.get(parent)?.len() as i64;
                Cell::Int(rng.random_range(1..=n.max(1)))
            }
        };
        described.push(format!("{} {}", column.name, cell.literal()));
        values.push(cell.literal());
    }
    let names: Vec<&str> = p.table.columns.iter().map(|c| c.name).collect();
    write(
        format!(
            "Add a new {} with {}",
            p.table.singular,
            described.join(", ")
        ),
        format!(
            "INSERT INTO {} ({}) VALUES ({})",
            p.table.name,
            names.join(", "),
            values.join(", ")
        ),
        t,
    )
}
