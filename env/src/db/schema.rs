//! The DB task's domains: tables, columns, and seeded rows.
//!
//! Four domains (company, shop, school, library) of three or four tables linked by foreign
//! keys. Every value comes from a fixed word list or a small integer range, so a word-level
//! tokenizer can have a piece for every value an answer can hold.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use rand::Rng;
use rand::seq::IndexedRandom;
use rand_chacha::ChaCha8Rng;

/// What a column holds, which decides how its values are generated and which questions use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The `INTEGER PRIMARY KEY`, numbered from 1.
    Id,
    /// The row's name, unique within its table.
    Name(Names),
    /// A text value from a short list, shared by several rows.
    Category(&'static [&'static str]),
    /// An integer in `min..=max`.
    Number(i64, i64),
    /// A foreign key to the table at this index of the domain.
    Ref(usize),
}

/// How a name column's values are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Names {
    /// A first and a last name: `Ava Stone`.
    Person,
    /// A colour and an item: `Red Lamp`.
    Product,
    /// An adjective and a noun: `Silent River`.
    Title,
    /// One word from a list (departments, projects, subjects), each used once.
    Unique(&'static [&'static str]),
}

/// One column of a table.
#[derive(Debug)]
pub struct ColumnSpec {
    /// The SQL name.
    pub name: &'static str,
    /// The words questions use for it.
    pub label: &'static str,
    /// What it holds.
    pub kind: Kind,
}

/// One table of a domain.
#[derive(Debug)]
pub struct TableSpec {
    /// The SQL name (a plural noun).
    pub name: &'static str,
    /// One row, in words.
    pub singular: &'static str,
    /// Several rows, in words.
    pub plural: &'static str,
    /// The fewest and most rows generated.
    pub rows: (usize, usize),
    /// The columns; the first is always the id.
    pub columns: &'static [ColumnSpec],
}

/// A set of related tables.
#[derive(Debug)]
pub struct Domain {
    /// The domain's name.
    pub name: &'static str,
    /// The tables, parents before the tables that refer to them.
    pub tables: &'static [TableSpec],
}

const fn col(name: &'static str, label: &'static str, kind: Kind) -> ColumnSpec {
    ColumnSpec { name, label, kind }
}

const ID: ColumnSpec = col("id", "id", Kind::Id);

/// First names of generated people.
pub const FIRST_NAMES: &[&str] = &[
    "Ava", "Ben", "Cara", "Dan", "Eva", "Finn", "Gina", "Hugo", "Iris", "Jack", "Kira", "Leo",
    "Mia", "Nico", "Olga", "Paul", "Rosa", "Sam", "Tara", "Umar", "Vera", "Will", "Yara", "Zack",
    "Alma", "Boris", "Clara", "Dora", "Emil", "Fay",
];
/// Last names of generated people.
pub const LAST_NAMES: &[&str] = &[
    "Stone", "Reed", "Hart", "Cole", "Lane", "Fox", "Gray", "Hill", "Kent", "Moss", "Nash", "Park",
    "Ross", "Shaw", "Todd", "Wade", "Young", "Baker", "Clark", "Diaz", "Evans", "Ford", "Green",
    "Hayes", "Irwin", "James", "King", "Lopez", "Miller", "Novak",
];
/// Colours of product names.
pub const COLOURS: &[&str] = &[
    "Red", "Blue", "Green", "Black", "White", "Golden", "Silver", "Orange",
];
/// Items of product names.
pub const ITEMS: &[&str] = &[
    "Lamp", "Chair", "Kettle", "Ball", "Rake", "Clock", "Mug", "Kite", "Towel", "Bottle",
];
/// Adjectives of book titles.
pub const ADJECTIVES: &[&str] = &[
    "Silent", "Hidden", "Broken", "Last", "Golden", "Distant", "Lost", "Quiet", "Burning", "Frozen",
];
/// Nouns of book titles.
pub const NOUNS: &[&str] = &[
    "River", "Garden", "Crown", "Road", "Empire", "Harbor", "Winter", "Mirror", "Forest", "Letter",
];
/// Department names.
pub const DEPARTMENTS: &[&str] = &[
    "Sales",
    "Engineering",
    "Marketing",
    "Finance",
    "Support",
    "Legal",
    "Research",
    "Operations",
];
/// Project names.
pub const PROJECTS: &[&str] = &[
    "Apollo", "Falcon", "Orion", "Phoenix", "Atlas", "Nova", "Titan", "Comet", "Zephyr", "Vega",
    "Aurora", "Mercury", "Helix", "Pulsar", "Quasar", "Nimbus",
];
/// Course titles.
pub const SUBJECTS: &[&str] = &[
    "Algebra",
    "Biology",
    "Chemistry",
    "Drawing",
    "Economics",
    "Geometry",
    "History",
    "Latin",
    "Music",
    "Physics",
    "Poetry",
    "Statistics",
];
/// Cities.
pub const CITIES: &[&str] = &[
    "Lyon", "Oslo", "Porto", "Dublin", "Vienna", "Prague", "Madrid", "Berlin",
];
/// Countries.
pub const COUNTRIES: &[&str] = &["France", "Norway", "Spain", "Ireland", "Italy", "Canada"];
/// Product categories.
pub const CATEGORIES: &[&str] = &["Home", "Garden", "Toys", "Sports", "Kitchen"];
/// Faculties of courses.
pub const FACULTIES: &[&str] = &["Science", "Arts", "Business"];
/// Book genres.
pub const GENRES: &[&str] = &["Fantasy", "Mystery", "Romance", "History", "Poetry"];

