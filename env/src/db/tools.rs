//! The DB task's tools, as in AgentBench's DB task.

use crate::tool::{Param, ParamKind, ToolSchema};

/// `execute_sql(query)`: runs one SQL statement and shows its result.
pub const EXECUTE_SQL: &str = "execute_sql";
/// `commit_final_answer(answers)`: gives the answer and ends the episode.
pub const COMMIT_FINAL_ANSWER: &str = "commit_final_answer";

const EXECUTE_DESCRIPTION: &str = "run one SQL statement on the database and see its result";
const QUERY_DESCRIPTION: &str = "one SQLite statement";
const COMMIT_DESCRIPTION: &str =
    "give the answer and end the episode; after a change to the database give an empty list";
const ANSWERS_DESCRIPTION: &str = "the answer values, one value per string";

/// The schemas of the two tools.
pub fn schemas() -> Vec<ToolSchema> {
    vec![
        ToolSchema::new(
            EXECUTE_SQL,
            EXECUTE_DESCRIPTION,
            vec![Param::required(
                "query",
                ParamKind::String,
                QUERY_DESCRIPTION,
            )],
        ),
        ToolSchema::new(
            COMMIT_FINAL_ANSWER,
            COMMIT_DESCRIPTION,
            vec![Param::required(
                "answers",
                ParamKind::StringArray,
                ANSWERS_DESCRIPTION,
            )],
        ),
    ]
}

/// Every text of the schemas, for the vocabulary.
pub(crate) fn texts() -> [&'static str; 8] {
    [
        EXECUTE_SQL,
        EXECUTE_DESCRIPTION,
        "query",
        QUERY_DESCRIPTION,
        COMMIT_FINAL_ANSWER,
        COMMIT_DESCRIPTION,
        "answers",
        ANSWERS_DESCRIPTION,
    ]
}
