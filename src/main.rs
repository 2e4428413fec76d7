//! `agentry`: check, expand and run experiment files.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agentry::{Interpreted, RunArgs};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "agentry",
    version,
    about = "Agentic RL experiments from .arl files."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check experiment files; print every error and exit 1 if any.
    Check {
        /// The `.arl` files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the Rust code an experiment file compiles to.
    Expand {
        /// The `.arl` file.
        file: PathBuf,
    },
    /// Run an experiment file without compiling it (it must name no Rust types).
    Run {
        /// The `.arl` file.
        file: PathBuf,
        #[command(flatten)]
        run: RunArgs,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Check { files } => {
            let mut failed = false;
            for file in &files {
                match read(file).and_then(|source| {
                    agentry::dsl::check(&source)
                        .map(|_| ())
                        .map_err(|d| d.render(&display(file), &source))
                }) {
                    Ok(()) => println!("{}: ok", display(file)),
                    Err(message) => {
                        eprintln!("{message}");
                        failed = true;
                    }
                }
            }
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Expand { file } => {
            let result = read(&file).and_then(|source| {
                agentry::expand_pretty(&source, &display(&file))
                    .map_err(|d| d.render(&display(&file), &source))
            });
            finish(result.map(|code| print!("{code}")))
        }
        Command::Run { file, run } => {
            let result = read(&file).and_then(|source| {
                let spec =
                    agentry::dsl::check(&source).map_err(|d| d.render(&display(&file), &source))?;
                agentry::run(&Interpreted(spec), &run.options())
                    .map(|_| ())
                    .map_err(|e| format!("error: {e}"))
            });
            finish(result)
        }
    }
}

fn read(file: &Path) -> Result<String, String> {
    std::fs::read_to_string(file)
        .map_err(|e| format!("error: cannot read `{}`: {e}", display(file)))
}

fn display(file: &Path) -> String {
    file.display().to_string()
}

fn finish(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}