/// Every domain, in a fixed order.
pub const DOMAINS: &[Domain] = &[
    Domain {
        name: "company",
        tables: &[
            TableSpec {
                name: "departments",
                singular: "department",
                plural: "departments",
                rows: (3, 6),
                columns: &[
                    ID,
                    col("name", "name", Kind::Name(Names::Unique(DEPARTMENTS))),
                    col("city", "city", Kind::Category(CITIES)),
                ],
            },
            TableSpec {
                name: "employees",
                singular: "employee",
                plural: "employees",
                rows: (12, 40),
                columns: &[
                    ID,
                    col("name", "name", Kind::Name(Names::Person)),
                    col("department_id", "department", Kind::Ref(0)),
                    col("salary", "salary", Kind::Number(30, 150)),
                    col("age", "age", Kind::Number(21, 65)),
                    col("hire_year", "hire year", Kind::Number(2000, 2024)),
                ],
            },
            TableSpec {
                name: "projects",
                singular: "project",
                plural: "projects",
                rows: (5, 15),
                columns: &[
                    ID,
                    col("name", "name", Kind::Name(Names::Unique(PROJECTS))),
                    col("department_id", "department", Kind::Ref(0)),
                    col("budget", "budget", Kind::Number(10, 500)),
                ],
            },
        ],
    },
    Domain {
        name: "shop",
        tables: &[
            TableSpec {
                name: "customers",
                singular: "customer",
                plural: "customers",
                rows: (6, 20),
                columns: &[
                    ID,
                    col("name", "name", Kind::Name(Names::Person)),
                    col("city", "city", Kind::Category(CITIES)),
                    col("age", "age", Kind::Number(18, 80)),
                ],
            },
            TableSpec {
                name: "products",
                singular: "product",
                plural: "products",
                rows: (5, 15),
                columns: &[
                    ID,
                    col("name", "name", Kind::Name(Names::Product)),
                    col("category", "category", Kind::Category(CATEGORIES)),
                    col("price", "price", Kind::Number(2, 300)),
                ],
            },
            TableSpec {
                name: "orders",
                singular: "order",
                plural: "orders",
                rows: (15, 60),
                columns: &[
                    ID,
                    col("customer_id", "customer", Kind::Ref(0)),
                    col("product_id", "product", Kind::Ref(1)),
                    col("quantity", "quantity", Kind::Number(1, 10)),
                    col("year", "year", Kind::Number(2018, 2024)),
                ],
            },
        ],
    },
    Domain {
        name: "school",
        tables: &[
            TableSpec {
                name: "students",
                singular: "student",
                plural: "students",
                rows: (8, 30),
                columns: &[
                    ID,
                    col("name", "name", Kind::Name(Names::Person)),
                    col("city", "city", Kind::Category(CITIES)),
                    col("age", "age", Kind::Number(17, 30)),
                ],
            },
            TableSpec {
                name: "courses",
                singular: "course",
                plural: "courses",
                rows: (4, 10),
                columns: &[
                    ID,
                    col("title", "title", Kind::Name(Names::Unique(SUBJECTS))),
                    col("faculty", "faculty", Kind::Category(FACULTIES)),
                    col("credits", "credits", Kind::Number(1, 6)),
                ],
            },
            TableSpec {
                name: "enrollments",
                singular: "enrollment",
                plural: "enrollments",
                rows: (15, 60),
                columns: &[
                    ID,
                    col("student_id", "student", Kind::Ref(0)),
                    col("course_id", "course", Kind::Ref(1)),
                    col("score", "score", Kind::Number(40, 100)),
                ],
            },
        ],
    },
    Domain {
        name: "library",
        tables: &[
            TableSpec {
                name: "authors",
                singular: "author",
                plural: "authors",
                rows: (4, 10),
                columns: &[
                    ID,
                    col("name", "name", Kind::Name(Names::Person)),
                    col("country", "country", Kind::Category(COUNTRIES)),
                ],
            },
            TableSpec {
                name: "books",
                singular: "book",
                plural: "books",
                rows: (8, 30),
                columns: &[
                    ID,
                    col("title", "title", Kind::Name(Names::Title)),
                    col("author_id", "author", Kind::Ref(0)),
                    col("genre", "genre", Kind::Category(GENRES)),
                    col("pages", "pages", Kind::Number(80, 900)),
                    col("year", "year", Kind::Number(1950, 2024)),
                ],
            },
            TableSpec {
                name: "members",
                singular: "member",
                plural: "members",
                rows: (5, 15),
                columns: &[
                    ID,
                    col("name", "name", Kind::Name(Names::Person)),
                    col("city", "city", Kind::Category(CITIES)),
                ],
            },
            TableSpec {
                name: "loans",
                singular: "loan",
                plural: "loans",
                rows: (10, 50),
                columns: &[
                    ID,
                    col("book_id", "book", Kind::Ref(1)),
                    col("member_id", "member", Kind::Ref(2)),
                    col("days", "days", Kind::Number(1, 60)),
                ],
            },
        ],
    },
];

