agentry::experiment!("syntax_error.arl");

fn main() {}
