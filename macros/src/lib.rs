//! The `experiment!` macro: compiles an Agentry experiment file into Rust at build time.
//!
//! This crate is a thin adapter, as in askama: it finds the file, hands its text to
//! [`agentry_dsl`], and turns the result into tokens. All parsing, checking and code generation
//! live in `agentry-dsl`, where they are ordinary functions that tests call directly.

use std::path::{Path, PathBuf};

use proc_macro::TokenStream;
use quote::quote;

/// Compiles `experiments/NAME.arl` (relative to the crate's `Cargo.toml`) into a type named
/// after the experiment that implements `agentry::Experiment`.
///
/// ```ignore
/// agentry::experiment!("experiments/quickstart.arl");
/// fn main() -> agentry::Result<()> {
///     agentry::main(Quickstart)
/// }
/// ```
///
/// Errors in the file are reported at build time, each with `file:line:col`, the line and a
/// caret; cargo rebuilds the crate when the file changes.
#[proc_macro]
pub fn experiment(input: TokenStream) -> TokenStream {
    let literal = syn::parse_macro_input!(input as syn::LitStr);
    match expand(&literal.value()) {
        Ok(tokens) => tokens.into(),
        Err(messages) => messages
            .into_iter()
            .map(|message| syn::Error::new(literal.span(), message))
            .reduce(|mut all, next| {
                all.combine(next);
                all
            })
            .map(|error| error.to_compile_error())
            .unwrap_or_default()
            .into(),
    }
}

/// The generated code, or one message per error (each becomes its own compile error).
fn expand(relative: &str) -> Result<proc_macro2::TokenStream, Vec<String>> {
    let path = resolve(relative).map_err(|e| vec![e])?;
    let source = std::fs::read_to_string(&path).map_err(|e| {
        vec![format!(
            "cannot read experiment file `{}`: {e}",
            path.display()
        )]
    })?;
    let generated = agentry_dsl::expand_source(&source, relative).map_err(|diagnostics| {
        let mut sorted: Vec<_> = diagnostics.iter().collect();
        sorted.sort_by_key(|d| d.span.start);
        sorted
            .into_iter()
            .map(|d| {
                // rustc prints its own `error: ` before the message.
                let rendered = d.render(relative, &source);
                rendered
                    .strip_prefix("error: ")
                    .unwrap_or(&rendered)
                    .trim_end()
                    .to_string()
            })
            .collect::<Vec<_>>()
    })?;
    let absolute = path.to_string_lossy();
    Ok(quote! {
        #generated
        // Makes rustc record the file as an input, so cargo rebuilds when it changes.
        const _: &[u8] = ::core::include_bytes!(#absolute);
    })
}

/// The file relative to the crate's manifest directory; failing that, relative to the directory
/// of the source file that invokes the macro (trybuild moves the manifest directory).
fn resolve(relative: &str) -> Result<PathBuf, String> {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_default();
    let candidates = [
        Some(manifest.join(relative)),
        proc_macro::Span::call_site()
            .local_file()
            .and_then(|file| file.parent().map(|dir| dir.join(relative))),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            format!(
                "experiment file `{relative}` not found (looked in `{}`)",
                Path::new(&manifest).display()
            )
        })
}
