agentry::experiment!("missing_algorithm.arl");

fn main() {}
