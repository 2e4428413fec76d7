agentry::experiment!("wrong_type.arl");

fn main() {}
