agentry::experiment!("out_of_range.arl");

fn main() {}
