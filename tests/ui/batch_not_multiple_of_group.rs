agentry::experiment!("batch_not_multiple_of_group.arl");

fn main() {}
