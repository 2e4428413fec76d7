agentry::experiment!("unknown_key.arl");

fn main() {}
