agentry::experiment!("many_errors.arl");

fn main() {}