/// One value of a generated row.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cell {
    /// An integer.
    Int(i64),
    /// A text value (never containing a quote).
    Text(String),
}

impl Cell {
    /// The SQL literal: `42` or `'Ava Stone'`.
    pub fn literal(&self) -> String {
        match self {
            Cell::Int(n) => n.to_string(),
            Cell::Text(s) => format!("'{s}'"),
        }
    }

    /// The value as an observation shows it.
    pub fn text(&self) -> String {
        match self {
            Cell::Int(n) => n.to_string(),
            Cell::Text(s) => s.clone(),
        }
    }
}

/// A generated database: a domain and the rows of each of its tables.
#[derive(Clone, Debug)]
pub struct Data {
    /// The domain.
    pub domain: &'static Domain,
    /// `rows[t][r][c]`: table `t`, row `r`, column `c`.
    pub rows: Vec<Vec<Vec<Cell>>>,
}

impl Data {
    /// Rows for every table of `domain`, drawn from `rng`.
    pub fn generate(domain: &'static Domain, rng: &mut ChaCha8Rng) -> Data {
        let mut rows: Vec<Vec<Vec<Cell>>> = Vec::with_capacity(domain.tables.len());
        for table in domain.tables {
            let (lo, hi) = table.rows;
            let mut n = rng.random_range(lo..=hi);
            let mut used: BTreeSet<String> = BTreeSet::new();
            let mut table_rows = Vec::with_capacity(n);
            for column in table.columns {
                if let Kind::Name(Names::Unique(list)) = column.kind {
                    n = n.min(list.len());
                }
            }
            for r in 0..n {
                let mut row = Vec::with_capacity(table.columns.len());
                for column in table.columns {
                    let cell = match column.kind {
                        Kind::Id => Cell::Int(r as i64 + 1),
                        Kind::Name(names) => Cell::Text(fresh_name(names, &mut used, rng)),
                        Kind::Category(list) => {
                            Cell::Text(list.choose(rng).copied().unwrap_or_default().to_string())
                        }
                        Kind::Number(min, max) => Cell::Int(rng.random_range(min..=max)),
                        Kind::Ref(parent) => {
                            let count = rows.get(parent).map_or(1, Vec::len).max(1);
                            Cell::Int(rng.random_range(1..=count as i64))
                        }
                    };
                    row.push(cell);
                }
                table_rows.push(row);
            }
            rows.push(table_rows);
        }
        Data { domain, rows }
    }

