agentry::experiment!("unknown_environment.arl");

fn main() {}
