agentry::experiment!("missing_user_type.arl");

fn main() {}