    /// The SQL that creates and fills the database: one `CREATE TABLE` and one multi-row
    /// `INSERT` per table. It is also the instance's canonical content.
    pub fn script(&self) -> String {
        let mut out = String::with_capacity(4096);
        for (table, rows) in self.domain.tables.iter().zip(&self.rows) {
            let _ = writeln!(out, "CREATE TABLE {};", create_columns(self.domain, table));
            if rows.is_empty() {
                continue;
            }
            let _ = write!(out, "INSERT INTO {} VALUES ", table.name);
            for (i, row) in rows.iter().enumerate() {
                out.push_str(if i == 0 { "(" } else { ", (" });
                for (j, cell) in row.iter().enumerate() {
                    if j > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(&cell.literal());
                }
                out.push(')');
            }
            out.push_str(";\n");
        }
        out
    }

    /// The schema as the instruction shows it:
    /// `departments(id INTEGER PRIMARY KEY, name TEXT, city TEXT); employees(...)`.
    pub fn table_info(&self) -> String {
        self.domain
            .tables
            .iter()
            .map(|t| create_columns(self.domain, t))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// `name(col TYPE, ...)` of a table, as in its `CREATE TABLE`.
fn create_columns(domain: &Domain, table: &TableSpec) -> String {
    let columns: Vec<String> = table
        .columns
        .iter()
        .map(|c| match c.kind {
            Kind::Id => format!("{} INTEGER PRIMARY KEY", c.name),
            Kind::Name(_) | Kind::Category(_) => format!("{} TEXT", c.name),
            Kind::Number(..) => format!("{} INTEGER", c.name),
            Kind::Ref(parent) => format!(
                "{} INTEGER REFERENCES {}(id)",
                c.name,
                domain.tables.get(parent).map_or("", |p| p.name)
            ),
        })
        .collect();
    format!("{}({})", table.name, columns.join(", "))
}

/// A name not yet in `used` (and records it).
pub(crate) fn fresh_name(
    names: Names,
    used: &mut BTreeSet<String>,
    rng: &mut ChaCha8Rng,
) -> String {
    let pair = |a: &[&str], b: &[&str], rng: &mut ChaCha8Rng| {
        format!(
            "{} {}",
            a.choose(rng).copied().unwrap_or_default(),
            b.choose(rng).copied().unwrap_or_default()
        )
    };
    // Every list has far more names than a table has rows, so a few draws find a new one; the
    // draw count is bounded all the same, and the last draw is taken even if it repeats.
    let mut name = String::new();
    for _ in 0..64 {
        name = match names {
            Names::Person => pair(FIRST_NAMES, LAST_NAMES, rng),
            Names::Product => pair(COLOURS, ITEMS, rng),
            Names::Title => pair(ADJECTIVES, NOUNS, rng),
            Names::Unique(list) => {
                let free: Vec<&str> = list
                    .iter()
                    .copied()
                    .filter(|w| !used.contains(*w))
                    .collect();
                free.choose(rng).copied().unwrap_or_default().to_string()
            }
        };
        if !used.contains(&name) {
            break;
        }
    }
    used.insert(name.clone());
    name
}

/// Every word that generated values can contain.
pub(crate) fn value_words() -> impl Iterator<Item = &'static str> {
    [
        FIRST_NAMES,
        LAST_NAMES,
        COLOURS,
        ITEMS,
        ADJECTIVES,
        NOUNS,
        DEPARTMENTS,
        PROJECTS,
        SUBJECTS,
        CITIES,
        COUNTRIES,
        CATEGORIES,
        FACULTIES,
        GENRES,
    ]
    .into_iter()
    .flatten()
    .copied()
}
